"""Several logical devices on one machine: ``flow.config.gpu_device_num(n)`` / ``cpu_device_num(n)``.

Data parallelism, as OneFlow runs both of its logical views on one machine:

- **Replicas.** A job is traced once per distinct per-device shape and compiled into one plan per device: the same
  generated code with its own buffers and random stream (``compiler.Plan(..., replica=...)``). Every replica reads
  the session's variables; on the CPU they share the very arrays.
- **Gradients.** Right before the first update a train plan calls ``all_reduce`` with the model gradients the
  updates read: replica 0 waits for every replica's gradients, averages them and alone runs the updates; the other
  replicas skip the updates and wait until they are done (``release``). The update scales by ``1 / loss.size`` of
  the per-device loss, so n devices on a batch train exactly as one device on the whole batch.
- **Feeds and results** are split and joined here and nowhere else: ``split_feeds`` gives each device its piece
  (a ``tp.Numpy`` argument is split along axis 0, a ``tp.ListNumpy`` argument is a list with one array a device),
  ``join`` turns the per-device pieces of a returned or watched tensor into a ``DeviceValues``: ``pieces`` (what
  ``tp.ListNumpy`` gives: one array a device under the mirrored view, ``[whole]`` under the consistent view, as in
  OneFlow) and ``whole`` (what ``tp.Numpy`` gives: the logical value under the consistent view, the pieces
  concatenated under the mirrored view).
- **Consistent view.** How the pieces of a tensor make the logical value follows from how it depends on the split
  batch (``join_kinds``): along the batch axis they are concatenated; reductions over it (a mean loss) are averaged,
  summed or maxed, so a scalar mean loss comes out as on one device; values of variables alone are taken from
  device 0. A loss summed over the batch has its gradients summed instead of averaged, as OneFlow's consistent view.
  Where the job itself needs the logical value of such a reduction (``x / reduce_sum(x)``), the trace puts an
  all-reduce before that op (``ops.placement.box_partials``; ``combine`` below exchanges the values).
- **Data ops** in the job (readers, seeded random sources) make one batch a call for all devices and hand each its
  rows (``BatchShares``), so n devices read exactly what one device reads.
- **Execution.** CPU: the replicas are threads of this process (NumPy releases the GIL in BLAS and in its loops).
  GPU: replica k runs on GPU k with copies of the variables, broadcast from GPU 0 with NCCL at the start of each
  call; gradients are reduced to GPU 0 with NCCL (``cupy.cuda.nccl``).

With one device none of this runs: the job calls its one plan exactly as before.
"""
from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, NamedTuple

import numpy as np

from ..errors import DeviceError, FeedError, TraceError

# ----------------------------------------------------------------------------------------------------- feeds


def split_feeds(job_name, arg_names, arg_defs, values, n, check):
    """The feeds of each of ``n`` devices: a list of ``n`` lists of arrays. ``check(where, arg_def, array)`` checks
    one array against its placeholder (the per-device shape for ``tp.ListNumpy``, the whole for ``tp.Numpy``)."""
    per_device = [[] for _ in range(n)]
    for name, d, value in zip(arg_names, arg_defs, values):
        where = f"job {job_name} argument {name!r}"
        if d.dynamic:
            if not isinstance(value, (list, tuple)) or len(value) != n:
                got = type(value).__name__ + (f" of length {len(value)}" if isinstance(value, (list, tuple)) else "")
                raise FeedError(f"{where}: expected a list of {n} numpy.ndarray, one for each of the {n} devices "
                                f"(tp.ListNumpy; flow.config set {n} devices), got {got}")
            pieces = [check(f"{where} (piece {i})", d, piece) for i, piece in enumerate(value)]
        else:
            whole = check(where, d, value)
            if whole.ndim == 0 or whole.shape[0] % n:
                raise FeedError(f"{where}: the consistent view splits the batch (axis 0) evenly over {n} devices, "
                                f"but shape {whole.shape} has {whole.shape[0] if whole.ndim else 'no'} rows; "
                                f"use a batch size divisible by {n}")
            pieces = np.split(whole, n)
        for feeds, piece in zip(per_device, pieces):
            feeds.append(piece)
    return per_device


# ----------------------------------------------------------------------------------------------------- joins

class DeviceValues:
    """One tensor's host values on every device: ``pieces`` (one array a device under the mirrored view, ``[whole]``
    under the consistent view) and ``whole`` (the logical value; under the mirrored view the pieces concatenated
    along axis 0, or stacked when each is a scalar)."""

    __slots__ = ("pieces", "_whole")

    def __init__(self, pieces, whole=None):
        self.pieces = pieces
        self._whole = whole

    @property
    def whole(self):
        if self._whole is None:
            pieces = self.pieces
            self._whole = pieces[0] if len(pieces) == 1 else \
                np.stack(pieces) if pieces[0].ndim == 0 else np.concatenate(pieces)
        return self._whole

    def __repr__(self):
        return f"DeviceValues({self.pieces!r})"


def join(pieces, kind, view):
    """``DeviceValues`` of one tensor from its per-device host arrays; ``kind`` from ``join_kinds`` (consistent)."""
    if view == "mirrored":
        return DeviceValues(list(pieces))
    if kind == "split":
        whole = np.concatenate(pieces)
    elif kind == "broadcast":
        whole = pieces[0]
    else:
        stacked = np.stack(pieces)
        whole = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[kind](stacked, axis=0)
        whole = np.asarray(whole, dtype=pieces[0].dtype)
    return DeviceValues([whole], whole)


_PARTIAL = ("sum", "mean", "max", "min")


def join_rule(node, kinds):
    """How the per-device values of ``node``'s outputs make its logical value, given its inputs' ``kinds`` (see
    ``join_kinds``); each op says it through its traits (``flowlab.ops.Op``: ``batch_source``, ``partial_join``,
    ``split_join``)."""
    op = node.op
    if op.batch_source:
        return "split"
    if not node.inputs or all(k == "broadcast" for k in kinds):
        return "broadcast"
    if None in kinds:
        return None
    partial = next((k for k in kinds if k in _PARTIAL), None)
    if partial is not None:     # joins through the op only if every other input is the same on all devices
        return op.partial_join(node, kinds, partial) if all(k in (partial, "broadcast") for k in kinds) else None
    return op.split_join(node, kinds)


def join_kinds(graph):
    """For every tensor of ``graph`` traced per device under the consistent view: ``"split"`` (pieces along the
    batch axis: concatenate), ``"broadcast"`` (the same on every device: take one), ``"sum"``/``"mean"``/``"max"``
    (a reduction over the batch: combine) or None (flowlab cannot tell). A gradient of a tensor that is the same on
    every device (a variable's) sums over the batch like the loss: summed for per-example and summed losses,
    averaged for mean losses."""
    kinds = {}
    for node in graph.nodes:
        kind = join_rule(node, [kinds.get(t.id) for t in node.inputs])
        for t in node.outputs:
            kinds[t.id] = kind
    loss_kinds = {kinds.get(loss.id) for _, loss in graph.losses}
    grad_of_broadcast = "mean" if loss_kinds == {"mean"} else "sum" if loss_kinds <= {"split", "sum"} else None
    for forward_id, grad in graph.grad_of.items():
        forward = kinds.get(forward_id)
        kinds[grad.id] = "split" if forward == "split" else grad_of_broadcast if forward == "broadcast" else None
    return kinds


def gradient_mode(graph, view):
    """How replicas combine model gradients: ``"mean"``, or ``"sum"`` for losses summed over the batch under the
    consistent view (their one-device gradient is the sum of the devices')."""
    if view != "consistent" or not graph.losses:
        return "mean"
    kinds = join_kinds(graph)
    return "sum" if all(kinds.get(loss.id) == "sum" for _, loss in graph.losses) else "mean"


def check_joinable(graph, tensors, kinds, n):
    """Under the consistent view every returned or watched tensor, and every loss, must have a join kind: a loss
    flowlab cannot join would train n devices differently from one, silently."""
    losses = {loss.id for _, loss in graph.losses}
    for t in list(tensors) + [loss for _, loss in graph.losses]:
        if kinds.get(t.id) is None:
            what = "the loss " if t.id in losses else ""
            raise TraceError(
                f"job {graph.name}: under the consistent view on {n} devices flowlab cannot tell how the devices' "
                f"values of {what}{t.logical_blob_name} make its logical value (it is neither split along the batch "
                "axis nor a sum, mean, max or min over it; made at "
                f"{t.node.source}); use the mirrored view "
                "(config.default_logical_view(flow.scope.mirrored_view())) to get each device's piece")


# ----------------------------------------------------------------------------------------------------- reduction

class HostReduce:
    """All-reduce between replica threads of one process (CPU). Each replica posts its gradients; replica 0 waits
    for all, combines them and runs the updates; the others wait until replica 0 calls ``release``."""

    def __init__(self, n, mode):
        self.n, self.mode = n, mode
        self._posted = [None] * n
        self._arrived = threading.Barrier(n)
        self._released = threading.Barrier(n)
        self._exchanged = [None] * n        # combine's: one value a device
        self._all_posted = threading.Barrier(n)
        self._all_read = threading.Barrier(n)

    def combine(self, index, array, how):
        """The logical value of a per-device reduction over the batch, on every device (the consistent view's
        boxing, ``ops.placement.AllReduce``): the devices' ``array`` s summed (``how`` "sum"), averaged ("mean") or
        their elementwise "max" / "min". Each device combines the pieces in device order: all get the same bits."""
        self._exchanged[index] = array
        self._all_posted.wait()
        try:
            return combine_pieces(self._exchanged, how)
        finally:
            self._all_read.wait()       # no device posts its next value before every one has read these

    def all_reduce(self, index, arrays, averaged=(), concatenated=()):
        """The combined ``arrays`` (summed, or averaged in ``mode`` "mean"; those at positions ``averaged`` are
        averaged always; those at ``concatenated``, a sparse gradient's rows and ids, are joined along axis 0, the
        rows scaled as a sum's would be) on replica 0; the others get theirs back once replica 0 released them."""
        self._posted[index] = arrays
        self._arrived.wait()
        if index:
            self._released.wait()          # replica 0 reads our gradients and updates the shared variables
            return arrays
        combined = []
        for k, array in enumerate(arrays):
            if k in concatenated:
                total = np.concatenate([posted[k] for posted in self._posted])
            else:
                total = array.copy()
                for other in self._posted[1:]:
                    total += other[k]
            if (self.mode == "mean" or k in averaged) and total.dtype.kind == "f":
                total *= total.dtype.type(1 / self.n)
            combined.append(total)
        return combined

    def release(self, index):
        self._released.wait()

    def prepare(self, index):
        pass

    def _barriers(self):
        return self._arrived, self._released, self._all_posted, self._all_read

    def abort(self):
        for barrier in self._barriers():
            barrier.abort()

    def reset(self):
        for barrier in self._barriers():
            barrier.reset()
        self._posted = [None] * self.n
        self._exchanged = [None] * self.n


def combine_pieces(pieces, how):
    """``pieces`` (one array a device) combined as ``HostReduce.combine`` says, into a new array."""
    total = np.array(pieces[0], copy=True)
    if how in ("max", "min"):
        pick = np.maximum if how == "max" else np.minimum
        for piece in pieces[1:]:
            pick(total, piece, out=total)
        return total
    for piece in pieces[1:]:
        total += piece
    if how == "mean":
        total *= total.dtype.type(1 / len(pieces))
    return total


_NCCL_TYPES = {"float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
               "int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32", "int64": "NCCL_INT64"}


class NcclReduce(HostReduce):
    """GPU k holds replica k. Gradients are reduced onto GPU 0 with NCCL, where replica 0 updates the variables;
    ``prepare`` broadcasts the variables from GPU 0 into each other GPU's copies at the start of every call, so
    values set from the host (initialisation, checkpoint loads) reach every GPU."""

    def __init__(self, n, mode, cupy, mirrors):
        super().__init__(n, mode)
        from cupy.cuda import nccl
        self.cupy, self.nccl = cupy, nccl
        self.comms = nccl.NcclCommunicator.initAll(list(range(n)))
        self.mirrors = mirrors          # per replica: {name: object with .value on that GPU}; replica 0: session's

    def _call(self, index, what, array, out, *args):
        stream = self.cupy.cuda.get_current_stream().ptr
        dtype = getattr(self.nccl, _NCCL_TYPES[array.dtype.name])
        getattr(self.comms[index], what)(array.data.ptr, out.data.ptr, array.size, dtype, *args, stream)

    def prepare(self, index):
        for name in sorted(self.mirrors[index]):
            value = self.mirrors[index][name].value
            self._call(index, "broadcast", value, value, 0)

    def combine(self, index, array, how):
        array = self.cupy.ascontiguousarray(array).reshape(array.shape)     # a 0-d value stays 0-d
        out = self.cupy.empty_like(array)
        op = {"sum": "NCCL_SUM", "mean": "NCCL_SUM", "max": "NCCL_MAX", "min": "NCCL_MIN"}[how]
        self._call(index, "allReduce", array, out, getattr(self.nccl, op))
        if how == "mean":
            out *= out.dtype.type(1 / self.n)
        return out

    def all_reduce(self, index, arrays, averaged=(), concatenated=()):
        self._arrived.wait()
        combined = []
        for k, array in enumerate(arrays):
            if k in concatenated:          # every GPU's rows (ids) one after another: an all-gather
                out = self.cupy.empty((self.n * array.shape[0],) + array.shape[1:], array.dtype)
                self._call(index, "allGather", self.cupy.ascontiguousarray(array), out)
            else:
                out = self.cupy.empty_like(array) if index == 0 else array
                self._call(index, "reduce", array, out, self.nccl.NCCL_SUM, 0)
            if index == 0 and (self.mode == "mean" or k in averaged) and out.dtype.kind == "f":
                out *= out.dtype.type(1 / self.n)
            combined.append(out)
        if index:
            self._released.wait()
            return arrays
        return combined


class Replica(NamedTuple):
    """What makes a ``compiler.Plan`` one replica: its device's index and the reducer all replicas share."""
    index: int
    reducer: Any

    @property
    def count(self) -> int:
        """How many devices run the job."""
        return self.reducer.n


def device_rows(rows, device):
    """The slice of a whole batch of ``rows`` rows that ``device`` (a ``Replica``) holds: its share along axis 0."""
    share = rows // device.count
    return slice(device.index * share, (device.index + 1) * share)


class BatchShares:
    """A batch that a data op (a reader, a seeded random source) makes once a call for all the devices: the first
    device to ask for call ``step`` makes it, each device takes it once (and cuts out its ``device_rows``), the last
    one drops it. So n devices read the very records, in the very order, that one device reads (OneFlow instead
    gives each device its own part files). An error making the batch is raised on every device."""

    def __init__(self):
        self._lock = threading.Lock()
        self._calls = {}        # step -> [batch, error, devices that took it]

    def take(self, step, device, make):
        with self._lock:
            entry = self._calls.get(step)
            if entry is None:
                for old in [s for s in self._calls if s < step]:
                    del self._calls[old]        # left by a call on which a device failed before taking its piece
                try:
                    entry = [make(), None, 0]
                except BaseException as e:      # every device of this call raises it
                    entry = [None, e, 0]
                self._calls[step] = entry
            entry[2] += 1
            if entry[2] == device.count:
                del self._calls[step]
        if entry[1] is not None:
            raise entry[1]
        return entry[0]


class _Mirror:
    """A variable's copy on one GPU; the plan of that GPU's replica reads ``.value``."""
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def gpu_mirrors(cupy, variables, n):
    """Per replica the variables its plan reads: the session's on GPU 0, copies (filled by ``prepare``) elsewhere."""
    count = cupy.cuda.runtime.getDeviceCount()
    if count < n:
        raise DeviceError(f"flow.config set {n} GPUs, but this machine has {count}")
    mirrors = [dict(variables)]
    for k in range(1, n):
        with cupy.cuda.Device(k):
            mirrors.append({name: _Mirror(cupy.empty(v.shape, v.dtype)) for name, v in variables.items()})
    return mirrors


class Replicas:
    """The replica plans of one compiled job signature; ``run`` calls them concurrently, one thread a device."""

    def __init__(self, plans, reducer, gpu=False):
        self.plans = plans
        self.reducer = reducer
        self.gpu = gpu
        self._pool = concurrent.futures.ThreadPoolExecutor(len(plans) - 1, thread_name_prefix="flowlab-device")

    def _run_one(self, index, feeds, step, emit):
        try:
            if self.gpu:
                cupy = self.reducer.cupy
                with cupy.cuda.Device(index):
                    self.reducer.prepare(index)
                    feeds = [cupy.asarray(a) for a in feeds]
                    return self.plans[index](feeds, step, emit)
            return self.plans[index](feeds, step, emit)
        except BaseException:
            self.reducer.abort()            # the others may wait for this replica at the all-reduce
            raise

    def run(self, per_device_feeds, step, emits):
        """Each replica's outputs (host arrays), in device order; the first error of any replica is raised."""
        futures = [self._pool.submit(self._run_one, k, feeds, step, emit)
                   for k, (feeds, emit) in enumerate(zip(per_device_feeds, emits)) if k]
        results, errors = [None] * len(self.plans), []
        try:
            results[0] = self._run_one(0, per_device_feeds[0], step, emits[0])
        except BaseException as e:
            errors.append(e)
        for k, future in enumerate(futures, 1):
            try:
                results[k] = future.result()
            except BaseException as e:
                errors.append(e)
        if errors:
            self.reducer.reset()
            # a replica that only saw another's failure (a broken barrier) does not hide the failure itself
            raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
        return results


__all__ = ["BatchShares", "DeviceValues", "HostReduce", "NcclReduce", "Replica", "Replicas", "check_joinable",
           "combine_pieces", "device_rows", "gpu_mirrors", "gradient_mode", "join", "join_kinds", "join_rule",
           "split_feeds"]
