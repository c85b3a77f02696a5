"""Run a convolution's two gradients side by side, each whole on one core, instead of each split over the cores.

In a host plan with large products every kernel splits its work over the cores (``runtime.host_threads``), and each
split costs: the other thread starts 20-50 us after the hand-off (the caller then waits as long at the end), and each
half of a product packs its own copy of the operand the halves share. A convolution's input gradient and filter
gradient read the same output gradient and not each other's results, and cost about the same: as two tasks, one a
thread, they take one hand-off instead of several and copy nothing twice. ResNet-50 at batch 4, 2 cores (a machine
shared with other work): dx and dw of its 1x1 and 3x3 layers alone, 382 -> 335 ms a step; the step's CPU time
1569-1607 -> 1522-1595 ms; its wall time within noise (flowlab / previous flowlab 0.92 at load ~2, 1.00 at ~1.5):
the pool thread now idles where a layer's dx costs more than its dw.

Ops opt in with the trait ``Op.side_by_side`` (a name both ops of a pair give). Two nodes pair when their ops give
the same name and are different ops, they read a common input (the output gradient), each has one output, both
products have at least ``host_threads.SPLIT_MACS`` multiply-adds (smaller ones run whole on one thread anyway, where
a hand-off costs more than it saves), and the later one can move up to the earlier one: every input is made before
it and no update in between changes a variable it reads. The pair runs where the earlier node was.
"""
from __future__ import annotations

import functools

from ..graph import Node
from ..ops import Op
from ..runtime import host_threads
from .buffers import view_bases


class SideBySide(Op):
    """Two nodes' kernels as one node: ``first(xp, *inputs[:arity])`` and ``second(xp, *inputs[arity:])`` as two
    ``host_threads`` tasks, each on one thread (one after the other where kernels do not spread, e.g. on one core).
    Made by the compiler's ``side_by_side`` pass, never traced; ``members`` are the two nodes."""
    prefix, api = "SideBySide_", "side by side"
    outputs = ("first", "second")

    @staticmethod
    def gemm_macs(node):
        return max(m.op.gemm_macs(m) for m in node.attrs["members"])

    @staticmethod
    def forward(xp, *arrays, first, second, arity, members):
        return tuple(host_threads.run([_alone(first, xp, arrays[:arity]), _alone(second, xp, arrays[arity:])]))


def _alone(kernel, xp, arrays):
    """A task running ``kernel`` with its work on the thread that runs the task only."""
    def task():
        with host_threads.using(1):
            return kernel(xp, *arrays)
    return task


def _pairable(node):
    op = node.op
    return (op.side_by_side is not None and len(node.outputs) == 1 and op.gemm_macs is not None
            and op.gemm_macs(node) >= host_threads.SPLIT_MACS and not (op.supports_out or op.donates or op.random
                                                                         or op.takes_device or op.host_args))


def _movable(later, to, nodes, position_of, producer_at, base):
    """Whether ``later`` may run at position ``to``: its inputs are made before, no update in between changes a
    variable it reads."""
    if any(producer_at.get(t.id, -1) >= to for t in later.inputs):
        return False
    read = {base.get(t.id, t.id) for t in later.inputs}
    return not any(n.op.updates_variable and base.get(n.inputs[0].id, n.inputs[0].id) in read
                   for n in nodes[to:position_of[id(later)]])


def pair_side_by_side(nodes):
    """The node list with each pair (see the module docstring) replaced by one ``SideBySide`` node where the earlier
    of the two was; returns ``(nodes, number of pairs)``."""
    position_of = {id(n): i for i, n in enumerate(nodes)}
    producer_at = {t.id: i for i, n in enumerate(nodes) for t in n.outputs}
    base = view_bases(nodes)
    waiting = {}                # (trait name, input id) -> earlier nodes not paired yet
    replaced, dropped = {}, set()
    for node in nodes:
        if not _pairable(node):
            continue
        partner = None
        for t in node.inputs:
            for other in waiting.get((node.op.side_by_side, t.id), ()):
                if other.op is not node.op and id(other) not in replaced and \
                        _movable(node, position_of[id(other)], nodes, position_of, producer_at, base):
                    partner = other
                    break
            if partner is not None:
                break
        if partner is None:
            for t in node.inputs:
                waiting.setdefault((node.op.side_by_side, t.id), []).append(node)
            continue
        pair = Node(SideBySide, f"{partner.name}+{node.name}", partner.inputs + node.inputs,
                    dict(first=functools.partial(partner.op.forward, **partner.attrs),
                         second=functools.partial(node.op.forward, **node.attrs), arity=len(partner.inputs),
                         members=(partner, node)),
                    partner.source, partner.device_tag, partner.frames)
        pair.outputs = list(partner.outputs) + list(node.outputs)
        replaced[id(partner)] = pair
        dropped.add(id(node))
    return [replaced.get(id(n), n) for n in nodes if id(n) not in dropped], len(replaced)
