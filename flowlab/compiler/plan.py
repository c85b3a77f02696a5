"""Turn a pruned, fused, buffer-planned node list into one straight-line Python function and run it."""
from __future__ import annotations

import functools
import itertools
import linecache

import numpy as np

from .buffers import plan_buffers
from .fuse import cupy_kernel_factory, fuse_elementwise
from .prune import prune

_plan_ids = itertools.count()


class Plan:
    """A compiled job. ``plan(feeds, step)`` returns ``(outputs, delivered)``, both host NumPy arrays.

    ``outputs`` follow ``output_tensors``; ``delivered`` maps each id in ``deliver`` to a host copy taken right after
    the tensor was computed (before optimizer updates change variables in place). A job with nothing to deliver runs
    a function with no delivery code at all.
    """

    def __init__(self, graph, output_tensors, backend, variables, deliver=(), rng_seed=0):
        self.graph = graph
        self.backend = backend
        self.output_tensors = list(output_tensors)
        deliver = list(deliver)
        self.deliver_ids = [t.id for t in deliver]
        roots = self.output_tensors + deliver
        nodes = prune(graph.nodes, roots, graph.side_effects)
        visible = {t.id for t in roots}
        if backend.is_gpu:
            nodes = fuse_elementwise(nodes, visible, cupy_kernel_factory(backend.xp))
        self.nodes = nodes
        self.buffer_of, buffer_specs = plan_buffers(nodes, {t.id for t in self.output_tensors})
        xp = backend.xp
        self.buffers = [xp.empty(shape, dtype) for shape, dtype in buffer_specs]
        self.rng = backend.random_generator(rng_seed)
        self.source, self._run = self._generate(variables)

    @property
    def num_buffers(self):
        return len(self.buffers)

    def _generate(self, variables):
        xp = self.backend.xp
        to_host = (lambda a: a.get()) if self.backend.is_gpu else (lambda a: np.array(a, copy=True))
        ns = {"xp": xp, "B": self.buffers, "RNG": self.rng, "host": to_host}
        deliver = set(self.deliver_ids)
        lines = [f"def run(feeds, step):  # job {self.graph.name}"]
        if deliver:
            lines.append("    D = {}")
        placeholder_index = {t.id: i for i, t in enumerate(self.graph.placeholders)}
        for i, node in enumerate(self.nodes):
            outs = ", ".join(f"t{t.id}" for t in node.outputs)
            target = f"{outs} = " if node.outputs else ""
            op = node.op
            comment = f"  # {node.name} ({op.__name__})"
            if op.__name__ == "Input":
                lines.append(f"    {outs} = feeds[{placeholder_index[node.outputs[0].id]}]{comment}")
            elif op.is_variable:
                ns[f"v{i}"] = variables[node.attrs["var"]]
                lines.append(f"    {outs} = v{i}.value{comment}")
            elif op.__name__ == "Constant":
                ns[f"c{i}"] = self.backend.asarray(node.attrs["value"])
                lines.append(f"    {outs} = c{i}{comment}")
            else:
                ns[f"k{i}"] = functools.partial(op.forward, **node.attrs)
                args = ["xp"] + [f"t{t.id}" for t in node.inputs]
                if node.outputs and node.outputs[0].id in self.buffer_of and op.supports_out:
                    args.append(f"out=B[{self.buffer_of[node.outputs[0].id]}]")
                if getattr(op, "random", False):
                    args.append("rng=RNG")
                if hasattr(op, "host_args"):
                    ns[f"h{i}"] = functools.partial(op.host_args, node)
                    args.append(f"**h{i}(step)")
                lines.append(f"    {target}k{i}({', '.join(args)}){comment}")
            for t in node.outputs:
                if t.id in deliver:
                    lines.append(f"    D[{t.id}] = host(t{t.id})")
        outs = "".join(f"host(t{t.id}), " for t in self.output_tensors)
        lines.append(f"    return ({outs}), {'D' if deliver else '{}'}")
        source = "\n".join(lines) + "\n"
        filename = f"<flowlab plan {self.graph.name} #{next(_plan_ids)}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # readable tracebacks
        exec(compile(source, filename, "exec"), ns)
        return source, ns["run"]

    def __call__(self, feeds, step=0):
        return self._run(feeds, step)

    def __str__(self):
        return self.source


def compile_graph(graph, output_tensors, backend, variables, deliver=(), rng_seed=0) -> Plan:
    return Plan(graph, output_tensors, backend, variables, deliver, rng_seed)


__all__ = ["Plan", "compile_graph", "plan_buffers", "prune"]
