"""Finite-difference checks of VJPs through the real tracer, autodiff and executor (float64)."""
from __future__ import annotations

import inspect

import numpy as np

import flowlab as flow
import flowlab.typing as tp
from flowlab.autodiff import gradients


def _job(build, specs, weights):
    def job(*xs):
        y = build(*xs)
        loss = flow.math.reduce_sum(flow.math.multiply(y, flow.constant(weights, dtype=y.dtype), name="gradcheck_weight"))
        grads = gradients([loss], list(xs), [flow.constant(1.0, dtype=flow.float64)])
        return [loss] + [gr if gr is not None else loss for gr in grads]

    params = [inspect.Parameter(f"x{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                annotation=tp.Numpy.Placeholder(a.shape, dtype=a.dtype)) for i, a in enumerate(specs)]
    job.__signature__ = inspect.Signature(params, return_annotation=tp.Bundle[tp.Numpy])
    job.__name__ = f"gradcheck_{getattr(build, '__name__', 'fn')}"
    return flow.global_function()(job)


def check_grad(build, *inputs, wrt=None, eps=1e-6, rtol=1e-5, atol=1e-7, max_points=60, seed=0):
    """Compare autodiff gradients of ``sum(build(*inputs) * w)`` with central differences.

    ``wrt`` lists the indices of the inputs to check (default: every floating input). Up to ``max_points`` elements of
    each input are probed. Returns the analytic gradients.
    """
    rng = np.random.default_rng(seed)
    inputs = [np.array(a) for a in inputs]
    wrt = [i for i, a in enumerate(inputs) if a.dtype.kind == "f"] if wrt is None else list(wrt)

    # Trace once to learn the output shape, then make the job whose loss weights the output randomly.
    probe = _job(build, inputs, np.ones((), np.float64))
    out_shape = _output_shape(probe, inputs)
    weights = rng.uniform(-1, 1, out_shape)
    job = _job(build, inputs, weights)
    results = job(*inputs)
    analytic = results[1:]

    def f(values):
        return float(job(*values)[0])

    for i in wrt:
        x = inputs[i]
        flat = x.reshape(-1)
        points = range(flat.size) if flat.size <= max_points else rng.choice(flat.size, max_points, replace=False)
        numeric = np.zeros(len(list(points)))
        for k, p in enumerate(points):
            plus, minus = [v.copy() for v in inputs], [v.copy() for v in inputs]
            plus[i].reshape(-1)[p] += eps
            minus[i].reshape(-1)[p] -= eps
            numeric[k] = (f(plus) - f(minus)) / (2 * eps)
        got = analytic[i].reshape(-1)[list(points)]
        np.testing.assert_allclose(got, numeric, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {i} of {getattr(build, '__name__', build)}")
    return analytic


def _output_shape(probe, inputs):
    graph = probe.compiled(tuple(a.shape for a in inputs)).graph
    # The loss weights build's output by a named multiply: its first input is that output.
    mul = next(n for n in graph.nodes if n.name == "gradcheck_weight")
    return mul.inputs[0].shape


def run(build, *arrays, job_type="predict"):
    """The outputs of ``build`` on ``arrays`` in one job of ``job_type`` (a list): each array a placeholder of its
    shape and dtype, a single output or a list/tuple of them returned."""
    params = [inspect.Parameter(f"x{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                annotation=tp.Numpy.Placeholder(a.shape, dtype=a.dtype)) for i, a in enumerate(arrays)]

    def job(*xs):
        out = build(*xs)
        return list(out) if isinstance(out, (list, tuple)) else [out]
    job.__signature__ = inspect.Signature(params, return_annotation=tp.Bundle[tp.Numpy])
    job.__name__ = f"{getattr(build, '__name__', 'op')}_job".replace("<lambda>", "op")
    return flow.global_function(type=job_type)(job)(*arrays)
