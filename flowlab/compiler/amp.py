"""Auto mixed precision (``FunctionConfig.enable_auto_mixed_precision``): the big products compute in float16.

Each node whose op declares ``amp = "float16"`` (matrix products and convolutions with their gradients: OneFlow
0.3.4's white list, ``job_rewriter/auto_mixed_precision_lists.cpp``) and whose inputs and outputs are all float32
gets ``Cast`` nodes before it (its inputs to float16) and after it (its output back to float32). Everything else --
variables (the float32 master weights), optimizer updates, losses, softmax, reductions, batch norm statistics --
stays float32, and so does every tensor the traced job names: the product's float32 output keeps its id, so
returns, buffers, deliveries and watches see float32 as before. As under PyTorch's autocast, each product casts its
own float32 inputs; unlike autocast, whose products return float16, and unlike OneFlow, which also runs its gray and
clear lists (bias add, activations, pooling...) in float16 between two white ops, the output is cast back at once:
a cast more per product, and nothing outside the products ever sees float16.

A tensor is cast once per call and its float16 copy shared by all products reading it (a weight read by its forward
product and by its input gradient), unless an optimizer update changes the tensor in place in between.

Active on CuPy. On NumPy, which has no fast float16 arithmetic, the rewrite is off unless ``ON_NUMPY`` is true
(``FLOWLAB_AMP_NUMPY=1`` sets it at import; tests set it to check the rewrite on the host): it would only be slower.
"""
from __future__ import annotations

import os

import numpy as np

from ..graph import Node
from ..ops.array import Cast
from .buffers import view_bases

ON_NUMPY = os.environ.get("FLOWLAB_AMP_NUMPY", "0") == "1"

_FLOAT32, _FLOAT16 = np.dtype(np.float32), np.dtype(np.float16)


def active(backend) -> bool:
    """Whether the rewrite runs on ``backend`` (for a job that asks for it)."""
    return backend.is_gpu or ON_NUMPY


def _converts(node):
    return node.op.amp == "float16" and all(t.dtype == _FLOAT32 for t in (*node.inputs, *node.outputs))


def _cast_name(tensor, suffix):
    return tensor.logical_blob_name.replace("/", "-") + suffix      # OneFlow's names for the casts it inserts


def insert_casts(nodes, graph):
    """``nodes`` with each float16 product between casts; returns ``(nodes, products, casts)``. New tensors are
    registered with ``graph`` (``Graph.compiler_tensor``); the traced nodes and tensors are not changed."""
    base = view_bases(nodes)
    half = {}           # tensor id -> its float16 copy made earlier in this call
    result, products, casts = [], 0, 0
    for node in nodes:
        if node.op.updates_variable:    # a copy made before an in-place update holds the old value
            changed = base.get(node.inputs[0].id, node.inputs[0].id)
            for tid in [tid for tid in half if base.get(tid, tid) == changed]:
                del half[tid]
        if not _converts(node):
            result.append(node)
            continue
        inputs = []
        for t in node.inputs:
            if t.id not in half:
                cast = Node(Cast, _cast_name(t, "-cast_f2h"), (t,), {"dtype": _FLOAT16}, node.source,
                            node.device_tag, node.frames)
                half[t.id] = graph.compiler_tensor(cast, t.shape, _FLOAT16, f"{cast.name}/out_0")
                result.append(cast)
                casts += 1
            inputs.append(half[t.id])
        product = Node(node.op, node.name, inputs, node.attrs, node.source, node.device_tag, node.frames)
        result.append(product)
        for t in node.outputs:
            made = graph.compiler_tensor(product, t.shape, _FLOAT16, f"{t.logical_blob_name}-float16")
            back = Node(Cast, _cast_name(t, "-cast_h2f"), (made,), {"dtype": _FLOAT32}, node.source,
                        node.device_tag, node.frames)
            back.outputs.append(t)      # the traced float32 tensor, as its readers and watches know it
            result.append(back)
            casts += 1
        products += 1
    return result, products, casts
