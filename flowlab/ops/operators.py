"""Python operators on lazy tensors: ``x + y``, ``2 * x``, ``-x``, ``x ** 2``, ``x @ w`` build the ``flow.math`` ops.

They are set on ``LazyTensor`` here, beside the ops they build, so that ``flowlab.graph`` (which every op imports)
imports no op: the dependency runs one way, graph <- ops. ``flowlab.job`` imports this module, so they exist
whenever a job is traced.
"""
from __future__ import annotations

from ..graph import LazyTensor
from . import math


def _install():
    def operator(fn, reflected=False):
        if reflected:
            return lambda self, other: fn(other, self)
        return lambda self, other: fn(self, other)

    LazyTensor.__add__, LazyTensor.__radd__ = operator(math.add), operator(math.add, reflected=True)
    LazyTensor.__sub__, LazyTensor.__rsub__ = operator(math.subtract), operator(math.subtract, reflected=True)
    LazyTensor.__mul__, LazyTensor.__rmul__ = operator(math.multiply), operator(math.multiply, reflected=True)
    LazyTensor.__truediv__ = operator(math.divide)
    LazyTensor.__rtruediv__ = operator(math.divide, reflected=True)
    LazyTensor.__pow__ = lambda self, exponent: math.pow(self, exponent)
    LazyTensor.__matmul__ = operator(math.matmul)
    LazyTensor.__neg__ = lambda self: math.negative(self)


_install()
