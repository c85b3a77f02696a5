"""A plan replayed as one CUDA graph (CuPy): one launch a call instead of one per kernel.

On a GPU a small step is bound by the host: the seed MLP's ~60 kernels cost ~1.5 ms of Python and launch overhead
for ~0.12 ms of GPU work (``benchmarks/gpu_steady.py``). A plan that runs the same kernels on the same memory every
call is captured once and then replayed with a single launch.

- Call 1 runs eagerly (kernels compile, cuBLAS picks its algorithms, caches fill); call 2 captures the plan on a
  side stream and launches the graph; later calls copy their feeds into the graph's input buffers, launch it and
  copy the outputs to the host.
- Memory: what the plan allocates while being captured comes from a memory pool of the graph's own, kept as long as
  the graph, so no other array can ever be given memory that a replay writes. Variables are read and updated where
  they live; scratch buffers and constants belong to the plan.
- What a capture freezes is checked on every call: the ops' host arguments (``Op.host_args``: a learning rate of
  a schedule, Adam's step) and which array each variable holds (a checkpoint load may replace it). A change means a
  new capture; a plan that needs three captures within ``UNSTABLE_CALLS`` calls runs eagerly from then on.
- Watch deliveries are copied to pinned host memory inside the graph (see ``GraphReplay``); watch statistics (small
  float64 vectors: ``watch(stats=True)``, live panels, ``watch_health``) are copied out together at the graph's end.
- A plan that cannot be captured (an op that reads device values on the host, which a capture forbids) runs
  eagerly, and says why in ``print(plan)``.

``FLOWLAB_CUDA_GRAPHS=0`` turns replay off (every call eager).
"""
from __future__ import annotations

import collections
import functools
import logging
import os
import threading

import numpy as np

log = logging.getLogger("flowlab")

UNSTABLE_CALLS = 50     # three captures within this many calls: the plan changes too often to replay


def enabled() -> bool:
    return os.environ.get("FLOWLAB_CUDA_GRAPHS", "1") != "0"


class HostCopy:
    """A delivery of one replay: calling it waits for the launch and returns a host copy of the pinned buffer (the
    same array on every call). Thread-safe: a live view's thread may take it while the job's thread does."""
    __slots__ = ("_launched", "_pinned", "_value", "_lock")

    def __init__(self, launched, pinned):
        self._launched, self._pinned, self._value = launched, pinned, None
        self._lock = threading.Lock()

    def __call__(self):
        with self._lock:
            if self._value is None:
                self._launched.synchronize()
                self._value, self._pinned = self._pinned.copy(), None
            return self._value


def _part(landing, offset, size):
    """One small vector of a launch's block (a view of the block's host copy, which nothing overwrites)."""
    return landing()[offset:offset + size]


class GraphReplay:
    """Runs one plan: ``replay(run_eager, run_device, feeds, step, emit)``. ``hooks`` are the plan's host-argument
    functions (``step -> dict``), ``variables`` the session variables it reads, ``schedule`` its deliveries' ``(every,
    when, put)``.

    Deliveries: the graph copies every watched tensor into a pinned host buffer of its own, in stream order right
    where the tensor is made (before an update or a later op can change it), and small vectors made for the host
    (statistics, histograms) together at its end (``stage_small``); after a launch each delivery due on this call is handed on (to its ``put``, else to ``emit``) as a ``HostCopy``, a
    function that waits for the graph and returns the buffer's contents. Before the next launch overwrites the
    buffers, every copy not yet taken is taken (by then the graph has long finished: the call's outputs were read).
    """

    def __init__(self, cupy, hooks, variables, schedule=()):
        self.cupy = cupy
        self.hooks = hooks
        self.variables = variables
        self.schedule = schedule
        self._staged = []                             # (delivery index, pinned buffer or stage_small's slot)
        self._small, self._blocks = [], []            # stage_small's vectors while capturing; their pinned blocks
        self._handed = []                             # the HostCopy objects the last launch handed on
        self.calls = 0
        self.captures = collections.deque(maxlen=3)   # call numbers of the latest captures
        self.captured = 0                             # captures in all
        self.off_reason = None                        # why this plan runs eagerly from now on
        self._graph = self._pool = self._outputs = None
        self._inputs = None                           # the graph's feed buffers
        self._frozen = None                           # (host arguments, variable arrays) the graph was captured with

    @property
    def state(self) -> str:
        """One line for ``print(plan)``."""
        if self.off_reason:
            return f"eager: {self.off_reason}"
        if self._graph is None:
            return "replayed as one CUDA graph from its second call"
        return f"replayed as one CUDA graph (captured {self.captured} time(s))"

    def __call__(self, run_eager, run_device, feeds, step, emit):
        self.calls += 1
        if self.off_reason is not None or self.calls == 1:
            return run_eager(feeds, step, emit)
        try:
            frozen = ([h(step) for h in self.hooks], [v.value for v in self.variables])
            stale = self._graph is None or frozen[0] != self._frozen[0] or \
                any(a is not b for a, b in zip(frozen[1], self._frozen[1]))
        except Exception as e:          # host arguments that cannot be compared (arrays): do not replay
            return self._give_up(f"host arguments not comparable ({type(e).__name__})", run_eager, feeds, step, emit)
        self._load(feeds)
        if stale:
            if len(self.captures) == 3 and self.calls - self.captures[0] < UNSTABLE_CALLS:
                return self._give_up(f"captured 3 times in {self.calls - self.captures[0]} calls (host arguments "
                                     "or variables change from call to call)", run_eager, feeds, step, emit)
            try:
                self._capture(run_device, step)
            except Exception as e:      # an op that synchronises with the host, or anything else capture forbids
                return self._give_up(f"cannot be captured ({type(e).__name__}: {str(e)[:160]})", run_eager,
                                     feeds, step, emit)
            self._frozen = frozen
            self.captures.append(self.calls)
            self.captured += 1
        stream = self.cupy.cuda.get_current_stream()
        for copy in self._handed:           # what the last launch handed on, before this one overwrites it
            copy()
        self._graph.launch(stream=stream)
        if self._staged:
            self._emit_due(emit, step, stream.record())
        return tuple(out.get() for out in self._outputs)

    def _emit_due(self, emit, step, launched):
        handed = self._handed = []
        blocks = {}                             # block index -> its HostCopy, for small vectors
        for k, pinned in self._staged:
            every, when, put = self.schedule[k]
            if step % every == 0 and (when is None or when()):
                if isinstance(pinned, list):        # a part of a block of small vectors
                    block, offset, size = pinned
                    landing = blocks.get(block)
                    if landing is None:
                        landing = blocks[block] = HostCopy(launched, self._blocks[block])
                        handed.append(landing)
                    copy = functools.partial(_part, landing, offset, size)
                else:
                    copy = HostCopy(launched, pinned)
                    handed.append(copy)
                if put is not None:
                    put(step, copy)
                else:
                    emit(k, copy, step)

    def stage(self, array):
        """(While capturing) copy ``array`` to a new pinned buffer in stream order; returns the buffer."""
        import cupyx
        source = array if array.flags.c_contiguous else self.cupy.ascontiguousarray(array)
        pinned = cupyx.empty_pinned(array.shape, array.dtype)
        self._copy_to_host(pinned, source.data.ptr, source.nbytes)
        return pinned

    def stage_small(self, array):
        """(While capturing) a small float64 vector made for the host alone (statistics, a histogram) that nothing
        changes later in the plan: copied out at the end of the capture (``_land_small``), with one copy for all the
        vectors that share one allocation (``ops.stats.Results``); returns its slot ``[block, offset, size]``,
        filled then."""
        if array.dtype != np.float64 or array.ndim != 1 or not array.flags.c_contiguous:
            return self.stage(array)
        slot = [None, None, array.size]
        self._small.append((array, slot))    # (kept alive until copied: its memory cannot be given to another)
        return slot

    def _land_small(self):
        """Copy ``stage_small``'s vectors to pinned blocks: one copy an allocation, spanning its vectors."""
        if not self._small:
            return
        import cupyx
        groups = {}
        for array, slot in self._small:
            groups.setdefault(id(array.data.mem), []).append((array, slot))
        for members in groups.values():
            start = min(array.data.ptr for array, _ in members)
            end = max(array.data.ptr + array.nbytes for array, _ in members)
            block = cupyx.empty_pinned((end - start) // 8, np.float64)
            self._copy_to_host(block, start, end - start)
            self._blocks.append(block)
            for array, slot in members:
                slot[0], slot[1] = len(self._blocks) - 1, (array.data.ptr - start) // 8
        self._small = []

    def _copy_to_host(self, pinned, device_pointer, nbytes):
        # the runtime's copy itself: ndarray.get would also record events for CuPy's pinned pool to watch
        runtime = self.cupy.cuda.runtime
        runtime.memcpyAsync(pinned.ctypes.data, device_pointer, nbytes, runtime.memcpyDeviceToHost,
                            self.cupy.cuda.get_current_stream().ptr)

    def stage_histogram(self, array, bins):
        from ..ops.stats import histogram_vector
        return self.stage_small(histogram_vector(self.cupy, array, bins))

    def _load(self, feeds):
        """Copy this call's feeds into the graph's input buffers (stream-ordered after the previous replay)."""
        cupy = self.cupy
        if self._inputs is None:
            self._inputs = [cupy.empty(np.shape(f), f.dtype) for f in feeds]
        for buffer, feed in zip(self._inputs, feeds):
            if isinstance(feed, np.ndarray):      # (np.ascontiguousarray would make a 0-d feed 1-d)
                buffer.set(feed if feed.flags.c_contiguous else np.ascontiguousarray(feed))
            else:
                cupy.copyto(buffer, feed)

    def _drop(self):
        """Let the graph go, and its memory and pinned buffers with it."""
        for copy in self._handed:
            copy()
        self._graph = self._pool = self._outputs = None
        self._staged, self._handed, self._blocks = [], [], []

    def _capture(self, run_device, step):
        cupy = self.cupy
        self._drop()
        # Nothing captured runs before the launch on the current stream, which orders it after the feeds' copies.
        pool, stream = cupy.cuda.MemoryPool(), cupy.cuda.Stream(non_blocking=True)
        with cupy.cuda.using_allocator(pool.malloc), stream:
            stream.begin_capture()
            staged, self._small = [], []
            try:
                outputs = run_device(self._inputs, step, lambda k, pinned, step: staged.append((k, pinned)))
                self._land_small()
            except BaseException:
                self._small = []
                try:
                    stream.end_capture()
                except Exception:       # the capture was invalidated by what failed: nothing to keep
                    pass
                raise
            graph = stream.end_capture()
        self._graph, self._pool, self._outputs, self._staged = graph, pool, outputs, staged

    def _give_up(self, reason, run_eager, feeds, step, emit):
        self.off_reason = reason
        self._drop()
        self._inputs = None
        log.debug("flowlab: a plan runs eagerly: %s", reason)
        return run_eager(feeds, step, emit)
