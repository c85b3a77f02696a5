"""The dashboard's one shared store, the cache of the logdir's ``LogdirProvider``: every event file is tailed once,
here, every run asset (projector configs, structure graphs) is read once per change, here, and every browser session
reads from it; no view opens a file.

A background thread polls the provider every ``reload_interval`` seconds (less often when a poll takes long, so
that polling uses at most ``POLL_SHARE`` of a core) and appends what arrived to ``Series``,
one per ``(run, tag, kind)``. What a series keeps, so that memory stays bounded without losing what matters:

- **scalars**: every point, as NumPy columns (``steps`` int64, ``wall_times`` and ``values`` float64) that grow by
  doubling and are handed to sessions as zero-copy slices. Past ``max_points`` a series is downsampled once to half
  of it by ``flowlab.summary.thinning.downsample`` over its whole step range (each bucket's first, last, min and max
  point and its first NaN/+Inf/-Inf), so coverage stays even and no spike or NaN is ever dropped.
- **health** (``flow.watch_health`` reports, ``SummaryWriter.add_health``): every report folded at ingestion into
  the series' ``grid``, a ``flowlab.summary.thinning.HealthGrid`` (a fixed number of step buckets keeping each cell's
  min, max, sum and NaN/Inf counts: a whole run, with no spike or NaN hidden), plus a bounded sample of the reports
  themselves (decoded matrices) as for the kinds below. A record that does not decode (``health_log.decode``) is
  counted in ``status()["health_skipped"]`` and left out. A restart purge rebuilds the grid from the kept sample.
- **other kinds** (histograms, images, text, tensors, ...): a bounded sample, ``samples[kind]`` per series (as
  TensorBoard's ``--samples_per_plugin``), ``flowlab.summary.thinning.EvenSample``: every ``stride``-th item, the
  stride doubling when the sample overflows (an even spread over the whole run), plus the newest item of every poll,
  so the latest value is always there (those extras have a budget of ``samples[kind]`` more before they are
  dropped).

A series only grows, except when a restart purge drops its tail, a file read again from its start (truncated,
rewritten or replaced under the tailer: a ``reread`` item) drops the steps it had given (they come back merged in
step order, with the values the file holds now), or a downsampling/thinning replaces it; each bumps its ``epoch`` (a
health series' grid changes with each new report: sessions follow it by its ``last_step``, and redraw it whole after
an epoch change). A session remembers ``(epoch, length)`` per series it shows, so ``Store.read`` hands it only the new
items, or everything, flagged ``reset``, after an epoch change: views stream deltas and never resend a whole series
per poll.

Runs: a run is a directory of event files, except tensorboardX's ``add_hparams`` sub-folders: each call writes a
folder ``<run>/<time>`` (or ``<run>/<name>``) holding the experiment, the session's hparams and its metrics as
scalars. Its user means them as that run's hparams and final metrics, so such a folder (``_fold_target``: first an
experiment, below a run that logged training data) is no run of its own here: its items go to the parent run, which
then is one HParams session with its metrics, and the folder takes no row nor colour in the run list.

Run assets: after each poll the store reads again the projector configs and structure graphs whose files changed
(``LogdirProvider.projector_signatures`` / ``structure_signatures``), keeping per run the last good read (``Asset``)
and the error of a read that failed (retried after ``ASSET_RETRY`` seconds: a projector being written). Each change
bumps ``version``, so views follow assets as they follow series (``projectors()``, ``structure_graph(run)``, and the
sprites' bytes with ``sprite(run, embedding)``).

Thread safety: the poll thread changes series under ``lock``; readers take it only to slice (scalar columns are
never written in place below their length, so a slice taken stays valid after the lock is released).
"""
from __future__ import annotations

import posixpath
import threading
import time
from typing import Any, NamedTuple

import numpy as np

from flowlab.summary import health_log
from flowlab.summary.redact import redact
from flowlab.summary.provider import LogdirProvider
from flowlab.summary.thinning import EvenSample, HealthGrid, downsample

# Kinds the store keeps (graph/hparams/text/images are few per run; scalars and histograms are the bulk).
KEPT = ("scalar", "histogram", "image", "audio", "text", "tensor", "hparams", "graph", "health")

# Items kept per series and kind (TensorBoard keeps 10 images, 10 audio clips, 500 histograms, 10 tensors per series;
# text is a tensor plugin that asks for 100). Graphs and hparams: a few per run, all kept. Health reports: their grid
# keeps the whole run; the sample is what a restart purge rebuilds it from.
DEFAULT_SAMPLES = {"histogram": 500, "image": 10, "audio": 10, "text": 100, "tensor": 10, "graph": 10, "hparams": 100,
                   "health": 200}
MAX_POINTS = 4_000_000          # exact scalar points per series before it is downsampled (96 MB at 24 B a point)
# step buckets of a run's health reports: the columns of its Health-tab heatmap, a third of the page wide (~2 px
# each; more only cost the page drawing time), and the points of its trends; extremes and NaN/Inf survive merging
HEALTH_BUCKETS = 200
RELOAD_INTERVAL = 0.25          # seconds between polls of a logdir that is quick to poll
POLL_SHARE = 0.2                # ...and at most this share of a core on one that is not (1,000 runs: ~0.1 s a poll)
POLL_BYTES = 1 << 20            # bytes decoded and stored at a time (bounds a big logdir's first poll)
ASSET_RETRY = 5.0               # seconds before an unchanged run asset whose read failed is read again


def parse_samples(text):
    """``"images=20,histograms=100"`` (TensorBoard's ``--samples_per_plugin`` form) -> ``{"image": 20, ...}``; plugin
    names or kinds, singular or plural. Raises ValueError naming what is wrong."""
    aliases = {k: k for k in DEFAULT_SAMPLES} | {k + "s": k for k in DEFAULT_SAMPLES} | {
        "images": "image", "distributions": "histogram", "graphs": "graph", "tensors": "tensor"}
    out = {}
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        name, sep, count = part.partition("=")
        kind = aliases.get(name.strip().lower())
        if not sep or kind is None:
            raise ValueError(f"--samples-per-plugin: expected KIND=N with KIND one of "
                             f"{', '.join(sorted(DEFAULT_SAMPLES))}, got {part!r}")
        try:
            n = int(count)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"--samples-per-plugin: {name.strip()} needs a whole number of at least 1, got {count!r}")
        out[kind] = n
    return out


class _Columns:
    """Append-only step/wall/value columns with amortised doubling (``Series.slice`` hands out views of them)."""

    __slots__ = ("steps", "walls", "values", "n")

    def __init__(self, capacity=16):
        self.steps = np.empty(capacity, np.int64)
        self.walls = np.empty(capacity, np.float64)
        self.values = np.empty(capacity, np.float64)
        self.n = 0

    def extend(self, steps, walls, values):
        k = len(steps)
        if self.n + k > len(self.steps):
            size = max(2 * len(self.steps), self.n + k)
            for name in ("steps", "walls", "values"):
                old = getattr(self, name)
                new = np.empty(size, old.dtype)
                new[:self.n] = old[:self.n]
                setattr(self, name, new)
        self.steps[self.n:self.n + k] = steps
        self.walls[self.n:self.n + k] = walls
        self.values[self.n:self.n + k] = values
        self.n += k

    def keep(self, index):
        """Replace the columns by the rows ``index`` (new arrays: slices handed out earlier stay as they were)."""
        steps, walls, values = self.steps[:self.n][index], self.walls[:self.n][index], self.values[:self.n][index]
        self.steps, self.walls, self.values, self.n = steps, walls, values, len(index)


class Series:
    """One ``(run, tag, kind)`` stream of ``(step, wall_time, value)`` items (see the module doc for what is kept).

    ``steps``, ``wall_times``, ``values``: NumPy arrays for scalars, lists otherwise (snapshots; sessions follow a
    series with ``Store.read``). ``grid``: a health series' ``HealthGrid`` (None for other kinds, and before a
    health series' first report); read it under the store's ``lock``."""

    __slots__ = ("run", "tag", "kind", "plugin", "epoch", "limit", "_columns", "_sample", "grid", "_merge")

    def __init__(self, run, tag, kind, plugin="", limit=MAX_POINTS):
        self.run, self.tag, self.kind, self.plugin = run, tag, kind, plugin
        self.epoch = 0
        self.limit = limit                  # scalars: points before downsampling; other kinds: items kept
        self._columns = _Columns() if kind == "scalar" else None
        self._sample = EvenSample(limit) if kind != "scalar" else None    # other kinds: (index, step, wall, value)
        self.grid = None
        self._merge = False                 # scalars: a file was read again; its steps go back in step order

    @property
    def key(self):
        return self.run, self.tag, self.kind

    @property
    def offered(self):
        """Items this series has been given, kept or not (other kinds than scalars keep an even sample of them)."""
        return self._sample.offered if self._sample is not None else len(self)

    def __len__(self):
        return self._columns.n if self._columns is not None else len(self._sample)

    def slice(self, start=0):
        """``(steps, wall_times, values)`` from item ``start`` on."""
        if self._columns is not None:
            c = self._columns
            return c.steps[start:c.n], c.walls[start:c.n], c.values[start:c.n]
        items = self._sample.items[start:]
        return [i[1] for i in items], [i[2] for i in items], [i[3] for i in items]

    @property
    def steps(self):
        return self.slice()[0]

    @property
    def wall_times(self):
        return self.slice()[1]

    @property
    def values(self):
        return self.slice()[2]

    # -- growing (poll thread, under the store's lock) -------------------------------------------------------------
    def extend(self, steps, wall_times, values):
        """Scalars: append columns; past ``limit`` points, downsample the whole series to half of it."""
        c = self._columns
        merge = self._merge and c.n and len(steps) and steps[0] < c.steps[c.n - 1]
        c.extend(steps, wall_times, values)
        if merge:                           # a re-read file's steps: back in step order, not after the others'
            c.keep(np.argsort(c.steps[:c.n], kind="stable"))
            self.epoch += 1
        if c.n > self.limit:
            c.keep(downsample(c.steps[:c.n], c.values[:c.n], self.limit // 2))
            self.epoch += 1

    def add(self, step, wall_time, value):
        """One item of a kind other than scalars, sampled (see the module doc)."""
        if self._sample.add(step, wall_time, value):
            self.epoch += 1

    def end_poll(self):
        """Keep this poll's newest item even when it fell between strides: the latest value is always shown. True
        when it was kept here."""
        kept, thinned = self._sample.end_poll()
        if thinned:
            self.epoch += 1
        return kept

    def purge_from(self, step):
        """Drop items with step >= ``step`` (a restarted run re-logs them)."""
        return self.drop_steps(step, None)

    def drop_steps(self, first, last=None):
        """Drop items with ``first <= step <= last`` (``last`` None: no upper bound); True when any went. A bounded
        drop is a file read again: its steps, when they come back, are merged in step order."""
        if self._columns is not None:
            c = self._columns
            self._merge |= last is not None
            steps = c.steps[:c.n]
            keep = np.flatnonzero((steps < first) | (steps > last) if last is not None else steps < first)
            if len(keep) == c.n:
                return False
            c.keep(keep)
        elif not self._sample.drop_steps(first, last):
            return False
        self.epoch += 1
        return True


class Delta(NamedTuple):
    """What a session has not seen of one series: ``reset`` means replace, else append. Scalars come as NumPy
    arrays (read-only views of the store's columns), other kinds as lists."""
    series: Series
    epoch: int
    reset: bool
    steps: Any
    wall_times: Any
    values: Any


class Asset(NamedTuple):
    """A run asset as the store last read it: ``value`` (None before a first good read) and ``version``, the
    signature of the file it was read from; ``error`` says why the latest read failed (None when it did not), the
    value then being the previous one. ``tried`` and ``retry_at``: the signature last read, and when a failed read
    of an unchanged file is tried again."""
    version: Any
    value: Any
    error: str | None = None
    tried: Any = None
    retry_at: float = 0.0


class Store:
    """The shared store over ``logdir`` (a path or an fsspec URL, ``storage_options`` going to its filesystem).
    ``samples``: items kept per series of each kind (``DEFAULT_SAMPLES`` for the others); ``max_points``: exact
    scalar points per series."""

    def __init__(self, logdir, reload_interval=RELOAD_INTERVAL, max_points=MAX_POINTS, samples=None,
                 storage_options=None):
        if not reload_interval > 0:
            raise ValueError(f"reload_interval must be a positive number of seconds, got {reload_interval!r}")
        if not isinstance(max_points, int) or max_points < 100:
            raise ValueError(f"max_points must be an int of at least 100, got {max_points!r}")
        samples = dict(samples or {})
        for kind, n in samples.items():
            if kind not in DEFAULT_SAMPLES or not isinstance(n, int) or n < 1:
                raise ValueError(f"samples: expected {{kind: n >= 1}} with kind one of {sorted(DEFAULT_SAMPLES)}, "
                                 f"got {kind!r}: {n!r}")
        self.samples = DEFAULT_SAMPLES | samples
        self.reload_interval = float(reload_interval)
        self.max_points = max_points
        self.lock = threading.Lock()
        self.version = 0                       # bumps on every change: sessions skip work when it has not moved
        self._series: dict[tuple, Series] = {}
        self._sorted: dict[str | None, list[Series]] = {}    # kind -> series sorted by (run, tag), rebuilt on change
        self._runs: list[str] = []
        self._unindexed = False                 # series were added since ``_index`` last sorted them
        self._provider = LogdirProvider(logdir, storage_options)
        self.logdir = self._provider.logdir     # absolute path, or the URL as normalised
        self._last_update = None
        self._last_error = None
        self._tail_stats = self._provider.stats()   # refreshed by the poll thread: readers never touch the provider
        self._projectors: dict[str, Asset] = {}     # run -> its projector config's embeddings ([Embedding])
        self._structures: dict[str, Asset] = {}     # run -> its structure graph's jobs ([dict])
        self._health_layouts: dict[bytes, tuple] = {}     # a health tag's metadata content -> (layers, statistics)
        self._health_skipped = 0
        self._exists = False
        self._folds: dict[str, str] = {}        # run -> where its items go: itself, or an add_hparams folder's parent
        self._training_runs: set[str] = set()   # runs that gave items other than hparams (a parent folds need)
        self._fed: dict[str, set] = {}          # folded add_hparams folder -> the tags it gave its parent
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
        wait = self.reload_interval
        while not self._stop.wait(wait):
            start = time.perf_counter()
            self.poll()
            wait = max(self.reload_interval, (time.perf_counter() - start) * (1 - POLL_SHARE) / POLL_SHARE)

    def poll(self) -> int:
        """Read what the logdir gained; returns the number of items stored. Never raises for bad logs.

        Reads ``POLL_BYTES`` at a time and stores (samples) each batch before reading the next, so a big logdir's
        first poll never holds much more than that in decoded items (all 100,000 histograms of a logdir at once
        were twice the store's own size)."""
        stored, touched = 0, set()
        try:
            while True:
                items = self._provider.poll(kinds=KEPT, max_bytes=POLL_BYTES)
                stored += self._store(items, touched)
                if not self._provider.more or self._stop.is_set():
                    break
            self._tail_stats = self._provider.stats()
            self._exists = self._provider.exists()      # (a request on a remote logdir: once a poll)
            self._refresh_assets()
            self._last_error = None
        except Exception as e:  # a store that dies stops the dashboard: report the failure and keep polling
            self._last_error = f"{type(e).__name__}: {e}"
        with self.lock:
            if self._unindexed:             # new series: sorted once a poll (10,000 runs came in 41 batches)
                self._index()
                self._unindexed = False
                self.version += 1
            kept = False
            for series in touched:          # after every batch: one newest item per series and poll
                if series.kind != "scalar":
                    kept |= series.end_poll()
            if kept:
                self.version += 1           # else a view would not see a finished run's last item
        return stored

    def _store(self, items, touched) -> int:
        if not items:
            self._last_update = self._last_update or time.time()
            return 0
        with self.lock:
            added = False
            chunks: dict[Series, list] = {}            # scalars of this poll, per series, until a purge
            reports: dict[Series, list] = {}           # health reports of this poll, per series, until a purge
            for d in items:
                run = self._folds.get(d.run) or self._fold_target(d)
                folded = run != d.run
                if folded:
                    d = self._folded(d, run)
                if d.kind in ("purge", "reread"):
                    self._flush(chunks)
                    self._fold(reports)
                    if d.kind == "purge":
                        self._purge(d)
                    else:
                        self._reread(d)
                    continue
                if d.kind == "health":
                    layout = self._health_layout(d)
                    if layout is None:
                        self._health_skipped += 1
                        continue
                if d.kind != "hparams":
                    self._training_runs.add(d.run)
                key = (d.run, d.tag, d.kind)
                series = self._series.get(key)
                if series is None:
                    limit = self.max_points if d.kind == "scalar" else self.samples[d.kind]
                    series = self._series[key] = Series(d.run, d.tag, d.kind, d.plugin, limit)
                    added = True
                if folded and d.kind == "scalar":
                    series._merge = True    # a folder's metrics (step 0, say) go in step order among the run's own
                if d.kind == "scalar":      # columns, or single values (records the column decoder passes over)
                    chunks.setdefault(series, []).append((np.atleast_1d(d.step), np.atleast_1d(d.wall_time),
                                                          np.atleast_1d(d.value)))
                else:
                    if d.kind == "health":
                        if series.grid is None:
                            series.grid = HealthGrid(*layout, HEALTH_BUCKETS)
                        elif (series.grid.layers, series.grid.statistics) != layout:   # (a tag keeps its first)
                            self._health_skipped += 1
                            continue
                        reports.setdefault(series, []).append((int(d.step), d.value))
                    series.add(d.step, d.wall_time, d.value)
                touched.add(series)
            self._flush(chunks)
            self._fold(reports)
            if added:               # indexed once the poll's batches are stored (``poll``), not after each
                self._unindexed = True
            self.version += 1
            self._last_update = time.time()
        return len(items)

    def _fold_target(self, d):
        """The run the items of ``d.run``, seen for the first time, go to: the parent run when ``d.run`` is a
        tensorboardX ``add_hparams`` folder (see the module doc), else ``d.run`` itself. Such a folder begins with
        the experiment; TensorFlow's hparams sessions (``<experiment>/<session>``) begin with their own hparams and
        their parent holds only the experiment, so they stay runs, as TensorBoard shows them."""
        parent = None if d.run == "." else posixpath.dirname(d.run) or "."
        folds = (d.kind == "hparams" and parent in self._training_runs and isinstance(d.value, dict)
                 and "experiment" in d.value)
        target = self._folds[d.run] = parent if folds else d.run
        return target

    def _folded(self, d, run):
        """``d`` of an add_hparams folder as an item of its parent ``run``; a purge of the whole folder drops only
        what the folder gave."""
        if d.kind == "purge" and d.value is None:
            return d._replace(run=run, value=tuple(self._fed.get(d.run, ())))
        if d.tag is not None:
            self._fed.setdefault(d.run, set()).add(d.tag)
        return d._replace(run=run)

    def _index(self):
        ordered = sorted(self._series.values(), key=lambda s: (s.run, s.tag or ""))
        by_kind: dict[str | None, list[Series]] = {None: ordered}
        for s in ordered:
            by_kind.setdefault(s.kind, []).append(s)
        self._sorted = by_kind
        self._runs = sorted({s.run for s in ordered})

    @staticmethod
    def _flush(chunks):
        """Append each series' scalars of this poll in step order: the tailer decodes plain scalar records as
        columns and hands the others (a tag's first, metadata-carrying record, ...) one by one, so a poll's items
        of one tag may come out of order."""
        for series, parts in chunks.items():
            steps, walls, values = (np.concatenate(c) for c in zip(*parts))
            if len(parts) > 1 and np.any(steps[1:] < steps[:-1]):
                order = np.argsort(steps, kind="stable")
                steps, walls, values = steps[order], walls[order], values[order]
            series.extend(steps, walls, values)
        chunks.clear()

    def _health_layout(self, d):
        """``(layers, statistics)`` of a health record, or None when it does not decode (``health_log.decode``,
        run once per tag layout: a record of a known one only has its shape checked)."""
        layout = self._health_layouts.get(d.plugin_content)
        if layout is None:
            try:
                record = health_log.decode(d.value, d.plugin_content)
            except ValueError:
                return None
            layout = self._health_layouts[d.plugin_content] = (record.layers, record.statistics)
        return layout if np.shape(d.value) == (len(layout[0]), len(layout[1])) else None

    @staticmethod
    def _fold(reports):
        """Fold each health series' reports of this poll into its grid, as one block in step order."""
        for series, rows in reports.items():
            rows.sort(key=lambda row: row[0])
            series.grid.extend([step for step, _ in rows], np.stack([matrix for _, matrix in rows]))
        reports.clear()

    def _purge(self, d):
        tags = None if d.value is None else set(d.value)
        for series in self._series.values():
            if series.run == d.run and (tags is None or series.tag in tags):
                self._drop(series, d.step, None)

    def _reread(self, d):
        """A file the tailer reads again from its start (truncated, rewritten, replaced): drop the steps it had given,
        tag by tag, so that each step shows once, with the value the file holds now."""
        spans = d.value["spans"]
        for series in self._series.values():
            span = spans.get(series.tag) if series.run == d.run else None
            if span is not None:
                self._drop(series, *span)

    @staticmethod
    def _drop(series, first, last):
        """Drop ``series``' items with ``first <= step <= last`` (``last`` None: every later step too)."""
        purged = series.drop_steps(first, last)
        grid = series.grid
        if grid is not None and grid.last_step is not None and grid.last_step >= first:
            # the grid cannot drop steps: make it again from the reports kept
            series.grid = HealthGrid(grid.layers, grid.statistics, grid.buckets.max_buckets)
            steps, _, matrices = series.slice()
            if steps:
                order = np.argsort(steps, kind="stable")
                series.grid.extend(np.asarray(steps)[order], np.stack(matrices)[order])
            if not purged:
                series.epoch += 1

    def _refresh_assets(self):
        """Read again the run assets whose files changed (or whose failed read is due again); drop those gone."""
        provider = self._provider
        changed = False
        for name, signatures, read in (("_projectors", provider.projector_signatures(), provider.read_projector),
                                       ("_structures", provider.structure_signatures(), provider.read_structure_graph)):
            assets = dict(getattr(self, name))
            now = time.monotonic()
            for run in set(assets) - set(signatures):
                del assets[run]
                changed = True
            for run, signature in signatures.items():
                old = assets.get(run)
                if old is not None and old.tried == signature and (old.error is None or now < old.retry_at):
                    continue
                try:
                    assets[run] = Asset(signature, read(run), tried=signature)
                except Exception as e:      # noqa: BLE001 - a half-written or hostile asset: keep what we had, say why
                    assets[run] = Asset(old.version if old else None, old.value if old else None,
                                        redact(f"{type(e).__name__}: {e}"), signature, now + ASSET_RETRY)
                changed = True
            setattr(self, name, assets)     # replaced whole: readers never see a half-updated table
        if changed:
            with self.lock:
                self.version += 1

    # ------------------------------------------------------------------------------------------------- reading
    def projectors(self) -> dict[str, Asset]:
        """{run: ``Asset``} of every run directory holding a projector config: ``value`` its embeddings
        (``projector.Embedding``, exception samples among them), None when it could not be read yet."""
        return self._projectors

    def structure_graph(self, run) -> tuple[Any, list]:
        """``(version, jobs)`` of ``run``'s structure_graph.json: ``(None, [])`` when it has none."""
        asset = self._structures.get(run)
        return (asset.version, asset.value) if asset is not None and asset.value is not None else (None, [])

    def sprite(self, run, embedding) -> bytes | None:
        """The bytes of an embedding's sprite image (size-capped), None when it has none. Raises ``OSError`` or
        ``ValueError`` (``UnsafePath``) for one that cannot be read."""
        return self._provider.read_sprite(run, embedding)

    def series(self, kind=None) -> list[Series]:
        """Series of one kind (all kinds for ``None``), sorted by run then tag (a shared list: do not change it)."""
        return self._sorted.get(kind, [])

    def runs(self) -> list[str]:
        return self._runs

    def read(self, series: Series, seen_epoch=None, seen_length=0) -> Delta:
        """Items of ``series`` a session has not seen, given what it saw (``None`` epoch: nothing yet)."""
        with self.lock:
            reset = seen_epoch != series.epoch
            return Delta(series, series.epoch, reset, *series.slice(0 if reset else seen_length))

    def status(self) -> dict:
        stats = self._tail_stats
        return {
            "logdir": redact(self.logdir),              # shown in every page: no URL credentials
            "exists": self._exists,
            "runs": stats["runs"],
            "files": stats["files"],
            "records_read": stats["records_read"],
            "records_skipped": stats["records_skipped"],
            "errors": stats["errors"],
            "last_update": self._last_update,
            "store_error": None if self._last_error is None else redact(self._last_error),
            "series": len(self._series),
            "health_skipped": self._health_skipped,
            # files that changed under the tailer (``LogdirTailer.stats``): read again, or followed to a new name
            "rereads": stats.get("resets", 0),
            "files_followed": stats.get("followed", 0),
            "file_changes": stats.get("changes", []),
        }
