"""Host values as users receive them: ``Blob``, ``BlobDef`` and the one annotation -> converter rule.

A job's result and a watch handler's argument start as a host array (or, on several devices, a ``DeviceValues``
holding one piece a device and the logical whole). What the user gets depends only on the annotation:

    tp.Numpy         the array (the whole under the consistent view)
    tp.ListNumpy     a list of arrays: one a device under the mirrored view, else ``[array]``
    no annotation    a ``Blob``: ``.numpy()`` / ``.ndarray()`` and ``.numpy_list()``

``converter`` gives that function for one annotation; ``return_converter`` reads a job's whole return annotation
(``Tuple[...]``, ``Dict[str, ...]``, ``tp.Bundle[...]``, ``tp.Callback[...]``, ``None``) with the same rule at the
leaves. ``job`` and ``watching`` both use these; neither knows the other.
"""
from __future__ import annotations

import inspect
import typing

import numpy as np

from . import typing as tp
from .runtime.devices import DeviceValues

NO_ANNOTATION = inspect.Parameter.empty     # the same object as inspect.Signature.empty


class Blob:
    """A job result or watched value on the host: ``.numpy()`` (or OneFlow's older ``.ndarray()``) gives the array;
    NumPy attributes such as ``.mean()`` and ``.shape``, indexing and arithmetic work directly. ``.numpy_list()`` (``.ndarray_list()``) gives
    one array a device under the mirrored view, else ``[array]``."""

    __slots__ = ("_array", "_pieces")

    def __init__(self, array, pieces=None):
        self._array = array
        self._pieces = pieces

    def numpy(self):
        return self._array

    ndarray = numpy

    def numpy_list(self):
        return [self._array] if self._pieces is None else self._pieces

    ndarray_list = numpy_list

    def __array__(self, dtype=None, copy=None):
        return self._array if dtype is None else self._array.astype(dtype)

    def __getattr__(self, name):
        return getattr(self._array, name)

    def __repr__(self):
        return f"Blob({self._array!r})"


def _forwarded(name):
    def method(self, *args, **kwargs):
        return getattr(self._array, name)(*(a._array if isinstance(a, Blob) else a for a in args), **kwargs)
    method.__name__ = name
    return method


# The operators of the array too (indexing, arithmetic, len, iteration...), as OneFlow's LocalBlob forwards every
# ndarray special method the class does not have already: DCGAN indexes its returned images, ``gout[i, 0]``. NumPy's
# own protocols (``__array_ufunc__``, ``__array_function__``...) and the class-level hooks are not forwarded: NumPy
# functions take a Blob through ``__array__``.
_NOT_FORWARDED = ("__class_getitem__", "__init_subclass__", "__subclasshook__", "__reduce__", "__reduce_ex__",
                  "__setstate__", "__getstate__")
for _name in dir(np.ndarray):
    if _name.startswith("__") and _name.endswith("__") and not _name.startswith("__array") \
            and _name not in _NOT_FORWARDED and not hasattr(Blob, _name) and callable(getattr(np.ndarray, _name)):
        setattr(Blob, _name, _forwarded(_name))
del _name


class BlobDef:
    """What ``watch_scope`` reports beside each value: the lazy tensor's static description."""

    __slots__ = ("shape", "dtype", "logical_blob_name", "op_name", "_node")

    def __init__(self, tensor):
        self.shape = tensor.shape
        self.dtype = tensor.dtype
        self.logical_blob_name = tensor.logical_blob_name
        self.op_name = tensor.op_name
        self._node = tensor.node

    @property
    def lbn(self):
        return self.logical_blob_name

    @property
    def location(self):
        """Where the tensor was made: the user's stack down to the op's call (OneFlow's ``BlobDef.location``)."""
        return self._node.location

    def __repr__(self):
        return f"BlobDef({self.logical_blob_name!r}, shape={self.shape}, dtype={self.dtype})"


# ------------------------------------------------------------------------------------------------ the one rule

def to_numpy(value):
    """``tp.Numpy``: the host array; the logical whole of a multi-device value."""
    return value.whole if isinstance(value, DeviceValues) else value


def to_list(value):
    """``tp.ListNumpy``: one array a device (``[array]`` on one device)."""
    return value.pieces if isinstance(value, DeviceValues) else [value]


def to_blob(value):
    """No annotation: a ``Blob`` holding the whole and, on several devices, the pieces."""
    if isinstance(value, DeviceValues):
        return Blob(value.whole, value.pieces)
    return Blob(value)


def converter(annotation, where):
    """The function turning one host value into what ``annotation`` promises (see the module docstring).
    ``where`` starts the error message for any other annotation, e.g. "handler f annotates its argument as int"."""
    if annotation is tp.Numpy:
        return to_numpy
    if annotation is tp.ListNumpy:
        return to_list
    if annotation is NO_ANNOTATION or annotation is Blob:
        return to_blob
    raise TypeError(f"{where}, which is not supported; use tp.Numpy, tp.ListNumpy or no annotation (a blob with "
                    ".numpy())")


def over_tree(convert):
    """``convert`` applied to every leaf of nested tuples, lists and dicts."""
    def apply(value):
        if isinstance(value, (tuple, list)):
            return type(value)(apply(v) for v in value)
        if isinstance(value, dict):
            return {k: apply(v) for k, v in value.items()}
        return convert(value)
    return apply


def return_converter(annotation, where):
    """``(kind, convert)`` for a job's return annotation. ``kind`` is ``"none"`` (``-> None``), ``"handle"`` (no
    annotation: a handle whose ``.get()`` gives blobs), ``"callback"`` (``tp.Callback[...]``) or ``"value"``;
    ``convert`` turns the returned structure of host values into what the annotation promises."""
    if annotation is None or annotation is type(None):
        return "none", lambda value: None
    if annotation is NO_ANNOTATION:
        return "handle", over_tree(to_blob)
    if typing.get_origin(annotation) is tp.Callback:
        args = typing.get_args(annotation)
        return "callback", _structure(args[0] if args else tp.Numpy, where)
    return "value", _structure(annotation, where)


def _structure(annotation, where):
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is tp.Bundle:
        return over_tree(converter(args[0] if args else tp.Numpy, where))
    if origin in (tuple, list):
        parts = [_structure(a, where) for a in args]
        return lambda value: type(value)(convert(v) for convert, v in zip(parts, value))
    if origin is dict:
        convert = _structure(args[1], where)
        return lambda value: {k: convert(v) for k, v in value.items()}
    try:
        return over_tree(converter(annotation, where))
    except TypeError:           # the job's whole annotation is what the user should fix
        raise TypeError(f"{where}: unsupported return annotation {annotation!r}: use tp.Numpy, tp.ListNumpy, "
                        "tp.Callback[...], Tuple[...], Dict[str, ...] or None") from None


__all__ = ["Blob", "BlobDef", "converter", "return_converter", "over_tree", "to_blob", "to_list", "to_numpy"]
