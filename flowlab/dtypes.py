"""OneFlow's dtype names. flowlab dtypes are plain ``numpy.dtype`` objects, so they compare equal to NumPy's."""
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


def as_dtype(value, argument="dtype"):
    """Turn ``flow.float``, ``np.float32``, ``"float32"`` … into a ``numpy.dtype``; a clear error otherwise."""
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
