"""What the live views share: choosing notebook or terminal output, the throttled refresh thread, and ``LiveView``
(display, close, ``with``).

Threads: values arrive on the watch dispatcher thread (or the training loop's thread); they only update plain data
under a short data lock and ``poke()`` the refresher. Only the refresher's thread, or an explicit ``refresh()``,
touches widgets and Bokeh models, under the view's UI lock, so those objects never see two threads at once.
Throttle: after each flush the refresher sleeps until the next multiple of its period, so a flood of values costs at
most ``hz`` flushes a second and each flush sends only the latest value; an idle view sends nothing and the first
value after a pause shows at once. Periods are counted from one shared origin, so views refreshing at one rate flush
at the same instants: their updates reach the page together and BokehJS paints them in one frame.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref

MAX_HZ = 20    # Jupyter drops IOPub messages above ~1000/s; a few rows at 20 Hz stay far below that
DEFAULT_HZ = 4  # live to the eye (a number changes every 0.25 s) at a fraction of the page's drawing work

_log = logging.getLogger("flowlab")


def in_notebook():
    """True inside a Jupyter kernel (not in a terminal IPython or a plain script)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in shell.config


def resolve_mode(mode, api):
    if mode is None:
        return "notebook" if in_notebook() else "terminal"
    if mode not in ("notebook", "terminal"):
        raise ValueError(f"{api}: mode must be 'notebook', 'terminal' or None (detect), got {mode!r}")
    return mode


def check_hz(refresh_hz, api):
    if not isinstance(refresh_hz, (int, float)) or isinstance(refresh_hz, bool) or not 0 < refresh_hz <= MAX_HZ:
        raise ValueError(f"{api}: refresh_hz must be a number in (0, {MAX_HZ}], got {refresh_hz!r}")
    return float(refresh_hz)


class Refresher:
    """Calls ``flush()`` on a daemon thread soon after ``poke()``, at most once per ``period`` seconds.

    The thread starts on the first poke and holds its view only weakly: a view that is garbage collected (a notebook
    cell run again) ends its thread instead of leaking it.
    """

    def __init__(self, flush, period, name):
        self._flush = weakref.WeakMethod(flush)
        self._period = period
        self._name = name
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = None
        self._start = threading.Lock()
        self._failed = False

    def poke(self):
        if self._stop.is_set():
            return
        if self._thread is None:
            with self._start:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                    self._thread.start()
        if not self._wake.is_set():     # set() takes a lock even when already set; pokes come every step
            self._wake.set()

    def _run(self):
        while not self._stop.is_set():
            if not self._wake.wait(timeout=5.0):
                if self._flush() is None:
                    return          # the view is gone
                continue
            self._wake.clear()
            if self._stop.is_set():
                return
            flush = self._flush()
            if flush is None:
                return
            try:
                flush()
            except Exception:       # keep the training running; say once what broke the display
                if not self._failed:
                    _log.exception("flowlab: %s failed to refresh its display", self._name)
                    self._failed = True
            del flush
            # the throttle: no flush before the next multiple of the period (a shared grid for every view)
            self._stop.wait(self._period - time.monotonic() % self._period)

    def stop(self):
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)


class LiveView:
    """Base of the live widgets: shown through a ``LiveDocument`` (``widget``) in a notebook, as text elsewhere.

    A subclass sets ``widget`` (or leaves it None outside a notebook) and ``_refresher``, and defines ``refresh()``.
    """

    widget = None

    def _ipython_display_(self):
        if self.widget is not None:
            self.widget._ipython_display_()
        else:
            print(repr(self))

    def close(self):
        """Push what is pending, stop the refresh thread and leave the final state (and its static copy) shown."""
        self._refresher.stop()
        self.refresh()
        if self.widget is not None:
            self.widget.settle()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
