"""The dashboard's one shared store: every event file is tailed once, here, and every browser session reads from it.

A background thread polls ``LogdirTailer`` every ``reload_interval`` seconds and appends what arrived to
``Series`` — one per ``(run, tag, kind)``. A series only grows, except when a restart purge drops its tail or when it
outgrows ``max_points`` and is thinned (every other point of its older half dropped, newest points kept at full
resolution); either bumps its ``epoch``. A session remembers ``(epoch, length)`` per series it shows, so
``Store.read`` hands it only the new items — or everything, flagged ``reset``, after an epoch change. That is what
lets views use ``ColumnDataSource.stream`` for deltas and never resend a whole series per poll.

Thread safety: the poll thread changes series under ``lock``; readers take the same lock only to copy slices.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, NamedTuple

import numpy as np

from flowlab.summary.tailer import LogdirTailer

# Kinds the store keeps (graph/hparams/text/images are few per run; scalars and histograms are the bulk).
KEPT = ("scalar", "histogram", "image", "text", "tensor", "hparams", "graph")


class Series:
    """One ``(run, tag, kind)`` stream of ``(step, wall_time, value)`` items."""

    __slots__ = ("run", "tag", "kind", "plugin", "steps", "wall_times", "values", "epoch")

    def __init__(self, run, tag, kind, plugin=""):
        self.run, self.tag, self.kind, self.plugin = run, tag, kind, plugin
        self.steps: list[int] = []
        self.wall_times: list[float] = []
        self.values: list[Any] = []
        self.epoch = 0

    @property
    def key(self):
        return self.run, self.tag, self.kind

    def __len__(self):
        return len(self.steps)

    def append(self, step, wall_time, value):
        self.steps.append(int(step))
        self.wall_times.append(float(wall_time))
        self.values.append(value)

    def extend(self, steps, wall_times, values):
        self.steps.extend(steps)
        self.wall_times.extend(wall_times)
        self.values.extend(values)

    def purge_from(self, step):
        """Drop items with step >= ``step`` (a restarted run re-logs them)."""
        keep = [i for i, s in enumerate(self.steps) if s < step]
        if len(keep) == len(self.steps):
            return False
        self.steps = [self.steps[i] for i in keep]
        self.wall_times = [self.wall_times[i] for i in keep]
        self.values = [self.values[i] for i in keep]
        self.epoch += 1
        return True

    def thin(self, max_points):
        """Halve the older half when over ``max_points``: memory stays bounded, recent points stay exact."""
        if len(self.steps) <= max_points:
            return False
        half = len(self.steps) // 2
        keep = list(range(0, half, 2)) + list(range(half, len(self.steps)))
        self.steps = [self.steps[i] for i in keep]
        self.wall_times = [self.wall_times[i] for i in keep]
        self.values = [self.values[i] for i in keep]
        self.epoch += 1
        return True


class Delta(NamedTuple):
    """What a session has not seen of one series: ``reset`` means replace, else append."""
    series: Series
    epoch: int
    reset: bool
    steps: list
    wall_times: list
    values: list


class Store:
    def __init__(self, logdir, reload_interval=1.0, max_points=50_000):
        if reload_interval <= 0:
            raise ValueError(f"reload_interval must be a positive number of seconds, got {reload_interval!r}")
        if max_points < 100:
            raise ValueError(f"max_points must be at least 100, got {max_points!r}")
        self.logdir = os.path.abspath(os.fspath(logdir))
        self.reload_interval = float(reload_interval)
        self.max_points = int(max_points)
        self.lock = threading.Lock()
        self.version = 0                       # bumps on every change: sessions skip work when it has not moved
        self._series: dict[tuple, Series] = {}
        self._tailer = LogdirTailer(self.logdir)
        self._last_update = None
        self._last_error = None
        self._tail_stats = self._tailer.stats()   # refreshed by the poll thread: readers never touch the tailer
        self._stop = threading.Event()
        self._thread = None

    # ------------------------------------------------------------------------------------------------- polling
    def start(self):
        if self._thread is None:
            self.poll()                         # the first page already has data
            self._thread = threading.Thread(target=self._loop, name="flowlab-dashboard-store", daemon=True)
            self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self):
        while not self._stop.wait(self.reload_interval):
            self.poll()

    def poll(self) -> int:
        """Read what the logdir gained; returns the number of items stored. Never raises for bad logs."""
        try:
            items = self._tailer.poll(kinds=KEPT, columnar=True)
            self._tail_stats = self._tailer.stats()
            self._last_error = None
        except Exception as e:  # a store that dies stops the dashboard: report the failure and keep polling
            self._last_error = f"{type(e).__name__}: {e}"
            return 0
        if not items:
            self._last_update = self._last_update or time.time()
            return 0
        with self.lock:
            for d in items:
                if d.kind == "purge":
                    self._purge(d)
                    continue
                key = (d.run, d.tag, d.kind)
                series = self._series.get(key)
                if series is None:
                    series = self._series[key] = Series(d.run, d.tag, d.kind, d.plugin)
                if isinstance(d.step, np.ndarray):     # scalars arrive as columns (columnar polling)
                    series.extend(d.step.tolist(), d.wall_time.tolist(), d.value.tolist())
                else:
                    series.append(d.step, d.wall_time, d.value)
                while series.thin(self.max_points):
                    pass
            self.version += 1
            self._last_update = time.time()
        return len(items)

    def _purge(self, d):
        tags = None if d.value is None else set(d.value)
        for series in self._series.values():
            if series.run == d.run and (tags is None or series.tag in tags):
                series.purge_from(d.step)

    # ------------------------------------------------------------------------------------------------- reading
    def series(self, kind=None) -> list[Series]:
        """Series of one kind (all kinds for ``None``), sorted by run then tag."""
        with self.lock:
            found = [s for s in self._series.values() if kind is None or s.kind == kind]
        return sorted(found, key=lambda s: (s.run, s.tag or ""))

    def runs(self) -> list[str]:
        with self.lock:
            return sorted({s.run for s in self._series.values()})

    def read(self, series: Series, seen_epoch=None, seen_length=0) -> Delta:
        """Items of ``series`` a session has not seen, given what it saw (``None`` epoch: nothing yet)."""
        with self.lock:
            reset = seen_epoch != series.epoch
            start = 0 if reset else seen_length
            return Delta(series, series.epoch, reset, series.steps[start:], series.wall_times[start:],
                         series.values[start:])

    def status(self) -> dict:
        stats = self._tail_stats
        exists = os.path.isdir(self.logdir)
        return {
            "logdir": self.logdir,
            "exists": exists,
            "runs": stats["runs"],
            "files": stats["files"],
            "records_read": stats["records_read"],
            "records_skipped": stats["records_skipped"],
            "errors": stats["errors"],
            "last_update": self._last_update,
            "store_error": self._last_error,
            "series": len(self._series),
        }
