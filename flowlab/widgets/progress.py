"""``TrainingProgress``: steps, loss, a loss curve and speed, in a notebook or as one terminal status line.

``update()`` may be called from the training loop or, as a watch handler, from the watch dispatcher thread; it only
records numbers under a data lock. In a notebook the throttled refresh thread (see ``_live``) pushes them to the
widgets at most ``refresh_hz`` times a second; in a terminal ``update()`` itself rewrites the status line with
``\\r``, at most 4 times a second, and ``close()`` prints the final state and a newline.
"""
from __future__ import annotations

import html
import math
import sys
import threading
import time

import numpy as np

from ..plots import Trend, line_figure, trend_source
from ..watching import TensorStats
from ._live import Refresher, check_hz, resolve_mode

TERMINAL_PERIOD = 0.25   # seconds between status lines: readable, and cheap even for fast loops
SPEED_SAMPLE = 0.25      # seconds per speed sample; samples are smoothed exponentially


def _fmt(v):
    return f"{v:.4g}" if isinstance(v, (float, np.floating)) else str(v)


class TrainingProgress:
    """Show training progress: ``progress.update(step, loss=None, **metrics)`` with ``step`` the number of steps
    done (``i + 1`` in a 0-based loop). ``total_steps`` adds a progress bar. Also a watch handler:
    ``flow.watch(loss, progress)`` updates it with the mean of each delivered loss."""

    def __init__(self, total_steps=None, refresh_hz=10, mode=None, file=None, max_points=1000):
        if total_steps is not None and (not isinstance(total_steps, int) or total_steps < 1):
            raise ValueError(f"TrainingProgress: total_steps must be a positive int or None, got {total_steps!r}")
        self.total_steps = total_steps
        self.mode = resolve_mode(mode, "TrainingProgress")
        self.refresh_hz = check_hz(refresh_hz, "TrainingProgress")
        self._file = file
        self._data_lock = threading.Lock()
        self._ui_lock = threading.RLock()
        self._step, self._loss, self._metrics = 0, None, {}
        self._losses = Trend(max_points)
        self._speed = None                   # smoothed steps/s
        self._sample = None                  # (time, step) where the current speed sample started
        self._dirty = False
        self._last_line, self._last_print = "", -math.inf
        self._refresher = Refresher(self.refresh, 1.0 / self.refresh_hz, "flowlab-training-progress")
        self.box = None
        if self.mode == "notebook":
            self._build()

    def _build(self):
        import ipywidgets
        from jupyter_bokeh import BokehModel
        self._label = ipywidgets.HTML("waiting for the first step…")
        top = [self._label]
        if self.total_steps is not None:
            self._bar = ipywidgets.IntProgress(value=0, min=0, max=self.total_steps)
            top.insert(0, self._bar)
        self._loss_source = trend_source()
        figure = line_figure(self._loss_source, y="mean", title="loss", y_label="loss")
        self._model = BokehModel(figure)
        self._doc = figure.document
        self.box = ipywidgets.VBox([ipywidgets.HBox(top), self._model])

    # --------------------------------------------------------------------------------------------- recording

    def update(self, step, loss=None, **metrics):
        now = time.monotonic()
        step = int(step)
        with self._data_lock:
            self._track_speed(now, step)
            self._step = step
            if loss is not None:
                self._loss = float(loss)
                self._losses.append(step, self._loss, 0.0)
            self._metrics.update(metrics)
            self._dirty = True
        if self.mode == "notebook":
            self._refresher.poke()
        elif now - self._last_print >= TERMINAL_PERIOD:
            self.refresh()

    def _track_speed(self, now, step):
        if self._sample is None:
            self._sample = (now, step)
            return
        t0, s0 = self._sample
        if now - t0 >= SPEED_SAMPLE:
            rate = (step - s0) / (now - t0)
            self._speed = rate if self._speed is None else 0.7 * self._speed + 0.3 * rate
            self._sample = (now, step)

    def watch_event(self, value, blob_def, kind, step):
        """As a watch handler: the loss is the mean of the delivered value; call ``step`` k means k+1 steps done."""
        loss = value.mean if isinstance(value, TensorStats) else float(np.mean(value))
        self.update(step + 1, loss=loss)

    # ------------------------------------------------------------------------------------------------ display

    def _status(self, html_escape=False):
        esc = html.escape if html_escape else str
        parts = [f"step {self._step}" + (f"/{self.total_steps} ({100 * self._step / self.total_steps:.0f}%)"
                                         if self.total_steps else "")]
        if self._loss is not None:
            parts.append(f"loss {self._loss:.4g}")
        if self._speed is not None:
            parts.append(f"{self._speed:.3g} steps/s")
        parts += [f"{esc(str(k))} {esc(_fmt(v))}" for k, v in self._metrics.items()]
        return " | ".join(parts)

    def refresh(self):
        """Show the latest numbers now (the refresh thread and terminal updates call this too)."""
        with self._ui_lock:
            with self._data_lock:
                if not self._dirty:
                    return
                self._dirty = False
                line = self._status(html_escape=self.mode == "notebook")
                step, losses = self._step, self._losses.take()
            if self.mode == "terminal":
                out = self._file or sys.stderr
                # pad with spaces: a shorter line must cover the end of the previous one
                out.write("\r" + line.ljust(len(self._last_line)))
                out.flush()
                self._last_line, self._last_print = line, time.monotonic()
                return
            if self.total_steps is not None:
                with self._bar.hold_sync():
                    self._bar.value = min(step, self.total_steps)
            with self._label.hold_sync():
                self._label.value = line
            if losses is not None:
                self._doc.hold("combine")
                try:
                    change, columns = losses
                    if change == "stream":
                        self._loss_source.stream(columns)
                    else:
                        self._loss_source.data = columns
                finally:
                    self._doc.unhold()

    def _repr_mimebundle_(self, **kwargs):
        if self.box is not None:
            return self.box._repr_mimebundle_(**kwargs)
        return {"text/plain": f"TrainingProgress({self._last_line or 'no step yet'})"}

    def close(self):
        """Show the final state and stop refreshing; in a terminal, end the status line."""
        self._refresher.stop()
        self.refresh()
        if self.mode == "terminal" and self._last_line:
            out = self._file or sys.stderr
            out.write("\n")
            out.flush()
            self._last_line = ""     # a second close() adds no empty line

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
