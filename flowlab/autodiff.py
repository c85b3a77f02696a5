"""Reverse-mode autodiff over the traced graph.

``gradients(ys, xs)`` walks the nodes backwards from ``ys`` and calls each op's ``vjp``, which adds gradient nodes to
the same graph. Only nodes on a path from some ``x`` to some ``y`` are differentiated; contributions to one tensor are
summed. Every total gradient is recorded in ``graph.grad_of`` so watches can find the gradient of any tensor.
"""
from __future__ import annotations

from . import graph as g
from .errors import ShapeError, TraceError
from .ops.math import add_n


def _between(graph, ys, xs):
    """Ids of tensors that depend on some x and lead to some y."""
    from_x = {x.id for x in xs}
    for node in graph.nodes:
        if any(t.id in from_x for t in node.inputs):
            from_x.update(t.id for t in node.outputs)
    to_y = {y.id for y in ys}
    for node in reversed(graph.nodes):
        if any(t.id in to_y for t in node.outputs):
            to_y.update(t.id for t in node.inputs)
    return from_x & to_y


def gradients(ys, xs, seeds):
    """Gradient tensors of ``sum(seed * y)`` for each of ``xs`` (``None`` where no path leads from x to any y)."""
    ys, xs, seeds = list(ys), list(xs), list(seeds)
    graph = g.current_graph("gradients")
    relevant = _between(graph, ys, xs)
    pending: dict[int, list] = {}
    for y, seed in zip(ys, seeds):
        if seed.shape != y.shape:
            raise ShapeError(f"gradient seed for {y.logical_blob_name} has shape {seed.shape}, expected {y.shape}")
        pending.setdefault(y.id, []).append(seed)

    def total(t):
        parts = pending.pop(t.id, None)
        if not parts:
            return None
        with g.grad_scope(t.node):
            grad = parts[0] if len(parts) == 1 else add_n(parts)
        graph.grad_of[t.id] = grad
        return grad

    # Nodes added below are gradient nodes; iterate over a snapshot of the forward graph.
    for node in reversed(list(graph.nodes)):
        if not node.inputs or not any(t.id in relevant for t in node.outputs):
            continue   # sources (variables, placeholders) keep their pending gradient for the caller
        dys = [total(t) for t in node.outputs]
        if all(d is None for d in dys):
            continue
        if node.op.vjp is None:
            raise TraceError(f"op {node.name} ({node.op.api}) has no gradient, but it lies between the loss and a "
                             f"trainable variable (created at {node.source})")
        with g.grad_scope(node):
            grads = node.op.vjp(node, *dys)
        for t, grad in zip(node.inputs, grads):
            if grad is None or t.id not in relevant:
                continue
            if grad.shape != t.shape:
                raise AssertionError(f"vjp of {node.op.__name__} gave shape {grad.shape} for input {t.shape}")
            pending.setdefault(t.id, []).append(grad)
    return [total(x) if x.id in pending else graph.grad_of.get(x.id) for x in xs]
