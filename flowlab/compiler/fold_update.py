"""Fold a plain SGD update into the matrix product that makes its gradient (NumPy only).

A dense layer's kernel gradient is ``dyᵀ @ x``; plain SGD then scales it and subtracts it from the kernel, two more
passes over a kernel-sized tensor. When that gradient is read by the update alone (not watched, returned, clipped or
all-reduced), one BLAS call ``w += -lr * dyᵀ @ x`` does all three (``optim.SGDGemmUpdate``, ``runtime.blas``).
Only for kernels of at least ``FOLD_MIN_ELEMENTS``: below, the call's overhead costs more than the passes it saves.
"""
from __future__ import annotations

import math

from ..graph import Node
from ..ops.math import MatMul
from ..optim.optimizers import SGDGemmUpdate, SGDUpdate
from ..runtime import blas
from .buffers import view_bases


FOLD_MIN_ELEMENTS = 16_384
"""Kernels smaller than this keep their product and update apart. The fold's ctypes call reads three arrays'
addresses (``ndarray.ctypes.data``: ~1 us each); the passes it saves cost less below ~16k elements. Measured one BLAS
thread, batch 100, folded against unfolded: 64 x 128 20.9 against 19.4 us, 784 x 10 28.3 against 23.9, 128 x 128
44.2 against 44.9, 256 x 256 144 against 158, 1024 x 1024 2,156 against 2,437."""


def _foldable(update, product, nodes, position_of, readers, protected_ids, base):
    grad = update.inputs[1]
    if update.op is not SGDUpdate or not SGDUpdate.is_plain_step(update):
        return False
    if product is None or product.op is not MatMul or grad.id in protected_ids or len(readers[grad.id]) != 1:
        return False
    w, (a, b) = update.inputs[0], product.inputs
    if w.ndim != 2 or a.ndim != 2 or math.prod(w.shape) < FOLD_MIN_ELEMENTS or not blas.available(w.dtype):
        return False
    operands = {base.get(a.id, a.id), base.get(b.id, b.id)}
    if base.get(w.id, w.id) in operands:
        return False
    # the product moves down to the update: no update in between may change what it reads
    return not any(n.op.updates_variable and base.get(n.inputs[0].id, n.inputs[0].id) in operands
                   for n in nodes[position_of[id(product)] + 1:position_of[id(update)]])


def fold_sgd_into_gemm(nodes, protected_ids):
    """The node list with each foldable ``MatMul`` + ``SGDUpdate`` pair replaced by one ``SGDGemmUpdate`` where the
    update was; returns ``(nodes, number folded)``."""
    producer = {t.id: n for n in nodes for t in n.outputs}
    readers = {}
    for node in nodes:
        for t in node.inputs:
            readers.setdefault(t.id, []).append(node)
    base = view_bases(nodes)
    position_of = {id(n): i for i, n in enumerate(nodes)}
    replaced, dropped = {}, set()
    for node in nodes:
        if not node.op.updates_variable:
            continue
        product = producer.get(node.inputs[1].id)
        if not _foldable(node, product, nodes, position_of, readers, protected_ids, base):
            continue
        attrs = {k: product.attrs[k] for k in ("transpose_a", "transpose_b", "alpha")}
        attrs.update(grad_scale=node.attrs["grad_scale"], schedule=node.attrs["schedule"])
        fused = Node(SGDGemmUpdate, f"{product.name}+{node.name}", (node.inputs[0],) + product.inputs, attrs,
                     node.source, node.device_tag, node.frames)
        replaced[id(node)] = fused
        dropped.add(id(product))
    return [replaced.get(id(n), n) for n in nodes if id(n) not in dropped], len(replaced)
