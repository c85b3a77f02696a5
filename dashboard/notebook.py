"""``flowlab.dashboard.show(logdir)``: the dashboard inside a Jupyter notebook.

The server runs in its own thread with its own event loop (``server.ServerThread``), not on the kernel's loop: a
Bokeh server on the kernel's loop stalls while a cell blocks, which is exactly when a training loop is running.
The notebook shows it in an IFrame.
"""
from __future__ import annotations


def show(logdir, port=0, host="127.0.0.1", reload_interval=1.0, height=720):
    """Serve the dashboard for ``logdir`` (port 0: a free one) and display it; returns a handle with ``.url`` and
    ``.stop()``."""
    from IPython.display import IFrame, display

    from .server import ServerThread
    handle = ServerThread(logdir, port=port, host=host, reload_interval=reload_interval)
    display(IFrame(handle.url, width="100%", height=height))
    return handle
