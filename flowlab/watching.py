"""``flow.watch``, ``flow.watch_diff`` and ``flow.watch_scope``: deliver values and gradients of any tensor to Python.

Inside a job function these only *record* requests on the graph. When the job is compiled, ``flowlab.delivery``
turns each request into a delivery in the plan (a host copy right after the tensor is computed); the dispatcher thread
then converts the value as the handler's annotation asks (``flowlab.blob``'s rule: ``tp.Numpy`` -> ndarray,
``tp.ListNumpy`` -> [ndarray], none -> ``Blob``) and calls it. Jobs without watches compile to exactly the plan they
had before.

A handler object with a ``watch_event(value, blob_def, kind, step)`` method (``kind`` is ``"value"`` or
``"gradient"``) is told which tensor it sees: live widgets use this. If it also has ``watch_summary(blob_def, kind)``
returning ``(bins, wanted)``, the tensor is summarised where it lives and never copied whole: every call delivers a
``TensorStats``, and calls on which ``wanted()`` is true also deliver a ``TensorHistogram`` of ``bins`` bins (a live
panel asks for one per screen refresh; ``bins=0``: statistics only). Such a handler must only record what it gets,
quickly and thread-safely: on NumPy the calling thread delivers these summaries while the call's plan runs.
``(bins, wanted, feed)`` with a ``StatsFeed`` sends the statistics to the feed instead of ``watch_event``: the plan
appends each call's six numbers there and the handler takes them in bulk when it draws (live widgets do this: a
call then costs the compute side one append, not a handler call and an object).

On several devices (``runtime.devices``) each device's plan delivers its piece; the pieces are joined on the host
into a ``DeviceValues`` and the handler gets, as in OneFlow: ``tp.ListNumpy`` -> one array a device under the
mirrored view (``[whole]`` under the consistent view), ``tp.Numpy`` -> the whole tensor, a blob -> both
(``.numpy()``, ``.numpy_list()``). Statistics and histograms are then computed on the host from the whole.

Beyond OneFlow: ``stats=True`` delivers a ``TensorStats`` computed on the device instead of the tensor, ``every=N``
delivers every N-th call only, and ``watch_diff`` of a tensor without a gradient is an error, not a silent no-op.
"""
from __future__ import annotations

import collections
import contextlib
import inspect
import threading
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import numpy as np

from . import graph as g
from .blob import NO_ANNOTATION, BlobDef, converter, to_blob, to_numpy
from .errors import TraceError
from .ops.stats import (COPIED, PUT_FULL, PUT_NONFINITE, PUT_RETRY, PUT_WAKE, TAKES, WAKE, WRITTEN, close_stats_block,
                        put_stats_row, stats_block, stats_block_rows, stats_row_writer, stats_rows, stats_vector)
from .runtime import jit


class TensorStats(NamedTuple):
    """Summary of a tensor computed on the device (``watch(..., stats=True)``); min/max/mean/std skip NaN/Inf."""
    shape: tuple
    min: float
    max: float
    mean: float
    std: float
    nan_count: int
    inf_count: int

    @classmethod
    def from_vector(cls, shape, v):
        lo, hi, mean, std, nan, inf = v.tolist()
        return cls(tuple(shape), lo, hi, mean, std, int(nan), int(inf))


class TensorHistogram(NamedTuple):
    """Counts of a tensor's finite elements in equal-width bins over ``[lo, hi]``, computed on the device (see
    ``watch_summary`` above). No finite element: ``lo``/``hi`` NaN and zero counts; ``lo == hi``: all in bin 0."""
    shape: tuple
    lo: float
    hi: float
    counts: Any      # float64 ndarray of the bin counts

    @classmethod
    def from_vector(cls, shape, v):
        return cls(tuple(shape), float(v[0]), float(v[1]), v[2:])


class StatsFeed:
    """Where a plan puts one watched tensor's per-call ``stats_vector`` for a live view to take in bulk.

    ``put(step, vector)`` runs on the job's thread each call: one append, and ``on_put()`` (a refresh thread's
    wake-up) when it is the first since the last take. ``take()`` gives what was put since the last take, oldest
    first, one row a step, as ``(steps, vectors)``: a list of ints and a float64 array of shape ``(n, 6)``. Of
    consecutive puts of one step (a tensor watched twice puts each step twice; ``TrainingProgress.update`` may repeat
    one) the last counts, and a step an earlier take gave is not given again. Once ``limit`` vectors wait untaken (a
    view that stopped refreshing while training goes on), ``put`` calls ``on_full()`` instead, which must take them:
    memory stays bounded and no step is dropped, so no spike or NaN goes missing. On CuPy a vector may be a function
    that waits for its asynchronous copy; ``take`` resolves it. Takes must not run concurrently (views take under
    their data lock).

    On the host a small tensor is cheaper to copy than to summarise: ``put_tensor(step, x)`` copies ``x`` into a
    block of rows, and a full block (or a take, or a ``put``, which keeps the order) turns into vectors with one
    ``stats_rows`` call, so four reductions serve many calls (``batches`` says which tensors the plan sends this
    way); the block's vectors wait as one entry, and ``len`` and ``limit`` count their rows. With compiled kernels
    (``runtime.jit``) a float32 tensor of any size is summarised at once instead, in one pass written straight into
    a block of statistics rows by a kernel that holds the interpreter lock (``put_summary``,
    ``ops.stats.stats_block``): no statistics op in the plan, no lock taken, no copy to keep but a small tensor's
    last one (for ``latest``), and no array or entry a call. A take closes the block it hands over (a put on its
    way to it writes to the next one instead).

    A single number a step (``TrainingProgress``'s loss) goes in with ``put_value(step, value)``: one list extend by
    the pair, lock-free, and the pairs waiting become vectors in one vectorised pass when something else is put or
    at the next take (a take of ~1,400 steps put as 6-tuples cost ~1 ms, as pairs ~0.1 ms).
    """

    # A block stays in cache while it fills. Below 16 rows the copies cost what they save: four reductions over a
    # tensor of 12,800 float32 take ~5 µs of memory traffic either way, while a 1,000-element tensor's ~8 µs of
    # per-call overhead drops to ~3 µs with the copy (2-core VM).
    BLOCK_BYTES = 256 << 10
    MIN_ROWS, MAX_ROWS = 16, 1024

    def __init__(self, on_put, on_full, limit=4096):
        self._items = collections.deque()    # (step, vector) of a put, or (steps list, (n, 6) array) of a block
        self._chunk_rows = 0          # rows waiting in block entries beyond one an entry (under the block lock)
        self._on_put, self._on_full, self._limit = on_put, on_full, limit
        self._taken = True
        self._given = None           # the last step a take gave
        self._block = None           # put_tensor's copies (without compiled kernels)
        self._rows = 0               # the block's filled rows, and their steps
        self._steps = np.empty(self.MAX_ROWS, np.int64)
        self._pairs = []             # put_value's (step, value, step, value, ...), newer than every other row
        self._latest = None          # (step, flat copy, shape) of the last put_tensor of a small tensor
        # (compiled kernels) put_summary's block of statistics rows (``ops.stats.stats_block``), its writer, and the
        # copy of a small tensor kept for ``latest`` (empty for a large one), with its shape
        self._stats = None
        self._write = self._copy = self._copy_shape = None
        self._summary_of = None      # the size the writer and the copy are for; None while put_tensor's copies wait
        self._block_lock = threading.Lock()

    @property
    def limit(self):
        return self._limit

    @limit.setter
    def limit(self, limit):
        self._limit = limit
        stats = self._stats
        if stats is not None:               # the rows put_summary's block takes (puts read it there)
            stats[TAKES] = min(self.MAX_ROWS, limit)

    @classmethod
    def batches(cls, tensor):
        """Whether a plan on the host should ``put_tensor`` this (lazy) tensor rather than put its statistics: a
        small float one (copied), or with compiled kernels any float32 one (summarised at once)."""
        if tensor.dtype == np.float32 and jit.enabled():
            return True
        return tensor.dtype in (np.float32, np.float64) and cls._copied(int(np.prod(tensor.shape)),
                                                                          tensor.dtype.itemsize)

    @classmethod
    def _copied(cls, size, itemsize):
        return 0 < size * itemsize * cls.MIN_ROWS <= cls.BLOCK_BYTES

    def _stats_rows(self):
        """Rows written in put_summary's block (none without one)."""
        stats = self._stats
        return 0 if stats is None else int(stats[WRITTEN])

    def put(self, step, vector):
        if self._rows or self._pairs or self._stats_rows():     # rows kept go first: the feed stays in order
            with self._block_lock:
                self._summarise_block()
        items = self._items
        items.append((step, vector))
        self._wake(len(items) + self._chunk_rows)

    def _wake(self, waiting):
        if self._taken:             # the first put since a take: wake the consumer
            self._taken = False
            self._on_put()
        elif waiting >= self._limit:
            self._on_full()

    def put_for(self, tensor):
        """The put a plan on the host calls every step with (lazy) ``tensor``'s value, a tensor that ``batches``:
        ``put_summary`` for a float32 one with compiled kernels, ``put_tensor`` otherwise."""
        return self.put_summary if tensor.dtype == np.float32 and jit.enabled() else self.put_tensor

    def put_tensor(self, step, x):
        """Keep a copy of host array ``x`` (the plan may overwrite it) to summarise later with others; with compiled
        kernels a float32 ``x`` is summarised now (``put_summary``). A large ``x`` (a plan compiled with kernels, run
        without) is summarised now by NumPy."""
        if x.dtype == np.float32 and jit.enabled():
            self.put_summary(step, x)
            return
        if not self._copied(x.size, x.dtype.itemsize):
            self.put(step, stats_vector(np, x))
            return
        with self._block_lock:
            self._summary_of = None              # put_summary's next call hands these copies over first
            if self._pairs or self._stats_rows():
                self._summarise_block()
            block = self._block
            if block is None or block.shape[1] != x.size or block.dtype != x.dtype:
                self._summarise_block()          # a new shape (the job compiled for other arguments)
                rows = min(self.MAX_ROWS, max(self.MIN_ROWS, self.BLOCK_BYTES // (x.size * x.dtype.itemsize)))
                block = self._block = np.empty((rows, x.size), x.dtype)
            at = self._rows
            row = block[at]
            row[...] = x.reshape(-1)
            self._latest = (step, row, x.shape)
            self._steps[at] = step
            self._rows = at + 1
            if at + 1 == len(block):
                self._summarise_block()
            waiting = len(self._items) + self._chunk_rows
        self._wake(waiting)

    def put_summary(self, step, x):
        """``put_tensor`` of a float32 ``x`` with compiled kernels: ``x``'s statistics written as the next row of a
        block (``ops.stats.stats_block``), with its step, and a small ``x`` copied for ``latest``, in one compiled
        call that holds the interpreter lock (``ops.stats.stats_row_writer``): no lock and no bookkeeping in Python
        while nothing else is due. A watched step's hot path (``put_for``): in the README MLP's loop its two puts
        cost 4.9 µs a step, against 7.2 with a lock and the bookkeeping around a lock-free kernel."""
        if self._summary_of == x.size and not self._pairs and jit.enabled():
            result = self._write(x.ravel(), self._stats, step, self._copy)
            if not result:
                return
        else:
            result = None
        self._put_summary_slowly(step, x, result)

    def _put_summary_slowly(self, step, x, result):
        """What ``put_summary``'s one call left: getting ready (the first put, a new size, older rows or values to
        hand over first, inside ``jit.using(False)``), a NaN/Inf or empty tensor (the NumPy path's masked form), a
        block full or closed by a take, or the consumer to wake."""
        if not jit.enabled():                   # inside ``jit.using(False)``
            self.put_tensor(step, x)
            return
        with self._block_lock:
            while result is None or result & (PUT_NONFINITE | PUT_RETRY):
                if result is None or result & PUT_RETRY:
                    self._ready_for_summary(x)
                    result = self._write(x.ravel(), self._stats, step, self._copy)
                else:                                   # NaN/Inf, or empty: the NumPy path's masked form
                    result = put_stats_row.ready()(self._stats, step, stats_vector(np, x))
            if result & PUT_FULL:
                self._hand_over_stats()
            full = len(self._items) + self._chunk_rows >= self._limit
        if result & PUT_WAKE:
            self._taken = False
            self._on_put()
        elif full:
            self._on_full()

    def _ready_for_summary(self, x):
        """Ready put_summary's block, writer and copy for ``x`` (under the block lock): older rows and values handed
        over first, a block that has room, and the writer and copy sized for ``x`` (a job compiled for other
        arguments changes them)."""
        if self._rows or self._pairs:
            self._summarise_block()             # put_tensor's copies and put_value's values are older
        if self._stats is None:
            self._stats = stats_block(self.MAX_ROWS, self._limit)
            self._stats[WAKE] = float(self._taken)      # no take yet: the first row wakes the consumer
        elif self._stats[WRITTEN] >= self._stats[TAKES]:
            self._hand_over_stats()             # full (a put from another thread, or a lower limit)
        kept = x.size if self._copied(x.size, 4) else 0
        if self._copy is None or self._copy.size != kept:
            self._copy = np.empty(kept, np.float32)
        if self._summary_of != x.size:
            self._write = stats_row_writer(x.size)
            self._summary_of = x.size
        self._copy_shape = x.shape

    def _hand_over_stats(self, wake=False):
        """put_summary's block, when it holds rows, becomes an entry of ``_items``, and a fresh block takes its place
        (``wake``: the first put into it wakes the consumer). Closing the old block (one atomic kernel) tells a put
        on its way to it to retry; the rows it counts are all it will ever hold. Under the block lock."""
        stats = self._stats
        if stats is None:
            return
        if not stats[WRITTEN]:
            if wake:
                stats[WAKE] = 1.0
            return
        fresh = stats_block(self.MAX_ROWS, self._limit)
        n = close_stats_block.ready()(stats, fresh, wake)
        self._stats = fresh
        steps, rows = stats_block_rows(stats, n)
        self._chunk_rows += n - 1
        self._items.append((steps, rows))

    def put_value(self, step, value):
        """One number (a float) for step ``step``: its stats_vector is ``[v, v, v, 0, 0, 0]``, or for a NaN (Inf)
        ``[nan, nan, nan, nan, 1, 0]`` (``[..., 0, 1]``), built with those of the steps around it later. Any thread;
        the cheapest put: no lock (a list's ``extend`` is atomic, and only takes, under the block lock, remove the
        pairs from the front)."""
        if self._rows or self._stats is not None and self._stats[WRITTEN]:     # rows kept go first
            with self._block_lock:
                self._summarise_block()
        pairs = self._pairs
        pairs.extend((step, value))
        if self._taken:
            self._taken = False
            self._on_put()
        elif len(pairs) // 2 + len(self._items) + self._chunk_rows >= self._limit:
            self._on_full()

    def _summarise_pairs(self):
        """put_value's pairs waiting become one entry of vectors (under the block lock)."""
        pairs = self._pairs
        n = len(pairs)                  # even: a pair is put in one atomic extend
        taken = pairs[:n]
        del pairs[:n]                   # pairs put meanwhile stay (they lie after the first n)
        steps = np.array(taken[0::2], np.int64)
        self._chunk_rows += len(steps) - 1
        self._items.append((steps, self._value_rows(taken[1::2])))

    @staticmethod
    def _value_rows(values):
        """``put_value``'s numbers as an ``(n, 6)`` float64 array of stats_vector rows, in one pass."""
        v = np.array(values, np.float64)
        rows = np.empty((len(v), 6))
        finite = np.isfinite(v)
        if finite.all():
            rows[:, :3] = v[:, None]
            rows[:, 3:] = 0.0
            return rows
        rows[:, :4] = np.where(finite, 0.0, np.nan)[:, None]
        rows[:, :3] += np.where(finite, v, 0.0)[:, None]
        rows[:, 4] = np.isnan(v)
        rows[:, 5] = np.isinf(v)
        return rows

    def latest(self):
        """``(step, copy)`` of the last small tensor ``put_tensor`` or ``put_summary`` kept (its row stays in the
        block, or its copy kept, until the next put writes over it), or None: a view shows the last step's histogram
        from it at the end of a run, when the plan's on-demand histogram is older (any thread)."""
        with self._block_lock:
            if self._summary_of is None:
                if self._latest is None:
                    return None
                step, row, shape = self._latest
                return step, row.reshape(shape).copy()
            if not self._copy.size:
                return None
            while True:             # put_summary writes the copy without the lock: read until no put came between
                step = self._stats[COPIED]
                if step < 0:
                    return None
                value = self._copy.reshape(self._copy_shape).copy()
                if self._stats[COPIED] == step:
                    return int(step), value

    def _summarise_block(self, wake=False):
        """The filled rows of put_tensor's block or put_summary's, then put_value's pairs (newer), become entries of
        vectors (under the block lock); ``wake``: a take's, after which the next put wakes the consumer."""
        n = self._rows
        if n:
            # one entry for the block: a take joins arrays, where a tuple a row cost it ~20 µs per 1,000 rows
            self._chunk_rows += n - 1
            self._items.append((self._steps[:n].copy(), stats_rows(self._block[:n])))
            self._rows = 0
        self._hand_over_stats(wake)
        if self._pairs:
            self._summarise_pairs()

    def take(self, arrays=False):
        """See the class docstring; ``arrays``: the steps as an int64 array, not a list (a view that hands them to
        NumPy saves converting them back)."""
        self._taken = True          # before counting: a put that lands after the count sees it and wakes us again
        if self._block is not None or self._pairs or self._stats is not None:
            with self._block_lock:
                self._summarise_block(wake=True)
        items, taken = self._items, []
        for _ in range(len(items)):          # popleft is atomic: puts may go on meanwhile
            taken.append(items.popleft())
        if not taken:
            return ([] if not arrays else np.empty(0, np.int64)), None
        steps, vectors = zip(*taken)
        if np.ndarray in map(type, steps):   # some blocks of rows (put_tensor, put_value) among them
            at, vectors = self._join(taken)
        else:
            at, vectors = np.array(steps, np.int64), self._vectors(vectors)
        # one row a step: of consecutive rows of one step the last, and none of the step the last take gave
        keep = np.empty(len(at), bool)
        np.not_equal(at[1:], at[:-1], out=keep[:-1])
        keep[-1] = True
        if self._given is not None:
            keep &= at != self._given
        if not keep.all():
            if not keep.any():
                return ([] if not arrays else np.empty(0, np.int64)), None
            at, vectors = at[keep], vectors[keep]
        self._given = int(at[-1])
        return (at if arrays else at.tolist()), np.asarray(vectors, np.float64)

    def _join(self, taken):
        """The steps (int64) and the rows of entries holding blocks (and perhaps single puts), in order."""
        steps, parts, single_steps, singles, chunk_rows = [], [], [], [], 0
        for step, vector in taken:
            if type(step) is np.ndarray:
                if singles:
                    steps.append(np.array(single_steps, np.int64))
                    parts.append(self._vectors(singles))
                    single_steps, singles = [], []
                steps.append(step)
                parts.append(vector)
                chunk_rows += len(step) - 1
            else:
                single_steps.append(step)
                singles.append(vector)
        if singles:
            steps.append(np.array(single_steps, np.int64))
            parts.append(self._vectors(singles))
        with self._block_lock:
            self._chunk_rows -= chunk_rows
        if len(parts) == 1:
            return steps[0], parts[0]
        return np.concatenate(steps), np.concatenate(parts)

    @staticmethod
    def _vectors(vectors):
        """Single puts' vectors as an (n, 6) float64 array: host arrays joined in one call (a take of ~750 is then
        ~90 µs, not ~250), anything else (tuples, CuPy copies to wait for) row by row."""
        if set(map(type, vectors)) == {np.ndarray}:
            return np.concatenate(vectors).astype(np.float64, copy=False).reshape(-1, 6)
        return np.array([v() if callable(v) else v for v in vectors], dtype=np.float64).reshape(-1, 6)

    def __len__(self):
        return len(self._items) + self._chunk_rows + self._rows + self._stats_rows() + len(self._pairs) // 2


@dataclass
class WatchRequest:
    tensor: g.LazyTensor          # the watched forward tensor
    diff: bool                    # deliver its gradient instead of its value
    call: Callable[[Any, int], None]   # (host value, step) -> runs the user's handler
    describe: str                 # for error messages
    stats: bool = False
    every: int = 1
    source: str = ""
    when: Callable[[], bool] | None = None   # deliver only on calls where this returns True
    bins: int = 0                 # > 0: deliver a histogram of that many bins instead of the value
    inline: bool = False          # a summary for a watch_summary handler: delivered by the calling thread on NumPy
    feed: StatsFeed | None = None  # statistics go to this feed (see StatsFeed), not to ``call``
    target: g.LazyTensor | None = None   # what the plan delivers (value, gradient or stats), set at compile time
    put: Callable[[int, Any], None] | None = None   # the feed's put or put_tensor for ``target``, set with it
    optional: bool = False        # a watch_scope gradient: skipped, not an error, when the tensor has none
    after_run: Callable[[], list] | None = None   # run on the job's thread once the plan has run (ran or failed);
    #                               returns ``[(call, describe), ...]`` for the dispatcher (watch_health's reports)


# ------------------------------------------------------------------------------------------------------ handlers

def _converter(handler, api):
    """Check a handler when the job is defined; return a function turning a host array into its argument."""
    if not callable(handler):
        raise TypeError(f"{api}: handler must be callable (or a prompt string / None to print), got {handler!r}")
    try:
        params = list(inspect.signature(handler, eval_str=True).parameters.values())
    except (TypeError, ValueError):
        return lambda value: value            # builtins such as print: give the plain value
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if len(required) > 1:
        raise TypeError(f"{api}: handler {_name(handler)} must take one argument (the watched value); it requires "
                        f"{len(required)}: {', '.join(p.name for p in required)}")
    if not positional and not any(p.kind == p.VAR_POSITIONAL for p in params):
        raise TypeError(f"{api}: handler {_name(handler)} must take one argument (the watched value); it takes none")
    annotation = positional[0].annotation if positional else NO_ANNOTATION
    if annotation is TensorStats:
        annotation = NO_ANNOTATION
    convert = converter(annotation, f"{api}: handler {_name(handler)} annotates its argument as {annotation!r}")
    if convert is to_blob:          # statistics (stats=True) reach an unannotated handler as they are
        return lambda value: value if isinstance(value, TensorStats) else to_blob(value)
    return convert


def _name(handler):
    return getattr(handler, "__qualname__", None) or repr(handler)


def _printer(prompt):
    def show(value):
        print(value if not prompt else f"{prompt} {value}")
    return show


def _handler_call(handler, api, tensor, diff):
    if handler is None or isinstance(handler, str):
        show = _printer(handler)
        return lambda value, step: show(value), f"print ({handler!r})"
    if hasattr(handler, "watch_event"):
        # Live panels want to know what they are shown: the tensor, value or gradient, and the call number.
        blob_def, kind = BlobDef(tensor), ("gradient" if diff else "value")
        return lambda value, step: handler.watch_event(to_numpy(value), blob_def, kind, step), _name(type(handler))
    convert = _converter(handler, api)
    return lambda value, step: handler(convert(value)), _name(handler)


def _summary_plan(handler, api, tensor, diff):
    """``(bins, wanted, feed or None)`` from a handler's ``watch_summary``, checked; None for handlers that take
    whole values."""
    summary = getattr(handler, "watch_summary", None)
    if summary is None:
        return None
    plan = summary(BlobDef(tensor), "gradient" if diff else "value")
    expected = "(bins: int >= 0, wanted: callable[, feed: StatsFeed])"
    if not isinstance(plan, tuple) or len(plan) not in (2, 3):
        raise TypeError(f"{api}: {_name(type(handler))}.watch_summary must return {expected}, got {plan!r}")
    bins, wanted, feed = plan if len(plan) == 3 else (*plan, None)
    if not isinstance(bins, int) or isinstance(bins, bool) or bins < 0 or not callable(wanted) or \
            not (feed is None or isinstance(feed, StatsFeed)):
        raise TypeError(f"{api}: {_name(type(handler))}.watch_summary must return {expected}, got {plan!r}")
    return bins, wanted, feed


def _check_tensor(tensor, api):
    graph = g.current_graph(api)
    if not isinstance(tensor, g.LazyTensor):
        raise TypeError(f"{api}: expects a tensor of the job being traced, got {type(tensor).__name__}")
    if tensor.graph is not graph:
        raise TraceError(f"{api}: tensor {tensor.logical_blob_name} belongs to job {tensor.graph.name!r}, not to "
                         f"job {graph.name!r} being traced")
    return graph


def _check_options(api, stats, every):
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ValueError(f"{api}: every must be a positive int, got {every!r}")
    if not isinstance(stats, bool):
        raise TypeError(f"{api}: stats must be True or False, got {stats!r}")


def _watch(tensor, handler, stats, every, diff):
    api = "flow.watch_diff" if diff else "flow.watch"
    graph = _check_tensor(tensor, api)
    _check_options(api, stats, every)
    if diff and not graph.is_train:
        raise TraceError(f"{api}({tensor.logical_blob_name}): job {graph.name!r} is a predict job and computes no "
                         "gradients; watch gradients in a @flow.global_function(type=\"train\") job")
    call, name = _handler_call(handler, api, tensor, diff)
    what = "gradient of" if diff else "value of"
    describe = f"{api} handler {name} for the {what} {tensor.logical_blob_name}"
    source = g.user_source_line()
    summary = None if stats else _summary_plan(handler, api, tensor, diff)
    if summary is None:
        graph.watches.append(WatchRequest(tensor, diff, call, describe, stats, every, source))
        return
    bins, wanted, feed = summary
    graph.watches.append(WatchRequest(tensor, diff, call, describe, True, every, source, inline=True, feed=feed))
    if bins:
        graph.watches.append(WatchRequest(tensor, diff, call, describe, False, every, source, when=wanted, bins=bins,
                                          inline=True))


def watch(blob_watched, handler_or_prompt=None, stats=False, every=1):
    """Deliver the value of ``blob_watched`` to ``handler_or_prompt`` on each call (or print it with that prompt)."""
    _watch(blob_watched, handler_or_prompt, stats, every, diff=False)


def watch_diff(blob_watched, handler_or_prompt=None, stats=False, every=1):
    """Deliver the gradient of ``blob_watched`` (of the loss being minimised) on each call of a train job.

    Differs from OneFlow: watching the gradient of a tensor the loss does not depend on is an error naming it
    (OneFlow skipped such a watch silently).
    """
    _watch(blob_watched, handler_or_prompt, stats, every, diff=True)


def _scope_call(watcher, api):
    """A watch_scope target: a dict filled with ``lbn -> {"blob", "blob_def"}`` or a callable ``(blob, blob_def)``."""
    if isinstance(watcher, dict):
        def make(tensor):
            blob_def = BlobDef(tensor)

            def store(value, step):
                watcher[blob_def.logical_blob_name] = {"blob": to_blob(value), "blob_def": blob_def}
            return store
        return make, "dict"
    if callable(watcher):
        try:
            required = [p for p in inspect.signature(watcher).parameters.values()
                        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):
            required = [None, None]
        if len(required) > 2:
            raise TypeError(f"{api}: a callable watcher takes (blob, blob_def); {_name(watcher)} requires "
                            f"{len(required)} arguments")

        def make(tensor):
            blob_def = BlobDef(tensor)
            return lambda value, step: watcher(to_blob(value), blob_def)
        return make, _name(watcher)
    raise TypeError(f"{api}: expected a dict, a callable (blob, blob_def) or None, got {type(watcher).__name__}")


@contextlib.contextmanager
def watch_scope(blob_watcher=None, diff_blob_watcher=None):
    """Watch every tensor created inside the block (variables included): values to ``blob_watcher``, gradients to
    ``diff_blob_watcher``; each is a dict (``lbn -> {"blob": ..., "blob_def": ...}``) or a callable
    ``(blob, blob_def)``. Tensors without a gradient (integer ones, those the loss does not depend on) are only
    value-watched."""
    api = "flow.watch_scope"
    graph = g.current_graph(api)
    value_make = _scope_call(blob_watcher, api) if blob_watcher is not None else None
    diff_make = _scope_call(diff_blob_watcher, api) if diff_blob_watcher is not None else None
    if diff_make is not None and not graph.is_train:
        raise TraceError(f"{api}: diff_blob_watcher needs a train job; job {graph.name!r} is a predict job")
    first = len(graph.nodes)
    source = g.user_source_line()
    yield
    for node in graph.nodes[first:]:
        for tensor in node.outputs:
            if value_make is not None:
                make, name = value_make
                graph.watches.append(WatchRequest(tensor, False, make(tensor), f"{api} {name} for the value of "
                                                  f"{tensor.logical_blob_name}", source=source))
            if diff_make is not None and tensor.dtype.kind == "f":
                make, name = diff_make
                # scope members without a gradient are skipped, not errors
                graph.watches.append(WatchRequest(tensor, True, make(tensor), f"{api} {name} for the gradient of "
                                                  f"{tensor.logical_blob_name}", source=source, optional=True))


def gradient_targets(graph):
    """Forward tensors whose gradients watches need (passed to autodiff beside the variables)."""
    return [r.tensor for r in graph.watches if r.diff]
