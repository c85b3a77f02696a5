"""The one reader of a logdir, in the sense of TensorBoard's ``DataProvider``: everything flowlab shows of a logdir
(the dashboard's store, and through it every view) is read here, the same way for a local path and an fsspec URL
(``s3://bucket/prefix`` through s3fs, ``gs://``, ``memory://``...).

``LogdirProvider(logdir)`` offers
- the event data as it grows: ``poll()`` gives the items (``decode.Datum``, scalars as NumPy columns) completed since
  the last call (``tailer.LogdirTailer``), with ``more``, ``stats()`` and ``exists()``; the dashboard's store polls
  this and keeps what it needs (it is the provider's cache);
- the run assets that are not event files, found by the same listing (no walk of their own): projector configs
  (``projector_signatures``, ``read_projector``, a sprite's bytes with ``read_sprite``) and flowlab's structure
  graphs (``structure_signatures``, ``read_structure_graph``). A signature changes when its file does, so a cache
  reads a file again only then;
- one-shot queries over the whole logdir as TensorBoard's ``DataProvider`` names them: ``list_runs``,
  ``list_scalars`` / ``read_scalars`` (downsampled by ``thinning.downsample``: no spike or NaN dropped),
  ``list_tensors`` / ``read_tensors`` (histograms, text and other tensors) and ``list_blob_sequences`` /
  ``read_blob_sequences`` (images and audio), each sequence an even sample keeping its last item. These read the
  logdir afresh (``reader``), apart from the incremental feed.
"""
from __future__ import annotations

import json
from typing import Any, NamedTuple

import numpy as np

from . import reader
from .oneflow_api import STRUCTURE_GRAPH_FILE
from .projector import CONFIG_FILE, MAX_SPRITE_BYTES, Embedding
from .projector import read_projector as _read_projector
from .tailer import LogdirTailer
from .thinning import downsample as _downsample

MAX_STRUCTURE_BYTES = 64 << 20      # a structure graph larger than this is not read (ResNet-50's is ~0.5 MB)
ASSET_NAMES = (CONFIG_FILE, STRUCTURE_GRAPH_FILE)
TENSOR_KINDS = ("histogram", "text", "tensor")      # what ``read_tensors`` gives; blob sequences: images and audio
BLOB_KINDS = ("image", "audio")
RUN_KINDS = ("scalar", *TENSOR_KINDS, *BLOB_KINDS, "hparams", "graph", "health")


class TimeSeries(NamedTuple):
    """What ``list_*`` says of one (run, tag): its kind and plugin, how many items, and the last one's step and
    wall time (TensorBoard's ``ScalarTimeSeries`` / ``TensorTimeSeries`` / ``BlobSequenceTimeSeries``)."""
    kind: str
    plugin: str
    plugin_content: bytes
    count: int
    max_step: int
    max_wall_time: float


class Sequence(NamedTuple):
    """One (run, tag) as ``read_tensors`` / ``read_blob_sequences`` give it: steps, wall times and values (buckets
    [k, 3] for histograms, str or arrays of str for text, arrays for tensors, ``decode.Image`` for images, lists of
    encoded clips for audio)."""
    kind: str
    step: np.ndarray
    wall_time: np.ndarray
    values: list


class LogdirProvider:
    """The reader of ``logdir`` (a local path or an fsspec URL; ``storage_options`` go to its filesystem). See the
    module docstring. ``logdir`` is the absolute local path or the normalised URL."""

    def __init__(self, logdir, storage_options=None):
        self._tailer = LogdirTailer(logdir, storage_options, asset_names=ASSET_NAMES)
        self._storage_options = storage_options
        self.logdir = self._tailer.logdir

    # ------------------------------------------------------------------------------------------ the event data
    def exists(self) -> bool:
        """Whether the logdir is there now; never raises (an unreachable remote logdir is absent)."""
        return self._tailer.exists()

    def poll(self, kinds=None, max_bytes=None) -> list:
        """Items completed since the last poll (``LogdirTailer.poll`` with columnar scalars): of ``kinds`` only
        when given; about ``max_bytes`` read at most, ``more`` then saying whether bytes are left."""
        return self._tailer.poll(kinds=kinds, columnar=True, max_bytes=max_bytes)

    @property
    def more(self) -> bool:
        return self._tailer.more

    def stats(self) -> dict:
        """The reading's counters and errors (``LogdirTailer.stats``)."""
        return self._tailer.stats()

    # ------------------------------------------------------------------------------------------ run assets
    def _signatures(self, name) -> dict[str, Any]:
        files = self._tailer.files
        found = {run: files.signature(asset) for run, asset in self._tailer.assets(name).items()}
        return {run: signature for run, signature in found.items() if signature is not None}

    def projector_signatures(self) -> dict[str, Any]:
        """{run: signature} of the runs (directories, ``"."`` the logdir) holding a projector config at the last
        poll (``Projector(logdir)`` need not write event files, so these need not be event-file runs)."""
        return self._signatures(CONFIG_FILE)

    def structure_signatures(self) -> dict[str, Any]:
        """{run: signature} of the runs holding flowlab's ``structure_graph.json`` at the last poll."""
        return self._signatures(STRUCTURE_GRAPH_FILE)

    def read_projector(self, run) -> list[Embedding]:
        """The embeddings of ``run``'s projector config (``projector.read_projector``: paths confined to the run
        directory, sizes capped; raises ``UnsafePath``, ``ValueError`` or ``OSError`` for a bad or half-written
        projector)."""
        directory = self._tailer.files.directory(run)
        return _read_projector(directory.name, directory)

    def read_sprite(self, run, embedding: Embedding) -> bytes | None:
        """The bytes of ``embedding``'s sprite image (size-capped), None when it has none or it is gone."""
        if not embedding.sprite:
            return None
        try:
            return self._tailer.files.directory(run).read_located(embedding.sprite, "sprite", MAX_SPRITE_BYTES)
        except FileNotFoundError:
            return None

    def read_structure_graph(self, run) -> list[dict]:
        """The jobs (dicts) of ``run``'s structure_graph.json; [] when it is gone or is no structure graph (it is
        written atomically, so only a foreign file fails to parse)."""
        try:
            data = self._tailer.files.directory(run).read(STRUCTURE_GRAPH_FILE, "structure graph", MAX_STRUCTURE_BYTES)
            jobs = json.loads(data.decode("utf-8")).get("jobs", [])
        except (OSError, ValueError, AttributeError):
            return []
        return [job for job in jobs if isinstance(job, dict)] if isinstance(jobs, list) else []

    # ------------------------------------------------------------------------------------------ one-shot queries
    def _objects(self, kinds):
        """{run: {tag: (kind, step, wall_time, values, first Datum)}} of the given non-scalar kinds (one read)."""
        return {run: {tag: (first.kind, step, wall, values, first) for tag, (step, wall, values, first) in tags.items()}
                for run, tags in reader.read_kinds(self.logdir, kinds, self._storage_options).items()}

    def list_runs(self) -> list[str]:
        """Every run with data of a kind the dashboard shows, in name order."""
        return sorted(reader.read_kinds(self.logdir, RUN_KINDS, self._storage_options))

    def list_scalars(self) -> dict[str, dict[str, TimeSeries]]:
        return {run: {tag: TimeSeries("scalar", "scalars", b"", len(s.step), int(s.step.max()),
                                      float(s.wall_time.max())) for tag, s in tags.items() if len(s.step)}
                for run, tags in reader.read_scalars(self.logdir, self._storage_options).items()}

    def read_scalars(self, downsample=1000) -> dict[str, dict[str, reader.ScalarSeries]]:
        """Every scalar series in step order, each downsampled to about ``downsample`` points that draw like all of
        them (``thinning.downsample``: each step bucket's first, last, extremes and NaN/Inf kept)."""
        _check_downsample(downsample, 4)
        out = {}
        for run, tags in reader.read_scalars(self.logdir, self._storage_options).items():
            for tag, s in tags.items():
                keep = _downsample(s.step, s.value, downsample)
                out.setdefault(run, {})[tag] = reader.ScalarSeries(s.step[keep], s.wall_time[keep], s.value[keep])
        return out

    def _list(self, kinds):
        return {run: {tag: TimeSeries(kind, first.plugin, first.plugin_content, len(step), int(step.max()),
                                      float(wall.max())) for tag, (kind, step, wall, _, first) in tags.items()
                      if len(step)}
                for run, tags in self._objects(kinds).items()}

    def _read(self, kinds, downsample):
        _check_downsample(downsample, 1)
        out = {}
        for run, tags in self._objects(kinds).items():
            for tag, (kind, step, wall, values, _) in tags.items():
                keep = _even(len(step), downsample)
                out.setdefault(run, {})[tag] = Sequence(kind, step[keep], wall[keep], [values[i] for i in keep])
        return out

    def list_tensors(self) -> dict[str, dict[str, TimeSeries]]:
        return self._list(TENSOR_KINDS)

    def read_tensors(self, downsample=100) -> dict[str, dict[str, Sequence]]:
        """Histograms, text and other tensors: at most ``downsample`` items per (run, tag), evenly spread, the last
        always among them."""
        return self._read(TENSOR_KINDS, downsample)

    def list_blob_sequences(self) -> dict[str, dict[str, TimeSeries]]:
        return self._list(BLOB_KINDS)

    def read_blob_sequences(self, downsample=10) -> dict[str, dict[str, Sequence]]:
        """Images (``decode.Image``: width, height, encoded images) and audio (encoded clips): at most
        ``downsample`` steps per (run, tag), evenly spread, the last always among them."""
        return self._read(BLOB_KINDS, downsample)

    def __repr__(self):
        return f"LogdirProvider({self.logdir!r})"


def _check_downsample(n, least):
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < least:
        raise ValueError(f"downsample must be an int of at least {least}, got {n!r}")


def _even(n, budget) -> np.ndarray:
    """Indices of at most ``budget`` of ``n`` items, evenly spread, the first and the last among them."""
    if n <= budget:
        return np.arange(n)
    if budget == 1:
        return np.array([n - 1])
    return np.unique(np.linspace(0, n - 1, budget).round().astype(np.int64))
