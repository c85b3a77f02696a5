"""Reading TensorBoard logdirs: one-shot readers built on the incremental :class:`LogdirTailer`.

Each ``read_*`` function reads a fresh tailer to the end (polling again while a file of junk has damage left past
one poll's budget), asking it only for the kinds it returns (so
``read_scalars`` never builds a protobuf message for a plain scalar record, and receives scalars as NumPy columns),
applies the tailer's purge items in order, as TensorBoard's ``EventAccumulator`` would have dropped that data, and
returns ``{run: {tag: series}}`` with each series stably sorted by step.

``logdir`` is a local path or any fsspec URL (``s3://bucket/prefix``...); ``storage_options`` go to its filesystem.

The live dashboard reads through ``provider.LogdirProvider`` (the tailer's feed, and the run assets); ``Datum`` and
``Image`` are re-exported.
"""
from __future__ import annotations

import posixpath
from itertools import chain
from typing import NamedTuple

import numpy as np

from . import health_log
from .tailer import GRAPH_TAG, KINDS, Datum, Image, LogdirTailer, tensor_to_array

__all__ = ["LogdirTailer", "Datum", "Image", "KINDS", "GRAPH_TAG", "tensor_to_array", "ScalarSeries",
           "HistogramSeries", "Series", "TensorSeries", "read_scalars", "read_histograms", "read_images", "read_text",
           "read_tensors", "read_hparams", "hparams_sessions", "read_graphs", "read_kind", "read_kinds"]


class ScalarSeries(NamedTuple):
    step: np.ndarray        # int64
    wall_time: np.ndarray   # float64
    value: np.ndarray       # float64


class HistogramSeries(NamedTuple):
    step: np.ndarray
    wall_time: np.ndarray
    buckets: list           # float64 arrays [k, 3]: (left, right, count)


class Series(NamedTuple):
    step: np.ndarray
    wall_time: np.ndarray
    values: list            # Image for images, str / array of str for text


class TensorSeries(NamedTuple):
    step: np.ndarray
    wall_time: np.ndarray
    values: list            # NumPy arrays
    plugin: str
    plugin_content: bytes


class _Column:
    """One tag's data while it accumulates: NumPy chunks, plus single items not yet made into a chunk."""
    __slots__ = ("chunks", "steps", "walls", "values", "first")

    def __init__(self, first: Datum):
        self.chunks, self.steps, self.walls, self.values, self.first = [], [], [], [], first

    def add(self, d: Datum):
        if isinstance(d.step, np.ndarray):
            self._flush()
            self.chunks.append((d.step, d.wall_time, d.value))
        else:
            self.steps.append(d.step)
            self.walls.append(d.wall_time)
            self.values.append(d.value)

    def _flush(self):
        if self.steps:
            self.chunks.append((np.array(self.steps, np.int64), np.array(self.walls, np.float64), self.values))
            self.steps, self.walls, self.values = [], [], []

    def purge(self, step, last=None):
        """Drop the items with ``step <= their step <= last`` (``last`` None: every later step)."""
        self._flush()
        self.chunks = [(s[keep], w[keep], v[keep] if isinstance(v, np.ndarray) else [x for x, k in zip(v, keep) if k])
                       for s, w, v in self.chunks
                       for keep in [(s < step) | (s > last) if last is not None else s < step]]

    def columns(self):
        """(step, wall_time, values chunks, order): ``order`` sorts by step stably, None when already sorted."""
        self._flush()
        step = np.concatenate([c[0] for c in self.chunks]) if self.chunks else np.zeros(0, np.int64)
        wall = np.concatenate([c[1] for c in self.chunks]) if self.chunks else np.zeros(0)
        order = np.argsort(step, kind="stable") if len(step) > 1 and (np.diff(step) < 0).any() else None
        return step.astype(np.int64), wall.astype(np.float64), [c[2] for c in self.chunks], order


def _items(logdir, kinds, storage_options):
    tailer = LogdirTailer(logdir, storage_options)
    yield from tailer.poll(kinds=kinds, columnar=True)
    while tailer.stats()["deferred"]:
        yield from tailer.poll(kinds=kinds, columnar=True)


def _collect(logdir, kinds, storage_options=None) -> dict[str, dict[str, _Column]]:
    runs: dict[str, dict[str, _Column]] = {}
    for d in _items(logdir, kinds, storage_options):
        tags = runs.setdefault(d.run, {})
        if d.kind == "purge":
            for column in (tags.values() if d.value is None else (tags[t] for t in d.value if t in tags)):
                column.purge(d.step)
        elif d.kind == "reread":                # a file changed between two polls is read again: drop what it gave
            for tag, (first, last) in d.value["spans"].items():
                if tag in tags:
                    tags[tag].purge(first, last)
        elif d.tag in tags:
            tags[d.tag].add(d)
        else:
            tags[d.tag] = column = _Column(d)
            column.add(d)
    return runs


def read_kind(logdir, kind, storage_options=None):
    """{run: {tag: (step, wall_time, values list, first Datum)}} for one non-scalar ``kind`` (the items of each tag
    stably sorted by step; the first Datum tells its plugin and kind)."""
    return read_kinds(logdir, {kind}, storage_options)


def read_kinds(logdir, kinds, storage_options=None):
    """``read_kind`` for several kinds in one read of the logdir (a tag has one kind in a run)."""
    out = {}
    for run, tags in _collect(logdir, set(kinds), storage_options).items():
        for tag, column in tags.items():
            step, wall, chunks, order = column.columns()
            values = list(chain.from_iterable(chunks))
            if order is not None:
                step, wall, values = step[order], wall[order], [values[i] for i in order]
            out.setdefault(run, {})[tag] = (step, wall, values, column.first)
    return out


def read_scalars(logdir, storage_options=None) -> dict[str, dict[str, ScalarSeries]]:
    """Every scalar series, checksums verified, plain scalar records decoded column-wise (see ``tailer.py``)."""
    out = {}
    for run, tags in _collect(logdir, {"scalar"}, storage_options).items():
        for tag, column in tags.items():
            step, wall, chunks, order = column.columns()
            value = np.concatenate([np.asarray(c, np.float64) for c in chunks]) if chunks else np.zeros(0)
            if order is not None:
                step, wall, value = step[order], wall[order], value[order]
            out.setdefault(run, {})[tag] = ScalarSeries(step, wall, value)
    return out


def read_histograms(logdir, storage_options=None) -> dict[str, dict[str, HistogramSeries]]:
    """Buckets: float64 [k, 3] arrays of (left, right, count); legacy HistogramProtos converted as TensorBoard does."""
    return {run: {tag: HistogramSeries(*s[:3]) for tag, s in tags.items()}
            for run, tags in read_kind(logdir, "histogram", storage_options).items()}


def read_images(logdir, storage_options=None) -> dict[str, dict[str, Series]]:
    """Values are :class:`Image` (width, height, encoded PNG bytes list)."""
    return {run: {tag: Series(*s[:3]) for tag, s in tags.items()}
            for run, tags in read_kind(logdir, "image", storage_options).items()}


def read_text(logdir, storage_options=None) -> dict[str, dict[str, Series]]:
    """Values are str (rank-0 text tensors) or NumPy arrays of str."""
    return {run: {tag: Series(*s[:3]) for tag, s in tags.items()}
            for run, tags in read_kind(logdir, "text", storage_options).items()}


def read_tensors(logdir, storage_options=None) -> dict[str, dict[str, TensorSeries]]:
    """Tensors whose plugin has no kind of its own (or no plugin), with that plugin's name and content."""
    return {run: {tag: TensorSeries(*s[:3], s[3].plugin, s[3].plugin_content) for tag, s in tags.items()}
            for run, tags in read_kind(logdir, "tensor", storage_options).items()}


def read_health(logdir, storage_options=None) -> dict[str, dict[str, Series]]:
    """``flow.watch_health`` reports written by ``SummaryWriter.add_health``: values are ``health_log.HealthRecord``
    (layers, statistics, matrix); a record that does not fit its tag's layout is left out."""
    out = {}
    for run, tags in read_kind(logdir, "health", storage_options).items():
        for tag, (step, wall, values, first) in tags.items():
            records, keep = [], []
            for i, value in enumerate(values):
                try:
                    records.append(health_log.decode(value, first.plugin_content))
                    keep.append(i)
                except ValueError:
                    continue
            out.setdefault(run, {})[tag] = Series(step[keep], wall[keep], records)
    return out


def read_graphs(logdir, storage_options=None) -> dict[str, list[bytes]]:
    """Serialized GraphDefs of each run, in step order."""
    return {run: tags[GRAPH_TAG][2] for run, tags in read_kind(logdir, "graph", storage_options).items()
            if GRAPH_TAG in tags}


def read_hparams(logdir, storage_options=None) -> dict[str, dict]:
    """{run: {"hparams": {name: float|str|bool}, "metrics": {tag: last value}, "experiment": dict|None,
    "status": str|None}} for every run holding hparams data.

    Metrics are those the experiment lists (the run's own experiment, else the first one found in the logdir): the
    last scalar of each metric tag, in the run itself or in its ``<run>/<group>`` sub-run, as TensorBoard's hparams
    plugin finds them. Without any experiment, every scalar tag of the run counts as a metric.
    """
    data = _collect(logdir, {"hparams", "scalar"}, storage_options)
    plugin = {}                                     # run -> {"experiment": ..., "session_start_info": ...}
    for run, tags in data.items():
        for tag, column in tags.items():
            if column.first.kind == "hparams":
                for chunk in column.columns()[2]:
                    for value in chunk:
                        for key, item in value.items():
                            plugin.setdefault(run, {}).setdefault(key, item)

    def last(run, tag):
        column = data.get(run, {}).get(tag)
        if column is None or column.first.kind != "scalar":
            return None
        step, _, chunks, order = column.columns()
        values = np.concatenate([np.asarray(c, np.float64) for c in chunks])
        return float(values[order[-1] if order is not None else -1]) if len(values) else None

    def scalar_tags(run):
        return [t for t, c in data[run].items() if c.first.kind == "scalar"]

    return hparams_sessions(plugin, scalar_tags, last)


def hparams_sessions(plugin, scalar_tags, last) -> dict[str, dict]:
    """``read_hparams``'s result from data already gathered (the live dashboard gathers it from its store).

    ``plugin``: {run: {"experiment" | "session_start_info" | "session_end_info": dict}}; ``scalar_tags(run)``: the
    run's scalar tags; ``last(run, tag)``: the last value of a scalar tag of a run, or None.
    """
    default = next((p["experiment"] for _, p in sorted(plugin.items()) if "experiment" in p), None)
    out = {}
    for run, p in plugin.items():
        experiment = p.get("experiment", default)
        if experiment is not None:
            names = [(m.get("name", {}).get("group", ""), m.get("name", {}).get("tag", ""))
                     for m in experiment.get("metric_infos", [])]
        else:
            names = [("", t) for t in scalar_tags(run)]
        metrics = {}
        for group, tag in names:
            # TensorBoard's rule: the group's run is normpath(session/group), so the logdir's root run "." has its
            # groups at "validation", not "./validation".
            value = last(posixpath.normpath(posixpath.join(run, group)) if group else run, tag)
            if value is not None:
                metrics[tag] = value
        out[run] = dict(hparams=p.get("session_start_info", {}).get("hparams", {}), metrics=metrics,
                        experiment=experiment, status=p.get("session_end_info", {}).get("status"))
    return out
