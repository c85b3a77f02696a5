"""``TrainingProgress``: step, loss, speed, a progress bar and the loss over the whole run, in a notebook or as one
terminal status line.

Steps are counted as everywhere in flowlab: a step is the call number of the train job (from 0, the ``step`` of
watches and summaries), so this widget and a ``WatchPanel`` show the same number for the same call. ``update()``
without a step takes the last train-job call's.

``update()`` may be called from any thread, every step: it appends the step and loss to a ``StatsFeed`` (a number
as one lock-free list extend by the pair, ``put_value``; other named numbers are kept under a data lock). As a watch
handler (``flow.watch(loss, progress)``) the job appends the loss's statistics to the same feed. The throttled
refresh thread (see ``_live``) takes the feed in bulk and, in a notebook, pushes the numbers at most ``refresh_hz``
times a second through a ``LiveDocument``; in a terminal it rewrites the status line with ``\\r``, at most 4 times a
second, and ``close()`` prints the final state and a newline.
"""
from __future__ import annotations

import math
import sys
import threading
import time

import numpy as np
from bokeh.layouts import column

from ..ops.stats import stats_vector
from ..plots import (Trend, bar_columns, fit_trend, status_sources, status_view, trend_columns, trend_figure,
                     trend_source)
from ..runtime import session
from ..watching import StatsFeed, TensorStats
from ._live import DEFAULT_HZ, LiveView, Refresher, check_hz, resolve_mode

TERMINAL_PERIOD = 0.25   # seconds between status lines: readable, and cheap even for fast loops
SPEED_SAMPLE = 0.25      # seconds per speed sample; samples are smoothed exponentially


def _fmt(v):
    return f"{v:.4g}" if isinstance(v, (float, np.floating)) else str(v)


def _never():
    return False


_NO_LOSS = (math.nan, math.nan, math.nan, math.nan, 0.0, 0.0)   # a step recorded without a loss



def _loss_of(stats):
    """The mean loss; one NaN (Inf) example makes it NaN (Inf), as ``np.mean`` would."""
    return math.nan if stats.nan_count else math.inf if stats.inf_count else stats.mean


class TrainingProgress(LiveView):
    """Show training progress: ``progress.update(step=None, loss=None, **metrics)``. ``total_steps`` adds a progress
    bar (step ``s`` done means ``s + 1`` of them). Also a watch handler: ``flow.watch(loss, progress)`` updates it
    every call with the loss's statistics computed on the device (its mean as the loss, its min…max as the curve's
    envelope)."""

    def __init__(self, total_steps=None, refresh_hz=DEFAULT_HZ, mode=None, file=None, max_points=500):
        if total_steps is not None and (not isinstance(total_steps, int) or isinstance(total_steps, bool)
                                        or total_steps < 1):
            raise ValueError(f"TrainingProgress: total_steps must be a positive int or None, got {total_steps!r}")
        self.total_steps = total_steps
        self.mode = resolve_mode(mode, "TrainingProgress")
        self.refresh_hz = check_hz(refresh_hz, "TrainingProgress")
        self._file = file
        self._data_lock = threading.Lock()
        self._ui_lock = threading.RLock()
        self._step, self._loss, self._metrics = None, None, {}
        self._losses = Trend(max_points)
        self._speed = None                   # smoothed steps/s
        self._sample = None                  # (time, step) where the current speed sample started
        self._dirty = False
        self._last_line = ""
        self._shown_done = 0.0               # the bar's fraction the page has (the sources start at 0)
        period = 1.0 / self.refresh_hz if self.mode == "notebook" else max(TERMINAL_PERIOD, 1.0 / self.refresh_hz)
        self._refresher = Refresher(self.refresh, period, "flowlab-training-progress")
        self._feed = StatsFeed(self._refresher.poke, self._take_feed)     # update() and a watched loss fill it
        if self.mode == "notebook":
            from .live import LiveDocument
            self._text_source, self._done_source = status_sources()
            self._loss_source = trend_source()
            self._loss_figure = trend_figure(self._loss_source, y_label="loss")
            root = column(status_view(self._text_source, self._done_source, bar=total_steps is not None),
                          self._loss_figure, sizing_mode="stretch_width")
            self.widget = LiveDocument(root, before_settle=self._settle, name="TrainingProgress")

    # --------------------------------------------------------------------------------------------- recording

    def update(self, step=None, loss=None, **metrics):
        """Record step ``step`` (default: the last train-job call) with its ``loss`` (a number, or the
        ``TensorStats`` of a per-example loss) and other named numbers. Cheap enough to call every step: the step
        and loss go to a ``StatsFeed`` that the refresh thread takes in bulk."""
        if step is None:
            step = session.default().last_train_step
            if step is None:
                step = -1 if self._step is None else self._step
                step += 1 + len(self._feed)
        if type(step) is not int:       # the common case (a plain int, or the job's own count) checks nothing more
            if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
                raise ValueError(f"TrainingProgress.update: step must be a non-negative int or None, got {step!r}")
            step = int(step)
        if step < 0:
            raise ValueError(f"TrainingProgress.update: step must be a non-negative int or None, got {step!r}")
        if metrics:
            with self._data_lock:
                self._metrics.update(metrics)
        if type(loss) is float:         # the common case first
            self._feed.put_value(step, loss)
        elif loss is None:
            self._feed.put(step, _NO_LOSS)
        elif isinstance(loss, TensorStats):
            self._feed.put(step, (loss.min, loss.max, loss.mean, loss.std, loss.nan_count, loss.inf_count))
        else:
            # a number: the feed keeps it in a column and builds its row (a NaN/Inf counted, so the curve marks it)
            # with the others' at the next take
            try:
                value = float(loss)
            except (TypeError, ValueError):
                raise TypeError(f"TrainingProgress.update: loss must be a number, a TensorStats or None, got "
                                f"{type(loss).__name__} {loss!r}") from None
            self._feed.put_value(step, value)

    def _track_speed(self, now, step):
        if self._sample is None:
            self._sample = (now, step)
            return
        t0, s0 = self._sample
        if now - t0 >= SPEED_SAMPLE:
            rate = (step - s0) / (now - t0)
            self._speed = rate if self._speed is None else 0.7 * self._speed + 0.3 * rate
            self._sample = (now, step)

    def watch_summary(self, blob_def, kind):
        """The watch protocol (see ``flowlab.watching``): statistics only, computed on the device and put in the
        widget's ``StatsFeed``."""
        return 0, _never, self._feed

    def _take_feed(self):
        """Record the steps the feed holds (the refresh thread, or the putting thread when the feed is full)."""
        with self._data_lock:
            steps, vectors = self._feed.take(arrays=True)
            if not steps.size:
                return
            last = int(steps[-1])
            self._track_speed(time.monotonic(), last)
            self._step, self._dirty = last, True
            with_loss = ~(np.isnan(vectors[:, 2]) & (vectors[:, 4] + vectors[:, 5] == 0))
            if with_loss.all():                 # the common case: every step brought its loss
                self._losses.extend(steps, vectors)
                self._loss = _loss_of(TensorStats.from_vector((), vectors[-1]))
            elif with_loss.any():
                self._losses.extend(steps[with_loss], vectors[with_loss])
                self._loss = _loss_of(TensorStats.from_vector((), vectors[with_loss][-1]))

    def watch_event(self, value, blob_def, kind, step):
        """As a watch handler: the loss is the mean of the delivered value."""
        if not isinstance(value, TensorStats):
            value = np.asarray(value)
            value = TensorStats.from_vector(value.shape, stats_vector(np, value))
        self.update(step, loss=value)

    # ------------------------------------------------------------------------------------------------ display

    def _status(self):
        if self._step is None:
            return "waiting for the first step…"
        parts = [f"step {self._step}" + (f" · {self._step + 1}/{self.total_steps} ({100 * self._done():.0f}%)"
                                         if self.total_steps else "")]
        if self._loss is not None:
            parts.append(f"loss {self._loss:.4g}")
        if self._speed is not None:
            parts.append(f"{self._speed:,.0f} steps/s" if self._speed >= 100 else f"{self._speed:.3g} steps/s")
        parts += [f"{k} {_fmt(v)}" for k, v in self._metrics.items()]
        return " | ".join(parts)

    def _done(self):
        """The fraction of ``total_steps`` done (0 without a total)."""
        if self.total_steps is None or self._step is None:
            return 0.0
        return min(self._step + 1, self.total_steps) / self.total_steps

    def refresh(self):
        """Show the latest numbers now (the refresh thread calls this too)."""
        with self._ui_lock:
            self._take_feed()
            with self._data_lock:
                if not self._dirty:
                    return
                self._dirty = False
                line, done = self._status(), self._done()
                losses = None if self.mode == "terminal" else self._losses.take()
            if self.mode == "terminal":
                out = self._file or sys.stderr
                # pad with spaces: a shorter line must cover the end of the previous one
                out.write("\r" + line.ljust(len(self._last_line)))
                out.flush()
                self._last_line = line
                return
            self.widget.splice(self._text_source, 0, {"text": [line]})
            if done != self._shown_done:      # (without total_steps never: a message carries 4 columns fewer)
                self.widget.splice(self._done_source, 0, bar_columns(done))
                self._shown_done = done
            if losses is not None:
                at, values = losses
                self.widget.splice(self._loss_source, at, trend_columns(values))
                fit_trend(self.widget, self._loss_figure, self.widget.data(self._loss_source))
            self.widget.push()

    def _settle(self):
        """The end of a cell (and ``close``): show the latest numbers, and fit the loss curve's ranges tight, the run
        being over (while it runs, the step axis keeps room to grow)."""
        self.refresh()
        if self.mode == "notebook":
            with self._ui_lock:
                fit_trend(self.widget, self._loss_figure, self.widget.data(self._loss_source), tight=True)

    def __repr__(self):
        with self._data_lock:
            return f"TrainingProgress({self._status()})"

    def close(self):
        """Show the final state and stop refreshing; in a terminal, end the status line."""
        super().close()
        if self.mode == "terminal" and self._last_line:
            out = self._file or sys.stderr
            out.write("\n")
            out.flush()
            self._last_line = ""     # a second close() adds no empty line
