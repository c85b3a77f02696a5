"""``flow.math``: elementwise arithmetic, unary functions, reductions and comparisons."""
from .ops.math import (abs, add, add_n, argmax, divide, equal, exp, greater, less, log, maximum, minimum, multiply,
                       negative, pow, reduce_max, reduce_mean, reduce_sum, sigmoid, sign, sqrt, square, subtract, tanh)
from .ops.nn import relu

__all__ = ["abs", "add", "add_n", "argmax", "divide", "equal", "exp", "greater", "less", "log", "maximum", "minimum",
           "multiply", "negative", "pow", "reduce_max", "reduce_mean", "reduce_sum", "relu", "sigmoid", "sign", "sqrt",
           "square", "subtract", "tanh"]
