"""Drive a real Jupyter frontend (JupyterLab 4 or Notebook 7) in headless Chromium from a pytest test.

Test-support module, not a test file: tests import it as ``from jupyter_page import ...``; tests/conftest.py gives
them the module-scoped fixtures ``jupyter_server`` (a ``JupyterServer``) and ``chromium`` (a Playwright browser)::

    from jupyter_page import NotebookPage, write_notebook

    def test_something(jupyter_server, chromium):
        write_notebook(jupyter_server.root_dir / "t.ipynb", ["import ipywidgets as w", "w.IntSlider()"])
        with NotebookPage(chromium, jupyter_server, "t.ipynb", ui="lab") as nb:
            nb.run_all()
            nb.wait_idle()
            assert nb.errors() == [] and nb.output_errors() == []

One server serves both UIs: ``/lab/tree/<nb>`` (JupyterLab) and ``/notebooks/<nb>`` (Notebook 7). Use a separate
notebook file per page: two pages on the same path share one kernel session.

Events (console messages, websocket frames) reach Python only while the test is inside a Playwright call (the sync
API pumps its event loop there). Wait with Playwright (``nb.wait_idle()``, ``page.wait_for_function``,
``page.wait_for_timeout``), not ``time.sleep``, so that frames are recorded with timely timestamps; ``nb.flush()``
does one round trip to the page to deliver whatever is pending. Times are ``time.time()`` throughout.

Worth knowing when writing tests on top of this:

- The page sends a ``comm_open`` and a ``comm_msg`` (the widget manager's ``request_states``) on load; count the
  frames of a time window (``nb.sent_messages("comm_msg", since=..., until=...)``), not of the whole session.
- After ``restart_kernel()`` the old widget views stay in the DOM (showing their last state) until their cell runs
  again; mark or count them before re-running rather than waiting for a selector that already matches.
- ``output_area(i)`` includes the prompt (``[3]:``); ``text()`` and ``canvases()`` see into open shadow roots,
  ``inner_text()`` does not.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import re
import secrets
import signal
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
UIS = ("lab", "notebook7")
TIMEOUT_S = 60.0
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}
_CHECKOUT = Path(__file__).resolve().parent.parent       # the flowlab checkout these tests belong to


def launch_chromium(playwright):
    """Launch Debian's headless chromium with the flags this machine needs; returns a Playwright ``Browser``."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def write_notebook(path, sources, *, kernelspec=KERNELSPEC):
    """Write an nbformat-v4 notebook of code cells with the given sources to ``path``; returns the ``Path``.

    The kernelspec metadata is what keeps JupyterLab from asking which kernel to use.
    """
    import nbformat
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in sources])
    nb.metadata["kernelspec"] = dict(kernelspec)
    nb.metadata["language_info"] = {"name": "python"}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


# --------------------------------------------------------------------------------------------------------------------
# The server


# jupyter_server_config.py in our own JUPYTER_CONFIG_DIR: two fixes for serving both UIs from one server, which
# would otherwise make what a page shows depend on which pages the server served before it.
_SERVER_CONFIG = """\
# JupyterLab's page handler writes each request's treePath/workspace/mode into the page-config dict it shares with
# Notebook 7's handlers (tornado setting "page_config_data"): every /notebooks/ page served after /lab/tree/X would
# inherit treePath=X and fail with "Command 'filebrowser:open-path' not registered" trying to open X. A hook that
# returns a copy keeps each page's config its own.
c.ServerApp.tornado_settings = {"page_config_hook": lambda handler, page_config: dict(page_config)}

# FileFindHandler caches resolved static paths in a class-wide dict keyed by the relative path alone, across routes
# with different roots. JupyterLab and Notebook 7 ship the same content-hashed font files, so once a lab page has
# loaded e.g. 620019ed9d1100b6.woff2, /static/notebook/620019ed9d1100b6.woff2 resolves to lab's copy and is refused
# with 403 ("not in root static directory"). Without the cache each request looks the file up in its own roots.
from jupyter_server.base.handlers import FileFindHandler


class _NoCache(dict):
    def __setitem__(self, key, value):
        pass


FileFindHandler._static_paths = _NoCache()
"""


# User settings of both frontends (JUPYTERLAB_SETTINGS_DIR), by plugin id.
_LAB_SETTINGS = {
    # News ("fetchNews") and update checks off: no network here, and their toasts would cover the notebook.
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
    # Every cell rendered (the default windowing leaves off-screen cells unpainted): canvases get drawn and
    # locators find cells wherever the notebook is scrolled.
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
}


class JupyterServer:
    """``python -m jupyterlab`` on 127.0.0.1 and a free port, serving ``root_dir`` to both JupyterLab and Notebook 7.

    Use as a context manager (``with JupyterServer(tmp) as srv``). Kernels use the default ``python3`` kernelspec,
    which jupyter_client launches with the server's own interpreter (``sys.executable`` here), so the venv and flowlab
    are importable in them. User config/data/runtime/IPython dirs and the lab settings/workspaces dirs are redirected
    into ``<root_dir>/.jupyter-test/``; the venv's own dirs (``sys.prefix/etc/jupyter``, ``sys.prefix/share/jupyter``:
    server extensions, kernelspecs, labextensions) stay on the search path. The log goes to ``log_path``.
    """

    def __init__(self, root_dir, *, timeout=TIMEOUT_S, extra_args=()):
        self.root_dir = Path(root_dir).resolve()
        self.state_dir = self.root_dir / ".jupyter-test"
        self.log_path = self.state_dir / "server.log"
        self.token = secrets.token_hex(16)
        self.timeout = timeout
        self.extra_args = list(extra_args)
        self.process = None
        self.port = None
        self._log = None

    @property
    def url(self):
        """Base URL, e.g. ``http://127.0.0.1:PORT`` (no trailing slash)."""
        return f"http://127.0.0.1:{self.port}"

    def notebook_url(self, path, ui="lab", *, workspace=None):
        """Page URL (with the token) of the notebook at ``path`` (relative to ``root_dir``) in ``ui``.

        ``ui`` is ``"lab"`` (JupyterLab; in the named ``workspace`` when given, which keeps pages from restoring each
        other's layout) or ``"notebook7"`` (Notebook 7).
        """
        rel = quote(str(path).replace(os.sep, "/"))
        if ui == "lab":
            prefix = f"/lab/workspaces/{quote(workspace)}/tree/" if workspace else "/lab/tree/"
        elif ui == "notebook7":
            prefix = "/notebooks/"
        else:
            raise ValueError(f"ui must be one of {UIS}, not {ui!r}")
        return f"{self.url}{prefix}{rel}?token={self.token}"

    def start(self):
        """Start the server and wait until ``/api/status`` answers; returns self."""
        for sub in ("config", "data", "runtime", "ipython", "workspaces"):
            (self.state_dir / sub).mkdir(parents=True, exist_ok=True)
        (self.state_dir / "config" / "jupyter_server_config.py").write_text(_SERVER_CONFIG)
        for plugin, values in _LAB_SETTINGS.items():
            package, name = plugin.split(":")
            settings = self.state_dir / "settings" / package / f"{name}.jupyterlab-settings"
            settings.parent.mkdir(parents=True, exist_ok=True)
            settings.write_text(json.dumps(values))
        env = dict(os.environ,
                   # user-level dirs only: the venv's etc/ and share/jupyter are still searched (jupyter --paths)
                   JUPYTER_CONFIG_DIR=str(self.state_dir / "config"),
                   JUPYTER_DATA_DIR=str(self.state_dir / "data"),
                   JUPYTER_RUNTIME_DIR=str(self.state_dir / "runtime"),
                   IPYTHONDIR=str(self.state_dir / "ipython"),              # no user profile/startup files in kernels
                   JUPYTERLAB_SETTINGS_DIR=str(self.state_dir / "settings"),
                   JUPYTERLAB_WORKSPACES_DIR=str(self.state_dir / "workspaces"),
                   # kernels import flowlab from this checkout, not from wherever the interpreter would find it
                   PYTHONPATH=os.pathsep.join(filter(None, [str(_CHECKOUT), os.environ.get("PYTHONPATH")])),
                   PYTHONUNBUFFERED="1")
        cmd = [sys.executable, "-m", "jupyterlab",        # = `jupyter lab`, without a PATH lookup of jupyter-lab
               "--no-browser", "--allow-root",
               "--ServerApp.ip=127.0.0.1", "--ServerApp.port=0",   # the OS picks a free port; read back below
               f"--ServerApp.root_dir={self.root_dir}",
               f"--IdentityProvider.token={self.token}",
               "--LabApp.expose_app_in_browser=True",               # window.jupyterapp in JupyterLab
               "--JupyterNotebookApp.expose_app_in_browser=True",   # ... and in Notebook 7
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
               *self.extra_args]
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(cmd, cwd=self.root_dir, env=env, stdin=subprocess.DEVNULL,
                                        stdout=self._log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self):
        info_file = self.state_dir / "runtime" / f"jpserver-{self.process.pid}.json"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"jupyter server exited with {self.process.returncode}:\n{self.log_tail()}")
            if self.port is None and info_file.exists():
                try:
                    self.port = json.loads(info_file.read_text())["port"]
                except (ValueError, KeyError):
                    pass                                   # written but not complete yet
            if self.port is not None:
                try:
                    self.api("GET", "/api/status", timeout=5)
                    return
                except (OSError, urllib.error.URLError):
                    pass
            time.sleep(0.1)
        raise TimeoutError(f"jupyter server not ready after {self.timeout} s:\n{self.log_tail()}")

    def api(self, method, path, body=None, *, timeout=10):
        """Call the REST API with the token (e.g. ``api("GET", "/api/sessions")``); returns the decoded JSON or None."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def kernels(self):
        """The running kernels as the server lists them (``/api/kernels``)."""
        return self.api("GET", "/api/kernels")

    def shutdown_sessions(self, path):
        """Delete the sessions (and so shut down the kernels) of the notebook at ``path`` (relative to root_dir)."""
        path = str(path).replace(os.sep, "/")
        for session in self.api("GET", "/api/sessions"):
            if session.get("path") == path:
                self.api("DELETE", f"/api/sessions/{session['id']}", timeout=30)

    def log_tail(self, lines=60):
        """The last ``lines`` lines of the server log (for failure messages)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout=10):
        """Shut down kernels and the server (``POST /api/shutdown``); SIGTERM, then SIGKILL, if it lingers."""
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            try:
                if self.port is not None:
                    self.api("POST", "/api/shutdown", timeout=5)
            except (OSError, urllib.error.URLError):
                pass
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


# --------------------------------------------------------------------------------------------------------------------
# Kernel websocket frames


class WsMessage(NamedTuple):
    """A kernel message the page sent over a websocket."""
    time: float            # time.time() when Python received the event (see the module docstring)
    channel: str           # "shell", "control", "stdin", ...
    msg_type: str          # "execute_request", "comm_msg", ...
    content: dict
    kernel_id: str
    n_buffers: int         # binary buffers attached (widgets send arrays this way)
    msg_id: str


def decode_kernel_frame(payload, *, channels=None):
    """Decode one kernel websocket frame into a dict: channel, header, parent_header, content, buffers.

    Binary frames use the ``v1.kernel.websocket.jupyter.org`` subprotocol (what JupyterLab 4 / Notebook 7 negotiate
    with jupyter_server 2): a little-endian uint64 count n, then n uint64 offsets; the parts between consecutive
    offsets are channel, header, parent header, metadata, content and then the buffers (last offset = end). See
    ``jupyter_server/services/kernels/connection/base.py`` (``serialize_msg_to_ws_v1``) and @jupyterlab/services'
    ``serializeV1KernelWebsocketJupyterOrg``. Text frames (legacy protocol) are one JSON message; legacy binary
    frames (uint32 big-endian part count and offsets, first part the JSON message) are decoded too. With
    ``channels`` given, a v1 frame on another channel returns None without its JSON being parsed.
    """
    if isinstance(payload, str):
        msg = json.loads(payload)
        msg["buffers"] = []
    else:
        data = bytes(payload)
        n = int.from_bytes(data[:8], "little") if len(data) >= 8 else 0
        offsets = [int.from_bytes(data[8 * (i + 1):8 * (i + 2)], "little") for i in range(n)] if 6 <= n < 1024 else []
        if offsets and offsets[0] == 8 * (n + 1) and offsets == sorted(offsets) and offsets[-1] == len(data):
            parts = [data[a:b] for a, b in zip(offsets, offsets[1:])]
            channel = parts[0].decode()
            if channels is not None and channel not in channels:
                return None
            msg = {"channel": channel, "header": json.loads(parts[1] or b"{}"),
                   "parent_header": json.loads(parts[2] or b"{}"), "content": json.loads(parts[4] or b"{}"),
                   "buffers": parts[5:]}
        else:                                                            # legacy binary
            nbufs = struct.unpack("!I", data[:4])[0]
            offsets = list(struct.unpack("!" + "I" * nbufs, data[4:4 * (nbufs + 1)])) + [len(data)]
            parts = [data[a:b] for a, b in zip(offsets, offsets[1:])]
            msg = dict(json.loads(parts[0]), buffers=parts[1:])
    msg = {"channel": msg.get("channel", ""), "header": msg.get("header") or {},
           "parent_header": msg.get("parent_header") or {}, "content": msg.get("content") or {},
           "buffers": msg["buffers"]}
    if channels is not None and msg["channel"] not in channels:
        return None
    return msg


_KERNEL_WS = re.compile(r"/api/kernels/([^/?]+)/channels")


# --------------------------------------------------------------------------------------------------------------------
# Page-side JavaScript

# The notebook panel showing `path`, in either UI (stashed as window.__flPanel once found).
_FIND_PANEL_JS = """(path) => {
    const app = window.jupyterapp;
    if (!app || !app.shell) return false;
    const isPanel = (w) => w && w.context && w.context.path === path && w.content && w.sessionContext;
    let panel = isPanel(app.shell.currentWidget) ? app.shell.currentWidget : null;
    if (!panel && app.shell.widgets) {
        for (const w of app.shell.widgets('main')) { if (isPanel(w)) { panel = w; break; } }
    }
    if (!panel) return false;
    window.__flPanel = panel;
    const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
    return !!(panel.context.isReady && kernel && kernel.status === 'idle'
              && kernel.connectionStatus === 'connected' && panel.content.widgets.length > 0);
}"""

_KERNEL_STATUS_JS = """() => {
    const s = window.__flPanel && window.__flPanel.sessionContext.session;
    return s && s.kernel ? s.kernel.status : 'none';
}"""

# Starts a command without awaiting it; window.__flRuns counts commands started and settled.
_RUN_COMMAND_JS = """([command, args]) => {
    const panel = window.__flPanel;
    window.jupyterapp.shell.activateById(panel.id);
    window.__flRuns = window.__flRuns || {started: 0, settled: 0};
    window.__flRuns.started += 1;
    window.jupyterapp.commands.execute(command, args || {})
        .catch((e) => console.error(`jupyter_page: ${command} failed: ${e}`))
        .finally(() => { window.__flRuns.settled += 1; });
}"""

_IDLE_JS = """() => {
    const runs = window.__flRuns || {started: 0, settled: 0};
    const s = window.__flPanel && window.__flPanel.sessionContext.session;
    return runs.started === runs.settled && !!(s && s.kernel && s.kernel.status === 'idle');
}"""

_CELL_RUNNING_JS = """(index) => {
    const cell = window.__flPanel.content.widgets[index];
    if (!cell) throw new Error(`no cell ${index}`);
    if (cell.model.executionState !== undefined) return cell.model.executionState === 'running';
    return !!(cell.promptNode && cell.promptNode.textContent.includes('*'));
}"""

# Starts a restart (no dialog) and a round trip to the new kernel process; window.__flRestart says how it went.
_RESTART_JS = """() => {
    const kernel = window.__flPanel.sessionContext.session.kernel;
    const state = window.__flRestart = {done: false, error: null};
    kernel.restart().then(() => kernel.requestKernelInfo())
        .catch((e) => { state.error = String(e); })
        .finally(() => { state.done = true; });
}"""

# Texts of errors shown in output areas: stderr-typed outputs (tracebacks, stderr streams, JupyterLab's
# "Javascript Error: ..." for a renderer that threw) and the widget managers' error views.
_OUTPUT_ERRORS_JS = """(root) => {
    const out = [];
    const seen = new Set();
    const add = (el) => { if (!seen.has(el)) { seen.add(el); out.push(el.innerText.trim()); } };
    root.querySelectorAll('[data-mime-type="application/vnd.jupyter.stderr"]').forEach(add);
    root.querySelectorAll('.jupyter-widgets-error-widget').forEach(add);
    root.querySelectorAll('.jupyter-widgets').forEach((el) => {
        const t = el.innerText || '';
        if (/Error displaying widget|Failed to create view|Click to show javascript error/.test(t)
            && !el.querySelector('.jupyter-widgets-error-widget')) add(el);
    });
    return out;
}"""

# Every <canvas> under `root`, open shadow roots included, and whether anything was drawn on it.
CANVASES_JS = """(root) => {
    const canvases = [];
    const visit = (node) => {
        if (node instanceof HTMLCanvasElement) canvases.push(node);
        if (node.shadowRoot) visit(node.shadowRoot);
        for (const child of node.children || []) visit(child);
    };
    visit(root);
    return canvases.map((c) => {
        const rect = c.getBoundingClientRect();
        const info = {width: c.width, height: c.height, cssWidth: rect.width, cssHeight: rect.height,
                      visible: c.checkVisibility ? c.checkVisibility() : rect.width > 0,
                      differsFromFirstPixel: false, drawn: false, error: null};
        if (!c.width || !c.height) return info;
        try {
            // Copy onto a fresh 2d canvas: works for 2d and WebGL sources and never creates a context on `c`.
            const copy = document.createElement('canvas');
            copy.width = c.width; copy.height = c.height;
            const ctx = copy.getContext('2d', {willReadFrequently: true});
            ctx.drawImage(c, 0, 0);
            const px = ctx.getImageData(0, 0, c.width, c.height).data;
            const [r0, g0, b0, a0] = [px[0], px[1], px[2], px[3]];
            let hash = 0;
            for (let i = 0; i < px.length; i += 4) {
                const [r, g, b, a] = [px[i], px[i + 1], px[i + 2], px[i + 3]];
                if (r !== r0 || g !== g0 || b !== b0 || a !== a0) info.differsFromFirstPixel = true;
                if (a !== 0 && !(r === 255 && g === 255 && b === 255)) info.drawn = true;
                hash = (hash * 31 + r + 7 * g + 13 * b + 17 * a) | 0;
            }
            info.fingerprint = hash;          // changes when what the canvas shows changes
        } catch (e) {
            info.error = String(e);
        }
        return info;
    });
}"""

# Visible text under `root`, walking into open shadow roots and slots (innerText stops at shadow boundaries).
TEXT_JS = """(root) => {
    const parts = [];
    const skip = new Set(['SCRIPT', 'STYLE', 'TEMPLATE', 'NOSCRIPT']);
    const visit = (node) => {
        if (node.nodeType === Node.TEXT_NODE) {
            // Chromium's parser splits a text longer than 65,536 characters into sibling text nodes: one text
            // (a long printed line) again, not two words
            const previous = node.previousSibling;
            const joined = previous && previous.nodeType === Node.TEXT_NODE && parts.length;
            if (joined) parts[parts.length - 1] += node.textContent;
            else parts.push(node.textContent);
            return;
        }
        if (node.nodeType === Node.ELEMENT_NODE) {
            if (skip.has(node.tagName)) return;
            if (node.checkVisibility && !node.checkVisibility()) return;
            if (node.tagName === 'SLOT') {
                const assigned = node.assignedNodes({flatten: true});
                (assigned.length ? assigned : node.childNodes).forEach(visit);
                return;
            }
            if (node.shadowRoot) { node.shadowRoot.childNodes.forEach(visit); return; }
        }
        node.childNodes.forEach(visit);
    };
    visit(root);
    return parts.join(' ').replace(/\\s+/g, ' ').trim();
}"""

# Records (Date.now()/1000, innerText) each time the element's text changes, under window.__flWatch[key].
_WATCH_TEXT_JS = """(el, key) => {
    window.__flWatch = window.__flWatch || {};
    const log = window.__flWatch[key] = [[Date.now() / 1000, el.innerText]];
    const check = () => {
        const text = el.innerText;
        if (text !== log[log.length - 1][1]) log.push([Date.now() / 1000, text]);
    };
    new MutationObserver(check).observe(el, {subtree: true, childList: true, characterData: true,
                                             attributes: true});
}"""


# --------------------------------------------------------------------------------------------------------------------
# Console noise

# Console errors the Jupyter frontends print themselves in a plain, healthy run (found by opening a notebook with a
# trivial cell and running it in both UIs). Keep this list narrow: each pattern says why it is benign.
# Page errors are recorded as "<name>: <message>\n<stack>", so a pattern can pin the file that threw.
BENIGN_CONSOLE_PATTERNS = [
    # Notebook 7.6 only, on every page load, also with every federated extension disabled, without our settings
    # file, and under `jupyter notebook` as under `jupyter lab`: the keyboard-shortcuts plugin's pluginChanged handler
    # reads registry.plugins["@jupyterlab/docmanager-extension:plugin"].schema while that plugin's settings are still
    # loading. The handler throws before it changes anything; the settings still load and the page works.
    r"^TypeError: Cannot read properties of undefined \(reading 'schema'\)\nTypeError: [^\n]*\n"
    r"\s+at \S*/static/notebook/notebook_core\.\w+\.js",                      # thrown in Notebook 7's own bundle
]


def filter_benign(messages, patterns=BENIGN_CONSOLE_PATTERNS):
    """``messages`` without those matching (``re.search``) one of the regexes in ``patterns``."""
    compiled = [re.compile(p) for p in patterns]
    return [m for m in messages if not any(c.search(m) for c in compiled)]


# --------------------------------------------------------------------------------------------------------------------
# The page


class NotebookPage:
    """A notebook opened in ``ui`` ("lab" or "notebook7") in a fresh browser context of ``browser``.

    Use as a context manager, or call ``open()`` / ``close()``. Collects ``console_errors`` (console messages of type
    error), ``page_errors`` (uncaught exceptions) and ``sent`` (kernel messages the page sent, ``WsMessage``).
    ``page`` is the Playwright page for anything not wrapped here.
    """

    _workspaces = itertools.count()
    CHROME_PX = 250     # what JupyterLab's menu, tabs and toolbars take of the window's height, and a margin

    def __init__(self, browser, server, path, ui="lab", *, viewport=(1400, 900), timeout=TIMEOUT_S):
        if ui not in UIS:
            raise ValueError(f"ui must be one of {UIS}, not {ui!r}")
        self.browser, self.server, self.path, self.ui = browser, server, str(path), ui
        self.viewport, self.timeout = viewport, timeout
        self.context = self.page = None
        self.console_errors, self.page_errors, self.sent = [], [], []
        self._answered = set()                      # msg_ids of requests with a reply, or given up on at a restart
        self.load_s = None

    # -- lifecycle

    def open(self):
        """Open the page and wait until the notebook's kernel is connected and idle; returns self."""
        try:
            return self._open()
        except BaseException:
            self.close()
            raise

    def _open(self):
        width, height = self.viewport
        self.context = self.browser.new_context(viewport={"width": width, "height": height})
        self.page = self.context.new_page()
        self.page.set_default_timeout(self.timeout * 1000)
        self.page.on("console", self._on_console)
        self.page.on("pageerror", lambda err: self.page_errors.append(f"{err.name}: {err.message}\n{err.stack}"))
        self.page.on("websocket", self._on_websocket)
        workspace = f"jupyter-page-{os.getpid()}-{next(self._workspaces)}"
        start = time.perf_counter()
        self.page.goto(self.server.notebook_url(self.path, self.ui, workspace=workspace))
        try:
            self.page.wait_for_function(_FIND_PANEL_JS, arg=self.path, polling=100, timeout=self.timeout * 1000)
        except Exception as exc:
            raise AssertionError(f"notebook {self.path} not ready in {self.ui} after {self.timeout} s "
                                 f"({exc.__class__.__name__}); console errors: {self.console_errors}; "
                                 f"page errors: {self.page_errors}\nserver log:\n{self.server.log_tail()}") from exc
        # The frontend's start-up requests (kernel info, comm info, the debugger's state...) answered too: a restart
        # while one is in flight cancels it and the debugger logs "Could not restore the debugger state".
        self.wait_replies()
        self.load_s = time.perf_counter() - start
        return self

    def close(self, *, shutdown_kernel=True):
        """Close the browser context, then shut the notebook's kernel down (unless told not to)."""
        if self.context is not None:
            self.context.close()
        self.context = self.page = None
        if shutdown_kernel:
            try:
                self.server.shutdown_sessions(self.path)
            except (OSError, urllib.error.URLError):
                pass                                           # the server is gone; it took its kernels along

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()

    # -- event recording

    def _on_console(self, msg):
        if msg.type == "error":
            loc = msg.location or {}
            where = f" ({loc.get('url', '')}:{loc.get('lineNumber', '')})" if loc.get("url") else ""
            self.console_errors.append(msg.text + where)

    def _on_websocket(self, ws):
        match = _KERNEL_WS.search(ws.url)
        if match is None:
            return                                             # /api/events/subscribe and the like
        kernel_id = match.group(1)

        def on_sent(payload):
            now = time.time()
            try:
                msg = decode_kernel_frame(payload)
            except Exception as exc:                           # keep the record; a test can look at it
                msg = {"channel": "?", "header": {"msg_type": f"undecodable: {exc}"}, "content": {}, "buffers": []}
            header = msg["header"]
            self.sent.append(WsMessage(now, msg["channel"], header.get("msg_type", ""), msg["content"], kernel_id,
                                       len(msg["buffers"]), header.get("msg_id", "")))

        def on_received(payload):                              # only to know which requests were answered
            try:
                msg = decode_kernel_frame(payload, channels=("shell", "control"))
            except Exception:
                return
            if msg and msg["header"].get("msg_type", "").endswith("_reply"):
                self._answered.add(msg["parent_header"].get("msg_id"))

        ws.on("framesent", on_sent)
        ws.on("framereceived", on_received)

    def flush(self):
        """One round trip to the page, so that events it emitted before now are recorded; returns time.time()."""
        self.page.evaluate("() => 0")
        return time.time()

    def sent_messages(self, msg_type=None, *, channel=None, since=None, until=None):
        """Recorded ``WsMessage``s sent by the page, filtered by type, channel and [since, until) (time.time())."""
        return [m for m in self.sent
                if (msg_type is None or m.msg_type == msg_type) and (channel is None or m.channel == channel)
                and (since is None or m.time >= since) and (until is None or m.time < until)]

    def pending_requests(self, exclude=("execute_request",)):
        """Requests the page sent that have no reply yet (``WsMessage``s), except the types in ``exclude``."""
        return [m for m in self.sent if m.msg_type.endswith("_request") and m.msg_type not in exclude
                and m.msg_id not in self._answered]

    def wait_replies(self, timeout=10.0, exclude=("execute_request",)):
        """Wait until ``pending_requests(exclude)`` is empty; returns what is still pending after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while self.pending_requests(exclude) and time.monotonic() < deadline:
            self.page.wait_for_timeout(50)                     # lets Playwright deliver the frames
        return self.pending_requests(exclude)

    def errors(self, patterns=BENIGN_CONSOLE_PATTERNS):
        """Console errors and uncaught page errors (after a ``flush()``), without the known-benign frontend noise."""
        if self.page is not None:
            self.flush()
        return filter_benign(self.console_errors + self.page_errors, patterns)

    # -- kernel and execution

    def kernel_status(self):
        """The kernel's status as the page sees it: "idle", "busy", "starting", "restarting", ... or "none"."""
        return self.page.evaluate(_KERNEL_STATUS_JS)

    def run_all(self):
        """Start running every cell (``notebook:run-all-cells``) and return at once, without waiting for it."""
        self.page.evaluate(_RUN_COMMAND_JS, ["notebook:run-all-cells", {}])

    def run_cell(self, index):
        """Start running code cell ``index`` (0-based) and return at once."""
        self.page.evaluate("(i) => { window.__flPanel.content.activeCellIndex = i; }", index)
        self.page.evaluate(_RUN_COMMAND_JS, ["notebook:run-cell", {}])

    def wait_idle(self, timeout=TIMEOUT_S):
        """Wait until every run started here has finished and the kernel is idle."""
        try:
            self.page.wait_for_function(_IDLE_JS, polling=50, timeout=timeout * 1000)
        except Exception as exc:
            raise AssertionError(f"kernel not idle after {timeout} s (status {self.kernel_status()!r}); "
                                 f"output errors: {self.output_errors()}; console errors: {self.errors()}") from exc

    def is_running(self):
        """Whether a run started here is unfinished or the kernel is busy."""
        return not self.page.evaluate(_IDLE_JS)

    def is_cell_running(self, index):
        """Whether cell ``index`` is executing or queued (its prompt shows ``[*]``)."""
        return self.page.evaluate(_CELL_RUNNING_JS, index)

    def execution_count(self, index):
        """The execution count in cell ``index``'s prompt (``None`` before it ran and while it runs)."""
        return self.page.evaluate("(i) => window.__flPanel.content.widgets[i].model.executionCount ?? null", index)

    def restart_kernel(self, timeout=TIMEOUT_S):
        """Restart the kernel without the confirmation dialog and wait until it is idle again.

        Waits (up to 10 s) for replies to the page's pending requests other than execute_request first: cancelling
        one makes the frontend log errors. Requests still pending are then given up on.
        """
        self.wait_replies()
        self._answered.update(m.msg_id for m in self.pending_requests(exclude=()))
        self.page.evaluate(_RESTART_JS)
        self.page.wait_for_function("() => window.__flRestart.done", polling=50, timeout=timeout * 1000)
        error = self.page.evaluate("() => window.__flRestart.error")
        if error:
            raise AssertionError(f"kernel restart failed: {error}\nserver log:\n{self.server.log_tail()}")
        self.page.wait_for_function(_FIND_PANEL_JS, arg=self.path, polling=100, timeout=timeout * 1000)
        self.wait_idle(timeout)

    # -- the DOM

    def cell(self, index):
        """Locator of cell ``index`` (0-based, as in the notebook file)."""
        return self.page.locator(".jp-Notebook .jp-Cell").nth(index)

    def output_area(self, index):
        """Locator of the output area (prompt included) of code cell ``index`` (0-based, as in the notebook file)."""
        return self.cell(index).locator(".jp-OutputArea").first

    def output_errors(self):
        """Texts of errors shown in output areas: tracebacks, stderr streams, "Javascript Error", widget error views.

        An anywidget whose ``render`` throws leaves an empty output: that shows in ``errors()`` only.
        """
        return self.page.locator(".jp-Notebook").first.evaluate(_OUTPUT_ERRORS_JS)

    def canvases(self, locator):
        """For each ``<canvas>`` under ``locator`` (shadow DOM included): size, visibility and whether drawn on.

        Each item is a dict: width, height (backing store), cssWidth, cssHeight, visible, drawn (some pixel neither
        transparent nor white), differsFromFirstPixel, fingerprint (a hash of the pixels), error (e.g. a tainted
        canvas).
        """
        return self._locate(locator).evaluate(CANVASES_JS)

    def text(self, locator):
        """Visible text under ``locator``, including text inside open shadow roots, whitespace collapsed."""
        return self._locate(locator).evaluate(TEXT_JS)

    def watch_text(self, locator, key):
        """Start recording the ``innerText`` of ``locator``'s element each time it changes; read with ``watched(key)``.

        Runs in the page (a MutationObserver), so no change is missed while Python waits on something else.
        """
        self._locate(locator).evaluate(_WATCH_TEXT_JS, key)

    def watched(self, key):
        """The ``(time.time(), text)`` pairs recorded by ``watch_text(..., key)``, the initial text first."""
        return [tuple(x) for x in self.page.evaluate("(key) => (window.__flWatch || {})[key] || []", key)]

    def screenshot(self, path, locator=None):
        """Full-page screenshot (or of ``locator``'s element, scrolled into view) to ``path``; returns the ``Path``.

        The Jupyter UIs fill the viewport and scroll the notebook inside it, so "full page" is the window. Under
        JupyterLab's menu and toolbars less than the window shows: an element taller than that was shot with the
        toolbar over its top, so the window grows to hold it for the shot (and is put back).
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if locator is None:
            self.page.screenshot(path=str(path), full_page=True)
            return path
        element = self._locate(locator)
        width, height = self.viewport
        needed = math.ceil(element.evaluate("(el) => el.getBoundingClientRect().height")) + self.CHROME_PX
        if needed > height:
            self.page.set_viewport_size({"width": width, "height": needed})
            self.page.wait_for_timeout(300)          # the widgets lay out again for the new window
        element.evaluate("(el) => el.scrollIntoView({block: 'center'})")
        self.page.evaluate("() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")
        element.screenshot(path=str(path))
        if needed > height:
            self.page.set_viewport_size({"width": width, "height": height})
        return path

    def _locate(self, locator):
        """A CSS selector or Locator, narrowed to its first match."""
        loc = self.page.locator(locator) if isinstance(locator, str) else locator
        return loc.first
