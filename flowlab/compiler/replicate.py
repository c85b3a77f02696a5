"""Where a data-parallel replica combines model gradients (see ``runtime.devices``).

Every update reads its variable's gradient as input 1 (a sparse update, ``row_sparse``, its gradient rows as input 1
and their ids as input 2). Before the first node of a run of updates (and of nodes that read those gradients, such as
the global-norm clip factor) the replicas all-reduce the gradients produced so far (rows and ids are concatenated
instead: each device's ids differ); replica 0 alone runs the run, then releases the others. A job with several
``minimize`` calls has several runs.
"""
from __future__ import annotations

from typing import NamedTuple


class ReducePoints(NamedTuple):
    reduce_before: dict      # node position -> (group number, [gradient tensors], positions always averaged,
    #                          positions concatenated)
    release_before: dict     # node position (len(nodes): the end) -> group number
    first_only: set          # ids of the nodes only replica 0 runs


def reduce_points(nodes) -> ReducePoints:
    gradients = {n.inputs[1].id for n in nodes if n.op.updates_variable}
    statistics = {n.inputs[1].id for n in nodes if n.op.updates_variable and n.op.averages_devices}
    slices = {t.id for n in nodes if n.op.updates_variable and n.op.row_sparse for t in n.inputs[1:3]}
    gradients |= slices
    pending, reduce_before, release_before, first_only = [], {}, {}, set()
    open_group = None
    for i, node in enumerate(nodes):
        # an op that exchanges values with the other devices (``takes_device``) runs on every replica, never in a run
        in_run = not node.op.observes and not node.op.takes_device and \
            (node.op.updates_variable or any(t.id in gradients for t in node.inputs))
        if in_run:
            if open_group is None or pending:
                if open_group is not None:
                    release_before[i] = open_group
                open_group = len(reduce_before)
                reduce_before[i] = (open_group, pending,
                                    tuple(k for k, t in enumerate(pending) if t.id in statistics),
                                    tuple(k for k, t in enumerate(pending) if t.id in slices))
                pending = []
            first_only.add(id(node))
        elif open_group is not None:
            release_before[i] = open_group
            open_group = None
        pending.extend(t for t in node.outputs if t.id in gradients)
    if open_group is not None:
        release_before[len(nodes)] = open_group
    return ReducePoints(reduce_before, release_before, first_only)
