"""Dead-node elimination: autodiff builds every gradient it can; only what a root needs survives."""
from __future__ import annotations


def prune(nodes, root_tensors, root_nodes=()):
    """The nodes (in order) that ``root_tensors`` or the side-effect ``root_nodes`` depend on."""
    needed = {t.id for t in root_tensors}
    keep_nodes = {id(n) for n in root_nodes}
    kept = []
    for node in reversed(nodes):
        if id(node) in keep_nodes or any(t.id in needed for t in node.outputs):
            kept.append(node)
            needed.update(t.id for t in node.inputs)
    kept.reverse()
    return kept
