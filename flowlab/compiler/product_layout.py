"""Write a matrix product straight into the layout a transpose and a reshape of it ask for (NumPy only).

Multi-head attention merges its heads back with ``reshape(transpose(context, (0, 2, 1, 3)), (batch * seq, hidden))``;
the transpose is a view, so the reshape copies every element. Backward, the query, key and value gradients come out
of batched products in the heads' layout and go through the same two ops. A batched ``MatMul`` can write its
product into a strided view of the merged array instead (each head's rows ``hidden`` apart, BLAS's leading
dimension), so the copy disappears: a small BERT (hidden 128, 2 heads, batch 8 x 32) makes 8 such copies a step,
~6 us each plus a node's dispatch. The three nodes become one ``ops.math.MatMulInLayout``.
"""
from __future__ import annotations

import numpy as np

from ..graph import Node
from ..ops.array import Reshape, Transpose
from ..ops.math import MatMul, MatMulInLayout


def write_products_in_layout(nodes, protected_ids):
    """The node list with each ``MatMul`` -> ``Transpose`` -> ``Reshape`` chain (the product read by the transpose
    alone, the transpose by the reshape alone, neither one returned or watched, a float32 or float64 product) as one
    ``MatMulInLayout`` where the product was; returns ``(nodes, number of chains)``."""
    producer = {t.id: n for n in nodes for t in n.outputs}
    readers = {}
    for node in nodes:
        for t in node.inputs:
            readers.setdefault(t.id, []).append(node)

    def only_reader(tensor, op):
        found = readers.get(tensor.id, ())
        return len(found) == 1 and found[0].op is op and tensor.id not in protected_ids

    replaced, dropped = {}, set()
    for node in nodes:
        if node.op is not Reshape or set(node.attrs) != {"shape"}:     # batch_leading: a replica's reshape
            continue
        transpose = producer.get(node.inputs[0].id)
        if transpose is None or transpose.op is not Transpose or not only_reader(transpose.output, Reshape):
            continue
        product = producer.get(transpose.inputs[0].id)
        if product is None or product.op is not MatMul or product.output.dtype not in (np.float32, np.float64) \
                or not only_reader(product.output, Transpose):
            continue
        attrs = {k: product.attrs[k] for k in ("transpose_a", "transpose_b", "alpha")}
        attrs.update(perm=tuple(transpose.attrs["perm"]), shape=tuple(node.attrs["shape"]))
        fused = Node(MatMulInLayout, f"{product.name}+{node.name}", product.inputs, attrs, product.source,
                     product.device_tag, product.frames)
        fused.outputs = [node.output]           # the same tensor: its readers are unchanged
        replaced[id(product)] = fused
        dropped.update((id(transpose), id(node)))
    return [replaced.get(id(n), n) for n in nodes if id(n) not in dropped], len(replaced)
