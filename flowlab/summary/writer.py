"""``EventFileWriter``: one ``events.out.tfevents.*`` file, written by a background thread.

Callers append to an in-memory queue (a ``collections.deque``; a ``Condition`` wakes the thread) and return at
once. The thread wakes every ``flush_secs``, when ``max_queue`` items are waiting, or on ``flush()``/``close()``;
it frames what is queued and writes it in batches. A thread, not a process: a multiprocessing queue pickles every
event and is where tensorboardX loses most of its time (DESIGN.md §7).

Everything is checked and encoded on the caller's thread: a bad argument raises right there, and what reaches the
queue is either serialised bytes or a checked scalar tuple that cannot fail to serialise. So one bad call never
breaks the writer nor loses what was accepted before it.

Durability: the file is unbuffered, so every batch goes to the OS in one ``write`` of whole framed records, and a
writer killed with SIGKILL leaves everything up to its last complete record readable, with at most one partial
record at the tail. ``flush()`` returns once everything queued before it is in the OS; ``close()`` flushes and
closes (idempotently; a second ``close()``, from any thread, returns once the first has finished). Writers still
open at interpreter exit are closed by an ``atexit`` hook, and on SIGTERM by a handler installed when the first
writer opens (only over the default action, from the main thread): it writes out what is queued, then lets the
default action terminate the process as SIGTERM would have.

Write errors (a full disk, a file-size limit): the bytes not yet written are kept in memory, up to
``max_pending_bytes``, and retried every ``flush_secs`` from the exact byte where the OS stopped, so a record cut
short completes once space returns. A warning names the file when writes start failing and when they recover;
``flush()`` raises ``OSError`` naming the file while data waits; an ``add_*`` call is refused (``OSError``) only when
the pending bytes are over the limit; ``close()`` tries once more and says how many bytes were lost.

Threads: any number may add, flush and close at once. An ``add_*`` call that returns was accepted, and is on disk
once ``close()`` returns, even one that raced ``close()``; one that comes too late for the final write raises
``ValueError`` (closed) and writes nothing. No lock is taken on the hot path: a call that finds the writer closing
after queueing its item waits for ``close()`` and then takes the item back if the final write missed it.

Scalars take a fast path: the queue holds a small tuple and the thread builds the ``Event`` in place, because upb
copies a message assigned into another, which costs more than serialising it.

Plugin metadata: TensorBoard keeps the first ``SummaryMetadata`` of a tag and ignores repeats, so repeating it costs
only bytes, and a reader that lost a tag's first record (a damaged byte) still learns the tag's plugin from the
next one. Values of every kind but scalars keep their metadata on every record (it is small beside a histogram or
an image). Scalar records are the bulk of a log and the readers' fast path only decodes scalars without metadata,
so a scalar tag carries it on its first value in each file and again every ``SCALAR_METADATA_EVERY`` values.
"""
from __future__ import annotations

import atexit
import collections
import errno
import itertools
import math
import os
import signal
import socket
import sys
import threading
import time
import warnings

from . import encode, proto
from .record import frame

_file_numbers = itertools.count()          # file names end in .<n>: two writers in one second never collide
_open_writers = set()                      # closed at exit; the writer's own thread keeps it alive until then
_BATCH_BYTES = 256 << 10
SCALAR_METADATA_EVERY = 1000               # a scalar tag repeats its metadata with every 1000th value
_INT64 = (-2**63, 2**63)


def check_step(step, name="step") -> int:
    """``step`` as an int that fits ``Event.step`` (int64)."""
    if type(step) is not int:
        try:
            step = int(step.__index__())
        except (AttributeError, TypeError):
            raise TypeError(f"{name} must be an int, got {type(step).__name__} {step!r}") from None
    if not _INT64[0] <= step < _INT64[1]:
        raise ValueError(f"{name} must fit in 64 bits (int64), got {step}")
    return step


def _wall_time(wall_time):
    return time.time() if wall_time is None else encode.to_wall_time(wall_time, "wall_time")


class EventFileWriter:
    """Write ``Event``s to a new file in ``logdir``: ``events.out.tfevents.<secs>.<host>.<pid>.<n><suffix>``."""

    def __init__(self, logdir, flush_secs=1.0, filename_suffix="", max_queue=1024, max_pending_bytes=32 << 20):
        logdir = os.fspath(logdir)
        if isinstance(logdir, bytes):
            logdir = os.fsdecode(logdir)
        if "\0" in logdir:
            raise ValueError(f"logdir must be a path without NUL characters, got {logdir!r}")
        if not isinstance(filename_suffix, str) or os.sep in filename_suffix or "\0" in filename_suffix \
                or (os.altsep and os.altsep in filename_suffix):
            raise ValueError(f"filename_suffix must be a str without {os.sep!r} or NUL, got {filename_suffix!r}")
        if not flush_secs > 0 or not max_queue >= 1 or not max_pending_bytes >= 0:
            raise ValueError(f"flush_secs must be > 0, max_queue >= 1 and max_pending_bytes >= 0, got "
                             f"{flush_secs!r}, {max_queue!r} and {max_pending_bytes!r}")
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
        self._pid = os.getpid()             # a forked child's SIGTERM must not write its copy of our queue
        self._flush_secs, self._max_queue = float(flush_secs), int(max_queue)
        self._max_pending = int(max_pending_bytes)
        self._queue = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)        # the thread waits here
        self._drained = threading.Condition(self._lock)     # callers held back by a full queue wait here
        # Held while taking items off the queue and writing them: it orders the thread's writes with the SIGTERM
        # handler's, and whoever holds it takes no other lock (so the handler can wait for it, see _flush_now).
        self._io_lock = threading.RLock()
        self._woken = False
        self._stopping = self._closed = False
        self._finished = threading.Event()  # set once close() has written everything it will and closed the file
        self._pending = bytearray()         # framed bytes a failed write left unwritten, oldest first
        self._error = None                  # the OSError of the last failed write while bytes are pending
        self._dropped = 0                   # items that failed to serialise on the thread (none expected)
        self._scalar_counts = {}            # scalar tag -> its values so far in this file (metadata every Nth)
        self._thread = threading.Thread(target=self._run, name=f"EventFileWriter {name}", daemon=True)
        self._thread.start()
        _open_writers.add(self)
        _install_sigterm_flush()

    # ------------------------------------------------------------------------------------------------ adding

    def add_event(self, event):
        """Queue an ``Event`` as it is (serialised now, so a bad event raises here)."""
        if getattr(getattr(event, "DESCRIPTOR", None), "full_name", None) != "tensorboard.Event":
            raise TypeError(f"event must be a tensorboard.Event message, got {type(event).__name__}")
        self._put(_serialise_here(event, "event"))

    def add_summary(self, summary, step=0, wall_time=None):
        """Queue a ``Summary`` (or a list of ``Summary.Value``s) as one Event at ``step``."""
        event = proto.Event(wall_time=_wall_time(wall_time), step=check_step(step or 0))
        if isinstance(summary, proto.Summary):
            event.summary.CopyFrom(summary)
        else:
            event.summary.value.extend(summary)
        counts, seen = self._scalar_counts, {}
        for value in event.summary.value:       # only scalars shed repeated metadata (see the module docstring)
            if value.metadata.plugin_data.plugin_name == "scalars":
                count = seen[value.tag] = seen.get(value.tag, counts.get(value.tag, 0)) + 1
                if (count - 1) % SCALAR_METADATA_EVERY:
                    value.ClearField("metadata")
        self._put(_serialise_here(event, "summary"))
        counts.update(seen)                     # counted once accepted: a refused first value keeps its metadata due

    def add_scalar(self, tag: str, value: float, step=0, wall_time=None):
        """Queue one scalar: the hot path. Arguments are checked here (cheaply once a tag is known)."""
        counts = self._scalar_counts
        count = counts.get(tag)
        if count is None:
            encode.check_tag(tag)
            count = 0
        if type(value) is not float:
            value = encode.to_scalar(value, "value")
        if type(step) is not int or not _INT64[0] <= step < _INT64[1]:
            step = check_step(step)
        self._put((time.time() if wall_time is None else
                   wall_time if type(wall_time) is float and math.isfinite(wall_time) else _wall_time(wall_time),
                   step, tag, value, not count % SCALAR_METADATA_EVERY))
        # Counted once accepted, so a refused first value leaves the metadata to the next. Two threads racing here
        # at worst send it once more or less.
        counts[tag] = count + 1

    def add_graph_def(self, graph_def: bytes, step=0, wall_time=None):
        """Queue a serialised ``GraphDef`` (``Event.graph_def``)."""
        if not isinstance(graph_def, (bytes, bytearray)):
            raise TypeError(f"graph_def must be serialised GraphDef bytes, got {type(graph_def).__name__}")
        self._put(proto.Event(wall_time=_wall_time(wall_time), step=check_step(step),
                              graph_def=bytes(graph_def)).SerializeToString())

    def _put(self, item):
        if self._stopping:
            raise self._closed_error()
        if self._error is not None and len(self._pending) >= self._max_pending:
            error = self._error
            raise OSError(error.errno, f"event file cannot be written ({error.strerror}) and "
                                       f"{len(self._pending):,} bytes of accepted events already wait in memory "
                                       f"(max_pending_bytes={self._max_pending:,}); this event was not accepted",
                          self.path)
        queue = self._queue
        queue.append(item)
        if self._stopping:                  # close() began while this item was going in: written, or refused
            self._settle_late(item)
        if len(queue) >= self._max_queue:
            with self._lock:
                self._woken = True
                self._wake.notify()
                # Back-pressure: a caller far ahead of the thread waits rather than filling memory.
                while len(queue) >= 4 * self._max_queue and self._thread.is_alive():
                    self._drained.wait(0.1)

    def _settle_late(self, item):
        """An item queued after close() had begun: wait for close() to finish, then either it was written (the
        thread or close()'s final drain took it off the queue) or it is taken back and refused. Seeing
        ``_stopping`` false after appending means the append came first, so the thread's last drain sees the item
        (it ends only when ``_stopping`` is set and the queue is empty)."""
        self._finished.wait()
        with self._io_lock:                 # nothing drains any more; late callers remove their own items
            queue = self._queue
            for i, queued in enumerate(queue):
                if queued is item:
                    del queue[i]
                    raise self._closed_error()

    def _closed_error(self):
        return ValueError(f"event file {self.path!r} is closed; nothing more can be added")

    # ------------------------------------------------------------------------------------------------ flushing

    def flush(self):
        """Block until everything queued so far is written to the OS; ``OSError`` (naming the file) if some of
        it could not be written yet (it is kept and retried)."""
        if self._closed:
            self._finished.wait()                       # a close() under way on another thread writes it all
            return
        marker = threading.Event()
        self._queue.append(marker)
        self._wake_thread()
        while not marker.wait(0.1):
            if self._stopping:                          # close() began: it writes everything queued
                self._finished.wait()
                return
            if not self._thread.is_alive():             # e.g. in a forked child: drain on this thread
                self._drain()
        if self._pending:
            raise self._write_error()

    def close(self):
        """Write what is queued and close the file; later calls do nothing. ``OSError`` (naming the file) if some
        accepted events could not be written: they are lost."""
        with self._lock:                    # exactly one caller closes; the others wait for it below
            closing, self._closed = not self._closed, True
        if not closing:
            self._finished.wait()
            return
        try:
            self._stopping = True
            self._wake_thread()
            self._thread.join()             # the thread drains the queue before it ends
            # Writes what a forked child's queue holds (its thread is gone), and items that came in while the
            # thread was ending; later ones are taken back by their callers (_settle_late).
            self._drain()
            with self._io_lock:
                lost = len(self._pending)
                self._file.close()
        finally:                            # even if interrupted: whoever waits for this close() must not hang
            self._finished.set()
        _open_writers.discard(self)
        if lost:
            error = self._error
            raise OSError(error.errno, f"event file closed with {lost:,} bytes of accepted events that could not "
                                       f"be written ({error.strerror}); they are lost", self.path)

    def _wake_thread(self):
        with self._lock:
            self._woken = True
            self._wake.notify()

    def _write_error(self):
        error = self._error
        return OSError(error.errno, f"cannot write event file ({error.strerror}); {len(self._pending):,} bytes of "
                                    f"accepted events are kept in memory and retried every {self._flush_secs:g} s "
                                    f"(up to max_pending_bytes={self._max_pending:,})", self.path)

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
        """Write everything queued, a batch at a time; flush() markers are set and blocked callers woken between
        batches, outside ``_io_lock``."""
        while True:
            with self._io_lock:
                markers, news = self._write_batch()
            for marker in markers:
                marker.set()
            for message in news:
                warnings.warn(message, RuntimeWarning, stacklevel=2)
            with self._lock:
                self._drained.notify_all()
            if not self._queue:
                return

    def _write_batch(self):
        """Take up to one batch off the queue and write it (with any bytes pending from a failed write).
        Returns (flush markers reached, warnings to give)."""
        queue, records, size, markers, news = self._queue, [], 0, [], []
        while queue and size < _BATCH_BYTES:
            item = queue.popleft()
            if type(item) is bytes:
                record = frame(item)
            elif type(item) is tuple:
                try:
                    record = frame(self._serialise_scalar(item))
                except Exception as e:                  # noqa: BLE001 - checked on the caller's thread; never lose more
                    self._dropped += 1
                    news.append(f"event file {self.path!r}: dropped one scalar that could not be encoded "
                                f"({type(e).__name__}: {e})")
                    continue
            else:                                       # a flush() marker: all before it must be out first
                markers.append(item)
                break
            records.append(record)
            size += len(record)
        if records or self._pending:
            news += self._write(records)
        return markers, news

    @staticmethod
    def _serialise_scalar(item) -> bytes:
        wall_time, step, tag, value, first = item
        event = proto.Event(wall_time=wall_time, step=step)
        encode.fill_scalar(event.summary.value.add(), tag, value, first)
        return event.SerializeToString()

    def _write(self, records):
        """Write the pending bytes and then ``records``; on an OSError keep exactly what was not written."""
        data = b"".join(records)
        if self._pending:
            self._pending += data
            data = self._pending
        written, failure = 0, None
        with memoryview(data) as view:
            try:
                while written < len(view):              # one write of whole records; loop only on a short write
                    n = self._file.write(view[written:])
                    if not n:
                        raise OSError(errno.EIO, "the OS accepted no bytes")
                    written += n
            except OSError as e:
                failure = e
        if failure is None:
            if self._pending:
                self._pending = bytearray()
            if self._error is not None:
                self._error = None
                return [f"event file {self.path!r}: writing works again; the events kept since the failure "
                        f"are written"]
            return []
        if data is self._pending:
            del self._pending[:written]
        else:
            self._pending = bytearray(data[written:])
        first = self._error is None
        self._error = failure
        return [str(self._write_error())] if first else []

    def _flush_now(self, timeout=10.0):
        """Write what is queued from the calling thread, for the SIGTERM handler: it may interrupt the main thread
        while that holds ``_lock`` or a flush() marker's lock, so it takes only ``_io_lock`` (whose holder takes
        no other lock) and leaves markers and waiting callers alone: the process is about to end."""
        if not self._io_lock.acquire(timeout=timeout):
            return False
        try:
            while self._queue:
                self._write_batch()
            if self._pending:
                self._write([])
            return not self._pending
        finally:
            self._io_lock.release()

    def __repr__(self):
        return f"EventFileWriter({self.path!r}{', closed' if self._closed else ''})"


def _serialise_here(event, what) -> bytes:
    try:
        return event.SerializeToString()
    except Exception as e:                              # noqa: BLE001 - upb raises various types; name the call
        raise ValueError(f"{what} cannot be serialised: {type(e).__name__}: {e}") from None


@atexit.register
def _close_open_writers():
    for writer in list(_open_writers):
        try:
            writer.close()
        except Exception as e:                          # noqa: BLE001 - at exit, close the others regardless
            print(f"flowlab: {e}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------------- SIGTERM

def _flush_on_sigterm(signum, frame):
    # Restore the previous (default) action first: a second SIGTERM during the flush then ends the process at once.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for writer in list(_open_writers):
        # A writer being closed still counts (its thread may be mid-drain); a forked child's copies do not.
        if writer._pid != os.getpid() or writer._file.closed:
            continue
        try:
            if not writer._flush_now():
                print(f"flowlab: on SIGTERM, event file {writer.path!r} could not be written completely",
                      file=sys.stderr)
        except Exception as e:                          # noqa: BLE001 - terminate regardless
            print(f"flowlab: on SIGTERM, event file {writer.path!r}: {e}", file=sys.stderr)
    os.kill(os.getpid(), signal.SIGTERM)    # the default action: terminated by SIGTERM, as without this handler
    os._exit(128 + signal.SIGTERM)          # not reached unless SIGTERM is blocked


def _install_sigterm_flush():
    """Flush on SIGTERM like at exit, where that is safe for a library: only on the main thread (signal.signal
    refuses others) and only over the default action (a user's handler, SIG_IGN or a handler set outside Python
    is left alone; ours restores the default and re-raises, which is chaining to it)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTERM"):
        return
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _flush_on_sigterm)
    except (ValueError, OSError):                       # e.g. an embedded interpreter without signal support
        pass
