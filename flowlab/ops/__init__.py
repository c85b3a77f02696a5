"""Ops: each one a small class holding its shape/dtype rule, its kernel and its gradient side by side.

An op class is never instantiated; a graph node stores the class and the op's static ``attrs``.

- ``infer(*inputs, **attrs)`` takes the input ``LazyTensor`` s and returns ``(shape, dtype)`` (or a list of them, one per
  output). It raises ``ShapeError`` with a plain message; ``apply`` adds the user's source line.
- ``forward(xp, *arrays, **attrs)`` computes with ``xp`` = ``numpy`` or ``cupy``. Ops with ``supports_out`` also take
  ``out=``, a preallocated buffer to write into (see ``flowlab.compiler``).
- ``vjp(node, *dys)`` builds the gradient *in the graph*, from other ops, and returns one tensor or ``None`` per input.
  Autodiff never special-cases an op.
- Elementwise ops give ``c_expr``, a C expression over ``{0}``, ``{1}`` … used to fuse chains into one CuPy kernel.
- Ops whose kernel is a BLAS matrix product give ``gemm_macs(node)``, its size, so a plan of small products can run
  BLAS on one thread.

Everything the compiler, the devices and health need to know about an op is a *trait* declared on its class (below,
with its default), never a test of the class's name: adding an op touches its own module only.
"""
from __future__ import annotations

import sys

import numpy as np

from .. import graph as g
from ..errors import ShapeError, TraceError

# Ops that must run even though nothing reads their outputs (optimizer updates, summary writes).
SIDE_EFFECT = "side_effect"


_cupy_elementwise = {}     # name -> compiled kernel


def cupy_elementwise(cupy, name, inputs, outputs, body, **options):
    """The CuPy ``ElementwiseKernel`` ``flowlab_<name>`` of an op's own kernel, compiled on first use."""
    kernel = _cupy_elementwise.get(name)
    if kernel is None:
        kernel = _cupy_elementwise[name] = cupy.ElementwiseKernel(inputs, outputs, body, f"flowlab_{name}", **options)
    return kernel


def shape_error(api, message):
    """The error ``apply`` raises for a failed shape rule, for checks made before ``apply``: op name and user line."""
    return ShapeError(f"{api}: {message} (at {g.user_source_line()})")


class Op:
    prefix = "Op_"          # name prefix of an unnamed node, OneFlow's ("Relu_", "Matmul_" ...)
    api = "op"              # the user-facing function, for messages
    outputs = ("out",)      # output arg names: lbn "<node>/<arg>_0"
    is_variable = False
    is_view = False         # output 0 may alias input 0's memory (reshape, transpose)
    supports_out = False    # forward takes out= (a reusable buffer)
    inplace = False         # a single elementwise pass: out may be the buffer of an input that dies here
    donates = ()            # input positions the kernel may overwrite when told ``<name>_writable`` (see plan.py)
    side_effect = False     # kept by the compiler although nothing reads it
    replayable = False      # (side effects other than updates) works on the device only, with no host data or wait:
    #                         a CUDA graph may capture it (``RowTouches``); summary writes and readers are not
    updates_variable = False  # changes its first input (a variable) in place: optimizer updates
    averages_devices = False  # (updates) input 1 is a per-device statistic, not a gradient: replicas average it
    #                           whatever the loss (a batch norm's moving statistics under a summed loss)
    row_sparse = False      # (updates) the gradient is indexed slices: input 1 its rows, input 2 their ids (repeats
    #                         allowed); replicas concatenate both instead of adding them (``IndexedSlicesUpdate``)
    observes = False        # reads its inputs as this call made them (watch statistics): runs right after the last
    #                         of their producers
    is_placeholder = False  # a job argument: the plan reads it from the call's feeds, it has no kernel
    is_constant = False     # attrs["value"] is its output: moved to the device once, when the plan is compiled
    batch_source = False    # its output is a whole batch (an argument, a data reader): split over devices
    random = False          # forward takes ``rng=``, the plan's random generator (not replayable as a CUDA graph)
    nonnegative = False     # every output element is >= 0 (relu, sigmoid, softmax): health's dead-unit test
    amp: str | None = None  # "float16": a big product that computes in float16 under auto mixed precision, its
    #                         float32 inputs cast down and its output cast back (``compiler.amp``)
    reduction: str | None = None   # "sum" / "mean" / "max": reduces attrs["axes"] (how device pieces join)
    c_expr: str | None = None
    vjp = None              # ops without a vjp are not differentiable (integer ops, gradient ops)
    gemm_macs = None        # ops that call BLAS: (node) -> multiply-adds of their matrix product (see plan.py)
    host_args = None        # (node, step) -> extra keyword arguments computed on the host each call (schedules)
    takes_device = False    # forward and host_args also take ``device=``: the plan's ``runtime.devices.Replica`` on
    #                         several devices, else None (an all-reduce between devices, a reader handing each
    #                         device its piece of the batch)
    indexed_slices = None   # gradient ops that scatter rows into a table: (node) -> (ids, rows) tensors, or None for
    #                         a node that cannot (sparse updates touch only those rows; ``ops.indexing.GatherGrad``)
    distribution_axis = None  # (node) -> the axis along which every slice of the output sums to one (softmax), or None:
    #                           health reads attention probabilities by it
    is_sum = False          # adds its two inputs elementwise: with one an ancestor of the other, a residual connection
    side_by_side: str | None = None  # a name two big one-output ops share (a convolution's input and filter
    #                         gradients): two such nodes of different ops reading a common input run side by side,
    #                         each whole on one host thread, instead of each split over them (``compiler.side_by_side``)

    @classmethod
    def is_nonnegative(cls, node) -> bool:
        """Whether ``node``'s output is never negative (ops whose sign depends on their attrs override this)."""
        return cls.nonnegative

    @staticmethod
    def is_plain_step(node) -> bool:
        """For updates: whether the step is exactly ``lr * grad_scale * gradient`` (plain SGD), which health reads
        back from the variable's change and the compiler may fold into the product that makes the gradient."""
        return False

    @staticmethod
    def partial_join(node, kinds, kind):
        """How devices join this op's output when an input is a per-device reduction of ``kind`` ("sum", "mean",
        "max", "min") and every other input is that too or the same on all devices (``kinds``): that kind if the op
        commutes with the join, else None (see ``runtime.devices.join_kinds``). Most ops do not commute."""
        return None

    @staticmethod
    def split_join(node, kinds):
        """How devices join this op's output when no input is a per-device reduction: ``"split"`` when the batch
        axis stays in front of the output (dense layers, activations, per-example losses), else None."""
        out = node.outputs[0] if node.outputs else None
        split = [t for t, k in zip(node.inputs, kinds) if k == "split"]
        if out is not None and out.ndim and all(t.ndim and t.shape[0] == out.shape[0] for t in split):
            return "split"
        return None

    @staticmethod
    def infer(*inputs, **attrs):
        raise TypeError("op classes define infer")

    @staticmethod
    def forward(xp, *arrays, **attrs):
        raise TypeError("op classes define forward")


def ufunc_op(base, name, api, ufunc, c_expr, vjp=None, prefix=None, **traits):
    """Declare an elementwise op whose kernel is the ufunc ``xp.<ufunc>(*inputs, out=out)`` in one statement, its
    gradient beside it (autograd's ``defvjp``): ``Exp = ufunc_op(_FloatUnary, "Exp", "flow.math.exp", "exp",
    "exp({0})", vjp=lambda node, dy: (multiply(dy, node.output),))``. ``base`` gives the shape rule; ``traits``
    set any other class attribute (``nonnegative=True``, ``partial_join=...``)."""
    def forward(xp, *arrays, out=None):
        return getattr(xp, ufunc)(*arrays, out=out)

    members = {"prefix": prefix or f"{name}_", "api": api, "c_expr": c_expr, "forward": staticmethod(forward),
               "__doc__": f"``{api}``: elementwise ``{ufunc}``.", "__module__": sys._getframe(1).f_globals["__name__"]}
    if vjp is not None:
        members["vjp"] = staticmethod(vjp)
    members.update({k: staticmethod(v) if callable(v) and not isinstance(v, staticmethod) else v
                    for k, v in traits.items()})
    return type(name, (base,), members)


def keeps_partials(*kinds):
    """A ``partial_join`` for ops through which those per-device reductions pass unchanged (``identity``: all
    four; ``negative``: sums and means)."""
    def partial_join(node, input_kinds, kind):
        return kind if kind in kinds else None
    return staticmethod(partial_join)


def apply(op: type[Op], inputs, name=None, **attrs):
    """Add one node to the graph being traced; returns its output tensor (or a tuple for several outputs)."""
    graph = g.current_graph(op.api)
    for i, t in enumerate(inputs):
        if not isinstance(t, g.LazyTensor):
            raise TypeError(f"{op.api}: input {i} must be a tensor of the job, got {type(t).__name__}")
        if t.graph is not graph:
            raise TraceError(f"{op.api}: input {t.logical_blob_name} belongs to job {t.graph.name!r}, "
                             f"not to job {graph.name!r} being traced")
    try:
        specs = op.infer(*inputs, **attrs)
    except ShapeError as e:
        raise ShapeError(f"{op.api}: {e} (at {g.user_source_line()})") from None
    if isinstance(specs, tuple) and len(specs) == 2 and not isinstance(specs[0], tuple):
        raise AssertionError(f"{op.__name__}.infer returned {specs!r}")
    single = not isinstance(specs, list)
    specs = [specs] if single else specs
    if name is None:
        name = g.unique_name(op.prefix)
    elif not isinstance(name, str):
        raise TypeError(f"{op.api}: name must be a string, got {name!r}")
    else:
        name = g.scoped_name(name)
    outs = graph.add_node(op, inputs, attrs, name, specs, op.outputs, g.current_device_tag())
    if op.side_effect:
        graph.side_effects.append(graph.nodes[-1])
    return outs[0] if single else tuple(outs)


def as_tensor(value, like: g.LazyTensor | None = None, argument="value"):
    """A tensor as it is; a Python or NumPy number/array becomes a constant node (dtype of ``like`` for scalars)."""
    if isinstance(value, g.LazyTensor):
        return value
    if isinstance(value, (bool, int, float, np.number, np.ndarray, list, tuple)):
        array = np.asarray(value)
        if like is not None and (array.ndim == 0 or array.dtype.kind in "fiu"):
            array = array.astype(like.dtype)
        elif array.dtype == np.float64:
            array = array.astype(np.float32)
        from .array import Constant
        return apply(Constant, (), value=array)
    raise TypeError(f"{argument}: expected a tensor or a number, got {type(value).__name__}")


def spec(shape, dtype):
    return (tuple(int(d) for d in shape), np.dtype(dtype))


def same_dtype(api_args, *tensors):
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        names = ", ".join(f"{t.logical_blob_name}: {t.dtype}" for t in tensors)
        raise ShapeError(f"inputs must share one dtype, got {names}")
    return tensors[0].dtype


def normalize_axis(axis, ndim, argument="axis"):
    if not isinstance(axis, (int, np.integer)) or not -ndim <= axis < max(ndim, 1):
        raise ShapeError(f"{argument} must be an int in [{-ndim}, {ndim}), got {axis!r}")
    return int(axis) % max(ndim, 1)


def normalize_axes(axis, ndim, argument="axis"):
    """``None`` -> all axes; int or sequence -> sorted tuple of non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = sorted({normalize_axis(a, ndim, argument) for a in axes})
    if len(out) != len(axes):
        raise ShapeError(f"{argument} repeats an axis: {axis!r}")
    return tuple(out)
