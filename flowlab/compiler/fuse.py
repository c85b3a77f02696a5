"""Elementwise fusion for CuPy: a chain of same-shape elementwise ops becomes one ``cupy.ElementwiseKernel``.

On the GPU each op launch reads and writes the whole tensor; a fused chain reads its inputs once and writes one
output. On NumPy there is nothing to gain (every ufunc is already a loop in C), so the pass runs for CuPy only.
A node joins the chain of its input when that input is produced by an elementwise op in the chain, is read by this
node only, and is neither returned nor watched. Each op's ``c_expr`` (next to its NumPy kernel) gives the C code.
"""
from __future__ import annotations

from ..graph import Node
from ..ops import Op


class FusedElementwise(Op):
    """Several elementwise ops as one kernel; ``attrs['expr']`` is the C body, ``attrs['members']`` the fused nodes."""
    prefix, api = "Fused_", "fused elementwise"
    supports_out = True

    @staticmethod
    def forward(xp, *arrays, kernel, expr, members, out=None):
        return kernel(*arrays) if out is None else kernel(*arrays, out)


def _fusible(node):
    if node.op.c_expr is None or len(node.outputs) != 1:
        return False
    shape = node.outputs[0].shape
    return all(t.shape == shape for t in node.inputs)


def find_chains(nodes, protected_ids):
    """Groups (lists of nodes, in order) of two or more fusible nodes; tensors in ``protected_ids`` stay visible."""
    users = {}
    for node in nodes:
        for t in node.inputs:
            users.setdefault(t.id, []).append(node)
    group_of, groups = {}, []
    for node in nodes:
        if not _fusible(node):
            continue
        joined = None
        for t in node.inputs:
            producer_group = group_of.get(t.id)
            if producer_group is not None and t.id not in protected_ids and len(users.get(t.id, ())) == 1 \
                    and producer_group[-1] is t.node and joined is None:
                joined = producer_group
        if joined is None:
            joined = []
            groups.append(joined)
        joined.append(node)
        group_of[node.outputs[0].id] = joined
    return [grp for grp in groups if len(grp) > 1]


def chain_expression(group):
    """``(input tensors, C expression, output tensor)`` of a chain: inner outputs are inlined into later exprs."""
    inputs, expr_of = [], {}
    for node in group:
        args = []
        for t in node.inputs:
            if t.id in expr_of:
                args.append(expr_of[t.id])
            else:
                if all(t.id != i.id for i in inputs):
                    inputs.append(t)
                args.append(f"x{[i.id for i in inputs].index(t.id)}")
        expr_of[node.outputs[0].id] = node.op.c_expr.format(*args, **node.attrs)
    out = group[-1].outputs[0]
    return inputs, expr_of[out.id], out


def fuse_elementwise(nodes, protected_ids, make_kernel):
    """Replace each chain by one ``FusedElementwise`` node; ``make_kernel(n_inputs, expr)`` builds the kernel."""
    replaced = {}
    for group in find_chains(nodes, protected_ids):
        inputs, expr, out = chain_expression(group)
        attrs = {"kernel": make_kernel(len(inputs), expr), "expr": expr, "members": [n.name for n in group]}
        fused = Node(FusedElementwise, "+".join(n.name for n in group), inputs, attrs, group[-1].source,
                     group[-1].device_tag)
        fused.outputs = [out]
        replaced[id(group[-1])] = fused
        for n in group[:-1]:
            replaced[id(n)] = None
    result = []
    for node in nodes:
        new = replaced.get(id(node), node)
        if new is not None:
            result.append(new)
    return result


def cupy_kernel_factory(cupy):
    """``make_kernel`` for CuPy: inputs ``x0..xn`` and output ``y`` all of one type ``T``."""
    cache = {}

    def make_kernel(n_inputs, expr):
        key = (n_inputs, expr)
        if key not in cache:
            params = ", ".join(f"T x{i}" for i in range(n_inputs))
            cache[key] = cupy.ElementwiseKernel(params, "T y", f"y = {expr};", "flowlab_fused")
        return cache[key]
    return make_kernel
