"""Compile a traced graph into a ``Plan``: small passes over the node list, then one generated Python function.

``PASSES`` lists them in the order they run (``describe()`` prints them); ``print(plan)`` shows what each did on
that plan, then the straight-line Python source a job call runs (``plan.source``), one line a node: the
steady-state call walks no graph.

``prune``, ``plan_buffers`` and ``fuse.fuse_elementwise`` are the plain functions behind the passes of those names;
``amp`` is auto mixed precision's rewrite (``amp.ON_NUMPY`` turns it on for NumPy).
"""
from __future__ import annotations

from . import amp, fuse, passes
from .buffers import plan_buffers
from .passes import PASSES, describe
from .plan import Delivery, Plan, compile_graph
from .prune import prune

__all__ = ["Delivery", "PASSES", "amp", "Plan", "compile_graph", "describe", "fuse", "passes", "plan_buffers", "prune"]
