"""NumPy kernels that split their work over the CPU's cores themselves, with BLAS on one thread.

On NumPy a step of a convolutional network is about three quarters BLAS products and one quarter NumPy work outside
BLAS (batch norm, im2col and col2im, pooling, ReLU gradients, optimizer updates), which runs on one core. Splitting
that work over threads gains nothing while OpenBLAS's own threads are in use: after each product OpenBLAS's idle
thread spins on the second core (up to 2**28 cycles, ~0.1 s, unless ``OPENBLAS_THREAD_TIMEOUT`` was set before NumPy
loaded), so a batch norm split over two threads took as long as on one (ResNet-50, 2 cores: 6.8-7.1 ms against
6.4-6.6). So a host plan with large products runs ``with spread_kernels:``: BLAS goes to one thread (through
``backend.one_blas_thread``; its idle threads then sleep, as nothing wakes them), and kernels split their products and
their other work over ``width()`` threads, as many as BLAS had (the user's ``OMP_NUM_THREADS`` /
``OPENBLAS_NUM_THREADS`` / ``threadpoolctl`` limit keeps its meaning), at most the usable cores. NumPy releases the
GIL inside BLAS calls, ufunc loops and copies, so the threads run at once.

Outside such a block (CuPy, small plans, direct kernel calls) ``width()`` is 1 and the helpers run inline.
``FLOWLAB_HOST_THREADS=0`` turns it off (BLAS keeps its own threads; kernels run on one).

- ``run(tasks)``: call each zero-argument callable; the calling thread and the pool's threads claim them in order.
- ``parts(total, minimum, work)``: contiguous slices of ``range(total)`` for ``run``: ``width()`` or fewer, or twice
  that many where each still holds enough work (``CHUNK_ELEMENTS``; products are split once per thread).
- ``matmul(a, b, out=None)``: ``np.matmul`` split over rows of ``a`` or columns of ``b`` (whichever is longer).
- ``SideStream``: one thread running a plan's second stream of nodes in order (``compiler.side_stream``); the plan's
  thread takes part of its backlog when it waits for it at the end of a call.

Tasks are claimed, not assigned: each thread takes the next unclaimed task when it is free, and the caller waits only
for tasks a pool thread has claimed. A pool thread wakes ~20-50 us after a hand-off on an idle machine, and much
later when another process holds the other core (ResNet-50 at load 3: 0.7 ms on average, ~560 ms of a step); with
tasks handed out in advance the caller finished its half and then waited for the other half to start. Claimed
tasks (two per thread for large passes) let the caller take over what the late thread has not begun and
even out halves that cost unequal time (padding rows, the thread that also packs a BLAS operand). A hand-off is one
``SimpleQueue.put`` and, when a pool thread finishes last, one lock release (``ThreadPoolExecutor``'s futures cost
~25 us of the caller's time each, ~760 per ResNet-50 step).

Tried and measured worse (ResNet-50 batch 4, 2 shared cores, load 1.5-4, in one process, interleaved). The late
start behaves as a wait for the GIL, which the caller holds until its own first task enters NumPy: whatever made the
pool thread ask for it more often delayed it further. A pool thread polling ``SimpleQueue.empty()`` with
``os.sched_yield()`` for 50-200 us before sleeping: median start 61 us against 41-45, the caller's waits 62 -> 84 ms
a step, step CPU +1-6 %, wall worse.
``sys.setswitchinterval(2e-4)``: median start 61-65 us against 45-50. The first kernel of a ``side_by_side`` pair
split over both threads (the second thread takes its rest once the other kernel is done): dx + dw of ResNet-50's 8
bottleneck convolution shapes 158 -> 165 ms wall, 121 -> 125 ms CPU. A gradient sum of 0.8-3.2M float32 split in
two: 0.11-0.87 ms -> 0.15-1.02 ms (memory-bound; the other core is busy).

Compiled kernels (``runtime.jit``; ResNet-50's batch norms, pooling, ReLU gradient, SGD and col2im) split from
``SPLIT_COMPILED`` elements (``compiled_work``), as they run 3-5x faster per element than NumPy's passes. ResNet-50
step, interleaved, load ~1.9, wall / CPU medians: from 256k elements 727 / 1324 ms, from 1M 749 / 1341 ms, never
754 / 1302 ms (alone, at load ~2, a batch norm's forward and gradient of 0.1-1.6M elements split took 1.5-2.5x as
long as whole: the pool thread starts late while other processes hold the other core). Tried and
measured slower, so not used (one thread, ResNet-50 sizes): a compiled im2col of the folded convolutions (NumPy's
strided copies: stem and stride-2 3x3 layers 3.9 / 2.4 / 1.5 -> 5.6 / 3.2 / 2.0 ms); a max pool gradient keeping
each window's running maximum, first position and NaN flag in arrays over a row of windows (pool1: 17 ms) or
passing once per kernel position as the NumPy kernel does (27 ms), against 13 ms for one search per window (NumPy
25 ms); Winograd's output-gradient transform (``A dy A^T`` per tile, a row of tiles in scratch) instead of a gather
and two BLAS products: 56x56x64 7.4 -> 6.5 ms, but 28x28x128 0.8 -> 5.4 ms and 14x14x256 0.4 -> 2.9 ms (short
loops over a row's 7-14 tiles do not vectorise).
"""
from __future__ import annotations

import collections
import math
import os
import queue
import threading
import weakref

import numpy as np

from .backend import one_blas_thread

SPLIT_MACS = 1 << 21        # a product below this many multiply-adds runs on one thread (hand-offs cost ~20-50 us)
SPLIT_ELEMENTS = 1 << 16    # likewise for kernels' other work, in elements
# Kernels' other work goes to two tasks per thread where each still holds this many elements (~0.1-0.3 ms of
# passes). Products stay at one block per thread: every block packs its own copy of the operand it shares with the
# others, so a fourth block costs up to ~17 % more CPU than halves (ResNet-50's 7x7x512 3x3 layer, one thread).
CHUNKS_PER_THREAD = 2
CHUNK_ELEMENTS = 1 << 18
# Compiled kernels (``runtime.jit``) do in one pass what NumPy kernels do in several, 3-5x faster per element: below
# this many elements one runs whole on the calling thread (``compiled_work``).
SPLIT_COMPILED = 1 << 18

class _Local(threading.local):
    width = 1           # a class default: ``width()`` reads it without a missed lookup's exception (~0.4 us)


_local = _Local()
_pool_lock = threading.Lock()
_pool: _Pool | None = None


def width() -> int:
    """Threads the calling thread's kernels may use now (1 outside ``spread_kernels``)."""
    return _local.width


def _turned_off(variable):
    """Whether the environment ``variable`` turns a feature off (``0``, ``false``, ``no`` or ``off``)."""
    return os.environ.get(variable, "1").strip().lower() in ("0", "false", "no", "off")


def enabled() -> bool:
    return not _turned_off("FLOWLAB_HOST_THREADS")


def _usable_cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _blas_threads():
    """The thread count NumPy's BLAS is set to now, or None where it cannot be read."""
    libraries = one_blas_thread.controllers()
    return max((lib.num_threads for lib in libraries), default=None)


class _Width:
    """``with using(n):`` kernels of the calling thread split work over ``n`` threads (tests and ``spread_kernels``)."""

    def __init__(self, n):
        self.n = max(1, int(n))

    def __enter__(self):
        self._saved = width()
        _local.width = self.n
        return self

    def __exit__(self, *exc):
        _local.width = self._saved


def using(n):
    return _Width(n)


class SpreadKernels:
    """``with spread_kernels:`` (a host plan's call): BLAS on one thread and ``width()`` = the BLAS thread count it
    had, at most the usable cores. Nothing changes where that is 1, BLAS cannot be controlled, or it is turned off."""

    def __enter__(self):
        n = _blas_threads() if enabled() else None
        n = min(n, _usable_cores()) if n else 1
        stack = _local.__dict__.setdefault("spread", [])
        if n <= 1 or width() > 1:       # nothing to split, or already inside (a nested plan call)
            stack.append(None)
            return self
        one_blas_thread.__enter__()
        entered = _Width(n)
        entered.__enter__()
        stack.append(entered)
        return self

    def __exit__(self, *exc):
        entered = _local.spread.pop()
        if entered is not None:
            entered.__exit__(*exc)
            one_blas_thread.__exit__(*exc)


spread_kernels = SpreadKernels()


class _Pool:
    """``size`` daemon threads, each running the callables put on one queue (None ends a thread)."""

    def __init__(self, size):
        self.size = size
        self.jobs = queue.SimpleQueue()
        for i in range(size):
            threading.Thread(target=self._work, name=f"flowlab-kernel_{i}", daemon=True).start()

    def _work(self):
        while True:
            job = self.jobs.get()
            if job is None:
                return
            job()

    def close(self):
        for _ in range(self.size):
            self.jobs.put(None)


def _executor(workers):
    """The pool, with at least ``workers`` threads."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool.size < workers:
            old, _pool = _pool, _Pool(workers)
            if old is not None:
                old.close()         # its threads end once they have run what was put before
        return _pool


def _forget_pool():
    """In a forked child the pool's threads do not exist: start a new pool when one is next needed."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


class _Job:
    """Tasks that threads claim one at a time, in order, until none is left; ``wait`` returns once every task has
    ended (at once when the caller ended the last one itself)."""

    def __init__(self, tasks):
        self.tasks = tasks
        self.results = [None] * len(tasks)
        self.errors = [None] * len(tasks)
        self._claimed = 0
        self._left = len(tasks)
        self._lock = threading.Lock()
        self._ended = threading.Lock()
        self._ended.acquire()           # released by whichever thread ends the last task

    def work(self):
        with self._lock:
            i = self._claimed
            self._claimed += 1
        while i < len(self.tasks):
            try:
                self.results[i] = self.tasks[i]()
            except BaseException as e:      # KeyboardInterrupt too: raised by run once every task has ended
                self.errors[i] = e
            with self._lock:
                self._left -= 1
                last = self._left == 0
                i = self._claimed
                self._claimed += 1
            if last:
                self._ended.release()

    def wait(self):
        self._ended.acquire()


def run(tasks):
    """The results of calling each of ``tasks`` (zero-argument callables), in order. The calling thread and up to
    ``width() - 1`` pool threads claim them in order as each becomes free; what no pool thread has claimed by then,
    the calling thread runs itself. The first error raised (in task order) is raised here, once every task has
    ended."""
    tasks = list(tasks)
    if len(tasks) <= 1 or width() <= 1:
        return [task() for task in tasks]
    job = _Job(tasks)
    helpers = min(width(), len(tasks)) - 1
    pool = _executor(helpers)
    for _ in range(helpers):
        pool.jobs.put(job.work)
    job.work()
    job.wait()                          # no task may outlive the arrays it writes
    for error in job.errors:
        if error is not None:
            raise error
    return job.results


def parts(total, minimum=1, work=None, per_thread=None):
    """Contiguous slices covering ``range(total)`` in order, each at least ``minimum`` long: ``width()`` of them, or
    ``CHUNKS_PER_THREAD`` times as many where ``work`` (the elements the whole job touches) gives each at least
    ``CHUNK_ELEMENTS``; fewer where ``total`` is short, one where ``work`` is below ``SPLIT_ELEMENTS``.
    ``per_thread=1`` keeps one slice per thread (blocks of a matrix product)."""
    if work is not None and work < SPLIT_ELEMENTS:
        return [slice(0, total)]
    count = width()
    if per_thread is not None:
        count *= per_thread
    elif count > 1 and work is not None and work >= count * CHUNKS_PER_THREAD * CHUNK_ELEMENTS:
        count *= CHUNKS_PER_THREAD
    count = max(1, min(count, total // max(1, minimum)))
    bounds = [total * i // count for i in range(count + 1)]
    return [slice(bounds[i], bounds[i + 1]) for i in range(count)]


def compiled_work(elements):
    """``work`` for ``parts`` / ``each`` of a compiled kernel touching ``elements``: 0 (one part, no hand-off) below
    ``SPLIT_COMPILED``."""
    return elements if elements >= SPLIT_COMPILED else 0


def each(function, total, minimum=1, work=None, per_thread=None):
    """``run`` of ``function(part)`` for each of ``parts(total, minimum, work, per_thread)``."""
    return run([lambda part=part: function(part) for part in parts(total, minimum, work, per_thread)])


def matmul(a, b, out=None):
    """``np.matmul(a, b, out=out)`` (``a``, ``b`` at least 2-D, NumPy), split into row blocks of ``a`` or column
    blocks of ``b`` (the longer side; each block one product writing its own block of ``out``)."""
    if width() <= 1:            # first: the size below costs ~6 us, a lot beside a small product
        return np.matmul(a, b, out=out)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    stack = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) if a.ndim > 2 or b.ndim > 2 else ()
    macs = math.prod(stack) * m * k * n
    if macs < SPLIT_MACS:
        return np.matmul(a, b, out=out)
    if out is None:
        out = np.empty(stack + (m, n), np.result_type(a, b))
    if m >= n:
        each(lambda rows: np.matmul(a[..., rows, :], b, out=out[..., rows, :]), m, 8, per_thread=1)
    else:
        each(lambda cols: np.matmul(a, b[..., :, cols], out=out[..., :, cols]), n, 8, per_thread=1)
    return out


def side_stream_enabled() -> bool:
    """Whether plans may run a second stream of nodes (``compiler.side_stream``): two or more usable cores, NumPy's
    BLAS allowed two or more threads (the user's ``OMP_NUM_THREADS=1`` keeps a step on one core), and neither
    ``FLOWLAB_HOST_THREADS=0`` nor ``FLOWLAB_SIDE_STREAM=0``."""
    if not enabled() or _turned_off("FLOWLAB_SIDE_STREAM"):
        return False
    blas_threads = _blas_threads()
    return _usable_cores() >= 2 and (blas_threads is None or blas_threads >= 2)


class SideStream:
    """A daemon thread that runs the callables ``put`` hands it, in order. ``join()`` waits until all put so far have
    run, and raises the first error one of them raised (the ones after it that have not started are skipped: they
    may read what it did not make). While it waits, the calling thread takes tasks itself, the latest first, each
    once every task it depends on has finished: ``depends[k]``, the indices of the tasks of a call whose results
    task ``k`` reads (the k-th ``put`` since the last ``join`` is task k; None: the caller only waits). So the
    caller, done with its own work, shares the stream's backlog instead of idling. ``wait(k)`` waits for one task
    (taking it likewise), whose results the caller reads before the end of the call. One per plan (its
    buffers are the plan's), started on first use (again in a forked child); the thread holds no reference to the
    stream and ends once the stream is garbage (its plan dropped)."""

    def __init__(self, name, depends=None):
        self.name = name
        self._state = None
        self._pid = None
        self.depends = depends

    @property
    def depends(self):
        return self._depends

    @depends.setter
    def depends(self, depends):             # (between calls) read by both threads from the shared state
        self._depends = depends
        if self._state is not None:
            self._state.depends = depends

    def put(self, task, *args):
        if self._pid != os.getpid():
            self._start()
        state = self._state
        with state.cond:
            state.pending.append((state.count, task, args))
            state.count += 1
            state.left += 1
        state.wake.release()

    def wait(self, k):
        """Until task ``k`` of this call (the k-th ``put`` since the last ``join``) has finished: a task whose
        results the caller reads next (a forward branch, ``compiler.side_stream.fork``). Runs it on the calling
        thread when the stream's thread has not taken it yet and what it reads is done. Raises the first error a
        task of this call raised (the caller must not read what a failed task did not make)."""
        state = self._state
        while True:
            with state.cond:
                if state.errors:            # (a task after a failed one is skipped: its results are missing)
                    raise state.errors[min(state.errors)]
                if k in state.finished:
                    return
                waiting = next((i for i, entry in enumerate(state.pending) if entry[0] == k), None)
                if waiting is None or state.depends is None or not state.depends[k] <= state.finished:
                    state.cond.wait()       # running on the stream's thread, or waiting for what it reads
                    continue
                _, task, args = state.pending[waiting]
                del state.pending[waiting]
            _run_task(state, k, task, args)

    def join(self):
        if self._pid != os.getpid():
            return
        state = self._state
        while state.depends is not None:
            with state.cond:
                if not state.pending:
                    break
                ready = next((i for i in range(len(state.pending) - 1, -1, -1)
                              if state.depends[state.pending[i][0]] <= state.finished), None)
                if ready is None:           # each waits for a task still running: until one finishes
                    state.cond.wait()
                    continue
                k, task, args = state.pending[ready]
                del state.pending[ready]
            _run_task(state, k, task, args)
        with state.cond:
            while state.left:
                state.cond.wait()
            errors, state.errors = state.errors, {}
            state.count = 0
            state.finished.clear()
        if errors:
            raise errors[min(errors)]

    def _start(self):
        self._state, self._pid = _SideState(self.depends), os.getpid()
        threading.Thread(target=_side_loop, args=(self._state,), name=f"flowlab-side {self.name}",
                         daemon=True).start()
        weakref.finalize(self, _stop, self._state)


class _SideState:
    """What a ``SideStream`` shares with its thread: the tasks not yet taken ``(index, task, args)``, the indices
    finished this call, the errors raised (index -> error), how many put are not finished, and ``depends``."""

    def __init__(self, depends):
        self.depends = depends
        self.cond = threading.Condition(threading.Lock())
        self.wake = threading.Semaphore(0)      # one release a put (a task the caller took leaves one spare)
        self.pending = collections.deque()
        self.finished = set()
        self.errors = {}
        self.count = self.left = 0
        self.stopped = False


def _stop(state):
    state.stopped = True
    state.wake.release()


def _run_task(state, k, task, args):
    if not state.errors:
        try:
            task(*args)
        except BaseException as e:          # raised by join() on the plan's thread
            with state.cond:
                state.errors[k] = e
    with state.cond:
        state.finished.add(k)
        state.left -= 1
        state.cond.notify_all()             # (a caller in join waits for the last, or for what a task depends on)


def _side_loop(state):
    while True:
        state.wake.acquire()
        if state.stopped:
            return
        with state.cond:
            if not state.pending:           # the caller took it
                continue
            k, task, args = state.pending.popleft()
            while state.depends is not None and not state.depends[k] <= state.finished:
                state.cond.wait()           # the caller took an earlier task this one reads from: until it is done
        _run_task(state, k, task, args)
        task = args = None                  # no reference to the plan (its namespace) while the thread waits
