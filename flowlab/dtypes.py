"""OneFlow's dtype names. flowlab dtypes are plain ``numpy.dtype`` objects, so they compare equal to NumPy's.

``DataType`` holds OneFlow's protobuf enum of data types (``oneflow/core/common/data_type.proto``), which older
programs pass as ``dtype``; ``as_dtype`` turns its numeric members into the dtype.
"""
import enum

import numpy as np

float32 = np.dtype("float32")
"""32-bit float, the default of variables and placeholders."""
float16 = np.dtype("float16")
"""16-bit float (mixed precision on CuPy)."""
float64 = np.dtype("float64")
"""64-bit float."""
int8 = np.dtype("int8")
"""8-bit signed integer."""
int32 = np.dtype("int32")
"""32-bit signed integer (labels)."""
int64 = np.dtype("int64")
"""64-bit signed integer."""
uint8 = np.dtype("uint8")
"""8-bit unsigned integer (images)."""
char = int8
"""OneFlow's name of int8."""
float = float32  # noqa: A001 - OneFlow's own name
"""OneFlow's name of float32."""
double = float64
"""OneFlow's name of float64."""

FLOATING = (float16, float32, float64)
"""The floating-point dtypes."""


class DataType(enum.IntEnum):
    """OneFlow's ``DataType`` enum, numbers included (they are what a protobuf enum's values are)."""
    kInvalidDataType = 0
    kChar = 1
    kFloat = 2
    kDouble = 3
    kInt8 = 4
    kInt32 = 5
    kInt64 = 6
    kUInt8 = 7
    kOFRecord = 8
    kFloat16 = 9
    kTensorBuffer = 10

    @property
    def dtype(self):
        """The flowlab dtype of a numeric member; a TypeError for the others (records, buffers, invalid)."""
        dtype = _ENUM_DTYPES.get(self)
        if dtype is None:
            raise TypeError(f"DataType.{self.name} is not a numeric dtype flowlab tensors can hold")
        return dtype

    @classmethod
    def Name(cls, number):  # noqa: N802 - the generated protobuf module's names
        """The member's name of a number, as ``DataType.Name`` of the generated module."""
        try:
            return cls(number).name
        except ValueError:
            raise ValueError(f"DataType has no member of number {number!r}") from None

    @classmethod
    def Value(cls, name):  # noqa: N802
        """The number of a member's name, as ``DataType.Value`` of the generated module."""
        try:
            return int(cls[name])
        except KeyError:
            raise ValueError(f"DataType has no member named {name!r}") from None

    @classmethod
    def keys(cls):
        return [m.name for m in cls]

    @classmethod
    def values(cls):
        return [int(m) for m in cls]

    @classmethod
    def items(cls):
        return [(m.name, int(m)) for m in cls]

    @classmethod
    def of(cls, dtype):
        """The member of a flowlab dtype (``flow.float32`` -> ``kFloat``; ``flow.char``, int8, gives ``kInt8``)."""
        dtype = np.dtype(dtype)
        for member, numpy_dtype in _ENUM_DTYPES.items():
            if numpy_dtype == dtype and member is not cls.kChar:
                return member
        raise TypeError(f"no OneFlow DataType for dtype {dtype}")


_ENUM_DTYPES = {DataType.kChar: int8, DataType.kFloat: float32, DataType.kDouble: float64, DataType.kInt8: int8,
                DataType.kInt32: int32, DataType.kInt64: int64, DataType.kUInt8: uint8, DataType.kFloat16: float16}


def as_dtype(value, argument="dtype"):
    """Turn ``flow.float``, ``np.float32``, ``"float32"``, ``DataType.kFloat`` … into a ``numpy.dtype``; a clear
    error otherwise."""
    if isinstance(value, DataType):
        try:
            return value.dtype
        except TypeError as e:
            raise TypeError(f"{argument}: {e}") from None
    try:
        dtype = np.dtype(value)
    except TypeError:
        raise TypeError(f"{argument}: expected a flowlab dtype such as flow.float32, got {value!r}") from None
    if dtype.kind not in "fiub":
        raise TypeError(f"{argument}: expected a numeric dtype, got {dtype}")
    return dtype


def is_floating(dtype):
    """Whether ``dtype`` is a floating-point type."""
    return np.dtype(dtype).kind == "f"


__all__ = [
    "float32", "float16", "float64", "int8", "int32", "int64", "uint8", "char", "float", "double", "FLOATING",
    "as_dtype", "is_floating",
]
