"""OneFlow's placement annotations on the consistent view: ``flow.distribute.split(axis)`` / ``broadcast()`` /
``auto()`` and ``flow.parallel_cast``.

In OneFlow they tell the compiler how a logical tensor lies over the devices (its "SBP": split along an axis, or
broadcast whole to each); the logical value, and so what the job computes, is the same whatever they say. flowlab runs
its ``gpu_device_num(n)`` logical devices data-parallel (``runtime.devices``): every device holds every variable
whole and its share of the batch, and the devices' pieces are joined by what each tensor is, not by annotations. So
these annotations are checked (a split axis must exist) and kept in the graph, where ``print(job.graph())`` shows
them, and training on n devices equals training on one, as OneFlow promises for the consistent view.

What flowlab does move between devices is what OneFlow's "boxing" moves from a partial value to a whole one: a
reduction over the batch axis (``reduce_sum(weights)``) is, on each device, a sum over its own piece only. Where such
a value meets an op that does not commute with joining it (``sum / count``, ``x / sum``), ``box_partials`` puts an
``AllReduce`` before that op when the job is traced: every device then holds the logical value (the devices' values
summed, averaged, or their max / min), exactly what one device computes; its gradient is all-reduced likewise.
"""
from __future__ import annotations

import numpy as np

from ..runtime.devices import join_rule
from . import Op, apply, as_tensor, keeps_partials, spec


class Distribute:
    """How a consistent tensor lies over the devices. ``sbp`` is OneFlow's short notation: ``S(axis)``, ``B``,
    ``A``."""
    sbp = "A"

    def __eq__(self, other):
        return type(other) is type(self) and other.sbp == self.sbp

    def __hash__(self):
        return hash(self.sbp)

    def __repr__(self):
        return f"flow.distribute.{self._call()}"

    def _call(self):
        return "auto()"


class AutoDistribute(Distribute):
    """Left to the compiler (OneFlow's default for ops and variables)."""


class BroadcastDistribute(Distribute):
    """The whole tensor on every device."""
    sbp = "B"

    def _call(self):
        return "broadcast()"


class SplitDistribute(Distribute):
    """Pieces along ``axis``, one a device."""

    def __init__(self, axis):
        self.axis = axis
        self.sbp = f"S({axis})"

    def _call(self):
        return f"split({self.axis})"


def split(axis):
    """``flow.distribute.split(axis)``: the tensor is cut along ``axis``, one piece a device."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or axis < 0:
        raise ValueError(f"flow.distribute.split: axis must be an int >= 0, got {axis!r}")
    return SplitDistribute(int(axis))


def broadcast():
    """``flow.distribute.broadcast()``: every device holds the whole tensor."""
    return BroadcastDistribute()


def auto():
    """``flow.distribute.auto()``: placement left to the compiler."""
    return AutoDistribute()


def assert_is_valid_distribute(distribute):
    """Raise ``TypeError`` unless ``distribute`` is one of the values above (OneFlow's check, with a message)."""
    if not isinstance(distribute, Distribute):
        raise TypeError(f"expected flow.distribute.split(axis), broadcast() or auto(), got {distribute!r}")


def check_distribute(api, argument, distribute, shape):
    """``distribute`` checked against a tensor of ``shape``: its ``sbp`` string, or None for None."""
    if distribute is None:
        return None
    if not isinstance(distribute, Distribute):
        raise TypeError(f"{api}: {argument} must be flow.distribute.split(axis), broadcast() or auto(), "
                        f"got {distribute!r}")
    if isinstance(distribute, SplitDistribute) and distribute.axis >= len(shape):
        raise ValueError(f"{api}: {argument} {distribute!r} splits axis {distribute.axis}, but the tensor has shape "
                         f"{tuple(shape)} ({len(shape)} axes)")
    return distribute.sbp


class ParallelCast(Op):
    """``flow.parallel_cast``: the same logical tensor, annotated with how it lies over the devices (attrs
    ``distribute`` and ``gradient_distribute``: ``S(axis)``, ``B`` or None)."""
    prefix, api = "ParallelCast_", "flow.parallel_cast"
    is_view = True
    partial_join = keeps_partials("sum", "mean", "max", "min")

    @staticmethod
    def infer(x, distribute, gradient_distribute):
        return spec(x.shape, x.dtype)

    @staticmethod
    def forward(xp, x, distribute, gradient_distribute):
        return x

    @staticmethod
    def vjp(node, dy):
        return (dy,)


def parallel_cast(input, name=None, distribute=None, gradient_distribute=None):  # noqa: A002 - OneFlow's name
    """``flow.parallel_cast(input, distribute=, gradient_distribute=)``: ``input`` as it is, its placement recorded
    (see the module's docstring); each must be ``split(axis)`` within the tensor's axes or ``broadcast()``."""
    x = as_tensor(input, argument="input")
    attrs = {}
    for argument, value in (("distribute", distribute), ("gradient_distribute", gradient_distribute)):
        if isinstance(value, AutoDistribute):
            raise ValueError(f"{ParallelCast.api}: {argument} must be split(axis) or broadcast(), got auto()")
        attrs[argument] = check_distribute(ParallelCast.api, argument, value, x.shape)
    return apply(ParallelCast, (x,), name, **attrs)


# ---------------------------------------------------------------------------------------------------- boxing

_PARTIALS = ("sum", "mean", "max", "min")


class AllReduce(Op):
    """The logical value of a per-device reduction over the batch (``how``: "sum", "mean", "max", "min"), the same
    on every device (``runtime.devices.HostReduce.combine``). Added by ``box_partials``, never by users."""
    prefix, api = "AllReduce_", "all-reduce between devices (consistent view)"
    takes_device = True

    @staticmethod
    def partial_join(node, kinds, kind):
        return "broadcast"

    @staticmethod
    def infer(x, how):
        return spec(x.shape, x.dtype)

    @staticmethod
    def forward(xp, x, how, device):
        return device.reducer.combine(device.index, x, how)

    @staticmethod
    def vjp(node, dy):
        return (apply(AllReduceGrad, (node.inputs[0], node.output, dy), how=node.attrs["how"]),)


class AllReduceGrad(Op):
    """Gradient of ``AllReduce``: every device's gradient of the whole value is its share of the loss's, so they are
    summed (and divided by the device count for a mean); for max / min it goes to the devices whose piece is the
    extreme, shared equally between devices that tie."""
    prefix, api = "AllReduceGrad_", "all-reduce gradient between devices (consistent view)"
    takes_device = True

    @staticmethod
    def infer(x, y, dy, how):
        return spec(x.shape, x.dtype)

    @staticmethod
    def forward(xp, x, y, dy, how, device):
        combine = device.reducer.combine
        total = combine(device.index, dy, "mean" if how == "mean" else "sum")
        if how in ("sum", "mean"):
            return total
        holds = (x == y).astype(dy.dtype)
        return holds * total / xp.maximum(combine(device.index, holds, "sum"), 1)


def box_partials(graph):
    """Put an ``AllReduce`` before every op of ``graph`` (a replica's forward trace under the consistent view of
    several devices) that reads a per-device reduction over the batch it does not commute with, so that it reads
    the logical value: the op then joins as it would have with that input the same on every device. Each partial
    tensor is boxed once, however many ops read it. Returns the ``AllReduce`` nodes added."""
    kinds, boxed, nodes, added = {}, {}, [], []
    for node in list(graph.nodes):
        input_kinds = [kinds.get(t.id) for t in node.inputs]
        kind = join_rule(node, input_kinds)
        if kind is None and any(k in _PARTIALS for k in input_kinds) and \
                join_rule(node, ["broadcast" if k in _PARTIALS else k for k in input_kinds]) is not None:
            inputs = []
            for t, k in zip(node.inputs, input_kinds):
                if k in _PARTIALS:
                    if t.id not in boxed:
                        box = graph.add_node(AllReduce, (t,), {"how": k}, graph.local_name("System-Boxing-AllReduce_"),
                                             [(t.shape, t.dtype)], AllReduce.outputs, node.device_tag)[0].node
                        graph.nodes.pop()           # placed here, right before its first reader
                        box.source, box.frames = node.source, node.frames
                        nodes.append(box)
                        added.append(box)
                        boxed[t.id] = box.outputs[0]
                        kinds[box.outputs[0].id] = "broadcast"
                    t = boxed[t.id]
                inputs.append(t)
            node.inputs = tuple(inputs)
            kind = join_rule(node, [kinds.get(t.id) for t in node.inputs])
        nodes.append(node)
        for t in node.outputs:
            kinds[t.id] = kind
    graph.nodes[:] = nodes
    return added


__all__ = ["AllReduce", "AllReduceGrad", "AutoDistribute", "BroadcastDistribute", "Distribute", "SplitDistribute",
           "assert_is_valid_distribute", "auto", "box_partials", "broadcast", "parallel_cast", "split"]
