"""Compile a traced graph into a ``Plan``: small passes over the node list, then one generated Python function.

    prune          keep the nodes that outputs, updates and watched tensors need
    fuse           (CuPy) chains of same-shape elementwise ops become one generated ElementwiseKernel
    plan_buffers   liveness analysis; ops that can write into ``out=`` reuse preallocated buffers
    generate       straight-line Python source, one line a node: the steady-state call walks no graph

``print(plan.source)`` shows what a job call runs.
"""
from __future__ import annotations

from .buffers import plan_buffers
from .fuse import fuse_elementwise
from .plan import Delivery, Plan, compile_graph
from .prune import prune

__all__ = ["Delivery", "Plan", "compile_graph", "fuse_elementwise", "plan_buffers", "prune"]
