"""Group the Adam updates of small variables into one update (NumPy only).

A BERT-sized model has dozens of small variables (biases, layer norms' scales and shifts: 2 to 512 elements). Each
``AdamUpdate`` of one is 13 NumPy calls over a few hundred elements, ~15 us of per-call costs for ~1 us of
arithmetic. Updates that would take Adam's NumPy path anyway (under ``optim.optimizers.BLAS_PASS_FROM`` elements)
and share every attribute and extra input (the same optimizer) become one ``AdamGroupUpdate`` over their arrays laid
end to end, with the same float operations per element (bit-identical results).
"""
from __future__ import annotations

import numbers

from ..graph import Node
from ..optim import optimizers
from ..optim.optimizers import AdamGroupUpdate, AdamUpdate
from .buffers import view_bases


def _key(node):
    """What updates must share to be grouped: every attribute (objects such as the schedule by identity), the extra
    inputs (clip factor, loss scale) and the dtype."""
    attrs = tuple(sorted((k, v if isinstance(v, (numbers.Number, str, type(None))) else id(v))
                         for k, v in node.attrs.items()))
    return attrs, tuple(t.id for t in node.inputs[4:]), node.inputs[0].dtype.str


def group_small_updates(nodes):
    """The node list with each set of groupable small ``AdamUpdate`` s replaced by one ``AdamGroupUpdate`` where the
    last of them was; returns ``(nodes, [size of each group])``. Updates are left alone when a node between the first
    and the last of a set reads one of their variables or moments (moving the update past it would change what it
    reads)."""
    candidates = {}
    for node in nodes:
        if node.op is AdamUpdate and node.inputs[0].size < optimizers.BLAS_PASS_FROM:
            candidates.setdefault(_key(node), []).append(node)
    base = view_bases(nodes)
    position = {id(n): i for i, n in enumerate(nodes)}
    replaced, dropped, sizes = {}, set(), []
    for members in candidates.values():
        if len(members) < 2:
            continue
        ids = {id(n) for n in members}
        state = {base.get(t.id, t.id) for n in members for k in (0, 2, 3) for t in (n.inputs[k],)}
        first, last = position[id(members[0])], position[id(members[-1])]
        if any(id(n) not in ids and any(base.get(t.id, t.id) in state for t in n.inputs)
               for n in nodes[first:last]):
            continue
        head = members[-1]
        inputs = tuple(t for n in members for t in n.inputs[:4]) + head.inputs[4:]
        group = Node(AdamGroupUpdate, f"{head.name}+{len(members) - 1}", inputs, dict(head.attrs, count=len(members)),
                     head.source, head.device_tag, head.frames)
        replaced[id(head)] = group
        dropped.update(id(n) for n in members[:-1])
        sizes.append(len(members))
    return [replaced.get(id(n), n) for n in nodes if id(n) not in dropped], sizes
