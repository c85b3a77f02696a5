"""The compiler's passes, in the order they run: ``PASSES``. Each is a small function over a ``Lowering`` (the node
list and what earlier passes found) that returns a short note of what it did, or None when it did nothing.

``describe()`` lists them; ``print(plan)`` shows which ran on that plan and what each did, then the generated code.
"""
from __future__ import annotations

import numpy as np

from . import amp
from .buffers import plan_buffers as assign_buffers
from .buffers import view_bases
from .fold_update import fold_sgd_into_gemm as fold_updates
from .fuse import cupy_kernel_factory
from .group_updates import group_small_updates as group_updates
from .fuse import fuse_elementwise as fuse_chains
from .product_layout import write_products_in_layout as products_in_layout
from .prune import prune as prune_nodes
from ..graph import Node
from ..ops.nn import Relu, ReluActivationStats
from ..ops.stats import ActivationStats
from ..runtime import host_threads, jit
from ..runtime.backend import ONE_BLAS_THREAD_BELOW
from .side_by_side import pair_side_by_side
from .side_stream import SPLIT_KERNELS_FROM
from .side_stream import fork as fork_branches
from .side_stream import split as split_side_stream


class Lowering:
    """What the passes work on: ``nodes`` (in run order) and what they decide for code generation.

    ``roots`` are the tensors the plan hands out (outputs, then delivered watches); ``snapshots`` the ids of
    outputs read right after they are made, because an update later changes them in place; ``buffer_of``,
    ``buffer_specs`` and ``last_use`` come from ``plan_buffers``; ``log`` is ``[(pass name, note)]``;
    ``replicated``: the plan is one of several data-parallel replicas (its gradients are all-reduced);
    ``mixed_precision``: the job asks for auto mixed precision (``FunctionConfig.enable_auto_mixed_precision``).
    """

    def __init__(self, graph, output_tensors, deliveries, backend, check_anomaly, replicated=False,
                 mixed_precision=False):
        self.graph = graph
        self.backend = backend
        self.check_anomaly = check_anomaly
        self.replicated = replicated
        self.mixed_precision = mixed_precision
        self.output_tensors = list(output_tensors)
        self.deliveries = list(deliveries)
        self.roots = self.output_tensors + [d.tensor for d in deliveries]
        self.nodes = list(graph.nodes)
        self.snapshots: set[int] = set()
        self.buffer_of: dict[int, int] = {}
        self.buffer_specs: list = []
        self.last_use: dict[int, int] = {}
        self.side: set[int] = set()             # id(node) of the nodes a second thread runs (side_stream)
        self.side_live: set[int] = set()        # tensor ids they read or make: buffers kept to the call's end
        self.side_donatable: set[int] = set()   # tensor ids they make and read once: their reader may overwrite
        self.side_starts: set[int] = set()      # id(node) of side nodes that start a task of their own (branches)
        self.log: list[tuple[str, str | None]] = []


def prune(lowering):
    """Keep the nodes that outputs, watched tensors and side effects (updates, summaries) need."""
    before = len(lowering.nodes)
    lowering.nodes = prune_nodes(lowering.nodes, lowering.roots, lowering.graph.side_effects)
    return f"kept {len(lowering.nodes)} of {before} nodes"


def auto_mixed_precision(lowering):
    """(Jobs with ``enable_auto_mixed_precision``; CuPy, or NumPy with ``compiler.amp.ON_NUMPY``) matrix products
    and convolutions compute in float16 between casts; variables, updates and everything else stay float32
    (``compiler.amp``). Before the passes that place nodes after the producers of the tensors they read."""
    if not lowering.mixed_precision:
        return None
    if not amp.active(lowering.backend):
        return "skipped: NumPy (no fast float16; compiler.amp.ON_NUMPY turns it on)"
    lowering.nodes, products, casts = amp.insert_casts(lowering.nodes, lowering.graph)
    return f"{products} products in float16, {casts} casts" if products else "no float32 product to convert"


def order_variables(lowering):
    """Variable reads first, by name (as OneFlow orders them; watch_scope dicts fill in this order)."""
    nodes = lowering.nodes
    reads = sorted((n for n in nodes if n.op.is_variable), key=lambda n: n.name)
    lowering.nodes = reads + [n for n in nodes if not n.op.is_variable]
    return f"{len(reads)} variable reads" if reads else None


def observers_early(lowering):
    """Each observing node (watch statistics, see ``Op.observes``) right after the node making its input (the last
    made of its inputs, for one reading several): it must see this call's value before an optimizer update changes a
    variable in place, and the value is in cache then."""
    made_at = {t.id: i for i, node in enumerate(lowering.nodes) if not node.op.observes for t in node.outputs}
    observers = {}
    for node in lowering.nodes:
        if node.op.observes:
            last = max(node.inputs, key=lambda t: made_at.get(t.id, -1))
            observers.setdefault(last.id, []).append(node)
    if not observers:
        return None
    ordered = []
    for node in lowering.nodes:
        if not node.op.observes:
            ordered.append(node)
            for t in node.outputs:
                ordered.extend(observers.get(t.id, ()))
    lowering.nodes = ordered
    return f"{sum(map(len, observers.values()))} observers moved"


def fuse_activation_stats(lowering):
    """(NumPy, compiled kernels on) a float32 ``Relu`` and the ``ActivationStats`` right after it (observers_early)
    reading its output, delivered every call, become one ``ReluActivationStats``: the statistics taken in the ReLU's
    own pass, not by streaming the layer's output again (``watch_health``). Not under anomaly detection (each op's
    own output is checked) nor on replicas (there the statistics are made on the host)."""
    if lowering.backend.is_gpu or lowering.check_anomaly or lowering.replicated or not jit.enabled():
        return None
    every_call = {d.tensor.id for d in lowering.deliveries if d.every == 1 and d.when is None and not d.bins}
    nodes, fused = lowering.nodes, []
    i = 0
    while i < len(nodes):
        node = nodes[i]
        stats = nodes[i + 1] if i + 1 < len(nodes) else None
        if node.op is Relu and stats is not None and stats.op is ActivationStats and \
                [t.id for t in stats.inputs] == [node.output.id] and node.output.dtype == np.float32 and \
                stats.output.id in every_call:
            merged = Node(ReluActivationStats, f"{node.name}+{stats.name}", node.inputs,
                          {"unit_axis": stats.attrs["unit_axis"], "scratch": stats.attrs["scratch"]},
                          node.source, node.device_tag, node.frames)
            merged.outputs = [node.output, stats.output]     # the same tensors: readers and deliveries unchanged
            fused.append(merged)
            i += 2
            continue
        fused.append(node)
        i += 1
    if len(fused) == len(nodes):
        return None
    lowering.nodes = fused
    return f"{len(nodes) - len(fused)} activation statistics taken in their ReLU's pass"


def fuse_elementwise(lowering):
    """(CuPy) chains of same-shape elementwise ops become one generated ElementwiseKernel. Not on NumPy (nothing to
    gain) nor under anomaly detection (every op's own output is checked)."""
    if not lowering.backend.is_gpu or lowering.check_anomaly:
        return "skipped: " + ("anomaly detection" if lowering.backend.is_gpu else "NumPy")
    before = len(lowering.nodes)
    lowering.nodes = fuse_chains(lowering.nodes, {t.id for t in lowering.roots},
                                 cupy_kernel_factory(lowering.backend.xp))
    return f"{before - len(lowering.nodes)} nodes fused away"


def fold_sgd_into_gemm(lowering):
    """(NumPy) a plain SGD update whose gradient is a matrix product read by nothing else runs as one BLAS product
    accumulating into the variable (``compiler.fold_update``). Not under anomaly detection (the gradient's own check
    names its op) nor on replicas (gradients are all-reduced before the update)."""
    if lowering.backend.is_gpu or lowering.check_anomaly or lowering.replicated:
        return "skipped: " + ("CuPy" if lowering.backend.is_gpu else
                              "anomaly detection" if lowering.check_anomaly else "replicas")
    lowering.nodes, folded = fold_updates(lowering.nodes, {t.id for t in lowering.roots})
    return f"{folded} updates folded into their gradient products" if folded else None


def write_products_in_layout(lowering):
    """(NumPy) a matrix product read only by a transpose read only by a reshape (attention merging its heads back)
    is written straight into the reshaped layout, without the reshape's copy (``compiler.product_layout``). Not
    under anomaly detection (each op's own output is checked) nor on replicas (their reshapes may be split)."""
    if lowering.backend.is_gpu or lowering.check_anomaly or lowering.replicated:
        return "skipped: " + ("CuPy" if lowering.backend.is_gpu else
                              "anomaly detection" if lowering.check_anomaly else "replicas")
    lowering.nodes, chains = products_in_layout(lowering.nodes, {t.id for t in lowering.roots})
    return f"{chains} products written in their reshaped layout" if chains else None


def snapshot_returned_variables(lowering):
    """A returned tensor that shares memory with a variable an update later changes in place (the variable itself,
    or a view of it) is copied right after it is made: the job returns the value its forward pass read, as OneFlow
    does. Jobs that return no such tensor are untouched."""
    base = view_bases(lowering.nodes)
    updated = {base.get(n.inputs[0].id, n.inputs[0].id) for n in lowering.nodes if n.op.updates_variable}
    if not updated:
        return None
    lowering.snapshots = {t.id for t in lowering.output_tensors if base.get(t.id, t.id) in updated}
    return f"{len(lowering.snapshots)} outputs read before the update" if lowering.snapshots else None


def group_small_updates(lowering):
    """(NumPy) the Adam updates of small variables that share an optimizer run as one update over their arrays laid
    end to end, bit-identical (``compiler.group_updates``). Not under anomaly detection (each variable's own check
    names its update) nor on replicas (each gradient's all-reduce precedes its update)."""
    if lowering.backend.is_gpu or lowering.check_anomaly or lowering.replicated:
        return "skipped: " + ("CuPy" if lowering.backend.is_gpu else
                              "anomaly detection" if lowering.check_anomaly else "replicas")
    lowering.nodes, sizes = group_updates(lowering.nodes)
    return f"{sum(sizes)} updates in {len(sizes)} groups" if sizes else None


def side_stream(lowering):
    """Weight gradients, bias gradients and optimizer updates run on a second thread beside the backward pass
    (``compiler.side_stream``), each update as early as it may, and so do branches of the forward pass (sibling
    products: attention's key and value beside its query). On NumPy with two or more cores, where the largest
    product has from ``runtime.backend.ONE_BLAS_THREAD_BELOW`` up to ``side_stream.SPLIT_KERNELS_FROM``
    multiply-adds; not under anomaly detection, on replicas, or with watched tensors or side effects other than
    updates (their order against the updates is the plan's)."""
    if lowering.backend.is_gpu or lowering.check_anomaly or lowering.replicated:
        return "skipped: " + ("CuPy" if lowering.backend.is_gpu else
                              "anomaly detection" if lowering.check_anomaly else "replicas")
    if not host_threads.side_stream_enabled():
        return "skipped: one core, one BLAS thread, or FLOWLAB_SIDE_STREAM=0"
    if len(lowering.roots) > len(lowering.output_tensors) or lowering.snapshots or any(
            (n.op.side_effect and not n.op.updates_variable) or n.op.observes for n in lowering.nodes):
        return "skipped: watched tensors, snapshots or side effects other than updates"
    largest = max((n.op.gemm_macs(n) for n in lowering.nodes if n.op.gemm_macs is not None), default=0)
    if largest >= SPLIT_KERNELS_FROM:
        return f"skipped: a product of {largest:,} multiply-adds (kernels split over the cores instead)"
    if largest < ONE_BLAS_THREAD_BELOW:
        return f"skipped: small products (the largest {largest:,} multiply-adds): one thread does it sooner"
    roots = {t.id for t in lowering.roots}
    nodes, side, live, donatable = split_side_stream(lowering.nodes, roots)
    if not side:
        return None
    nodes, branch_nodes, starts, branch_live = fork_branches(nodes, side, roots)
    lowering.nodes, lowering.side, lowering.side_live, lowering.side_donatable = \
        nodes, side | branch_nodes, live | branch_live, donatable
    lowering.side_starts = starts
    return f"{len(side)} of {len(nodes)} nodes on a second thread" + (
        f", and {len(starts)} forward branches of {len(branch_nodes)} nodes" if starts else "")


def side_by_side(lowering):
    """(NumPy, kernels spread over host threads) a convolution's input and filter gradients run side by side, each
    whole on one thread, instead of each split over the threads (``compiler.side_by_side``). Not under anomaly
    detection (each op's output is checked by name), on replicas, with a second stream (whose plans run kernels on
    one thread each), or where the largest product is below ``runtime.backend.ONE_BLAS_THREAD_BELOW`` (BLAS on one
    thread, kernels not spread)."""
    if lowering.backend.is_gpu or lowering.check_anomaly or lowering.replicated or lowering.side:
        return "skipped: " + ("CuPy" if lowering.backend.is_gpu else "anomaly detection" if lowering.check_anomaly
                              else "replicas" if lowering.replicated else "a second stream")
    if not host_threads.enabled():
        return "skipped: FLOWLAB_HOST_THREADS=0"
    largest = max((n.op.gemm_macs(n) for n in lowering.nodes if n.op.gemm_macs is not None), default=0)
    if largest < ONE_BLAS_THREAD_BELOW:
        return f"skipped: small products (the largest {largest:,} multiply-adds): kernels are not spread"
    lowering.nodes, pairs = pair_side_by_side(lowering.nodes)
    return f"{pairs} pairs side by side" if pairs else None


def plan_buffers(lowering):
    """Liveness analysis: ops that can write into ``out=`` reuse preallocated buffers; elementwise ops may write in
    place over an input that dies there (not under anomaly detection, whose reports show the inputs)."""
    keep = {t.id for t in lowering.output_tensors}
    lowering.buffer_of, lowering.buffer_specs, lowering.last_use = assign_buffers(
        lowering.nodes, keep, allow_inplace=not lowering.check_anomaly, live_ids=lowering.side_live)
    return f"{len(lowering.buffer_specs)} buffers for {len(lowering.buffer_of)} tensors"


PASSES = (prune, auto_mixed_precision, order_variables, observers_early, fuse_activation_stats, fuse_elementwise,
          fold_sgd_into_gemm, write_products_in_layout, snapshot_returned_variables, group_small_updates, side_stream,
          side_by_side, plan_buffers)


def run(lowering):
    """Run ``PASSES`` in order over ``lowering``, logging each one's note."""
    for compiler_pass in PASSES:
        lowering.log.append((compiler_pass.__name__, compiler_pass(lowering)))
    return lowering


def describe() -> str:
    """The passes in order, one line each: name and the first sentence of its docstring."""
    def first_sentence(doc):
        text = " ".join(doc.split())
        return text.split(". ")[0].rstrip(".") + "."
    return "\n".join(f"{i}. {p.__name__}: {first_sentence(p.__doc__)}" for i, p in enumerate(PASSES, 1))
