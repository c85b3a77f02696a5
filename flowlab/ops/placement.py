"""OneFlow's placement annotations on the consistent view: ``flow.distribute.split(axis)`` / ``broadcast()`` /
``auto()`` and ``flow.parallel_cast``.

In OneFlow they tell the compiler how a logical tensor lies over the devices (its "SBP": split along an axis, or
broadcast whole to each); the logical value, and so what the job computes, is the same whatever they say. flowlab runs
its ``gpu_device_num(n)`` logical devices data-parallel (``runtime.devices``): every device holds every variable
whole and its share of the batch, and the devices' pieces are joined by what each tensor is, not by annotations. So
these annotations are checked (a split axis must exist) and kept in the graph, where ``print(job.graph())`` shows
them, and training on n devices equals training on one, as OneFlow promises for the consistent view.
"""
from __future__ import annotations

import numpy as np

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


__all__ = ["AutoDistribute", "BroadcastDistribute", "Distribute", "SplitDistribute", "assert_is_valid_distribute",
           "auto", "broadcast", "parallel_cast", "split"]
