"""``flow.math``: elementwise arithmetic, unary functions, reductions, comparisons and clipping."""
from .ops.math import (abs, add, add_n, argmax, clip_by_value, divide, equal, exp, gelu, greater, less, log, maximum,
                       minimum, multiply, negative, pow, reduce_max, reduce_mean, reduce_sum, rsqrt, sigmoid, sign,
                       sqrt, square, subtract, tanh, top_k)
from .ops.nn import relu

__all__ = ["abs", "add", "add_n", "argmax", "clip_by_value", "divide", "equal", "exp", "gelu", "greater", "less", "log",
           "maximum", "minimum", "multiply", "negative", "pow", "reduce_max", "reduce_mean", "reduce_sum", "relu",
           "rsqrt", "sigmoid", "sign", "sqrt", "square", "subtract", "tanh", "top_k"]
