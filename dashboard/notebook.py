"""``flowlab.dashboard.show(logdir)``: the dashboard inside a Jupyter notebook.

The server runs in its own thread with its own event loop (``server.ServerThread``), not on the kernel's loop: a
Bokeh server on the kernel's loop stalls while a cell blocks, which is exactly when a training loop is running.
In a Jupyter kernel it is shown in an IFrame of the dashboard's own URL, so the websocket's Origin is the dashboard's
own and only the framing needs allowing: the server's CSP ``frame-ancestors`` admits pages from localhost and the
loopback addresses (a Jupyter server on this machine, on any port) and whatever ``frame_ancestors`` adds. Elsewhere
(a plain Python session, or a terminal IPython, which would print the IFrame's repr) ``show`` prints the URL.
"""
from __future__ import annotations


def show(logdir, port=0, host="127.0.0.1", reload_interval=0.25, height=720, frame_ancestors=()):
    """Serve the dashboard for ``logdir`` (port 0: a free one) and display it (outside Jupyter: print its URL);
    returns a handle with ``.url`` and ``.stop()``.

    ``frame_ancestors``: further CSP sources allowed to embed it, for a notebook front end that is not served from
    this machine's loopback names (for example ``["vscode-webview:"]`` or ``["https://hub.example.org"]``)."""
    from flowlab.summary.redact import redact

    from .server import ServerThread
    if isinstance(frame_ancestors, str):
        raise TypeError(f"frame_ancestors must be a list of CSP sources, got the string {frame_ancestors!r}")
    handle = ServerThread(logdir, port=port, host=host, reload_interval=reload_interval,
                          frame_ancestors=tuple(frame_ancestors))
    if _in_jupyter_kernel():
        from IPython.display import IFrame, display
        display(IFrame(handle.url, width="100%", height=height))
    else:
        print(f"flowlab dashboard for {redact(logdir)} at {handle.url}  (stop it with .stop())", flush=True)
    return handle


def _in_jupyter_kernel() -> bool:
    """True inside a Jupyter kernel (any front end: Lab, Notebook, VS Code), which renders an IFrame; a terminal
    IPython shell would print the IFrame's repr instead."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None
