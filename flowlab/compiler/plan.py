"""Run the passes (``compiler.passes.PASSES``) over a traced graph, turn the node list they leave into one
straight-line Python function, and run it."""
from __future__ import annotations

import functools
import itertools
import linecache
import math
from typing import Any, Callable, NamedTuple

import numpy as np

from ..errors import AnomalyError
from ..ops.stats import histogram_vector, stats_vector
from ..runtime import backend as backend_module
from ..runtime import cuda_graph, host_memory, host_threads
from . import passes
from .replicate import reduce_points

_plan_ids = itertools.count()


def _histogram_to_host(backend, array, bins):
    """``histogram_vector`` of ``array`` computed where it lives, on its way to the host (as
    ``backend.host_copy_async``): a watch ships ``2 + bins`` numbers instead of the tensor."""
    vector = histogram_vector(backend.xp, array, bins)
    return vector if not backend.is_gpu else backend.host_copy_async(vector)


class Delivery(NamedTuple):
    """A watched tensor the plan hands to the host: on calls whose step is a multiple of ``every`` and, with
    ``when``, on which ``when()`` is true; its histogram of ``bins`` bins (computed on the device) instead of it when
    ``bins > 0``; to ``put(step, value)`` (a ``StatsFeed``'s, ``watch_health``'s) instead of ``emit`` when given: on
    the host ``value`` is the tensor itself, which ``put`` must copy if it keeps it; on CuPy a function that waits
    for the copy and returns it."""
    tensor: Any
    every: int = 1
    when: Callable[[], bool] | None = None
    bins: int = 0
    put: Callable[[int, Any], None] | None = None


class Plan:
    """A compiled job. ``plan(feeds, step, emit)`` runs one call and returns the outputs as host NumPy arrays.

    ``deliveries`` is a list of ``Delivery``: right after such a tensor is computed (on the calls it names) the plan
    calls ``emit(k, copy, step)`` with ``k`` its index and ``copy`` a host copy of the tensor or of its histogram (a
    zero-argument function returning it on CuPy, where the copy is asynchronous), or the delivery's ``put(step,
    copy)``. Copies are taken before optimizer updates change variables in place. A plan with no deliveries contains
    no delivery code at all.
    ``check_anomaly`` adds a NaN/Inf check after every op (``config.detect_anomaly(True)``).

    ``rng_seed`` seeds the plan's random generator; ``rng`` instead shares another plan's (a job's two plans, see
    ``due``, draw from one stream). ``buffers_from``: another plan that never runs at the same time as this one,
    whose scratch buffers this one reuses where shape and dtype match (a buffer holds nothing from one call to the
    next: outputs and deliveries are copied or consumed before the call returns), so a job's two plans take one set
    of memory, and caches stay warm when calls alternate between them.

    On CuPy the plan is replayed as one CUDA graph from its second call where it can be (``runtime.cuda_graph``;
    ``replay`` is that ``GraphReplay`` or None, and ``print(plan)`` says which and why).

    ``mixed_precision``: the job asks for auto mixed precision (``compiler.amp``: on CuPy its products compute in
    float16).

    ``replica`` makes the plan one of several data-parallel copies (``runtime.devices.Replica``: its ``index`` and
    a ``reducer`` shared by all, whose ``all_reduce(index, gradients)`` and ``release(index)`` the plan calls where
    ``compiler.replicate`` says); replicas other than 0 skip the updates. Without it the plan is exactly the
    one-device plan.
    """

    def __init__(self, graph, output_tensors, backend, variables, deliveries=(), rng_seed=0, check_anomaly=False,
                 replica=None, rng=None, buffers_from=None, mixed_precision=False):
        self.graph = graph
        self.backend = backend
        self.output_tensors = list(output_tensors)
        self.deliveries = [Delivery(*d) for d in deliveries]
        lowering = passes.run(passes.Lowering(graph, self.output_tensors, self.deliveries, backend, check_anomaly,
                                                   replicated=replica is not None, mixed_precision=mixed_precision))
        self.passes = lowering.log
        self.nodes = lowering.nodes
        self.side = lowering.side
        self._side_starts = lowering.side_starts
        self._side_donatable = lowering.side_donatable
        self._side = host_threads.SideStream(graph.name) if self.side else None
        self.snapshots = lowering.snapshots
        self.replica = replica
        self.buffer_of, buffer_specs, self._last_use = lowering.buffer_of, lowering.buffer_specs, lowering.last_use
        xp = backend.xp
        self.buffers = _scratch(xp, buffer_specs, buffers_from)
        self.rng = rng if rng is not None else backend.random_generator(rng_seed)
        self._schedule = [(d.every, d.when) for d in self.deliveries]
        self.always_due = any(every == 1 and when is None for every, when in self._schedule)
        self.check_anomaly = check_anomaly
        self.largest_gemm = max((n.op.gemm_macs(n) for n in self.nodes if n.op.gemm_macs is not None), default=0)
        # small products run faster on one BLAS thread, above all beside a busy core (see runtime/backend.py)
        self.blas_limit = backend.blas_limit(self.largest_gemm)
        if self.side:
            # two streams of one-core kernels (compiler.side_stream): splitting the forward pass's kernels over the
            # cores as well made it slower (BERT, 2 cores: 9.2 against 7.0 ms; its products hand off more than half
            # of what they compute)
            self.blas_limit = backend_module.one_blas_thread
        if not backend.is_gpu and host_memory.wants_retained_blocks(self._largest_tensor_bytes()):
            host_memory.retain_freed_blocks()    # big per-step temporaries: no page faults each step
        self._hooks, self._variables_read = [], []
        self.source, self._run, self._run_device = self._generate(variables)
        reason = self._not_replayable()
        self.replay = None if reason else cuda_graph.GraphReplay(
            backend.xp, self._hooks, self._variables_read, [(d.every, d.when, d.put) for d in self.deliveries])
        if self.replay is not None:
            self._device_ns["G"] = self.replay
        self._graph_note = reason

    def _largest_tensor_bytes(self):
        return max((math.prod(t.shape) * t.dtype.itemsize for n in self.nodes for t in n.outputs
                    if t.shape is not None and None not in t.shape), default=0)

    @property
    def num_buffers(self):
        return len(self.buffers)

    def _generate(self, variables):
        xp = self.backend.xp
        ns = {"xp": xp, "B": self.buffers, "RNG": self.rng, "D": self.replica, "host": self.backend.to_host_copy,
              "deliver": self.backend.host_copy_async, "check": self._check, "S": self._side}
        # (second stream) the tensors its nodes read that the plan's own thread makes pass through the dict M;
        # its nodes run in groups of consecutive ones, each a function of its own (groups)
        side_reads = {t.id for node in self.nodes if id(node) in self.side for t in node.inputs}
        # (forward branches, side_stream.fork) the tensors the second stream makes that the plan's thread reads: it
        # waits for the group making one where it first reads it, and takes it from M
        main_reads = {t.id for node in self.nodes if id(node) not in self.side for t in node.inputs}
        branch_made = {}                        # tensor id -> the group making it
        waited, taken = set(), set()            # groups waited for, tensor ids taken from M, so far
        groups = []
        delivery_lines, graph_lines = {}, {}
        guards = {}             # tensor id -> the guards of its deliveries
        for k, d in enumerate(self.deliveries):
            conditions = [f"step % {d.every} == 0"] if d.every > 1 else []
            if d.when is not None:
                ns[f"w{k}"] = d.when
                conditions.append(f"w{k}()")
            # on the host an observer's output is a new array every call (nothing can overwrite it) and a put
            # copies what it keeps: no copy needed
            copy = "" if (d.tensor.node.op.observes or d.put) and not self.backend.is_gpu else "deliver"
            if d.bins:
                ns[f"d{k}"] = functools.partial(_histogram_to_host, self.backend, bins=d.bins)
                copy = f"d{k}"
            guard = f"if {' and '.join(conditions)}: " if conditions else ""
            guards.setdefault(d.tensor.id, set()).add(guard)
            value = f"{copy}(t{d.tensor.id})" if copy else f"t{d.tensor.id}"
            if d.put is not None:
                ns[f"p{k}"] = d.put
                line = f"p{k}(step, {value})"
            else:
                line = f"emit({k}, {value}, step)"
            delivery_lines.setdefault(d.tensor.id, []).append(f"    {guard}{line}")
            # the CUDA graph's copy: every delivery, unguarded (the replay decides per call which ones to emit)
            # (statistics and histograms are small vectors made for the host alone: copied out in one block)
            stage = f"G.stage_histogram(t{d.tensor.id}, {d.bins})" if d.bins else \
                f"G.stage_small(t{d.tensor.id})" if d.tensor.node.op.observes else f"G.stage(t{d.tensor.id})"
            graph_lines.setdefault(d.tensor.id, []).append(f"    emit({k}, {stage}, step)")
        lines = [f"def run(feeds, step, emit):  # job {self.graph.name}"]
        if self.side:
            lines.append("    M = {}")
        read = {t.id for node in self.nodes for t in node.inputs} | {t.id for t in self.output_tensors}
        placeholder_index = {t.id: i for i, t in enumerate(self.graph.placeholders)}
        points = reduce_points(self.nodes) if self.replica is not None else None
        if points is not None:
            ns["R"], replica = self.replica.reducer, self.replica.index
        for i, node in enumerate(self.nodes):
            if points is not None:
                lines.extend(_replica_lines(points, i, replica))
                if replica and id(node) in points.first_only:
                    continue
            outs = ", ".join(f"t{t.id}" for t in node.outputs)
            target = f"{outs} = " if node.outputs else ""
            op = node.op
            on_side = id(node) in self.side
            # a group ends where the plan's own thread has a node, and after an update (the next chain is another
            # variable's: a task of its own, which the plan's thread may take at the end, SideStream.join)
            if on_side and (i == 0 or id(self.nodes[i - 1]) not in self.side or
                            self.nodes[i - 1].op.updates_variable or id(node) in self._side_starts):
                groups.append(_Group([], [], []))
                lines.append(f"    S.put(g{len(groups) - 1}, M, step)  # second stream")
            own_lines = groups[-1].lines if on_side else lines
            if on_side:
                groups[-1].reads.extend(t.id for t in node.inputs if t.id not in groups[-1].made)
                groups[-1].made.extend(t.id for t in node.outputs)
                branch_made.update((t.id, len(groups) - 1) for t in node.outputs if t.id in main_reads)
            else:
                for t in node.inputs:
                    if t.id in branch_made and t.id not in taken:
                        j = branch_made[t.id]
                        if j not in waited:
                            lines.append(f"    S.wait({j})  # the forward branch it reads")
                            waited.add(j)
                        lines.append(f"    t{t.id} = M[{t.id}]")
                        taken.add(t.id)
            comment = f"  # {node.name} ({op.__name__})"
            if op.is_placeholder:
                lines.append(f"    {outs} = feeds[{placeholder_index[node.outputs[0].id]}]{comment}")
                if self.check_anomaly and node.outputs[0].dtype.kind == "f":
                    ns[f"n{i}"] = node
                    lines.append(f"    check(t{node.outputs[0].id}, n{i}, {node.outputs[0].id}, ())")
            elif op.is_variable:
                ns[f"v{i}"] = variables[node.attrs["var"]]
                self._variables_read.append(ns[f"v{i}"])
                lines.append(f"    {outs} = v{i}.value{comment}")
            elif op.is_constant:
                ns[f"c{i}"] = self.backend.asarray(node.attrs["value"])
                lines.append(f"    {outs} = c{i}{comment}")
            else:
                ns[f"k{i}"] = functools.partial(op.forward, **node.attrs)
                args = ["xp"] + [f"t{t.id}" for t in node.inputs]
                if node.outputs and node.outputs[0].id in self.buffer_of and op.supports_out:
                    args.append(f"out=B[{self.buffer_of[node.outputs[0].id]}]")
                if op.random:
                    args.append("rng=RNG")
                if op.donates and not self.check_anomaly and all(
                        node.inputs[p].id in self.buffer_of and (self._last_use[node.inputs[p].id] == i or (
                            on_side and node.inputs[p].id in self._side_donatable)) for p in op.donates):
                    args.append("writable=True")     # its scratch inputs die here: it may overwrite them
                if op.takes_device:
                    args.append("device=D")
                if op.host_args is not None:
                    ns[f"h{i}"] = functools.partial(op.host_args, node, **({"device": self.replica}
                                                                           if op.takes_device else {}))
                    self._hooks.append(ns[f"h{i}"])
                    args.append(f"**h{i}(step)")
                line = f"    {target}k{i}({', '.join(args)}){comment}"
                made = node.outputs[0].id if node.outputs else None
                only = guards.get(made, set())
                guard = next(iter(only)) if len(only) == 1 else ""
                if op.observes and guard and made not in read and not self.check_anomaly:
                    # statistics only its deliveries read: computed on the calls they deliver (the CUDA graph's
                    # copy computes them always; its replay decides per call which ones to emit)
                    delivery_lines[("op", made)] = [f"    {guard}{line.strip()}"]
                    graph_lines[("op", made)] = [line]
                    line = ("op", made)
                own_lines.append(line)
                if self.check_anomaly:
                    ns[f"n{i}"] = node
                    checked = [t for t in node.outputs if t.dtype.kind == "f"] or \
                        [t for t in node.inputs[:1] if op.updates_variable]   # an update: check the variable it changed
                    inputs = "".join(f"t{t.id}, " for t in node.inputs)
                    for t in checked:
                        lines.append(f"    check(t{t.id}, n{i}, {t.id}, ({inputs}))")
            for t in node.outputs:
                if t.id in side_reads and not on_side:
                    lines.append(f"    M[{t.id}] = t{t.id}")
                if t.id in self.snapshots:      # an update changes it in place later: return what was read
                    lines.append(f"    s{t.id} = t{t.id}.copy()")
                if t.id in delivery_lines:
                    lines.append(t.id)          # its deliveries: the eager plan's or the graph's, below
        if points is not None:
            lines.extend(_replica_lines(points, len(self.nodes), replica))
        if self.side:
            lines.append("    S.join()  # the second stream's nodes have run")
        outs = "".join(f"host({'s' if t.id in self.snapshots else 't'}{t.id}), " for t in self.output_tensors)
        lines.append(f"    return ({outs})")
        lines.extend(_group_functions(groups, side_reads | set(branch_made)))
        if self._side is not None:
            self._side.depends = _group_dependencies(groups)
        source, run = _compile(lines, delivery_lines, ns, f"{self.graph.name} #{next(_plan_ids)}")
        if not self.backend.is_gpu:
            return source, run, None
        # the plan as a CUDA graph captures it: outputs left where they are, every delivery staged (G: its replay)
        self._device_ns = dict(ns, host=_on_device, G=None)
        _, run_device = _compile(lines, graph_lines, self._device_ns, f"{self.graph.name} #{next(_plan_ids)} graph")
        return source, run, run_device

    def _not_replayable(self):
        """Why this plan cannot be replayed as a CUDA graph (``runtime.cuda_graph``), or None."""
        if not self.backend.is_gpu:
            return "not on CuPy"
        if not cuda_graph.enabled():
            return "FLOWLAB_CUDA_GRAPHS=0"
        if self.check_anomaly or self.replica is not None:
            return "anomaly detection or several devices: runs eagerly"
        for node in self.nodes:
            if node.op.random:
                return f"{node.name} draws random numbers: runs eagerly"
            if node.op.side_effect and not (node.op.updates_variable or node.op.replayable):
                return f"{node.name} works on the host: runs eagerly"
        return None

    def _check(self, value, node, tensor_id, inputs):
        xp = self.backend.xp
        if bool(xp.isfinite(value).all()):
            return
        raise AnomalyError(anomaly_report(self.graph, node, tensor_id, value, inputs, xp))

    def __call__(self, feeds, step=0, emit=None):
        """``feeds``: host or device arrays."""
        if self.backend.is_gpu:
            if self.replay is not None:
                return self.replay(self._run_eager, self._run_device, feeds, step, emit)
            return self._run_eager(feeds, step, emit)
        # small products: BLAS on one thread; large ones: kernels split their work over the cores themselves
        with self.blas_limit if self.blas_limit is not None else host_threads.spread_kernels:
            if self._side is None:
                return self._run(feeds, step, emit)
            try:
                return self._run(feeds, step, emit)
            except BaseException:
                _join_quietly(self._side)       # its nodes may still use the buffers: the next call waits
                raise

    def _run_eager(self, feeds, step, emit):
        return self._run([self.backend.asarray(f) for f in feeds], step, emit)

    def due(self, step) -> bool:
        """Whether some delivery may happen on call ``step``. A job whose watches all skip calls (``every > 1``,
        demand) runs a plan compiled without them on the other calls (``job._Compiled.plan_for``)."""
        return any(step % every == 0 and (when is None or when()) for every, when in self._schedule)

    def describe_passes(self) -> str:
        """Which passes ran on this plan and what each did, as comment lines; on CuPy, how it runs."""
        lines = [f"# {name}: {note or 'nothing to do'}" for name, note in self.passes]
        if self.backend.is_gpu:
            lines.append(f"# cuda_graph: {self.replay.state if self.replay is not None else self._graph_note}")
        return "\n".join(lines)

    def __str__(self):
        return f"{self.describe_passes()}\n{self.source}"


def _on_device(array):
    return array


def _join_quietly(side):
    """Wait for a second stream after the plan's own thread failed: its error is the one to raise."""
    try:
        side.join()
    except BaseException:
        pass


class _Group(NamedTuple):
    """A run of consecutive nodes of the second stream: their lines, the tensors they read that others make, and
    the tensors they make."""
    lines: list
    reads: list
    made: list


def _group_functions(groups, side_reads):
    """The source lines of the second stream's functions ``g<j>(M, step)``, one a group (its nodes' lines as the
    plan's own would be): what the group reads from M, what it makes that other groups read put into M."""
    lines = []
    for j, group in enumerate(groups):
        lines.append(f"def g{j}(M, step):")
        lines.extend(f"    t{tid} = M[{tid}]" for tid in dict.fromkeys(group.reads))
        lines.extend(group.lines)
        lines.extend(f"    M[{tid}] = t{tid}" for tid in group.made if tid in side_reads)
    return lines


def _group_dependencies(groups):
    """Per group, the indices of the earlier groups that make a tensor it reads (``SideStream.depends``: the plan's
    thread, waiting at the end of a call, may run a group itself once those have finished)."""
    made_by = {tid: j for j, group in enumerate(groups) for tid in group.made}
    return [frozenset(made_by[tid] for tid in group.reads if tid in made_by and made_by[tid] != j)
            for j, group in enumerate(groups)]


def _compile(lines, deliveries, ns, name):
    """The plan's function from its lines; an entry that is not a line (a tensor id, ``("op", id)``) stands for
    its lines in ``deliveries``."""
    source = "\n".join(line for entry in lines
                       for line in (deliveries[entry] if not isinstance(entry, str) else (entry,))) + "\n"
    filename = f"<flowlab plan {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # readable tracebacks
    exec(compile(source, filename, "exec"), ns)
    return source, ns["run"]


def _scratch(xp, specs, donor):
    """One array per buffer spec: ``donor``'s buffers where shape and dtype match (each used once), new ones else."""
    spare = {}
    for buffer in (donor.buffers if donor is not None else ()):
        spare.setdefault((tuple(buffer.shape), np.dtype(buffer.dtype)), []).append(buffer)
    scratch = []
    for shape, dtype in specs:
        reusable = spare.get((tuple(shape), np.dtype(dtype)))
        scratch.append(reusable.pop() if reusable else xp.empty(shape, dtype))
    return scratch


def _replica_lines(points, position, replica):
    """The all-reduce (and, on replica 0, the release) a replica runs before node ``position``."""
    lines = []
    if replica == 0 and position in points.release_before:
        lines.append(f"    R.release(0)  # updates of group {points.release_before[position]} done")
    if position in points.reduce_before:
        group, grads, averaged, concatenated = points.reduce_before[position]
        names = "".join(f"t{t.id}, " for t in grads)
        target = f"{names}= " if replica == 0 and grads else ""
        lines.append(f"    {target}R.all_reduce({replica}, ({names}), {averaged}, {concatenated})  "
                     f"# model gradients, group {group}")
    return lines


def _stats(xp, a):
    a = xp.asarray(a)
    if a.dtype.kind not in "biuf" or not a.size:
        return "empty" if not a.size else f"dtype {a.dtype}"
    lo, hi, mean, _, nan, inf = (float(v) for v in stats_vector(xp, a))
    body = f"min {lo:.4g} max {hi:.4g} mean {mean:.4g}" if lo == lo else "no finite values"
    return f"{body}, {int(nan)} NaN, {int(inf)} Inf of {a.size}"


def anomaly_report(graph, node, tensor_id, value, inputs, xp):
    """Name the op that made NaN/Inf, where the user wrote it, and what its inputs looked like."""
    tensor = graph.tensors[tensor_id]
    nan, inf = (int(v) for v in stats_vector(xp, xp.asarray(value))[4:])
    what = f"variable {tensor.logical_blob_name} after update {node.name}" if node.op.updates_variable else \
        f"{tensor.logical_blob_name}"
    forward = node.name.split("/")[0][len("System-AutoGrad-"):] if node.name.startswith("System-AutoGrad-") else None
    lines = [f"job {graph.name}: op {node.name} ({node.op.__name__}) produced {nan} NaN and {inf} Inf in {what} "
             f"(at {node.source}{', gradient of op ' + forward if forward else ''})", "inputs:"]
    if node.op.is_placeholder:
        lines[0] = f"job {graph.name}: argument {tensor.logical_blob_name} fed {nan} NaN and {inf} Inf"
        lines.pop()
    for t, array in zip(node.inputs, inputs):
        lines.append(f"  {t.logical_blob_name} {t.dtype}{list(t.shape)}: {_stats(xp, array)}")
    return "\n".join(lines)


def compile_graph(graph, output_tensors, backend, variables, deliveries=(), rng_seed=0, check_anomaly=False,
                  replica=None, rng=None, buffers_from=None, mixed_precision=False) -> Plan:
    return Plan(graph, output_tensors, backend, variables, deliveries, rng_seed, check_anomaly, replica, rng,
                buffers_from, mixed_precision)


__all__ = ["Delivery", "Plan", "compile_graph"]
