"""``EventFileWriter``: one ``events.out.tfevents.*`` file, written by a background thread.

Callers append to an in-memory queue (a ``collections.deque``; a ``Condition`` wakes the thread) and return at
once. The thread wakes every ``flush_secs``, when ``max_queue`` items are waiting, or on ``flush()``/``close()``;
it serialises and frames what is queued and writes it in batches. A thread, not a process: a multiprocessing queue
pickles every event and is where tensorboardX loses most of its time (DESIGN.md §7).

Durability: the file is unbuffered, so every batch goes to the OS in one ``write`` of whole framed records, and a
writer killed with SIGKILL leaves everything up to its last complete record readable, with at most one partial
record at the tail. ``flush()`` returns once everything queued before it is in the OS; ``close()`` flushes and
closes (idempotently), and writers still open at interpreter exit are closed by an ``atexit`` hook.

Scalars take a fast path: the queue holds a small tuple and the thread builds the ``Event`` in place, because upb
copies a message assigned into another, which costs more than serialising it.

TensorBoard keeps only the first ``SummaryMetadata`` of a tag, so ``add_summary`` sends metadata with the first
value of each tag in this file and strips it from later ones.
"""
from __future__ import annotations

import atexit
import collections
import itertools
import os
import socket
import threading
import time

from . import encode, proto
from .record import frame

_file_numbers = itertools.count()          # file names end in .<n>: two writers in one second never collide
_open_writers = set()                      # closed at exit; the writer's own thread keeps it alive until then
_BATCH_BYTES = 256 << 10


class EventFileWriter:
    """Write ``Event``s to a new file in ``logdir``: ``events.out.tfevents.<secs>.<host>.<pid>.<n><suffix>``."""

    def __init__(self, logdir, flush_secs=1.0, filename_suffix="", max_queue=1024):
        logdir = os.fspath(logdir)
        if not isinstance(filename_suffix, str) or os.sep in filename_suffix:
            raise ValueError(f"filename_suffix must be a str without {os.sep!r}, got {filename_suffix!r}")
        if not flush_secs > 0 or not max_queue >= 1:
            raise ValueError(f"flush_secs must be > 0 and max_queue >= 1, got {flush_secs!r} and {max_queue!r}")
        if os.path.exists(logdir) and not os.path.isdir(logdir):
            raise NotADirectoryError(f"logdir {logdir!r} exists and is not a directory")
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
                f".{next(_file_numbers)}{filename_suffix}")
        self.logdir, self.path = logdir, os.path.join(logdir, name)
        try:                                # creating the file is the up-front check that logdir is writable
            os.makedirs(logdir, exist_ok=True)
            self._file = open(self.path, "xb", buffering=0)
            # The version record goes out at once, so the file is a valid event file from its creation.
            self._file.write(frame(proto.Event(wall_time=time.time(), file_version="brain.Event:2")
                                   .SerializeToString()))
        except OSError as e:
            raise type(e)(e.errno, f"cannot write an event file in logdir {logdir!r}: {e.strerror}",
                          self.path) from None
        self._flush_secs, self._max_queue = float(flush_secs), int(max_queue)
        self._queue = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)        # the thread waits here
        self._drained = threading.Condition(self._lock)     # callers held back by a full queue wait here
        self._woken = False
        self._stopping = self._closed = False
        self._error = None
        self._tags = set()                  # tags that have had their first value (and metadata) in this file
        self._thread = threading.Thread(target=self._run, name=f"EventFileWriter {name}", daemon=True)
        self._thread.start()
        _open_writers.add(self)

    # ------------------------------------------------------------------------------------------------ adding

    def add_event(self, event):
        """Queue an ``Event`` as it is (no metadata stripping)."""
        self._put(event)

    def add_summary(self, summary, step=0, wall_time=None):
        """Queue a ``Summary`` (or a list of ``Summary.Value``s) as one Event at ``step``."""
        event = proto.Event(wall_time=time.time() if wall_time is None else wall_time, step=step or 0)
        if isinstance(summary, proto.Summary):
            event.summary.CopyFrom(summary)
        else:
            event.summary.value.extend(summary)
        for value in event.summary.value:
            if value.tag in self._tags:
                value.ClearField("metadata")
            else:
                self._tags.add(value.tag)
        self._put(event)

    def add_scalar(self, tag: str, value: float, step=0, wall_time=None):
        """Queue one already-checked scalar (``encode.check_tag``/``encode.to_scalar``): the hot path."""
        first = tag not in self._tags      # two threads racing here at worst both send metadata; harmless
        if first:
            self._tags.add(tag)
        self._put((time.time() if wall_time is None else wall_time, step, tag, value, first))

    def add_graph_def(self, graph_def: bytes, step=0, wall_time=None):
        """Queue a serialised ``GraphDef`` (``Event.graph_def``)."""
        if not isinstance(graph_def, (bytes, bytearray)):
            raise TypeError(f"graph_def must be serialised GraphDef bytes, got {type(graph_def).__name__}")
        self._put(proto.Event(wall_time=time.time() if wall_time is None else wall_time, step=step,
                              graph_def=bytes(graph_def)))

    def _put(self, item):
        if self._stopping:
            raise ValueError(f"event file {self.path!r} is closed")
        if self._error is not None:
            raise self._error
        queue = self._queue
        queue.append(item)
        if len(queue) >= self._max_queue:
            with self._lock:
                self._woken = True
                self._wake.notify()
                # Back-pressure: a caller far ahead of the thread waits rather than filling memory.
                while len(queue) >= 4 * self._max_queue and self._thread.is_alive():
                    self._drained.wait(0.1)

    # ------------------------------------------------------------------------------------------------ flushing

    def flush(self):
        """Block until everything queued so far is written to the OS."""
        if self._closed:
            return
        marker = threading.Event()
        self._queue.append(marker)
        self._wake_thread()
        while not marker.wait(0.1):
            if not self._thread.is_alive():             # e.g. in a forked child: drain on this thread
                self._drain()
        if self._error is not None:
            raise self._error

    def close(self):
        """Write what is queued and close the file; later calls do nothing."""
        if self._closed:
            return
        self._closed = self._stopping = True
        self._wake_thread()
        self._thread.join()                 # the thread drains the queue before it ends
        self._drain()                       # only finds work if the thread was gone (a forked child)
        self._file.close()
        _open_writers.discard(self)
        if self._error is not None:
            raise self._error

    def _wake_thread(self):
        with self._lock:
            self._woken = True
            self._wake.notify()

    # ------------------------------------------------------------------------------------------------ the thread

    def _run(self):
        while True:
            with self._lock:
                if not self._woken:     # a wake-up that came while draining is not lost: _woken stays set
                    self._wake.wait(self._flush_secs)
                self._woken = False
            self._drain()
            if self._stopping and not self._queue:
                return

    def _drain(self):
        queue, records, size = self._queue, [], 0
        while queue:
            item = queue.popleft()
            if type(item) is threading.Event:           # a flush() marker: all before it must be out first
                self._write(records)
                records, size = [], 0
                item.set()
                continue
            if self._error is not None:                 # after a failed write, drop events rather than hang
                continue
            try:
                record = frame(self._serialise(item))
            except Exception as e:                      # noqa: BLE001 - kept to raise on the caller's thread
                self._error = e
                continue
            records.append(record)
            size += len(record)
            if size >= _BATCH_BYTES:
                self._write(records)
                records, size = [], 0
                with self._lock:
                    self._drained.notify_all()
        self._write(records)
        with self._lock:
            self._drained.notify_all()

    @staticmethod
    def _serialise(item) -> bytes:
        if type(item) is tuple:
            wall_time, step, tag, value, first = item
            event = proto.Event(wall_time=wall_time, step=step)
            encode.fill_scalar(event.summary.value.add(), tag, value, first)
            return event.SerializeToString()
        return item.SerializeToString()

    def _write(self, records):
        if not records or self._error is not None:
            return
        data = memoryview(b"".join(records))
        try:
            while data:                                 # one write of whole records; loop only on a short write
                data = data[self._file.write(data):]
        except OSError as e:
            self._error = e

    def __repr__(self):
        return f"EventFileWriter({self.path!r}{', closed' if self._closed else ''})"


@atexit.register
def _close_open_writers():
    for writer in list(_open_writers):
        try:
            writer.close()
        except Exception:                               # noqa: BLE001 - at exit, close the others regardless
            pass
