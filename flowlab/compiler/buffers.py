"""Buffer planning: give each op that can write into ``out=`` a preallocated buffer, reused once its tensor is dead.

A view (reshape, transpose, broadcast) aliases its input, so a buffer stays busy until the last use of any view of
it. Tensors in ``keep`` (returned to the caller, copied later) get no buffer from the pool. An elementwise op
(``op.inplace``) may write into the buffer of an input that dies at that op: one ufunc reads each element before it
writes it, so ``relu(x)`` where nothing else reads ``x`` runs in place.
"""
from __future__ import annotations


def view_bases(nodes):
    """``{tensor id: id of the tensor whose memory it may share}`` for the outputs of views (chains followed)."""
    base = {}
    for node in nodes:
        if node.op.is_view and node.inputs:
            for t in node.outputs:
                base[t.id] = base.get(node.inputs[0].id, node.inputs[0].id)
    return base


def plan_buffers(nodes, keep_ids=frozenset(), allow_inplace=True, live_ids=frozenset()):
    """Return ``({tensor_id: buffer_index}, [(shape, dtype), ...], {tensor_id: index of its last reader})``.
    Tensors in ``live_ids`` (and what they are views of) keep their buffers to the end of the call: nothing else
    is written there (those a plan's second stream reads or makes, ``compiler.side_stream``)."""
    base = view_bases(nodes)
    last_use = {}
    for step, node in enumerate(nodes):
        for t in node.inputs:
            root = base.get(t.id, t.id)
            last_use[root] = step
            last_use[t.id] = step
    end = len(nodes)
    for tid in keep_ids:
        last_use[base.get(tid, tid)] = end
    for tid in live_ids:
        last_use[tid] = last_use[base.get(tid, tid)] = end

    assignment, buffers, free = {}, [], {}
    releases: dict[int, list[int]] = {}

    def release(step):
        for index in releases.pop(step, ()):
            shape, dtype = buffers[index]
            free.setdefault((shape, dtype.str), []).append(index)
    for step, node in enumerate(nodes):
        if node.op.inplace and allow_inplace:    # inputs dying here may lend their buffer to the output
            release(step)
        if node.op.supports_out:
            for t in node.outputs:
                if t.id in keep_ids or t.id not in last_use:
                    continue
                key = (t.shape, t.dtype.str)
                pool = free.get(key)
                if pool:
                    index = pool.pop()
                else:
                    index = len(buffers)
                    buffers.append((t.shape, t.dtype))
                assignment[t.id] = index
                releases.setdefault(last_use[t.id], []).append(index)
        release(step)
    return assignment, buffers, last_use
