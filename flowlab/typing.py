"""``oneflow.typing`` for flowlab: placeholders for job arguments and annotations for what jobs and watches return.

- ``Numpy.Placeholder(shape, dtype)``: an argument fed as one ndarray of exactly that shape and dtype.
- ``ListNumpy.Placeholder(shape, dtype)``: an argument fed as a list with one ndarray a device (one on one device)
  whose shape may be smaller than ``shape`` in any axis (OneFlow's mirrored, dynamic blobs); the job is traced once
  per actual shape.
- As return annotations: ``Numpy`` -> ndarray, ``ListNumpy`` -> list of ndarrays (one a device under the mirrored
  view, else one), ``Callback[Numpy]`` -> the job returns a function that takes a callback, ``None`` -> nothing.
"""
from __future__ import annotations

from typing import Generic, TypeVar

from . import graph as g
from .dtypes import as_dtype, float32

T = TypeVar("T")


class ArgDef:
    """What a job argument must look like. Creating one takes a name from OneFlow's global counter, and tracing the
    job's input takes another, as in OneFlow: that is why the seed's second dense layer is ``Dense_6``."""
    dynamic = False

    def __init__(self, shape, dtype=float32, batch_axis=0, name=None):
        try:
            self.shape = tuple(int(d) for d in shape)
        except TypeError:
            raise TypeError(f"Placeholder: shape must be a sequence of ints, got {shape!r}") from None
        if any(d <= 0 for d in self.shape):
            raise ValueError(f"Placeholder: shape must hold positive ints, got {self.shape}")
        self.dtype = as_dtype(dtype, "Placeholder dtype")
        self.batch_axis = batch_axis
        self.op_name = name if name is not None else f"Input_{g.new_unique_id()}"

    def __repr__(self):
        return f"{type(self).__name__}(shape={self.shape}, dtype={self.dtype})"


class FixedTensorDef(ArgDef):
    """A consistent (fixed-shape) argument: fed as one ndarray."""


class MirroredTensorDef(ArgDef):
    """A mirrored argument: fed as a list of one ndarray a device, each no larger than ``shape``."""
    dynamic = True


class Numpy:
    """Annotation: a job or watch value delivered as a ``numpy.ndarray``."""

    class Placeholder(FixedTensorDef):
        pass


class ListNumpy:
    """Annotation: values delivered as a list of ``numpy.ndarray`` (one a device under the mirrored view)."""

    class Placeholder(MirroredTensorDef):
        pass


class Callback(Generic[T]):
    """``-> tp.Callback[tp.Numpy]``: the job returns a function that takes the callback receiving the result."""


class Bundle(Generic[T]):
    """``tp.Bundle[tp.Numpy]``: a tuple, list or dict of values (nesting allowed)."""


__all__ = ["Numpy", "ListNumpy", "Callback", "Bundle", "FixedTensorDef", "MirroredTensorDef", "ArgDef"]
