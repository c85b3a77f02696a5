"""The host side of an OFRecord reader in a job: records read, shuffled, decoded and transformed a few batches
ahead of the job, on a background thread.

One ``Pipeline`` belongs to one ``flow.data.ofrecord_reader`` call of a traced job. While the job is traced, each
decoder or image op on that reader adds a ``Field``: a function of one record's earlier fields (or of the record
itself) that makes that op's output for the record. The first call of the job starts the producer thread:

    part files -> RecordSource (epochs, shuffle) -> batch_size records
        -> every field of every record (a small thread pool: Pillow and NumPy release the GIL)
        -> fields collated into arrays (or lists of images) -> Batch -> bounded queue (PREFETCH batches)

and every call of the job takes the next ``Batch`` off the queue (``next_batch``, from the reader node's host
arguments) and its field nodes pick their arrays out of it: all outputs of one reader in one call come from the
same records. On several devices one call takes one ``Batch`` of ``batch_size`` records for all of them and each
device's nodes read its ``piece_size`` rows (``batch[rows]``; ``runtime.devices.BatchShares``). An error in the producer (a damaged record, a missing key) is put on the queue in the batch's place
and raised by the job call that needs that batch; the pipeline then stays failed. ``close()`` stops the thread;
``flow.clear_default_session()`` closes the session's pipelines.
"""
from __future__ import annotations

import concurrent.futures
import os
import queue
import threading
import zlib
from typing import Any, Callable, NamedTuple

import numpy as np

from .ofrecord import OFRecordError, iter_file, parse

PREFETCH = 2                    # batches prepared ahead of the job
WORKERS = max(1, min(4, os.cpu_count() or 1))
RECORD = (-1, 0)                # a field input meaning "the record itself"


class Collate(NamedTuple):
    """How a field output's per-record values make the batch value: ``stack`` them into one array of
    ``(batch,) + shape`` and ``dtype``, or keep them as a ``list`` (an object array of variable-size images: OneFlow's
    tensor buffers)."""
    kind: str                   # "stack" | "list"
    shape: tuple = ()
    dtype: Any = None


class Field(NamedTuple):
    """One op's work on one record: ``fn(inputs, rng)`` returns a tuple, one value per ``collates`` entry.
    ``inputs`` are ``(field, output)`` pairs of earlier fields, or ``RECORD``; ``rng`` is a generator of this
    record's own (None unless ``random``)."""
    fn: Callable
    inputs: tuple
    collates: tuple
    what: str                   # the op and key, for messages
    random: bool = False
    seed: int | None = None


class Batch:
    """One call's prepared values: ``values[(field, output)]``. ``batch[rows]`` (a slice) is the batch of those
    records only: one device's piece."""
    __slots__ = ("values", "records")

    def __init__(self, values, records):
        self.values = values
        self.records = records          # [(path, offset)], for tests and messages

    def __len__(self):
        return len(self.records)

    def __getitem__(self, rows: slice) -> Batch:
        return Batch({key: value[rows] for key, value in self.values.items()}, self.records[rows])


class RecordSource:
    """The reader's endless stream of ``(serialized record, path, offset)`` over ``paths``, epoch after epoch
    (OneFlow's readers loop forever).

    ``shuffle_after_epoch``: epoch 0 reads the files in order; each later epoch in a new random order.
    ``random_shuffle``: records pass through a buffer of ``buffer_size`` and leave it in random order. The buffer
    is drained at the end of every epoch, so each epoch yields every record exactly once (OneFlow's buffer spans
    epochs instead)."""

    def __init__(self, paths, random_shuffle=False, buffer_size=1024, shuffle_after_epoch=False, seed=0):
        self.paths = list(paths)
        self.random_shuffle = random_shuffle
        self.buffer_size = max(1, int(buffer_size))
        self.shuffle_after_epoch = shuffle_after_epoch
        self.seed = seed
        self.epoch = 0

    def _file_order(self, epoch):
        if not self.shuffle_after_epoch or epoch == 0:
            return list(self.paths)
        order = np.random.default_rng([self.seed, 1, epoch]).permutation(len(self.paths))
        return [self.paths[i] for i in order]

    def _epoch(self, epoch):
        for path in self._file_order(epoch):
            for data, offset in iter_file(path):
                yield data, path, offset

    def __iter__(self):
        rng = np.random.default_rng([self.seed, 2])
        while True:
            count = 0
            if not self.random_shuffle:
                for item in self._epoch(self.epoch):
                    count += 1
                    yield item
            else:
                buffer = []
                for item in self._epoch(self.epoch):
                    count += 1
                    if len(buffer) < self.buffer_size:
                        buffer.append(item)
                        continue
                    k = int(rng.integers(len(buffer)))
                    buffer[k], item = item, buffer[k]
                    yield item
                for k in rng.permutation(len(buffer)):
                    yield buffer[k]
            if count == 0:
                raise OFRecordError(f"the OFRecord files {', '.join(self.paths)} hold no records")
            self.epoch += 1


class _Failure(NamedTuple):
    error: BaseException


class Pipeline:
    """The background preparation of one reader's batches (see the module docstring)."""

    def __init__(self, name, source: RecordSource, batch_size, seed=0, workers=WORKERS, prefetch=PREFETCH,
                 piece_size=None):
        self.name = name
        self.source = source
        self.batch_size = batch_size    # records a call
        self.piece_size = batch_size if piece_size is None else piece_size    # records a device gets of them
        self.seed = seed
        self.workers = workers
        self.prefetch = prefetch
        self.fields: list[Field] = []
        self._queue: queue.Queue = queue.Queue(maxsize=prefetch)
        self._thread: threading.Thread | None = None
        self._pool = None
        self._stop = threading.Event()
        self._failure: BaseException | None = None
        self._lock = threading.Lock()
        self.batches_made = 0           # batches the producer finished (for tests of prefetching)

    def __repr__(self):
        return f"Pipeline({self.name}, batch_size={self.batch_size}, {len(self.fields)} fields)"

    def add_field(self, field: Field) -> int:
        """Register one op's work; returns its field number. Only while the job is traced (before the first call)."""
        with self._lock:
            if self._thread is not None:
                raise RuntimeError(f"reader {self.name}: its batches are already being prepared; ops on a reader "
                                   "are added only while its job is traced")
            self.fields.append(field)
            return len(self.fields) - 1

    # ------------------------------------------------------------------------------------------- consumer side
    def next_batch(self) -> Batch:
        """The next prepared batch; starts the producer on first use. Raises the producer's error for the batch it
        failed on (and on every later call)."""
        if self._failure is not None:
            raise self._failure
        self._start()
        while True:
            # checked before each take: batches prefetched before close() are not handed out after it
            if self._stop.is_set():
                raise RuntimeError(f"reader {self.name}: its data pipeline was stopped "
                                   "(flow.clear_default_session() or close())")
            try:
                item = self._queue.get(timeout=0.2)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError(f"reader {self.name}: its producer thread ended unexpectedly") from None
        if isinstance(item, _Failure):
            self._failure = item.error
            raise item.error
        return item

    def _start(self):
        with self._lock:
            if self._thread is not None:
                return
            if self._stop.is_set():
                raise RuntimeError(f"reader {self.name}: its data pipeline was stopped "
                                   "(flow.clear_default_session() or close())")
            if self.workers > 1:
                self._pool = concurrent.futures.ThreadPoolExecutor(self.workers,
                                                                   thread_name_prefix=f"flowlab-data-{self.name}")
            self._thread = threading.Thread(target=self._produce, name=f"flowlab-data-{self.name}", daemon=True)
            self._thread.start()

    def close(self, timeout=5.0):
        """Stop preparing batches; waits up to ``timeout`` s for the producer to finish the batch in hand."""
        self._stop.set()
        thread, pool = self._thread, self._pool
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if pool is not None and (thread is None or not thread.is_alive()):
            pool.shutdown(wait=True)        # the workers finish the record in hand and end

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------------------------------------- producer side
    def _produce(self):
        records = iter(self.source)
        field_rngs = [np.random.default_rng(f.seed if f.seed is not None else [self.seed, 3, k])
                      if f.random else None for k, f in enumerate(self.fields)]
        while not self._stop.is_set():
            try:
                item = self._make_batch(records, field_rngs)
            except BaseException as e:      # handed to the job call that needs this batch
                item = _Failure(e)
            if self._stop.is_set():
                return
            while True:
                try:
                    self._queue.put(item, timeout=0.2)
                    break
                except queue.Full:
                    if self._stop.is_set():
                        return
            if isinstance(item, _Failure):
                return
            self.batches_made += 1

    def _make_batch(self, records, field_rngs) -> Batch:
        raw = [next(records) for _ in range(self.batch_size)]
        # one seed per record and random field, drawn here in order: results do not depend on thread timing
        seeds = [[int(r.integers(1 << 63)) if r is not None else None for r in field_rngs] for _ in raw]
        if self._pool is not None and len(raw) > 1:
            samples = list(self._pool.map(self._sample, raw, seeds))
        else:
            samples = [self._sample(item, s) for item, s in zip(raw, seeds)]
        values = {}
        for k, field in enumerate(self.fields):
            for j, collate in enumerate(field.collates):
                values[(k, j)] = _collate([s[(k, j)] for s in samples], collate, field, raw)
        return Batch(values, [(path, offset) for _, path, offset in raw])

    def _sample(self, item, seeds):
        data, path, offset = item
        rec = parse(data, path, offset)
        values = {RECORD: rec}
        for k, field in enumerate(self.fields):
            rng = np.random.default_rng(seeds[k]) if field.random else None
            try:
                outs = field.fn([values[i] for i in field.inputs], rng)
            except OFRecordError:
                raise
            except Exception as e:
                raise OFRecordError(f"{field.what}: {rec.where()}: {e}; keys present: "
                                    f"{sorted(rec.record.feature)}") from e
            for j, value in enumerate(outs):
                values[(k, j)] = value
        return values


def _collate(values, collate: Collate, field: Field, raw):
    if collate.kind == "list":
        out = np.empty(len(values), dtype=object)     # element by element: equal-shape images stay separate
        for i, v in enumerate(values):
            out[i] = v
        return out
    for (_, path, offset), v in zip(raw, values):
        if v.shape != collate.shape:
            raise OFRecordError(f"{field.what}: record at byte offset {offset} of {path} gives shape {v.shape}, "
                                f"expected {collate.shape}")
    return np.stack(values).astype(collate.dtype, copy=False)


def reader_seed(session_seed, name) -> int:
    """A reader's seed: the session's (``flow.config.seed``) and the reader's name, so runs repeat."""
    return int(np.random.default_rng([session_seed, zlib.crc32(name.encode())]).integers(1 << 63))


# Pipelines of the current session, closed by flow.clear_default_session() (runtime.session calls close_all).
_open: list[Pipeline] = []
_open_lock = threading.Lock()


def register(pipeline: Pipeline):
    with _open_lock:
        _open.append(pipeline)


def close_all():
    """Stop every pipeline made so far (their threads end; later pulls raise)."""
    with _open_lock:
        pipelines = list(_open)
        _open.clear()
    for p in pipelines:
        p.close()


__all__ = ["Batch", "Collate", "Field", "Pipeline", "RECORD", "RecordSource", "close_all", "register"]
