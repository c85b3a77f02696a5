"""``flow.watch_health(handler=None, every=1, writer=None, histogram_every=None, **thresholds)``: per-layer
statistics of a training network and alerts (dead ReLUs, vanishing or exploding gradients, bad update sizes, loss
spikes, NaN/Inf), delivered as a ``HealthReport`` to ``handler`` and/or ``writer.add_health`` every ``every`` calls.
The alerts read each number as what it means for its layer (``health_alerts``), so that they keep their meaning on
normalised networks (ResNets).

Layers, as OneFlow names them. ``flow.layers.dense``/``conv2d`` with prefix ``<p>`` (``name``, or ``Dense_<n>`` /
``Conv2d_<n>``) make variables ``<p>-weight``, ``<p>-bias`` and ops ``<p>_matmul``/``<p>_conv2d``, ``<p>_bias_add``,
``<p>_activation``. So: every trainable variable belongs to the layer named by its name without the last
``-<part>`` (a name without ``-`` is its own layer); the layer's *output* (activation) is the output of the last
forward op named ``<layer>_<something>``, or ``<layer>`` itself (OneFlow's ResNet names its ``flow.nn.conv2d``
``res2_0_branch2a`` beside the variable ``res2_0_branch2a-weight``); the longest matching layer wins, so
``hidden_2_matmul`` belongs to ``hidden_2``, not ``hidden``. A layer of variables only (used by the user's own ops)
has no activation statistics, and comes in the forward order where its variables are first read. A batch
normalization (``flow.layers.batch_normalization*`` named ``<b>``: variables
``<b>-gamma``, ``<b>-beta`` and the non-trainable ``<b>-moving_mean``, ``<b>-moving_variance``; OneFlow's ResNet
names them ``<conv>_bn_relu``, ``<conv>_bn_add_relu``, ``<conv>_bn``) is a layer of its own, also when frozen.

Roles (``LayerRole``, read from the graph, for ``health_alerts``): a layer *makes attention scores* when its
output reaches an attention softmax through ops of no other layer (a query or key projection); a layer is
*ReLU-like* when its output op is non-negative (``batch_normalization_relu`` is); *normalised* when a batch norm
normalizes its output (a conv before its batch norm: its weights are scale-invariant); a *batch norm*; and in a
residual branch behind a *gate*, the batch norm closing the branch: ``batch_normalization_add_relu`` (the branch:
what its normalized input depends on and its addend does not), or in the unfused form
``relu(add(batch_normalization(x), shortcut))`` the batch norm whose output the add reads.

Statistics (``HealthReport.table[layer]``), all from this call's tensors:
  activation: ``act_mean_abs``, ``act_std``, ``act_zero_fraction`` (exact zeros among all elements),
  ``act_max_abs``, ``dead_fraction`` (units, i.e. features of a dense layer or channels of a conv layer, that are
  exactly zero for every example and position of the batch), ``act_nan``, ``act_inf``;
  parameters (all the layer's trainable variables as one vector): ``weight_norm`` (before this call's update),
  ``grad_norm`` (of the gradient the optimizer uses; for a sparse update's indexed slices, of the rows summed by
  id, as the update applies them: ``ops.stats.SlicesSquareStats``), ``update_ratio`` (norm of this call's change of
  the weights / ``weight_norm``), ``weight_nan``/``weight_inf``, ``grad_nan``/``grad_inf``;
  batch norms (``ops.stats.batch_norm_vector``; their moving statistics before this call's update, which a predict
  job would normalize with now): ``moving_mean_abs``, ``moving_var_mean``, ``moving_var_min`` (a channel whose
  running variance collapsed), ``batch_mean_gap`` and ``batch_var_ratio`` (how far this call's batch statistics are
  from the moving ones: the train/eval gap; NaN without batch statistics), ``moving_nan``/``moving_inf``.
  ``HealthReport.loss`` is the mean of the loss being minimised. ``STATISTICS`` lists them all with a line each.
Transformers (graphs with attention: a softmax over the last axis of a ``(batch, heads, queries, keys)`` tensor, by
the op's ``distribution_axis`` trait): ``HealthReport.attention`` holds per attention block (the softmax's name
scope, e.g. ``bert-encoder-layer_0-attention-self``) each head's normalized entropy (``ops.stats.attention_vector``:
0 when every query attends to one key, 1 when to all alike), and ``HealthReport.residual`` per residual connection
(an elementwise sum one of whose inputs, the stream, is an ancestor of the other, the branch; keyed by the sum's
name) ``stream_norm``, ``growth`` (output RMS / stream RMS) and ``branch_ratio`` (branch RMS / stream RMS), in
forward order: how the residual stream's norm grows layer by layer.
Embedding tables updated row by row: a trainable variable whose gradient is indexed slices (gathered rows: its
update is ``indexed_slices_optimizer_conf``'s sparse one, or its gradient is one ``flow.gather`` gradient, the op's
``indexed_slices`` trait) has its rows tracked on every call, reports or not: per row the last call whose ids touched
it, i.e. gave it a gradient (``ops.stats.RowTouches``: O(ids) a call, on the table's device). Its layer's row
(several such tables of one layer add up) then holds ``rows_touched`` (distinct rows this call's ids touch),
``touched_fraction`` (rows touched at least once since the job's first call, over the table's rows), ``stale_rows``
and ``stale_fraction`` (rows untouched for more than ``stale_steps`` calls, default 1000, counting a row never touched
as last touched just before the first call): counted over the table on reporting calls only (``RowCoverage``).
Histograms: every ``histogram_every``-th report also carries, per layer, 30-bucket histograms of its activation,
its kernel (the ``-weight`` variable, else its largest) and the kernel's gradient (``HealthReport.histograms``; for
a sparse update's indexed slices, of the rows summed by id, as ``grad_norm``: ``ops.stats.SlicesHistogram``),
counted where the tensors live as the plan makes them (``ops.stats.histogram_vector``: ~1 ms for 400,000 values on
one core). By default every 100th report when a writer takes the reports, else none.

Where reports go: ``handler(report)``, and/or ``writer.add_health(report)`` for a ``SummaryWriter`` (the dashboard's
Health tab draws them from the log). A handler that also has ``health_block(block)`` (``HealthPanel``) and is the only
consumer (no writer, no histograms) of a job on the host takes them in bulk instead: ``HealthBlock``s of many calls,
made when a block is full, when the handler pulls (``health_source(flush)`` hands it the flush) and at
``flow.sync_default_session()`` (see ``_Monitor``: a call then only records its statistics).

How it runs. ``watch_health`` only records a request. When the job compiles (``delivery.resolve``) the request turns
into statistics ops of the graph (``ops.stats``: ``ActivationStats``, ``SquareStats``, ``MeanStat``,
``BatchNormStats``, observing ops that run right after the tensors they read) whose small vectors the plan delivers
to the monitor's ``put`` on the calls that deliver (a job whose reports skip calls runs a plan without them on the
others), plus histogram deliveries. On NumPy they are a few reductions on the job's thread; on CuPy one fused
kernel a float32 tensor (a batch norm's: a few small ones), writing into one device buffer, so the statistics are
part of the CUDA graph a plan is replayed as and reach the host with one copy. The update is the plain-SGD step
``lr * scale * gradient`` when the optimizer is SGD without momentum or clipping (free: its norm follows from the
gradient's); for other optimizers the weights are kept before the update (``SquareStats``' ``keep``) and the change
measured right after the call. The report (alerts come from the numbers alone: ``health_alerts``) is built once
the plan has run (``after_run``): on NumPy on the job's thread, on a GPU in the dispatcher beside the next call; it is
delivered as ``HealthRequest`` says. On several devices the tensors are delivered and summarised from the joined
whole on the host, and the report is built in the dispatcher when the loss (the last layer's output in a predict
job) arrives. A sparse update's gradient rows and ids of a table gathered more than once are each gather's
concatenated, on each device its own ones: those are delivered gather by gather and concatenated on the host, in one
device's order (``_slice_parts``).
"""
from __future__ import annotations

import functools
import math
import statistics
import threading
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from . import graph as g
from .errors import TraceError
from .ops import apply
from .ops.array import Concat
from .ops.normalization import batch_norm_parts
from .ops.scatter import unique_rows
from .ops.stats import (ActivationStats, AttentionStats, BatchNormStats, FlatViews, MeanStat, Results, RowCoverage,
                        RowTouches, RowTracker, Scratch, SlicesHistogram, SlicesSquareStats, SquareStats, SquaresStats,
                        activation_rows, batch_norm_vector, histogram_vector, mean_vector, square_vector)
from .runtime import dispatch, session
from .watching import WatchRequest, _name

THRESHOLDS = {
    "dead_fraction": 0.5,        # dead_relu: more than this fraction of a layer's units dead for the whole batch
    "vanishing_ratio": 1e-3,     # vanishing_gradient: a layer's gradient norm below this times the last layer's
    "exploding_ratio": 1e3,      # exploding_gradient: a layer's gradient norm above this times the last layer's
    "exploding_factor": 100.0,   # exploding_gradient: the total gradient norm above this times its recent median
    "update_ratio_low": 1e-5,    # update_ratio: update/weight norm ratio outside [low, high] (rule of thumb 1e-3)
    "update_ratio_high": 0.5,    # (early steps of a healthy net can reach 0.1)
    "loss_spike_factor": 3.0,    # loss_spike: loss above this times its recent median
    "closed_gate": 0.1,          # a residual branch's closing batch norm with gamma, beta RMS below this is "closed"
    "window": 20,                # how many earlier reports "recent" means
    "attention_collapsed": 0.05,  # attention_collapsed: a head's normalized entropy below this (one key per query)
    "attention_uniform": 0.98,   # attention_uniform: a head's above this in this report and the last `window` ones
    "residual_growth": 10.0,     # residual_growth: a residual add's output RMS above this times its stream's
    "stale_steps": 1000,         # an embedding row given no gradient for more than this many calls is stale
    "stale_fraction": 0.9,       # stale_rows: more than this fraction of a sparsely updated table's rows stale
}
"""The threshold keyword arguments of ``watch_health`` and their defaults (``health_alerts`` says what each
means)."""
MIN_HISTORY = 3
"""Earlier reports needed before the time-based alerts (``loss_spike``, ``exploding_gradient``) speak."""
BLOCK_COPY_BYTES = 8 << 20
"""Block path (``HealthRequest``): the ring of layer outputs copied whole holds at most about twice this, so a
block is at most ``BLOCK_COPY_BYTES`` of them (and ``BLOCK_ROWS`` bounds its calls)."""
BLOCK_ROWS = (16, 1024)
"""Block path: the fewest and the most calls a block the job's thread flushes holds."""
BLOCK_COPY_LIMIT = 16 << 10
"""Block path: a layer output of at most this many bytes (float32/float64) is copied whole and summarised with
the block's others; a larger one by its statistics op, each call."""
FUSED_GRADIENT_BYTES = 1 << 20
"""Block path: gradients of at most this many bytes in all have their squares taken by one op after the last."""
REPORT_BESIDE_NEXT_CALL_ON_GPU = True
"""On a GPU the report is made on the dispatcher thread beside the next call (False: on the job's thread, as
on the CPU); ``benchmarks/health.py --diagnose`` measures both."""

STATISTICS = {
    "act_mean_abs": "mean |x| of the layer's output",
    "act_std": "standard deviation of the layer's output",
    "act_zero_fraction": "fraction of exact zeros in the layer's output",
    "act_max_abs": "largest |x| in the layer's output",
    "dead_fraction": "fraction of units zero for the whole batch (dead ReLUs)",
    "act_nan": "NaNs in the layer's output",
    "act_inf": "Infs in the layer's output",
    "weight_norm": "norm of the layer's weights (before this step's update)",
    "weight_nan": "NaNs in the layer's weights",
    "weight_inf": "Infs in the layer's weights",
    "grad_norm": "norm of the layer's gradient",
    "grad_nan": "NaNs in the layer's gradient",
    "grad_inf": "Infs in the layer's gradient",
    "update_ratio": "norm of this step's update / weight norm (healthy near 1e-3)",
    # embedding tables updated row by row (a gradient of gathered rows: indexed slices)
    "rows_touched": "rows of the layer's embedding tables this step's ids give a gradient",
    "touched_fraction": "fraction of the tables' rows given a gradient at least once so far",
    "stale_rows": "rows given no gradient for more than stale_steps calls (never-touched rows included)",
    "stale_fraction": "stale rows / the tables' rows",
    # batch normalization layers (those with -moving_mean / -moving_variance variables), batch_norm_vector's order
    "moving_mean_abs": "mean |moving mean| over the channels of a batch norm",
    "moving_var_mean": "mean moving variance over the channels (huge: exploding pre-activations)",
    "moving_var_min": "smallest channel's moving variance (~0: a collapsed, constant channel)",
    "batch_mean_gap": "mean |batch mean - moving mean| / moving std: how far evaluation shifts a channel",
    "batch_var_ratio": "mean batch / moving variance (1: they agree; far from 1: train/eval gap)",
    "moving_nan": "NaNs in a batch norm's moving statistics",
    "moving_inf": "Infs in a batch norm's moving statistics",
}
"""Every statistic of ``HealthReport.table``, in the order reports list them, with what it means (the first
seven are the activation's, in the order ``activation_vector`` computes them)."""
TRANSFORMER_STATISTICS = {
    "attention_entropy": "a head's normalized attention entropy (0: each query attends to one key; 1: to all alike)",
    "stream_norm": "norm of the residual stream entering a residual sum",
    "growth": "RMS of a residual sum's output / its stream's (how much the layer grows the stream)",
    "branch_ratio": "RMS of a residual branch / its stream's",
}
"""Transformers' numbers (``HealthReport.attention``, ``.residual``), named as their log records
(``summary.health_log``)."""
ACTIVATION_STATISTICS = tuple(STATISTICS)[:7]
"""The statistics of a layer's output (activation)."""
BATCH_NORM_STATISTICS = tuple(STATISTICS)[-7:]
"""The statistics only a batch normalisation layer has."""
COUNT_STATISTICS = tuple(s for s in STATISTICS if s.endswith(("_nan", "_inf")))
"""The NaN and Inf counts among ``STATISTICS``."""
ROW_STATISTICS = ("rows_touched", "touched_fraction", "stale_rows", "stale_fraction")
"""The statistics only a layer with a sparsely updated embedding table has."""


class HealthAlert(NamedTuple):
    """Something wrong seen in a report: ``kind`` (``dead_relu``, ``vanishing_gradient``, ``exploding_gradient``,
    ``update_ratio``, ``loss_spike``, ``nan``, ``attention_collapsed``, ``attention_uniform``, ``residual_growth``,
    ``stale_rows``),
    the ``layer`` (None for the whole network; the attention block or residual sum for the transformer alerts), the
    ``step`` and a ``message`` saying what was seen, where, and what usually causes it."""
    kind: str
    layer: str | None
    step: int
    message: str


@dataclass
class HealthReport:
    """One delivery of ``watch_health``: ``table`` is ``{layer: {statistic: float}}`` with layers in forward order
    (see the module docstring for the statistics), ``loss`` the mean loss (None in a predict job), ``first_nonfinite``
    the first watched op, in run order, whose tensor held NaN/Inf (``{"op", "tensor", "layer", "what", "source"}``) or
    None, ``alerts`` a list of ``HealthAlert``, ``histograms`` None or ``{layer: {"activation" | "weight" |
    "gradient": [k, 3] float64 rows (left edge, right edge, count)}}`` (every ``histogram_every``-th report; the
    weight and gradient of the layer's kernel), ``attention`` ``{block: [normalized entropy per head]}`` and
    ``residual`` ``{sum: {"stream_norm", "growth", "branch_ratio"}}`` (transformers; see the module docstring)."""
    step: int
    table: dict
    loss: float | None = None
    first_nonfinite: dict | None = None
    alerts: list = field(default_factory=list)
    histograms: dict | None = None
    attention: dict = field(default_factory=dict)
    residual: dict = field(default_factory=dict)

    @functools.cached_property
    def total_grad_norm(self) -> float | None:
        """The norm of all the layers' gradients together (None when the table has none); every later report's
        alerts read it, so it is worked out once."""
        squares = [row["grad_norm"] ** 2 for row in self.table.values() if "grad_norm" in row]
        return math.sqrt(sum(squares)) if squares else None


# ------------------------------------------------------------------------------------------------ statistics

HISTOGRAM_BINS = 30
"""Buckets of the histograms a report carries every ``histogram_every`` reports."""


def histogram_buckets(v):
    """``[bins, 3]`` float64 host rows (left edge, right edge, count) from a ``histogram_vector`` (all equal: every
    edge at the value and every count in the last bucket, as TensorBoard does)."""
    v = _host(v)
    lo, hi, counts = v[0], v[1], v[2:]
    bins = counts.size
    out = np.zeros((bins, 3))
    if lo != lo:                     # no finite element
        return out
    if lo == hi:
        out[:, :2] = lo
        out[-1, 2] = counts.sum()
        return out
    edges = lo + (hi - lo) * np.arange(bins + 1) / bins
    edges[-1] = hi
    out[:, 0], out[:, 1], out[:, 2] = edges[:-1], edges[1:], counts
    return out


def _host(v):
    """A delivered vector on the host: a CuPy copy's waiting function is called, a device array copied."""
    v = v() if callable(v) else v
    return np.asarray(v.get() if hasattr(v, "get") else v, dtype=np.float64)


class _Kept:
    """A variable's value before this call's update (``SquareStats`` saves it there), to measure the update."""
    array = None

    def save(self, xp, w):
        if self.array is None or self.array.shape != w.shape:
            self.array = xp.empty_like(w)
        self.array[...] = w


# ------------------------------------------------------------------------------------------------ layers

@dataclass
class _Param:
    name: str                    # the variable's name
    read: g.LazyTensor           # its read in the graph
    update: g.Node | None        # the node updating it (train jobs)


@dataclass
class _Layer:
    name: str
    params: list
    output: g.LazyTensor | None = None
    unit_axis: int = 1
    nonnegative: bool = False    # its output comes from an op whose outputs are >= 0 (ReLU, sigmoid, softmax)
    position: int = 1 << 60      # index of its first forward node: layers are listed in forward order
    moving: dict | None = None   # a batch norm's {"moving_mean": read, "moving_variance": read}
    batch_norm: object = None    # the BatchNormParts of its batch-normalization node
    normalised: bool = False     # one of its ops' outputs is what a batch normalization normalizes
    gate: str | None = None      # the batch norm closing the residual branch it is in
    attention: str | None = None     # the attention block whose scores its output makes (a query or key projection)
    made: list = field(default_factory=list)     # the first output of each of its forward nodes


MOVING_STATISTICS = ("moving_mean", "moving_variance")     # a batch norm's non-trainable variables, by suffix
"""A batch norm's non-trainable variables, by name suffix."""


class LayerRole(NamedTuple):
    """What ``health_alerts`` needs to know of a layer beside its numbers (``roles``), read from the graph:
    ``relu``: its output is ReLU-like (dead units mean something); ``normalised``: its output feeds a batch
    normalization (so its weights are scale-invariant); ``batch_norm``: it is a batch normalization (its weights
    are the per-channel gamma and beta); ``gate``: the batch norm whose ``batch_normalization_add_relu`` closes the
    residual branch it is in; ``size``: how many trainable values it has; ``attention``: the attention block
    (``find_attention``) whose scores its output makes (a query or key projection: its output reaches the block's
    softmax through no other layer); ``vectors_only``: not a batch norm, and all its trainable variables are vectors
    (biases, a layer norm's gamma and beta: no kernel)."""
    relu: bool = True
    normalised: bool = False
    batch_norm: bool = False
    gate: str | None = None
    size: int = 0
    attention: str | None = None
    vectors_only: bool = False


def find_layers(graph):
    """The graph's layers by the rule of the module docstring, in forward order, with their batch normalizations
    (``-moving_mean``/``-moving_variance`` variables and the node that normalizes) and what they normalize."""
    updates = {n.inputs[0].id: n for n in graph.nodes if n.op.updates_variable}
    layers, moving = {}, {}
    for name, read in graph.variables.items():
        decl = graph.declarations.get(name)
        if decl is None:
            continue
        layer = name.rsplit("-", 1)[0] if "-" in name else name
        if not decl.trainable:
            part = name[len(layer) + 1:]
            if part in MOVING_STATISTICS:
                moving.setdefault(layer, {})[part] = read
            continue
        layers.setdefault(layer, _Layer(layer, [])).params.append(_Param(name, read, updates.get(read.id)))
    for layer, reads in moving.items():
        if len(reads) == len(MOVING_STATISTICS):       # a frozen batch norm (no trainable gamma/beta) is a layer too
            layers.setdefault(layer, _Layer(layer, [])).moving = reads
    by_length = sorted(layers, key=len, reverse=True)
    for i, node in enumerate(graph.nodes):
        if node.op.is_variable or node.op.observes or node.op.updates_variable or not node.outputs or \
                node.name.startswith("System-AutoGrad-") or node.outputs[0].dtype.kind != "f":
            continue
        owner = next((layers[n] for n in by_length if node.name.startswith(n + "_") or node.name == n), None)
        if owner is None:
            continue
        owner.output = node.outputs[0]
        owner.made.append(node.outputs[0])
        owner.nonnegative = node.op.is_nonnegative(node)
        owner.position = min(owner.position, i)
        if node.attrs.get("data_format") == "NHWC":
            owner.unit_axis = -1
        parts = batch_norm_parts(node)
        if parts is not None and owner.moving is not None:
            owner.batch_norm = parts
            owner.unit_axis = node.attrs["axis"]
    # a layer of variables only (BERT's embedding tables, read by ops of other names) comes where they are first read
    unplaced = {p.read.id: layer for layer in layers.values() if layer.output is None for p in layer.params}
    for i, node in enumerate(graph.nodes):
        if unplaced and _forward(node):
            for t in node.inputs:
                layer = unplaced.get(t.id)
                if layer is not None:
                    layer.position = min(layer.position, i)
    _find_normalisation(graph, layers.values())
    _find_attention_scores(graph, layers.values())
    return sorted(layers.values(), key=lambda layer: (layer.position, layer.name))


def _find_attention_scores(graph, layers):
    """Mark the layers whose output makes an attention block's scores: walking back from each block's softmax
    (``find_attention``) through ops of no layer (reshapes, transposes, the scores' matmul, the mask's add), the
    layers reached first (BERT's query and key projections; the value projection feeds the context, not the
    scores)."""
    owner = {t.id: layer for layer in layers for t in layer.made}
    for block, probs in find_attention(graph):
        seen, stack = set(), list(probs.node.inputs)
        while stack:
            t = stack.pop()
            if t.id in seen:
                continue
            seen.add(t.id)
            layer = owner.get(t.id)
            if layer is not None:
                layer.attention = layer.attention or block
            elif not t.node.op.is_variable:
                stack.extend(t.node.inputs)


def _find_normalisation(graph, layers):
    """Mark the layers one of whose ops' outputs a batch norm normalizes (``conv`` before ``conv_bn``, also when
    ``conv_relu`` after the batch norm makes ``conv``'s output), and the layers in a residual branch: the nodes that
    the batch norm closing the branch normalizes depend on and the shortcut does not (the innermost branch wins).
    The shortcut is the ``addend`` of ``batch_normalization_add_relu``, or in the unfused form
    (``relu(batch_normalization(x) + shortcut)``) the other input of the elementwise op of two same-shaped tensors
    that reads the batch norm's output."""
    normalizes = {layer.batch_norm.inputs.id for layer in layers if layer.batch_norm is not None}
    readers = {}                 # forward readers only: a gradient op of two same-shaped tensors is no sum
    for node in graph.nodes:
        if node.name.startswith("System-AutoGrad-") or node.op.updates_variable or node.op.observes:
            continue
        for t in node.inputs:
            readers.setdefault(t.id, []).append(node)
    branches = []
    for layer in layers:
        parts = layer.batch_norm
        if parts is None:
            layer.normalised = any(t.id in normalizes for t in layer.made)
            continue
        shortcuts = [parts.addend] if parts.addend is not None else [
            other for node in readers.get(layer.output.id, ()) if _merges(node)
            for other in node.inputs if other is not layer.output]
        for shortcut in shortcuts:
            branch = _ancestors(parts.inputs) - _ancestors(shortcut)
            branches.append((len(branch), layer.name, branch))
    branches.sort(key=lambda entry: entry[0])
    for layer in layers:
        if layer.output is not None:
            layer.gate = next((name for _, name, branch in branches
                               if any(id(t.node) in branch for t in layer.made)), None)


def _merges(node):
    """An elementwise op of two tensors of its output's shape (a residual sum, as ``flow.math.add`` makes it)."""
    return len(node.inputs) == 2 and len(node.outputs) == 1 and \
        all(t.shape == node.outputs[0].shape for t in node.inputs)


def _ancestors(tensor):
    """The ``id``s of the nodes ``tensor`` depends on, its own node included."""
    seen, stack = set(), [tensor.node]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(t.node for t in node.inputs)
    return seen


class Residual(NamedTuple):
    """A residual connection: the sum ``out = stream + branch`` named ``name``."""
    name: str
    out: g.LazyTensor
    stream: g.LazyTensor
    branch: g.LazyTensor


def _forward(node):
    return not (node.name.startswith("System-AutoGrad-") or node.op.observes or node.op.updates_variable or
                node.op.is_variable or not node.outputs)


def find_attention(graph):
    """``[(block, probabilities)]``: the forward softmaxes over the keys of ``(batch, heads, queries, keys)`` tensors,
    each named by its name scope (its own name when that scope holds another)."""
    found = [n for n in graph.nodes if _forward(n) and n.op.distribution_axis is not None and
             n.outputs[0].ndim == 4 and n.op.distribution_axis(n) == 3 and n.outputs[0].dtype.kind == "f"]
    scopes = [n.name.rsplit("-", 1)[0] if "-" in n.name else n.name for n in found]
    return [(scope if scopes.count(scope) == 1 else n.name, n.outputs[0]) for scope, n in zip(scopes, found)]


def find_residuals(graph):
    """The forward residual connections (``Residual``), in forward order: sums of two tensors of the output's
    shape one of which (the stream) the other (the branch) depends on."""
    out = []
    for node in graph.nodes:
        if not (_forward(node) and node.op.is_sum and _merges(node)) or node.outputs[0].dtype.kind != "f":
            continue
        a, b = node.inputs
        if id(a.node) in _ancestors(b):
            out.append(Residual(node.name, node.outputs[0], a, b))
        elif id(b.node) in _ancestors(a):
            out.append(Residual(node.name, node.outputs[0], b, a))
    return out


def roles_of(layers):
    """``{layer: LayerRole}`` of ``find_layers``' layers (see ``health_alerts``)."""
    return {layer.name: LayerRole(layer.nonnegative, layer.normalised, layer.batch_norm is not None, layer.gate,
                                  sum(math.prod(p.read.shape) for p in layer.params), layer.attention,
                                  layer.batch_norm is None and bool(layer.params) and
                                  all(len(p.read.shape) <= 1 for p in layer.params))
            for layer in layers}


def _kernel(layer):
    """A layer's main variable: its ``-weight``, else its largest (None for a frozen batch norm: it has none)."""
    if not layer.params:
        return None
    return next((p for p in layer.params if p.name.endswith("-weight")), None) or \
        max(layer.params, key=lambda p: math.prod(p.read.shape))


def _indexed_slice_ids(param):
    """The ids tensor of a variable whose gradient is indexed slices, else None: the ids input of its sparse update
    (an update op with the ``row_sparse`` trait: ``(table, rows, ids, ...)``), or those of the gather whose gradient
    (an op with the ``indexed_slices`` trait, axis 0) is the whole of its dense update's gradient."""
    update = param.update
    if update is None:
        return None
    if update.op.row_sparse and len(update.inputs) > 2 and update.inputs[2].dtype.kind in "iu":
        return update.inputs[2]
    grad = update.inputs[1].node
    if grad.op.indexed_slices is None:
        return None
    slices = grad.op.indexed_slices(grad)
    return None if slices is None else slices[0]


def _slice_parts(tensor):
    """The tensors whose joined values, one after another along axis 0, make the logical value of ``tensor``, a
    sparse update's gradient rows or ids: for a table gathered more than once those are each gather's, concatenated
    (``optim.optimizers.Optimizer._indexed_slices``). On several devices each device concatenates its own, so the
    devices' pieces of the concatenation are not the logical one; each gather's are (split along the batch)."""
    node = tensor.node
    if node.op is Concat and node.attrs["axis"] == 0:
        return list(node.inputs)
    return [tensor]


def _plain_sgd(update):
    """The update node is SGD without momentum or clipping: its step is ``lr * grad_scale * gradient``."""
    return update is not None and update.op.is_plain_step(update)


# ------------------------------------------------------------------------------------------------ the monitor

def _check_thresholds(thresholds):
    for key, value in thresholds.items():
        if key not in THRESHOLDS:
            raise TypeError(f"flow.watch_health: unknown threshold {key!r}; known: {', '.join(THRESHOLDS)}")
        if key in ("window", "stale_steps"):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"flow.watch_health: {key} must be a positive int, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or \
                not math.isfinite(value):
            raise ValueError(f"flow.watch_health: threshold {key} must be a positive number, got {value!r}")
    return {**THRESHOLDS, **thresholds}


def watch_health(handler=None, every=1, writer=None, histogram_every=None, **thresholds):
    """Deliver a ``HealthReport`` of every layer to ``handler(report)`` and/or ``writer.add_health(report)`` every
    ``every`` calls; every ``histogram_every``-th report (0: none; default 100 with a writer, else 0) carries the
    layers' histograms (see module doc)."""
    api = "flow.watch_health"
    graph = g.current_graph(api)
    if handler is None and writer is None:
        raise TypeError(f"{api}: give a handler (it receives a flowlab.HealthReport), a writer "
                        "(a flowlab.summary.SummaryWriter), or both")
    if handler is not None and not callable(handler):
        raise TypeError(f"{api}: handler must be callable (it receives a flowlab.HealthReport), got {handler!r}")
    if writer is not None and not callable(getattr(writer, "add_health", None)):
        raise TypeError(f"{api}: writer must be a flowlab.summary.SummaryWriter (something with add_health), got "
                        f"{type(writer).__name__}")
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ValueError(f"{api}: every must be a positive int, got {every!r}")
    if histogram_every is None:
        histogram_every = 0 if writer is None else 100
    if not isinstance(histogram_every, int) or isinstance(histogram_every, bool) or histogram_every < 0:
        raise ValueError(f"{api}: histogram_every must be an int >= 0 (0: no histograms), got {histogram_every!r}")
    graph.watches.append(HealthRequest(handler, writer, every, _check_thresholds(thresholds), g.user_source_line(),
                                       histogram_every))


class HealthRequest:
    """What ``watch_health`` records on the graph; ``expand`` turns it into watch requests once gradients exist.

    Where reports go: ``writer.add_health`` (it only encodes and queues) and a handler whose ``delivered_inline``
    attribute is true (``HealthPanel``: it only records) are called where the report is made (on NumPy the job's
    thread, sparing a hand-off between threads each call); any other handler runs on the watch dispatcher thread in
    a trailing batch, beside the next call (``runtime.dispatch``). Errors of either kind surface at the next job
    call, naming the handler.

    A handler with a ``health_block`` method (``HealthPanel``) takes reports in bulk when it is the only consumer
    (no writer, no histograms) and the plan runs on the host on one device: ``block_handler``. Each call then only
    records its statistics (``_Monitor``'s block path) and the handler gets ``HealthBlock``s (on its first call,
    when a block is full, when it pulls through the flush it gets from its ``health_source(flush)`` method if it has
    one, and at ``flow.sync_default_session()``; its errors surface at the next job call or sync, naming it). What
    ``health_source`` returns, when callable, is called after each call recorded (``HealthPanel``: its refresh
    thread's poke, which pulls). Anywhere else it gets one ``HealthReport`` a call, as any handler."""

    diff = False            # needs no gradient of its own (watching.gradient_targets)

    def __init__(self, handler, writer, every, thresholds, source, histogram_every=0):
        self.handler, self.writer, self.every, self.thresholds = handler, writer, every, thresholds
        self.source, self.histogram_every = source, histogram_every
        names = ([_name(handler)] if handler is not None else []) + \
            ([f"{type(writer).__name__}.add_health"] if writer is not None else [])
        self.describe = f"flow.watch_health handler {' and '.join(names)}"
        self.inline = [f for f in (writer and writer.add_health, handler)
                       if f is not None and (f is not handler or getattr(handler, "delivered_inline", False))]
        self.queued = handler if handler is not None and handler not in self.inline else None
        self.block_handler = handler if writer is None and not histogram_every and \
            callable(getattr(handler, "health_block", None)) else None

    def expand(self, graph, xp, devices=1):
        layers = find_layers(graph)
        if not layers:
            raise TraceError(f"flow.watch_health at {self.source}: job {graph.name!r} has no layers (trainable "
                             "variables such as flow.layers.dense makes) to watch")
        return _Monitor(self, graph, layers, xp, devices).requests


class _Monitor:
    """Collects one call's vectors (``_arrive``) and turns them into a report: on the job's thread once the plan has
    run (``after_run``), or on several devices in the dispatcher when the loss arrives (``_finish``).

    On one device every statistic is an observing op of the plan (``ops.stats``: ``ActivationStats``,
    ``SquareStats``, ``MeanStat``), added to the graph here, whose small vector the plan delivers to ``_arrive``
    (a host array, or on CuPy a function that waits for its copy; on the host a ReLU output's are taken in the
    ReLU's own pass, the compiler's ``fuse_activation_stats``); histograms are plan deliveries of ``bins``. So on
    a GPU the statistics are part of the CUDA graph a plan is replayed as. On several devices the tensors themselves
    are delivered and summarised on the host from the joined whole.

    The block path (``HealthRequest.block_handler``, on the host on one device): a call only records. Each vector is
    written into the current row of a ring of rows (a column range a vector, ``_columns``), a small layer output is
    copied whole into a ring of its own (``BLOCK_COPY_BYTES``: a copy costs a few µs where its statistics cost ~20),
    and ``after_run`` commits the row. ``flush`` (when ``block_rows`` rows wait, on the first call, or when the
    handler asks) turns the waiting rows into one ``HealthBlock``: the copied outputs' statistics in one vectorised
    pass (``ops.stats.activation_rows``), the tables as one array, and the alerts screened over the whole block
    (``_screen``); only the steps the screen flags get their report made (from that array) and ``health_alerts`` run
    on it, the rules it flags only, with the reports before them as history, so every alert fires on the step and
    with the message it would have one call at a time."""

    def __init__(self, request, graph, layers, xp, devices):
        self.request, self.layers, self.xp, self.graph = request, layers, xp, graph
        self.host_side = devices > 1           # statistics from the joined whole, in the dispatcher
        self.block = request.block_handler is not None and xp is np and devices == 1
        self._columns = {}                     # (block path) key -> (first, end) column of the ring's rows
        self._copied = []                      # (block path) (key, tensor, unit_axis, nonnegative) copied whole
        self._squares = []                     # (block path) (key, tensor, keep) of the weights and gradients
        self.history = []
        self.vectors = {}                      # step -> {key: vector}
        self.samples = {}                      # step -> {key: histogram vector}, on reports that carry them
        self.losses = {}                       # step -> the loss's mean vector (delivered in predict jobs too)
        self.histogram_every = request.histogram_every * request.every
        # what the histograms show: each layer's output, its kernel and the kernel's gradient
        self.kernels = {layer.name: getattr(_kernel(layer), "name", None) for layer in layers}
        self.histogram_keys = set()
        if self.histogram_every:
            for layer in layers:
                kernel = self.kernels[layer.name]
                self.histogram_keys.add(("act", layer.name))
                if kernel is not None:
                    self.histogram_keys.update({("weight", kernel), ("grad", kernel)})
        # the variables whose update follows from the gradient's norm (the plain-SGD step; see _table); the others'
        # values before the update are kept on delivering calls
        self.plain_sgd = {p.name for layer in layers for p in layer.params
                          if _plain_sgd(p.update) and not self.host_side}
        self.kept = {p.name: _Kept() for layer in layers for p in layer.params
                     if p.update is not None and p.name not in self.plain_sgd}
        self.lock = threading.Lock()
        self.results = Results()               # (GPU) the device buffer all statistics are written into
        self.order = []                        # (key, node, layer, what) in the order the plan makes them
        self.extra = 0                         # vectors outside self.order (they end in no NaN/Inf counts)
        self.requests = []
        self._names = {node.name for node in graph.nodes}
        for layer in layers:
            if layer.output is not None:
                self._add(("act", layer.name), layer.output, layer.name, "activation", ActivationStats,
                          unit_axis=layer.unit_axis, nonnegative=layer.nonnegative, scratch=Scratch())
            for p in layer.params:
                self._add(("weight", p.name), p.read, layer.name, "weight", SquareStats, scratch=Scratch(),
                          keep=self.kept.get(p.name))
                if p.update is None:
                    continue
                grad = p.update.inputs[1]
                if p.update.op.row_sparse:
                    # indexed slices: the norm of the gradient the update applies, repeated ids' rows summed first
                    ids = p.update.inputs[2]
                    self._add(("grad", p.name), grad, layer.name, "gradient", SlicesSquareStats, extra=(ids,),
                              parts=_slice_parts(grad), extra_parts=_slice_parts(ids), n_rows=p.read.shape[0],
                              scratch=Scratch())
                else:
                    self._add(("grad", p.name), grad, layer.name, "gradient", SquareStats, scratch=Scratch())
            if layer.moving is not None:
                self._add_batch_norm(layer)
        if self.block:
            self._add_squares()
        # transformers: each attention block's heads, and (then only) the residual stream at each residual sum
        # embedding tables updated row by row: their rows tracked every call, counted on reporting calls
        self.table_rows = {}                   # variable -> its table's rows
        for layer in layers:
            for p in layer.params:
                ids = _indexed_slice_ids(p)
                if ids is not None:
                    self.table_rows[p.name] = p.read.shape[0]
                    self._add_rows(layer, p, ids)
        self.attention = find_attention(graph)
        self.residuals = find_residuals(graph) if self.attention else []
        for block, probs in self.attention:
            self._add(("attn", block), probs, block, "attention", AttentionStats, ordered=False)
        for r in self.residuals:
            for part in ("out", "stream", "branch"):
                self._add((f"res_{part}", r.name), getattr(r, part), r.name, f"residual {part}", SquareStats,
                          scratch=Scratch())
        losses = [loss for _, loss in graph.losses]
        outputs = [layer.output for layer in layers if layer.output is not None]
        # the call is complete when this arrives: the loss, or in a predict job the last layer's output
        last = losses[0] if losses else outputs[-1] if outputs else layers[-1].params[0].read
        self.expected = len(self.order) + self.extra
        self.roles = roles_of(layers)
        self.is_train = bool(losses)
        if self.host_side:
            self.requests.append(self._request(last, call=self._finish))
        elif self.block:
            for name in self.kept:
                self._column(("update", name), 1)
            self._loss_column = self._column("loss", 1)[0]
            # a small loss is copied whole (its mean is the block's, at once), else its mean is taken each call
            self._loss_copied = last if _copied_whole(last) else None
            self.requests.append(self._request(
                last if self._loss_copied is not None else self._observe(MeanStat, last, "loss"),
                put=self._copy_loss if self._loss_copied is not None else self._record_loss,
                after_run=self._after_run_block))
            self._start_ring()
        else:
            self.requests.append(self._request(self._observe(MeanStat, last, "loss", into=self.results.reserve(1)),
                                               put=self._arrive_loss, after_run=self._after_run))
        self.order.sort(key=lambda entry: _run_position(graph, entry[1]))

    def _request(self, tensor, call=None, **options):
        return WatchRequest(tensor, False, call, self.request.describe, every=self.request.every,
                            source=self.request.source, **options)

    def _observe(self, op, tensor, what, extra=(), **attrs):
        """A statistics node reading ``tensor`` (and ``extra`` tensors made before it), named after what it watches
        (unique in the graph)."""
        name = f"System-Health-{what}"
        if name in self._names:
            name = self.graph.local_name(name + "_")
        self._names.add(name)
        return apply(op, (tensor, *extra), name, **attrs)

    def _add(self, key, tensor, layer, what, op, ordered=True, parts=None, extra=(), extra_parts=None, **attrs):
        """Deliver ``op``'s vector of ``tensor`` (and of ``extra``, the op's further inputs, made before it) under
        ``key``; ``ordered``: a vector ending in NaN and Inf counts, searched for the first non-finite op.
        ``parts``: on several devices, the tensors whose joined values, concatenated along axis 0, make ``tensor``'s
        (``_slice_parts``); ``[tensor]`` when None. ``extra_parts``: likewise for the one ``extra`` tensor."""
        if ordered:
            self.order.append((key, tensor.node, layer, what))
        else:
            self.extra += 1
        if self.host_side:
            pieces = parts or [tensor]
            extra_pieces = (extra_parts or list(extra)) if extra else []

            def call(wholes, step, key=key):
                # the op's own computation (and keep), on the joined whole (and on the joined extra input)
                own, others = wholes[:len(pieces)], wholes[len(pieces):]
                whole = own[0] if len(own) == 1 else np.concatenate(own)
                inputs = (np.concatenate(others),) if others else ()
                self._arrive(key, step, op.forward(np, whole, *inputs, **attrs))
                if key in self.histogram_keys and step % self.histogram_every == 0:
                    if op is SlicesSquareStats:         # indexed slices: the rows the update applies, summed by id
                        whole = unique_rows(np, inputs[0], whole, attrs["n_rows"])[1]
                    self._arrive_sample(key, step, histogram_vector(np, whole, HISTOGRAM_BINS))
            self._request_joined(pieces + extra_pieces, call, self.request.every)
            return
        if self.block and op is SquareStats and key[0] in ("weight", "grad"):
            self._squares.append((key, tensor, attrs.get("keep")))      # _add_squares: a few in one op
            return
        if self.block and op is ActivationStats and _copied_whole(tensor):
            self._column(key, 7)
            self._copied.append((key, tensor, attrs["unit_axis"], attrs["nonnegative"]))
            self.requests.append(self._request(tensor, put=self._copier(len(self._copied) - 1)))
            return
        width = 7 if op is ActivationStats else tensor.shape[1] if op is AttentionStats else 3
        stat = self._observe(op, tensor, f"{what}-{key[1]}".replace(" ", "_"), extra=extra,
                             into=None if self.block else self.results.reserve(width), **attrs)
        self.requests.append(self._request(stat, put=self._recorder(key, width) if self.block else
                                           functools.partial(self._arrive, key)))
        if key in self.histogram_keys and op is SlicesSquareStats:
            # indexed slices: the histogram of the rows the update applies (summed by id), counted where they live
            sample = self._observe(SlicesHistogram, tensor, f"{what}-histogram-{key[1]}", extra=extra,
                                   n_rows=attrs["n_rows"], bins=HISTOGRAM_BINS)
            self.requests.append(WatchRequest(sample, False, None, self.request.describe, every=self.histogram_every,
                                              source=self.request.source,
                                              put=functools.partial(self._arrive_sample, key)))
        elif key in self.histogram_keys:
            self.requests.append(WatchRequest(tensor, False, None, self.request.describe, every=self.histogram_every,
                                              source=self.request.source, bins=HISTOGRAM_BINS,
                                              put=functools.partial(self._arrive_sample, key)))

    def _add_squares(self):
        """(Block path) the weights' and the gradients' squares. Small gradients (``FUSED_GRADIENT_BYTES``: read
        again from the cache) have theirs taken by one op after the last of them, and the weights' by that same op
        when no update runs before it (one call and one put fewer, and the updates that follow find the weights in
        cache); else the weights' by one op after the last variable read, before any update, and large gradients'
        by one op each, right after each gradient. Every op is ``ops.stats.SquaresStats`` (``SquareStats`` alone)."""
        weights = [entry for entry in self._squares if entry[0][0] == "weight"]
        grads = [entry for entry in self._squares if entry[0][0] == "grad"]
        small = sum(math.prod(t.shape) * t.dtype.itemsize for _, t, _ in grads) <= FUSED_GRADIENT_BYTES
        groups = [weights] + ([grads] if small else [[entry] for entry in grads])
        if weights and grads and small and self._updates_follow(grads):
            groups = [weights + grads]
        for group in groups:
            if not group:
                continue
            spans = [self._column(key, 3) for key, _, _ in group]
            (key, tensor, keep), rest = group[0], group[1:]
            if rest:
                stat = self._observe(SquaresStats, tensor, f"squares-{key[0]}", extra=[t for _, t, _ in rest],
                                     keeps=tuple(k for _, _, k in group), memo=FlatViews())
            else:
                what = "weight" if key[0] == "weight" else "gradient"
                stat = self._observe(SquareStats, tensor, f"{what}-{key[1]}", scratch=Scratch(), keep=keep)
            self.requests.append(self._request(stat, put=self._span_recorder(spans[0][0], spans[-1][1])))

    def _updates_follow(self, grads):
        """Whether every variable update of the layers runs after every tensor of ``grads`` (graph order), so
        that an op reading the gradients sees the weights before this call's update."""
        last_grad = max(_run_position(self.graph, t.node) for _, t, _ in grads)
        updates = [p.update for layer in self.layers for p in layer.params if p.update is not None]
        return all(_run_position(self.graph, u) > last_grad for u in updates)

    def _add_batch_norm(self, layer):
        """A batch norm's moving statistics, and in a train job how far this call's batch statistics are from
        them (``ops.stats.batch_norm_vector``): one observing op reading all four, which runs right after the
        normalization, before the moving averages are updated in place. On several devices the per-channel
        statistics are delivered and averaged over the devices (each device's batch statistics, the moving ones
        alike on all), the vector made once all have arrived."""
        key, parts = ("bn", layer.name), layer.batch_norm
        tensors = [layer.moving[m] for m in MOVING_STATISTICS]
        if parts is not None and parts.batch_mean is not None:
            tensors = [parts.batch_mean, parts.batch_variance] + tensors
        epsilon = parts.epsilon if parts is not None else 1e-5
        self.order.append((key, tensors[0].node, layer.name, "moving statistics"))
        if self.host_side:
            channels = tensors[-1].shape[0]
            arrived = {}                                    # step -> {position: per-channel host vector}

            def call(value, step, position):
                per_channel = np.asarray(value.whole, np.float64).reshape(-1, channels).mean(axis=0)
                with self.lock:
                    pieces = arrived.setdefault(step, {})
                    pieces[position] = per_channel
                    if len(pieces) < len(tensors):
                        return
                    del arrived[step]
                    for old in [s for s in arrived if s < step]:
                        del arrived[old]                    # a call that failed half-way
                ordered = [pieces[i] for i in range(len(tensors))]
                batch = ordered[:2] if len(ordered) == 4 else (None, None)
                self._arrive(key, step, batch_norm_vector(np, *ordered[-2:], *batch, epsilon=epsilon))
            for position, tensor in enumerate(tensors):
                self.requests.append(self._request(tensor, call=functools.partial(call, position=position)))
            return
        stat = self._observe(BatchNormStats, tensors[0], f"moving-{layer.name}", extra=tensors[1:],
                             epsilon=epsilon, into=None if self.block else self.results.reserve(7))
        self.requests.append(self._request(stat, put=self._recorder(key, 7) if self.block else
                                           functools.partial(self._arrive, key)))

    def _add_rows(self, layer, p, ids):
        """Track the rows of ``p``'s table that each call's ``ids`` update (``RowTouches``, in every call's plan) and
        deliver ``row_coverage_vector`` on reporting calls under ``("rows", name)``. On several devices the joined
        ids (of each gather, for a table gathered more than once: ``_slice_parts``) are delivered every call and
        tracked on the host in the dispatcher, in call order."""
        key, rows = ("rows", p.name), p.read.shape[0]
        tracker, stale_after = RowTracker(), self.request.thresholds["stale_steps"]
        self.extra += 1
        if self.host_side:
            every = self.request.every
            parts = []
            for part in _slice_parts(ids):
                while part.node.op.is_view and len(part.node.inputs) == 1:
                    part = part.node.inputs[0]      # the ids as fed (split along the batch), not a flattened view
                parts.append(part)

            def call(wholes, step):
                flat = np.concatenate([np.asarray(w).reshape(-1) for w in wholes])
                touched = RowTouches.forward(np, flat, rows, tracker)
                if step % every == 0:
                    self._arrive(key, step, RowCoverage.forward(np, touched, rows, tracker, stale_after))
            self._request_joined(parts, call, 1)
            return
        touches = self._observe(RowTouches, ids, f"rows-{p.name}", rows=rows, tracker=tracker)
        stat = self._observe(RowCoverage, touches, f"row_coverage-{p.name}", rows=rows, tracker=tracker,
                             stale_after=stale_after, into=None if self.block else self.results.reserve(3))
        self.requests.append(self._request(stat, put=self._recorder(key, 3) if self.block else
                                           functools.partial(self._arrive, key)))

    def _request_joined(self, tensors, call, every):
        """Several devices: ``call(wholes, step)`` in the dispatcher once the joined values of all ``tensors`` of a
        call have arrived (``wholes``: those values, in the order of ``tensors``); on the calls ``every`` says."""
        if len(tensors) == 1:
            self.requests.append(WatchRequest(tensors[0], False, lambda value, step: call([value.whole], step),
                                              self.request.describe, every=every, source=self.request.source))
            return
        arrived = {}                                        # step -> {position: joined value}

        def arrive(value, step, position):
            with self.lock:
                pieces = arrived.setdefault(step, {})
                pieces[position] = value.whole
                if len(pieces) < len(tensors):
                    return
                del arrived[step]
                for old in [s for s in arrived if s < step]:
                    del arrived[old]                        # a call that failed half-way
            call([pieces[i] for i in range(len(tensors))], step)
        for position, tensor in enumerate(tensors):
            self.requests.append(WatchRequest(tensor, False, functools.partial(arrive, position=position),
                                              self.request.describe, every=every, source=self.request.source))

    def _arrive(self, key, step, vector):
        with self.lock:
            self.vectors.setdefault(step, {})[key] = vector

    def _arrive_sample(self, key, step, vector):
        with self.lock:
            self.samples.setdefault(step, {})[key] = vector

    def _arrive_loss(self, step, vector):
        with self.lock:
            self.losses[step] = vector

    def _after_run(self):
        """On the job's thread after the plan ran: this call's report, to the inline handlers here and to a queued
        handler through the returned dispatcher call. On a GPU the whole report is made in the dispatcher, beside
        the next call: the job's thread is what keeps the device busy there, while on the host it is the device."""
        with self.lock:
            if not self.losses:
                self.vectors.clear()            # not a delivering call, or it failed before the loss
                self.samples.clear()
                return []
            step = max(self.losses)
            loss, vectors, samples = self.losses.pop(step), self.vectors.pop(step, {}), self.samples.pop(step, None)
            self.losses.clear(), self.vectors.clear(), self.samples.clear()
        if len(vectors) == self.expected:
            vectors.update(self._updates())
        describe = lambda: f"{self.request.describe} (step {step})"       # noqa: E731
        if self.xp is not np and REPORT_BESIDE_NEXT_CALL_ON_GPU:
            return [(lambda: self._deliver(step, loss, vectors, samples, queue=False), describe)]
        queued = self._deliver(step, loss, vectors, samples, queue=True)
        return [] if queued is None else [(queued, describe)]

    # ------------------------------------------------------------------------------------------- block path

    def _column(self, key, width):
        """Reserve ``width`` columns of the ring's rows for ``key``'s vector."""
        first = sum(end - start for start, end in self._columns.values())
        self._columns[key] = (first, first + width)
        return self._columns[key]

    def _recorder(self, key, width):
        """The put of a statistics op's vector: written into this call's row."""
        return self._span_recorder(*self._column(key, width))

    def _span_recorder(self, start, end):
        def put(step, vector):
            self._row[start:end] = vector
            self._arrived += 1
        return put

    def _copier(self, k):
        """The put of a layer output copied whole (``_copied[k]``) into this call's slot of its ring."""
        def put(step, x):
            self._slots[k][...] = x
            self._arrived += 1
        return put

    def _record_loss(self, step, vector):
        self._row[self._loss_column] = vector[0]
        self._step = step
        self._arrived += 1

    def _copy_loss(self, step, x):
        self._loss_slot[...] = x
        self._step = step
        self._arrived += 1

    def _start_ring(self):
        """The rings: ``2 * block_rows`` rows of vectors, steps and copied outputs. The job's thread writes the slot
        at ``_head`` (its call's, committed by ``after_run``), ``flush`` reads those from ``_tail`` to ``_head``;
        the job flushes itself once ``block_rows`` wait, so it never writes a slot being read."""
        copied_bytes = sum(math.prod(t.shape) * t.dtype.itemsize for _, t, _, _ in self._copied) + \
            (0 if self._loss_copied is None else math.prod(self._loss_copied.shape) * self._loss_copied.dtype.itemsize)
        self.block_rows = int(min(BLOCK_ROWS[1], max(BLOCK_ROWS[0], BLOCK_COPY_BYTES // max(copied_bytes, 1))))
        capacity = 2 * self.block_rows
        width = sum(end - start for start, end in self._columns.values())
        self._rows = np.zeros((capacity, width))
        self._steps = np.zeros(capacity, np.int64)
        self._rings = [np.zeros((capacity, *t.shape), t.dtype) for _, t, _, _ in self._copied]
        loss = self._loss_copied
        self._loss_ring = None if loss is None else np.zeros((capacity, math.prod(loss.shape)), loss.dtype)
        self._expected_puts = sum(r.put is not None for r in self.requests)       # the loss's included
        self._arrived, self._step = 0, None
        self._head = self._tail = 0
        self._flush_lock = threading.Lock()
        self._context = _Context()
        self._layout = None
        self._views = [(self._rows[slot], [ring[slot] for ring in self._rings],
                        None if loss is None else self._loss_ring[slot].reshape(loss.shape))
                       for slot in range(capacity)]
        self._point(0)
        describe = self.request.describe
        handler = self.request.block_handler
        source = getattr(handler, "health_source", None)
        wake = source(self.flush) if source is not None else None
        self._wake = wake if callable(wake) else None     # told of each call recorded (a refresh thread's poke)
        session.on_sync(self.flush)           # flow.sync_default_session() delivers every call recorded
        self._deliver_block = handler.health_block
        self._describe_block = lambda steps: f"{describe} (steps {steps[0]} … {steps[-1]})" \
            if len(steps) > 1 else f"{describe} (step {steps[0]})"

    def _point(self, head):
        """Aim the puts at the ring slot of call ``head`` (views made once: this runs every call)."""
        self._row, self._slots, self._loss_slot = self._views[head % len(self._views)]

    def _after_run_block(self):
        """On the job's thread after the plan ran: commit this call's row when every vector arrived (a call that
        failed half-way, or one that delivers nothing, leaves none), and flush when a block is full (or on the first
        call: the handler sees the run start, and a handler's error surfaces at once)."""
        arrived, self._arrived = self._arrived, 0
        if arrived < self._expected_puts:
            return []
        if self.kept:
            for key, vector in self._updates().items():
                start, end = self._columns[key]
                self._row[start:end] = vector
        with self.lock:
            self._steps[self._head % len(self._steps)] = self._step
            self._head += 1
            due = self._head - self._tail >= self.block_rows or self._head == 1
        self._point(self._head)
        if due:
            self.flush()
        elif self._wake is not None:
            self._wake()
        return []

    def flush(self):
        """Give the calls recorded and not yet given to the block handler, as one ``HealthBlock`` (any thread; a
        handler's error surfaces at the next job call, naming it)."""
        with self._flush_lock:
            with self.lock:
                tail, head = self._tail, self._head
            if head == tail:
                return
            steps = None
            try:
                block = self._make_block(tail, head)
                steps = block.steps
            except BaseException as e:
                dispatch.default().report(f"{self.request.describe} (building a block of reports)", e)
                return
            finally:
                with self.lock:
                    self._tail = head
            try:
                self._deliver_block(block)
            except BaseException as e:
                dispatch.default().report(self._describe_block(steps), e)

    def _make_block(self, tail, head):
        capacity = len(self._steps)
        start, n = tail % capacity, head - tail
        parts = [(start, min(start + n, capacity))] + ([(0, start + n - capacity)] if start + n > capacity else [])
        index = np.concatenate([np.arange(a, b) for a, b in parts])
        rows, steps = self._rows[index], self._steps[index]
        for (key, _, unit_axis, nonnegative), ring in zip(self._copied, self._rings):
            first, end = self._columns[key]
            rows[:, first:end] = np.concatenate([activation_rows(ring[a:b], unit_axis, nonnegative) for a, b in parts])
        if self._loss_ring is not None:         # mean_vector's sum, row by row
            losses = self._loss_ring[index]
            rows[:, self._loss_column] = np.add.reduce(losses, axis=1, dtype=np.float64) / max(losses.shape[1], 1)
        if self._layout is None:
            self._layout = _BlockLayout(self)
        return self._layout.block(self, rows, steps)

    def _host_row(self, row):
        """One call's vectors as ``_report`` reads them, from a row of the ring."""
        values = row.tolist()
        return {key: values[start:end] for key, (start, end) in self._columns.items()}

    def _updates(self):
        """``{("update", name): [sum of squares of this call's change]}`` of the variables whose update is measured
        from their kept values: taken now, before the next call changes them (one host copy for all on a GPU)."""
        if not self.kept:
            return {}
        variables, xp = session.default().variables, self.xp
        names = list(self.kept)
        squares = [square_vector(xp, variables[name].value - self.kept[name].array)[:1] for name in names]
        if xp is not np:
            squares = list(xp.concatenate(squares).get().reshape(-1, 1))
        return {("update", name): v for name, v in zip(names, squares)}

    def _deliver(self, step, loss, vectors, samples, queue):
        """Make the report and give it to the inline handlers; the queued handler's call is returned when
        ``queue``, else made here (in the dispatcher, whose caller reports its error)."""
        report = self._report(step, float(_host(loss)[0]) if self.is_train else None, vectors, samples)
        if report is None:
            return None
        for deliver in self.request.inline:
            try:
                deliver(report)
            except BaseException as e:          # raised at the next job call, as a watch callback's error
                dispatch.default().report(f"{self.request.describe} (step {step})", e)
        queued = self.request.queued
        if queued is None:
            return None
        if queue:
            return lambda: queued(report)
        queued(report)
        return None

    def _finish(self, value, step):
        """Several devices: the loss's joined value arrived in the dispatcher, after this call's other tensors."""
        with self.lock:
            vectors = self.vectors.pop(step, {})
            samples = self.samples.pop(step, None)
            for pending in (self.vectors, self.samples):
                for old in [s for s in pending if s < step]:
                    del pending[old]           # a call that failed half-way
        loss = None
        if self.is_train:
            loss = float(mean_vector(np, np.asarray(getattr(value, "whole", value), dtype=np.float64))[0])
        report = self._report(step, loss, vectors, samples)
        if report is not None:
            for deliver in (*self.request.inline, self.request.queued):
                if deliver is not None:
                    deliver(report)

    def _report(self, step, loss, vectors, samples):
        if len(vectors) < self.expected:
            return None                        # the call failed before every tensor was made: no report
        # plain floats: the table, the alerts and the search for NaN read each number once or twice
        host = {key: (v if type(v) is np.ndarray else _host(v)).tolist() for key, v in vectors.items()}
        report = self._make_report(step, loss, host, samples)
        report.alerts = health_alerts(self.history, report, self.request.thresholds, roles=self.roles)
        self.history.append(report)
        del self.history[:-self.request.thresholds["window"] - 1]
        return report

    def _make_report(self, step, loss, host, samples=None, table=None):
        """The report of one call's vectors ``host`` (``{key: list of floats}``), without its alerts (``table``:
        its table, when made already)."""
        table = self._table(host, step) if table is None else table
        return HealthReport(step, table, loss, self._first_nonfinite(host, table),
                            histograms=samples and self._histograms(samples),
                            attention={block: host[("attn", block)] for block, _ in self.attention},
                            residual={r.name: _residual_row(host, r.name) for r in self.residuals})

    def _table(self, host, step):
        table = {}
        variables = session.default().variables
        scales = {}                             # the plain-SGD step's factor, once per schedule (most jobs: one)
        for layer in self.layers:
            activation = host.get(("act", layer.name))
            row = {} if activation is None else dict(zip(ACTIVATION_STATISTICS, activation))
            w2 = wn = wi = g2 = gn = gi = u2 = 0.0
            grads = False
            for p in layer.params:
                sq, nan, inf = host[("weight", p.name)]
                w2, wn, wi = w2 + sq, wn + nan, wi + inf
                if p.update is None:
                    continue
                grads = True
                gsq, nan, inf = host[("grad", p.name)]
                g2, gn, gi = g2 + gsq, gn + nan, gi + inf
                if p.name in self.plain_sgd:
                    attrs = p.update.attrs
                    key = (id(attrs["schedule"]), attrs["grad_scale"])
                    scale = scales.get(key)
                    if scale is None:
                        scale = scales[key] = attrs["schedule"](step) * attrs["grad_scale"]
                    u2 += scale * scale * gsq
                elif self.host_side:            # the kept copy is the joined whole, on the host
                    now = _host(variables[p.name].value)
                    u2 += float(square_vector(np, now - self.kept[p.name].array)[0])
                else:
                    u2 += host[("update", p.name)][0]
            if layer.params:
                row.update(weight_norm=math.sqrt(w2), weight_nan=wn, weight_inf=wi)
            if grads:
                row.update(grad_norm=math.sqrt(g2), grad_nan=gn, grad_inf=gi,
                           update_ratio=math.sqrt(u2) / math.sqrt(w2) if w2 > 0 else math.nan)
            tables = [(host[("rows", p.name)], self.table_rows[p.name]) for p in layer.params
                      if ("rows", p.name) in host]
            if tables:
                total = sum(rows for _, rows in tables)
                touched, ever, stale = (sum(v[i] for v, _ in tables) for i in range(3))
                row.update(rows_touched=touched, touched_fraction=ever / total, stale_rows=stale,
                           stale_fraction=stale / total)
            moving = host.get(("bn", layer.name))
            if moving is not None:
                row.update(zip(BATCH_NORM_STATISTICS, moving))
            table[layer.name] = row
        return table

    def _histograms(self, samples):
        """``{layer: {"activation" | "weight" | "gradient": buckets}}`` from one call's histogram vectors."""
        out = {}
        for layer in self.layers:
            kernel = self.kernels[layer.name]
            kinds = {what: histogram_buckets(samples[key])
                     for what, key in (("activation", ("act", layer.name)), ("weight", ("weight", kernel)),
                                       ("gradient", ("grad", kernel)))
                     if key in samples}
            out[layer.name] = kinds
        return out

    def _first_nonfinite(self, host, table):
        """The first watched op, in run order, whose tensor held NaN/Inf; searched only when some count of the
        ``table`` (made from the same vectors) says there is one."""
        if not any(row.get(count) for row in table.values() for count in COUNT_STATISTICS):
            return None
        for key, node, layer, what in self.order:
            v = host[key]
            nan, inf = v[-2], v[-1]
            if nan or inf:
                return {"op": node.name, "tensor": node.outputs[0].logical_blob_name, "layer": layer, "what": what,
                        "source": node.source, "nan": int(nan), "inf": int(inf)}
        return None


def _copied_whole(tensor):
    """The block path copies this layer output whole rather than summarise it each call (``BLOCK_COPY_LIMIT``)."""
    return tensor.dtype in (np.float32, np.float64) and \
        0 < math.prod(tensor.shape) * tensor.dtype.itemsize <= BLOCK_COPY_LIMIT


class _Context(NamedTuple):
    """The last ``window`` calls a block path has flushed: the alerts of the next block's first calls read them."""
    rows: np.ndarray = np.zeros((0, 0))
    steps: np.ndarray = np.zeros(0, np.int64)
    reports: tuple = ()             # their reports where made (None where not)


def _below(x):
    """A hair under ``x`` (the screen's margin: it may flag a call the rule then clears, never miss one)."""
    return x - 1e-9 * np.abs(x)


def _above(x):
    return x + 1e-9 * np.abs(x)


def _earlier_min(x, window):
    """``[i]``: the smallest finite value among ``x[i - window:i]`` (NaN when there is none)."""
    return np.fmin.reduce(_earlier(x, window), axis=1)


def _above_recent(x, factor, window):
    """Whether ``x[i]`` may be above ``factor`` times the median of the finite values among ``x[i - window:i]``
    (``loss_spike``, the exploding total gradient norm), without a median: of ``m`` values, the median is below
    ``x[i] / factor`` only if at least ``m // 2`` of them are (with ``_above``'s margin)."""
    earlier = _earlier(x, window)
    finite = np.isfinite(earlier).sum(axis=1)
    below = (earlier < _above(x / factor)[:, None]).sum(axis=1)
    return (finite > 0) & (below >= np.maximum(finite // 2, 1))


def _earlier(x, window):
    """``[i]``: ``x[i - window:i]``, NaN for non-finite values and before the start."""
    padded = np.concatenate([np.full(window, np.nan), np.where(np.isfinite(x), x, np.nan)])
    return np.lib.stride_tricks.sliding_window_view(padded, window)[:len(x)]


class _BlockLayout:
    """What a block path's rows hold and how its blocks are made: the tables as one array, the screen of the alerts
    (``_screen``), and the reports of the calls it flags."""

    def __init__(self, monitor):
        self.layers = tuple(layer.name for layer in monitor.layers)
        columns, statistics, per_layer, named = monitor._columns, {}, [], []
        self.tables = []                             # (layer index, [(rows column, table rows)]): embeddings
        for layer in monitor.layers:
            names = []
            act, bn = columns.get(("act", layer.name)), columns.get(("bn", layer.name))
            if act is not None:
                names += ACTIVATION_STATISTICS
            if layer.params:
                names += ["weight_norm", "weight_nan", "weight_inf"]
            if any(p.update is not None for p in layer.params):
                names += ["grad_norm", "grad_nan", "grad_inf", "update_ratio"]
            tables = [(columns[("rows", p.name)][0], monitor.table_rows[p.name]) for p in layer.params
                      if ("rows", p.name) in columns]
            if tables:
                names += ROW_STATISTICS
            if bn is not None:
                names += BATCH_NORM_STATISTICS
            statistics.update(dict.fromkeys(names))
            named.append(names)
            per_layer.append((layer, act, bn))
            if tables:
                self.tables.append((len(per_layer) - 1, tables))
        self.statistics = tuple(statistics)          # the tables' statistics, in their first-seen order
        where = {s: j for j, s in enumerate(self.statistics)}
        self.where = where
        # each layer's statistics as _table lists them, with their index in the block's values
        self.named = [(layer.name, [(name, where[name]) for name in names])
                      for (layer, _, _), names in zip(per_layer, named)]
        width = len(self.statistics)
        # statistics copied as they are (the activation's, a batch norm's): one fancy-indexed copy a block
        src, dst = [], []
        for i, (layer, act, bn) in enumerate(per_layer):
            for names, span in ((ACTIVATION_STATISTICS, act), (BATCH_NORM_STATISTICS, bn)):
                if span is not None:
                    src += range(*span)
                    dst += [i * width + where[s] for s in names]
        self.src, self.dst = np.array(src, np.intp), np.array(dst, np.intp)
        # statistics summed over a layer's variables, in _table's order (so the sums are _table's to the bit)
        self.params = []
        for i, (layer, _, _) in enumerate(per_layer):
            weights = [columns[("weight", p.name)][0] for p in layer.params]
            grads = []
            for p in layer.params:
                if p.update is None:
                    continue
                g = columns[("grad", p.name)][0]
                if p.name in monitor.plain_sgd:
                    attrs = p.update.attrs
                    grads.append((g, (attrs["schedule"], attrs["grad_scale"]), None))
                else:
                    grads.append((g, None, columns[("update", p.name)][0]))
            if weights:
                self.params.append((i, weights, grads))
        roles = monitor.roles
        t = monitor.request.thresholds
        self.t, self.window = t, t["window"]
        self.counts = [where[s] for s in COUNT_STATISTICS if s in where]
        self.relu = [i for i, name in enumerate(self.layers) if roles[name].relu]
        self.graded = [i for i, (layer, _, _) in enumerate(per_layer)
                       if any(p.update is not None for p in layer.params)]
        self.unrelaxed = np.array([_ratio_rule_relaxes_nothing(roles[self.layers[i]]) for i in self.graded], bool)
        self.plain = [i for i in self.graded if not roles[self.layers[i]].normalised and
                      not roles[self.layers[i]].batch_norm]
        # a layer making attention scores leaves the comparison across depth while its heads are uniform
        # (_Seen.scores_idle): which layers are compared then changes from call to call, so no screen
        self.depth_unscreened = any(roles[self.layers[i]].attention is not None for i in self.plain)
        self.attention = [(block, columns[("attn", block)]) for block, _ in monitor.attention]
        self.residual = [(r.name, columns[("res_out", r.name)][0], columns[("res_stream", r.name)][0],
                          columns[("res_branch", r.name)][0]) for r in monitor.residuals]
        self.loss = monitor._loss_column if monitor.is_train else None

    def values(self, rows, steps):
        """The tables of ``rows`` as one ``(calls, layers, statistics)`` array (NaN where a layer has none)."""
        n, width = len(rows), len(self.statistics)
        out = np.full((n, len(self.layers), width), np.nan)
        out.reshape(n, -1)[:, self.dst] = rows[:, self.src]
        scales = {}
        where = self.where
        with np.errstate(invalid="ignore", divide="ignore"):
            for i, weights, grads in self.params:
                w2, wn, wi = rows[:, weights[0]], rows[:, weights[0] + 1], rows[:, weights[0] + 2]
                for c in weights[1:]:
                    w2, wn, wi = w2 + rows[:, c], wn + rows[:, c + 1], wi + rows[:, c + 2]
                out[:, i, where["weight_norm"]], out[:, i, where["weight_nan"]] = np.sqrt(w2), wn
                out[:, i, where["weight_inf"]] = wi
                if not grads:
                    continue
                g2, gn, gi, u2 = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
                for c, plain, update in grads:
                    g2, gn, gi = g2 + rows[:, c], gn + rows[:, c + 1], gi + rows[:, c + 2]
                    if plain is not None:
                        key = (id(plain[0]), plain[1])
                        scale = scales.get(key)
                        if scale is None:
                            scale = scales[key] = np.array([plain[0](s) * plain[1] for s in steps.tolist()],
                                                           np.float64)
                        u2 = u2 + scale * scale * rows[:, c]
                    else:
                        u2 = u2 + rows[:, update]
                out[:, i, where["grad_norm"]], out[:, i, where["grad_nan"]] = np.sqrt(g2), gn
                out[:, i, where["grad_inf"]] = gi
                out[:, i, where["update_ratio"]] = np.where(w2 > 0, np.sqrt(u2) / np.sqrt(w2), np.nan)
            for i, tables in self.tables:               # summed over a layer's tables, as _table sums them
                total = sum(size for _, size in tables)
                touched, ever, stale = (sum(rows[:, c + k] for c, _ in tables) for k in range(3))
                out[:, i, where["rows_touched"]], out[:, i, where["stale_rows"]] = touched, stale
                out[:, i, where["touched_fraction"]] = ever / total
                out[:, i, where["stale_fraction"]] = stale / total
        return out

    def _screen(self, values, rows, first):
        """Per call (0 before ``first``), a bit mask (``_RULE_BIT``) of the alert rules it may meet: each rule's
        condition, read loosely (``_below``/``_above``; a median over a window not full of finite values read as their
        minimum), over the whole block at once. A superset: ``health_alerts`` then runs those rules on the calls
        flagged, and decides."""
        t, window, n = self.t, self.window, len(rows)
        masks = np.zeros(n, np.int64)
        where = self.where

        def may(rule, flag):
            masks[flag] |= _RULE_BIT[rule]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            if self.counts:
                may(_nan_alert, (values[:, :, self.counts] > 0).any(axis=(1, 2)))
            if self.relu and "dead_fraction" in where:
                may(_dead_relu_alerts,
                    (values[:, self.relu, where["dead_fraction"]] > _below(t["dead_fraction"])).any(axis=1))
            if self.graded:
                ratio = values[:, :, where["update_ratio"]]
                may(_update_ratio_alerts, (np.isfinite(ratio) & ((ratio < _above(t["update_ratio_low"])) |
                                                                 (ratio > _below(t["update_ratio_high"])))).any(axis=1))
                g = values[:, self.graded, where["grad_norm"]]
                depth = ~np.isfinite(g).all(axis=1) | (g == 0).any(axis=1)      # no gradient; vanishing, exploding
                if self.depth_unscreened:
                    depth[:] = True
                elif len(self.plain) >= 2:
                    last = values[:, self.plain[-1], where["grad_norm"]]
                    others = values[:, self.plain[:-1], where["grad_norm"]]
                    depth |= (last > 0) & ((others.min(axis=1) < _above(t["vanishing_ratio"] * last)) |
                                           (others.max(axis=1) > _below(t["exploding_ratio"] * last)))
                may(_depth_gradient_alerts, depth)
                total = np.zeros(n)
                for k in range(g.shape[1]):
                    total = total + g[:, k] ** 2
                total = np.sqrt(total)                                          # exploding over time
                may(_total_gradient_alerts, ~np.isfinite(total) | _above_recent(total, t["exploding_factor"], window))
            for i, _ in self.tables:
                may(_stale_rows_alerts, values[:, i, where["stale_fraction"]] > _below(t["stale_fraction"]))
            if self.loss is not None:
                loss = rows[:, self.loss]
                may(_loss_spike_alert, np.isfinite(loss) & _above_recent(loss, t["loss_spike_factor"], window))
            for _, (start, end) in self.attention:                              # collapsed, or uniform throughout
                heads = rows[:, start:end]
                earlier = np.stack([_earlier_min(heads[:, h], window) for h in range(end - start)], axis=1)
                uniform = _below(t["attention_uniform"])
                may(_attention_alerts, (heads < _above(t["attention_collapsed"])).any(axis=1) |
                    ((heads > uniform) & (earlier > uniform)).any(axis=1))
            for _, out, stream, _ in self.residual:
                growth = np.where(rows[:, stream] > 0, np.sqrt(rows[:, out] / rows[:, stream]), np.inf)
                may(_residual_alerts, ~(growth <= _below(t["residual_growth"])))
        masks[:first] = 0
        return masks

    def _bulk_update_ratio_alerts(self, values, steps, masks):
        """``{call: its alerts}`` of the flagged calls that only the update-ratio rule may alert on, where it alerts
        only on layers it relaxes nothing for (``_ratio_rule_relaxes_nothing``), none of them at an update of
        exactly 0 despite a gradient (a warm-up's first step: the rule reads the history then): decided over the
        block at once, with the rule's message, and no report made. A converged net's ratio often leaves the range
        for good, so this is the common case that would otherwise make a report and run the rule on every call."""
        calls = np.flatnonzero(masks == _RULE_BIT[_update_ratio_alerts])
        if not len(calls):
            return {}
        t, where = self.t, self.where
        graded = values[calls][:, self.graded]
        ratio, grad = graded[:, :, where["update_ratio"]], graded[:, :, where["grad_norm"]]
        with np.errstate(invalid="ignore"):
            out = np.isfinite(ratio) & ((ratio < t["update_ratio_low"]) | (ratio > t["update_ratio_high"]))
            warm_up = (ratio == 0) & (grad > 0)
        ruled = (out & (~self.unrelaxed | warm_up)).any(axis=1)
        names = [self.layers[i] for i in self.graded]
        direct = {}
        for call, step, decided, row_out, row_ratio, row_grad in zip(
                calls.tolist(), steps[calls].tolist(), (~ruled).tolist(), out.tolist(), ratio.tolist(), grad.tolist()):
            if decided:
                direct[call] = [HealthAlert("update_ratio", name, step, _update_ratio_message(name, r, g, t))
                                for name, fires, r, g in zip(names, row_out, row_ratio, row_grad) if fires]
        return direct

    def _report(self, monitor, row, values, step, nonfinite):
        """The ``HealthReport`` (alerts aside) of the call of ``row`` (the ring's) whose table the block made in bulk
        (``values``: ``_table``'s numbers, in its order); ``nonfinite``: some count of it is not 0."""
        table = {layer: {name: v[j] for name, j in names} for (layer, names), v in zip(self.named, values.tolist())}
        loss = float(row[self.loss]) if self.loss is not None else None
        if nonfinite or self.attention or self.residual:       # the first op with NaN, a transformer's rows
            return monitor._make_report(step, loss, monitor._host_row(row), table=table)
        return HealthReport(step, table, loss)

    def block(self, monitor, rows, steps):
        """The ``HealthBlock`` of new calls ``rows`` (their ``steps``); the alert window reads the calls before them
        (``monitor._context``), which then become the last ones of these. Only the calls the screen flags get their
        report made (and those of their windows), and only the rules it flags run on them: a rule that fires every
        call (a converged net's small update ratio) costs a few microseconds a call."""
        context = monitor._context
        first = len(context.steps)
        if first:
            rows, steps = np.concatenate([context.rows, rows]), np.concatenate([context.steps, steps])
        values = self.values(rows, steps)
        reports = list(context.reports) + [None] * (len(rows) - first)
        masks = self._screen(values, rows, first)
        nonfinite_bit = _RULE_BIT[_nan_alert]
        direct = self._bulk_update_ratio_alerts(values, steps, masks)

        def report_at(i):
            if reports[i] is None:
                reports[i] = self._report(monitor, rows[i], values[i], int(steps[i]), masks[i] & nonfinite_bit)
                reports[i].alerts = direct.get(i, [])
            return reports[i]

        alerts, window, made = [], self.window, 0          # reports[:made] are all made
        for i, mask in zip(*_nonzero(masks)):
            if i in direct:
                alerts += direct[i]
                continue
            for j in range(max(made, i - window), i + 1):
                report_at(j)
            made = i + 1
            report = reports[i]
            report.alerts = health_alerts(reports[max(0, i - window):i], report, self.t, roles=monitor.roles,
                                          rules=_rules_of(mask))
            alerts += report.alerts
        keep = slice(max(0, len(rows) - window), None)
        monitor._context = _Context(rows[keep], steps[keep], tuple(reports[keep]))
        return HealthBlock(
            steps[first:], self.layers, self.statistics, values[first:],
            rows[first:, self.loss] if self.loss is not None else None, alerts,
            {block: rows[first:, start:end] for block, (start, end) in self.attention},
            {name: _residual_columns(rows[first:], out, stream, branch) for name, out, stream, branch in self.residual},
            functools.partial(_block_report, reports[first:], report_at, first))


def _nonzero(masks):
    """The indices of the non-zero masks and those masks, as lists of ints."""
    where = np.flatnonzero(masks)
    return where.tolist(), masks[where].tolist()


def _block_report(reports, report_at, first, i):
    return reports[i] if reports[i] is not None else report_at(first + i)


def _residual_columns(rows, out, stream, branch):
    """``_residual_row``'s numbers of a block's calls, as columns."""
    o, s, b = rows[:, out], rows[:, stream], rows[:, branch]
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"stream_norm": np.sqrt(s), "growth": np.where(s > 0, np.sqrt(o / s), np.inf),
                "branch_ratio": np.where(s > 0, np.sqrt(b / s), np.inf)}


class HealthBlock:
    """The reports of consecutive calls in bulk, as ``watch_health`` gives them to a handler with a
    ``health_block`` method (``HealthRequest``): ``steps`` (int64, ``(n,)``), ``layers`` and ``statistics`` (the
    tables' names, as ``health_log.columns`` orders a report's), ``values`` (``(n, layers, statistics)`` float64,
    NaN where a layer has no such statistic: the reports' tables), ``loss`` (``(n,)``, None in a predict job),
    ``alerts`` (every ``HealthAlert`` of these calls, in step order, each the one a report of that call would
    carry), ``attention`` (``{block: (n, heads)}``) and ``residual`` (``{sum: {statistic: (n,)}}``). ``report(i)``
    makes the ``HealthReport`` of call ``i`` (its table, alerts and all); ``reports()`` all of them."""

    def __init__(self, steps, layers, statistics, values, loss, alerts, attention, residual, make_report):
        self.steps, self.layers, self.statistics, self.values = steps, layers, statistics, values
        self.loss, self.alerts, self.attention, self.residual = loss, alerts, attention, residual
        self._make_report = make_report

    def __len__(self):
        return len(self.steps)

    def report(self, i):
        """The ``HealthReport`` of call ``i`` of the block (negative: from the end)."""
        return self._make_report(range(len(self.steps))[i])

    def reports(self):
        return [self.report(i) for i in range(len(self.steps))]

    def __repr__(self):
        return (f"HealthBlock(steps {self.steps[0]}…{self.steps[-1]}, {len(self.layers)} layers, "
                f"{len(self.alerts)} alerts)")


def _residual_row(host, name):
    """``stream_norm``, ``growth`` and ``branch_ratio`` of a residual sum from its three tensors' sums of squares."""
    out, stream, branch = (host[(f"res_{part}", name)][0] for part in ("out", "stream", "branch"))
    return {"stream_norm": math.sqrt(stream),
            "growth": math.sqrt(out / stream) if stream > 0 else math.inf,
            "branch_ratio": math.sqrt(branch / stream) if stream > 0 else math.inf}


def _run_position(graph, node):
    """Where a node runs: variable reads first (the compiler's order_variables), then graph order."""
    if node.op.is_variable:
        return (0, node.name)
    return (1, graph.nodes.index(node))


# ------------------------------------------------------------------------------------------------ alerts

def health_alerts(history, report, thresholds=None, relu_layers=None, roles=None, rules=None):
    """The alerts of ``report`` given the earlier reports ``history`` (oldest first): a pure function of the numbers
    and of what each layer is (``roles``: ``{layer: LayerRole}`` as ``watch_health`` reads them from the graph;
    without it every layer is a plain one, ReLU-like when in ``relu_layers`` or when that is None). ``rules``: only
    these of ``ALERT_RULES`` (the block path's screen knows the others cannot fire); None: all.

    ``nan``: some watched tensor held NaN/Inf (names the first op, in run order). ``dead_relu``: a ReLU-like layer
    whose ``dead_fraction`` is above ``dead_fraction``. ``vanishing_gradient``: a layer that gets no gradient at all,
    or across depth a plain layer's ``grad_norm`` below ``vanishing_ratio`` times the last plain layer's;
    ``exploding_gradient``: a plain layer's above ``exploding_ratio`` times the last's, or across time the total
    gradient norm above ``exploding_factor`` times its median over the last ``window`` reports. ``update_ratio``: a
    layer's update/weight ratio outside ``[update_ratio_low, update_ratio_high]``. ``loss_spike``: the loss above
    ``loss_spike_factor`` times its median over the last ``window`` reports. ``stale_rows``: more than
    ``stale_fraction`` of a sparsely updated embedding table's rows had no gradient for more than ``stale_steps`` calls
    (``_stale_rows_alerts`` says how to read the threshold).

    On normalised networks the roles keep the alerts' meaning (each rule's function says why): a residual branch
    behind a closed gate (its batch norm's gamma and beta RMS below ``closed_gate``) is expected to get small or no
    gradients and updates; a normalised layer and a batch norm leave the across-depth gradient comparison; a
    normalised layer's update ratio alerts high only when it stayed high over the ``MIN_HISTORY`` reports before;
    a batch norm whose weights are still near zero has no high update ratio. On transformers likewise: a layer making
    an attention block's scores (``LayerRole.attention``: a query or key projection) leaves the across-depth
    comparison while the block's heads are all near uniform (``_Seen.scores_idle``: its gradient is tiny then by
    design), and a layer of vectors only (a zero-initialised output bias) whose weights are still near zero (RMS
    below ``closed_gate``) has no high update ratio; an update of exactly zero
    despite a gradient (a warm-up's first step, at a learning rate of 0) alerts only when it stayed zero over them.
    """
    t = {**THRESHOLDS, **(thresholds or {})}
    if roles is None:
        roles = {layer: LayerRole(relu=relu_layers is None or layer in relu_layers) for layer in report.table}
    seen = _Seen(report, history[-t["window"]:], t, roles)
    return [alert for rule in (ALERT_RULES if rules is None else rules) for alert in rule(seen)]


@dataclass
class _Seen:
    """What every rule reads: this report, the recent ones, the thresholds and the layers' roles."""
    report: HealthReport
    recent: list
    t: dict
    roles: dict

    def role(self, layer):
        return self.roles.get(layer) or LayerRole()

    def gate_closed(self, layer):
        """The residual branch ``layer`` is in is (still) switched off by the batch norm that closes it: that norm's
        gamma and beta have a root mean square below ``closed_gate`` (OneFlow's ResNet, after Goyal et al. 2017,
        starts them at zero). Everything in the branch then gets its gradient scaled by that small gamma: exactly
        zero at the first step, tiny for the next ones, by design."""
        gate = self.role(layer).gate
        if gate is None:
            return False
        return _weight_rms(self.report.table.get(gate, {}), self.role(gate)) < self.t["closed_gate"]

    def scores_idle(self, layer):
        """``layer`` makes the scores of an attention block whose heads are all (still) near uniform (normalized
        entropy above ``attention_uniform``). Its gradient is then tiny by design, not for want of signal: the
        scores' gradient is the softmax's Jacobian times the context's gradient, which at uniform attention only
        keeps each key's deviation from the mean value, and a query's gradient is proportional to the keys (a key's
        to the queries), themselves the other projection's output, as small as its small initialisation. It grows
        as the heads learn to attend (BERT's query and key gradients start ~1e-4 of the output's)."""
        block = self.role(layer).attention
        heads = self.report.attention.get(block) if block is not None else None
        return bool(heads) and all(e > self.t["attention_uniform"] for e in heads)

    def alert(self, kind, layer, message):
        return HealthAlert(kind, layer, self.report.step, message)


def _weight_rms(row, role):
    """Root mean square of a layer's trainable values (inf when unknown: no rule is then relaxed)."""
    norm = row.get("weight_norm")
    return norm / math.sqrt(role.size) if norm is not None and role.size else math.inf


def _nan_alert(seen):
    bad = seen.report.first_nonfinite
    if bad is None:
        return []
    return [seen.alert("nan", bad["layer"], (
        f"{bad['nan']} NaN and {bad['inf']} Inf in the {bad['what']} of layer {bad['layer']}: op {bad['op']} "
        f"({bad['tensor']}, at {bad['source']}) is the first watched op that made them this step. Usually a "
        "learning rate too high (weights diverged), a log/division of zero, or bad input data; "
        "flow.config.detect_anomaly(True) stops at the exact op."))]


def _dead_relu_alerts(seen):
    # Only ReLU-like outputs: zeros out of a linear layer (a conv's pre-activation before its batch norm, a layer fed
    # zeros) are not dead units. In a normalized net the ReLU is the batch norm's own (batch_normalization_relu):
    # a channel there is dead when beta pushes it below zero for the whole batch.
    out, t = [], seen.t
    for layer, row in seen.report.table.items():
        dead = row.get("dead_fraction")
        if dead is not None and dead > t["dead_fraction"] and seen.role(layer).relu:
            cause = ("a large negative beta of this batch norm, or a learning rate too high that pushed it there"
                     if seen.role(layer).batch_norm else "a large negative bias, a learning rate too high that pushed "
                     "the pre-activations below zero, or a bad initialisation")
            out.append(seen.alert("dead_relu", layer, (
                f"{dead:.0%} of the units of layer {layer} are zero for the whole batch (threshold "
                f"{t['dead_fraction']:.0%}): dead ReLUs. Usually {cause}.")))
    return out


def _ratio_rule_relaxes_nothing(role):
    """Whether ``_update_ratio_alerts`` alerts on a layer of ``role`` whenever its ratio leaves the range (but for an
    update of exactly 0 despite a gradient): no gate, not a batch norm, not normalised, not vectors only. The block
    path decides such layers' alerts in bulk, so a new relaxation in the rule belongs here too."""
    return role.gate is None and not role.batch_norm and not role.normalised and not role.vectors_only


def _update_ratio_alerts(seen):
    out, t = [], seen.t
    for layer, row in seen.report.table.items():
        ratio = row.get("update_ratio")
        if ratio is None or not math.isfinite(ratio) or t["update_ratio_low"] <= ratio <= t["update_ratio_high"]:
            continue
        low = ratio < t["update_ratio_low"]
        role = seen.role(layer)
        # A branch behind a closed gate moves slowly by design (see _Seen.gate_closed), not for want of a rate.
        if low and seen.gate_closed(layer):
            continue
        # An update of exactly zero despite a gradient is a learning rate of zero at this step: a linear warm-up's
        # first step (OneFlow's warmup.linear starts at 0, as BERT's schedule does), by design. Only one that stays
        # zero over the MIN_HISTORY reports before says the rate is wrong.
        if ratio == 0 and row.get("grad_norm", 0) > 0 and not _stays(seen, layer, lambda r: r == 0):
            continue
        # A batch norm whose gamma and beta start (near) zero (the gate itself): a ratio to a norm of almost nothing
        # is large whatever the step, so it says nothing about the learning rate; nor in the MIN_HISTORY reports
        # after it opened, while its norm is still a few steps' updates (the ratio falls about as 1/k, as for
        # vectors_only below: 0.4-0.75 at steps 3-5 of the small unfused ResNet-50, by rounding alone).
        if not low and role.batch_norm and (_weight_rms(row, role) < t["closed_gate"] or
                                            _recently_closed(seen, layer, role)):
            continue
        # Likewise a layer of vectors only (BERT's masked-LM output bias, zero-initialised) while they are still
        # near zero: Adam's first steps move every element by about the learning rate, so the ratio to a norm of
        # k such steps is about 1/k (2/k under a linear warm-up) whatever the rate. Too high a rate soon takes them
        # past closed_gate, and then alerts.
        if not low and role.vectors_only and _weight_rms(row, role) < t["closed_gate"]:
            continue
        # A layer that feeds a batch norm is scale-invariant: its gradient is orthogonal to its weights and
        # proportional to 1 / their norm, so a large step grows the norm and shrinks the next steps' ratio (from a
        # small initialisation the first steps are large by design). Only a ratio that stays high says the learning
        # rate is too high for it: high in each of the last MIN_HISTORY reports too.
        if not low and role.normalised and not _stays_high(seen, layer):
            continue
        out.append(seen.alert("update_ratio", layer, _update_ratio_message(layer, ratio, row.get("grad_norm"), t)))
    return out


def _update_ratio_message(layer, ratio, grad_norm, t):
    """The ``update_ratio`` alert's message: ``ratio`` is outside ``t``'s range."""
    low = ratio < t["update_ratio_low"]
    why = ("the weights are being overwritten. Usually a learning rate far too high." if not low else
           "its gradient is exactly zero: nothing reaches it from the loss. Usually dead ReLUs in or after "
           "this layer, or a path the loss does not depend on." if grad_norm == 0 else
           "the weights barely change. Usually a learning rate far too low, or vanishing gradients.")
    return (f"the update of layer {layer} is {ratio:.3g} of its weights' norm (healthy is around 1e-3; "
            f"threshold {t['update_ratio_low' if low else 'update_ratio_high']:g}): {why}")


def _recently_closed(seen, layer, role):
    """Whether ``layer``'s weight RMS was below ``closed_gate`` in one of the MIN_HISTORY reports before this one."""
    earlier = [r.table.get(layer, {}) for r in seen.recent[-MIN_HISTORY:]]
    return any(_weight_rms(row, role) < seen.t["closed_gate"] for row in earlier)


def _stays_high(seen, layer):
    return _stays(seen, layer, lambda r: not r <= seen.t["update_ratio_high"])


def _stays(seen, layer, holds):
    """``holds(update_ratio)`` of ``layer`` in each of the MIN_HISTORY reports before this one."""
    earlier = [r.table.get(layer, {}).get("update_ratio") for r in seen.recent[-MIN_HISTORY:]]
    return len(earlier) == MIN_HISTORY and all(r is not None and holds(r) for r in earlier)


def _depth_gradient_alerts(seen):
    """Gradients across depth. A gradient of exactly zero means nothing reaches a layer, whatever the layer (unless
    a closed gate explains it). Comparing norms with the last layer's only means something for plain layers: a
    layer that feeds a batch norm is scale-invariant (its gradient is proportional to 1 / its weight norm, so the
    norm tells its weights' scale, not how much signal comes back), and a batch norm's own gradient is per channel
    (gamma, beta); normalised networks are what keeps gradients from vanishing anyway."""
    out, t, table = [], seen.t, seen.report.table
    grads = [(layer, row["grad_norm"]) for layer, row in table.items()
             if math.isfinite(row.get("grad_norm", math.nan))]
    # a layer making attention scores while its heads are uniform gets a tiny gradient by design (_Seen.scores_idle)
    plain = [(layer, norm) for layer, norm in grads
             if not seen.role(layer).normalised and not seen.role(layer).batch_norm and not seen.scores_idle(layer)]
    last_layer, last = plain[-1] if plain else (None, 0.0)
    zero = next((layer for layer, norm in grads[:-1] if norm == 0 and not seen.gate_closed(layer)), None)
    if zero is not None:
        compared = f", 0 of the last layer {last_layer}'s ({last:.3g})" if last > 0 else ""
        out.append(seen.alert("vanishing_gradient", zero, (
            f"the gradient norm of layer {zero} is 0{compared}: no gradient reaches it at all. Usually dead ReLUs in "
            "or after this layer (see dead_relu), or a path the loss does not depend on.")))
    if len(plain) < 2 or last <= 0:
        return out
    low_layer, low = min(plain[:-1], key=lambda e: e[1])
    high_layer, high = max(plain[:-1], key=lambda e: e[1])
    if zero is None and low < t["vanishing_ratio"] * last:
        out.append(seen.alert("vanishing_gradient", low_layer, (
            f"the gradient norm of layer {low_layer} is {low:.3g}, {low / last:.3g} of the last layer "
            f"{last_layer}'s ({last:.3g}; threshold {t['vanishing_ratio']:g}): the gradient vanishes on its way "
            "back. Usually deep stacks of saturating activations (sigmoid, tanh), or too small an initialisation; "
            "ReLU, residual connections or normalisation (batch_normalization) help.")))
    if high > t["exploding_ratio"] * last:
        out.append(seen.alert("exploding_gradient", high_layer, (
            f"the gradient norm of layer {high_layer} is {high:.3g}, {high / last:.3g} times the last layer "
            f"{last_layer}'s ({last:.3g}; threshold {t['exploding_ratio']:g}): the gradient grows on its way "
            "back. Usually too large an initialisation or a learning rate too high; clip gradients, or normalise "
            "(batch_normalization).")))
    return out


def _total_gradient_alerts(seen):
    # Over time the whole network's gradient norm is comparable with itself, normalised or not.
    total, t = seen.report.total_grad_norm, seen.t
    earlier = [n for n in (r.total_grad_norm for r in seen.recent) if n is not None and math.isfinite(n)]
    if total is None or len(earlier) < MIN_HISTORY:
        return []
    median = statistics.median(earlier)
    if math.isfinite(total) and total <= t["exploding_factor"] * median:
        return []
    return [seen.alert("exploding_gradient", None, (
        f"the total gradient norm is {total:.3g}, {total / median:.3g} times its median {median:.3g} over "
        f"the last {len(earlier)} reports (threshold {t['exploding_factor']:g}x): the gradients blow up "
        "over time. Usually a learning rate too high; lower it or clip gradients."))]


def _loss_spike_alert(seen):
    report, t = seen.report, seen.t
    losses = [r.loss for r in seen.recent if r.loss is not None and math.isfinite(r.loss)]
    if report.loss is None or not math.isfinite(report.loss) or len(losses) < MIN_HISTORY:
        return []
    median = statistics.median(losses)
    if median <= 0 or report.loss <= t["loss_spike_factor"] * median:
        return []
    return [seen.alert("loss_spike", None, (
        f"the loss is {report.loss:.4g}, {report.loss / median:.3g} times its median {median:.4g} over the "
        f"last {len(losses)} reports (threshold {t['loss_spike_factor']:g}x). Usually a learning rate too "
        "high, a bad batch (mislabelled or unnormalised data), or the start of a divergence."))]


def _attention_alerts(seen):
    """A collapsed head (each query attends to one key: its softmax saturated, from unscaled scores or a learning
    rate too high) says so at once; a uniform head only when it stayed uniform over the whole window, since every
    head starts near uniform from a small initialisation."""
    out, t = [], seen.t
    earlier = seen.recent if len(seen.recent) >= t["window"] else None
    for block, heads in seen.report.attention.items():
        collapsed = [h for h, e in enumerate(heads) if e < t["attention_collapsed"]]
        if collapsed:
            out.append(seen.alert("attention_collapsed", block, (
                f"head{'s' if len(collapsed) > 1 else ''} {', '.join(map(str, collapsed))} of attention block "
                f"{block} attend{'' if len(collapsed) > 1 else 's'} to a single key (normalized entropy "
                f"{min(heads[h] for h in collapsed):.3g}, threshold {t['attention_collapsed']:g}): the softmax has "
                "saturated and passes almost no gradient. Usually attention scores missing their 1/sqrt(head size) "
                "scale, too large an initialisation, or a learning rate too high without warm-up.")))
        if earlier is None:
            continue
        uniform = [h for h, e in enumerate(heads) if e > t["attention_uniform"] and all(
            (r.attention.get(block) or [0.0] * len(heads))[h] > t["attention_uniform"] for r in earlier)]
        if uniform:
            out.append(seen.alert("attention_uniform", block, (
                f"head{'s' if len(uniform) > 1 else ''} {', '.join(map(str, uniform))} of attention block {block} "
                f"still attend{'' if len(uniform) > 1 else 's'} to every key alike after {len(earlier) + 1} reports "
                f"(normalized entropy above {t['attention_uniform']:g}): {'they' if len(uniform) > 1 else 'it'} "
                "learn nothing. Usually query/key weights that do not train (a learning rate far too low, frozen "
                "or zero-initialised projections) or scores scaled down to nothing.")))
    return out


def _residual_alerts(seen):
    t = seen.t
    return [seen.alert("residual_growth", name, (
        f"the residual sum {name} makes the stream {row['growth']:.3g} times larger (its branch's RMS is "
        f"{row['branch_ratio']:.3g} times the stream's, threshold {t['residual_growth']:g}x): the branch drowns "
        "the residual stream, whose norm then grows layer after layer. Usually too large an initialisation of "
        "the branch's last layer, a missing layer norm, or a learning rate too high."))
        for name, row in seen.report.residual.items() if not row["growth"] <= t["residual_growth"]]


def _stale_rows_alerts(seen):
    """An embedding whose rows are mostly stale. ``stale_rows`` already means "no gradient for more than ``stale_steps``
    calls", so the alert needs no history of its own: it speaks once a table has been trained that long and more
    than ``stale_fraction`` of it (default 0.9) still is not learning. With ids drawn evenly from a table of ``V`` rows,
    ``B`` distinct a call, a row stays untouched ``N`` calls with probability ``(1 - B/V)^N ~ exp(-N B / V)``: at
    the defaults (N = 1000) a healthy table is 90% stale only when it has over ~9,500 rows per id a call (2.4
    million rows for 256 ids a call); a skewed (Zipf) vocabulary's rare rows are stale legitimately, and a larger
    ``stale_steps`` or ``stale_fraction`` suits it."""
    out, t = [], seen.t
    for layer, row in seen.report.table.items():
        fraction = row.get("stale_fraction")
        if fraction is None or not fraction > t["stale_fraction"]:
            continue
        rows = row["stale_rows"] / fraction
        out.append(seen.alert("stale_rows", layer, (
            f"{fraction:.0%} of the rows of layer {layer}'s embedding table ({row['stale_rows']:.0f} of {rows:.0f}) "
            f"got no gradient for more than {t['stale_steps']} calls (threshold {t['stale_fraction']:.0%}); "
            f"{row['touched_fraction']:.1%} of them ever did, {row['rows_touched']:.0f} this step. Usually ids "
            "that reach only a few rows (an id-mapping or hashing bug, ids clipped to a range, a constant feature "
            "column), or a table far larger than the ids the data holds (memory and optimizer state for rows "
            "that never learn).")))
    return out


ALERT_RULES = (_nan_alert, _dead_relu_alerts, _update_ratio_alerts, _depth_gradient_alerts, _total_gradient_alerts,
               _loss_spike_alert, _attention_alerts, _residual_alerts, _stale_rows_alerts)
"""The alert rules, in the order their alerts are listed; each takes what the report saw and returns its
alerts (``health_alerts`` runs them)."""

_RULE_BIT = {rule: 1 << k for k, rule in enumerate(ALERT_RULES)}
_RULES_OF_MASK = {}          # a bit mask of _RULE_BIT -> its rules, in ALERT_RULES' order


def _rules_of(mask):
    rules = _RULES_OF_MASK.get(mask)
    if rules is None:
        rules = _RULES_OF_MASK[mask] = tuple(rule for rule in ALERT_RULES if mask & _RULE_BIT[rule])
    return rules


# What a user of watch_health reads; the request, scratch and statistics machinery is the package's own.
__all__ = [
    "watch_health", "HealthReport", "HealthAlert", "health_alerts", "find_layers", "roles_of", "LayerRole",
    "histogram_buckets", "THRESHOLDS", "STATISTICS", "ACTIVATION_STATISTICS", "BATCH_NORM_STATISTICS", "ROW_STATISTICS",
    "COUNT_STATISTICS", "HISTOGRAM_BINS", "ALERT_RULES", "TRANSFORMER_STATISTICS", "HealthBlock",
]
