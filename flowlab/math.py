"""``flow.math``: elementwise arithmetic, unary functions, reductions, comparisons and clipping."""
from .ops.math import (abs, add, add_n, argmax, clip_by_value, divide, equal, exp, greater, less, log, maximum,
                       minimum, multiply, negative, pow, reduce_max, reduce_mean, reduce_sum, sigmoid, sign, sqrt,
                       square, subtract, tanh)
from .ops.nn import relu

__all__ = ["abs", "add", "add_n", "argmax", "clip_by_value", "divide", "equal", "exp", "greater", "less", "log",
           "maximum", "minimum", "multiply", "negative", "pow", "reduce_max", "reduce_mean", "reduce_sum", "relu",
           "sigmoid", "sign", "sqrt", "square", "subtract", "tanh"]
