"""A second stream for the tail of a host train step: weight gradients and updates beside the backward pass.

On a 2-core CPU a step of a network with mid-sized products (a small BERT: 256 x 128 x 128 .. 256 x 128 x 512)
gains little from splitting each kernel over the cores: a hand-off between Python threads costs ~20-50 us, as much
as half such a product. Its backward pass has parallel work instead: a layer's weight gradient (``xᵀ dy``), its bias
gradient and the optimizer update read what the chain rule made but feed nothing the chain still needs. So those
nodes run on a second thread, in their order, while the calling thread goes on with the input gradients.

``split(nodes, roots)`` picks them: every optimizer update, and every node whose outputs reach one update alone
(never an output, a random or side-effecting node; the input gradients' chain reaches every update below it). Each
update moves up to right after the last node it must follow (its inputs' producers, every other reader of the
variables it changes), so it overlaps the rest of the backward pass instead of waiting at the end. The plan then
hands the picked nodes, a run of consecutive ones at a time, to its ``runtime.host_threads.SideStream``, and waits
for them before it returns; every tensor a picked node reads or makes keeps its buffer to the end of the call (the
two threads' timing is unknown, so no buffer is shared across them). Both streams run their kernels on one core
each, BLAS included (``runtime.backend.one_blas_thread``).

In the forward pass the second thread would idle, so it takes *branches* there (``fork``): where two or more
products read the same tensor (attention's query, key and value), every one but the first, with the short chain
that only it feeds (bias add, reshape, transpose into heads), runs on the second thread, handed over as soon as
that tensor is made; the plan's thread waits for a branch (``SideStream.wait``) where it first reads the branch's
result. Small BERT, 2 cores: the key and value products run while the plan's thread makes the query.
"""
from __future__ import annotations

from ..runtime.host_threads import SPLIT_MACS
from .buffers import view_bases

# Plans whose largest product has at least this many multiply-adds split kernels over the cores instead: there a
# kernel's halves are long enough to pay the hand-offs (ResNet-50's convolutions), and the second stream would take
# the second core they use.
SPLIT_KERNELS_FROM = 64_000_000


def split(nodes, root_ids):
    """``(nodes reordered, {id(node) of the side stream's nodes}, {tensor ids kept to the end of the call}, {ids of
    tensors they make that one node reads, and no view})``: the last, in buffers of their own, their reader may
    overwrite (``Op.donates``). The node set is empty where there is nothing to move (no update)."""
    readers = {}
    for node in nodes:
        for t in node.inputs:
            readers.setdefault(t.id, []).append(node)
    # the updates each node's outputs reach (None: two or more, i.e. the chain of input gradients, which feeds
    # every layer below): a node that reaches a single update is that update's own work
    reach, side = {}, set()
    for node in reversed(nodes):
        op = node.op
        if op.updates_variable:
            reach[id(node)] = {id(node)}
            side.add(id(node))
            continue
        reached = set()
        for t in node.outputs:
            for r in readers.get(t.id, ()):
                more = reach.get(id(r))
                reached = None if more is None or reached is None else reached | more
                if reached is None or len(reached) > 1:
                    reached = None
                    break
            if reached is None:
                break
        reach[id(node)] = reached
        if reached and _may_move(node, root_ids):
            side.add(id(node))
    if not side:
        return nodes, side, set(), set()
    ordered = _updates_early(nodes, readers)
    base = view_bases(ordered)
    kept, donatable = set(), set()
    for node in ordered:
        if id(node) in side:
            for t in list(node.inputs) + list(node.outputs):
                kept.add(t.id)
                kept.add(base.get(t.id, t.id))
            donatable.update(t.id for t in node.outputs if t.id not in base and len(readers.get(t.id, ())) == 1
                             and not readers[t.id][0].op.is_view)
    return ordered, side, kept, donatable


def _updates_early(nodes, readers):
    """The nodes with each update placed right after the last of its inputs' producers and of the other readers of
    the variables among its inputs (the weight it changes, its moments): a valid order that changes no value."""
    base = view_bases(nodes)
    producer_at = {t.id: i for i, n in enumerate(nodes) for t in n.outputs}
    variable_ids = {n.outputs[0].id for n in nodes if n.op.is_variable}
    view_readers = {}               # variable id -> the nodes reading it or a view of it
    for tid, nodes_reading in readers.items():
        root = base.get(tid, tid)
        if root in variable_ids:
            view_readers.setdefault(root, []).extend(nodes_reading)
    position = {id(n): i for i, n in enumerate(nodes)}
    after = {}                      # index -> the updates placed right after that node
    moved = set()
    for node in nodes:
        if not node.op.updates_variable:
            continue
        ready = max((producer_at.get(t.id, -1) for t in node.inputs), default=-1)
        for t in node.inputs:
            root = base.get(t.id, t.id)
            if root in variable_ids:
                ready = max([ready] + [position[id(r)] for r in view_readers.get(root, ()) if r is not node])
        if ready < position[id(node)]:
            after.setdefault(ready, []).append(node)
            moved.add(id(node))
    ordered = list(after.get(-1, ()))
    for i, node in enumerate(nodes):
        if id(node) not in moved:
            ordered.append(node)
        ordered.extend(after.get(i, ()))
    return ordered


def _may_move(node, root_ids):
    """Whether ``node`` may run on the second stream as part of another node's work: not a read of a feed, variable
    or constant, nothing random, observing or with a side effect (an update is a task's end, never a part), and no
    output of the plan."""
    op = node.op
    return not (op.is_placeholder or op.is_variable or op.is_constant or op.random or op.side_effect or op.observes
                or op.updates_variable or any(t.id in root_ids for t in node.outputs))


def fork(nodes, side, root_ids, min_macs=SPLIT_MACS):
    """``(nodes reordered, {id(node) of the branches' nodes}, {id(node) of each branch's first node}, {tensor ids
    the branches read or make})`` for the forward pass (the nodes before the first of ``side``): each product of at
    least ``min_macs`` multiply-adds that reads a tensor an earlier such product reads starts a branch, which goes on
    through each next node that is the only reader of the branch's last output and reads nothing else made after
    the branch's first node. A branch moves up to right after the last node making one of its inputs (the shared
    tensor), in its order; nothing else moves."""
    first_side = next((i for i, n in enumerate(nodes) if id(n) in side), len(nodes))
    readers, made_at = {}, {}
    for i, node in enumerate(nodes):
        for t in node.inputs:
            readers.setdefault(t.id, []).append(node)
        for t in node.outputs:
            made_at[t.id] = i
    position = {id(n): i for i, n in enumerate(nodes)}
    variable_ids = {n.outputs[0].id for n in nodes if n.op.is_variable}
    first_reader = {}           # tensor id -> the first big product reading it
    branches = []
    after = {}                  # index of a node -> the branches handed over right after it
    for node in nodes[:first_side]:
        if node.op.gemm_macs is None or node.op.gemm_macs(node) < min_macs or not _may_move(node, root_ids):
            continue
        shared = [t.id for t in node.inputs if t.id not in variable_ids and t.id in first_reader]
        for t in node.inputs:
            first_reader.setdefault(t.id, node)
        if not shared:
            continue
        start = position[id(node)]
        chain, made = [node], {t.id for t in node.outputs}
        while len(chain[-1].outputs) == 1 and len(readers.get(chain[-1].outputs[0].id, ())) == 1:
            nxt = readers[chain[-1].outputs[0].id][0]
            if position[id(nxt)] >= first_side or not _may_move(nxt, root_ids) or any(
                    t.id not in made and made_at.get(t.id, -1) >= start for t in nxt.inputs):
                break
            chain.append(nxt)
            made.update(t.id for t in nxt.outputs)
        branches.append(chain)
        # handed over right after the last node making one of its inputs (all made before its first node)
        ready = max((made_at.get(t.id, -1) for n in chain for t in n.inputs if t.id not in made), default=-1)
        after.setdefault(ready, []).append(chain)
    if not branches:
        return nodes, set(), set(), set()
    moved = {id(n) for chain in branches for n in chain}
    ordered = [n for chain in after.get(-1, ()) for n in chain]
    for i, node in enumerate(nodes):
        if id(node) not in moved:
            ordered.append(node)
        ordered.extend(n for chain in after.get(i, ()) for n in chain)
    base = view_bases(ordered)
    live = set()
    for n in (n for chain in branches for n in chain):
        for t in list(n.inputs) + list(n.outputs):
            live.update((t.id, base.get(t.id, t.id)))
    return ordered, moved, {id(chain[0]) for chain in branches}, live
