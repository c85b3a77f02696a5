"""The ops a transformer needs beyond the CNN set: slice / slice_v2, squeeze / expand_dims, broadcast_like, where,
gelu, rsqrt, top_k, layer_norm, and the attention shapes of matmul / softmax / cast. Kernels against PyTorch (or
NumPy where PyTorch has no such op), gradients by finite differences in float64 (``gradcheck.check_grad``)."""
import math
import warnings

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.errors import ShapeError
from gradcheck import check_grad, run


def rnd(*shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------------------------------------------------- slicing

def test_slice_as_bert_takes_positions_and_the_first_token():
    table = rnd(1, 16, 4, dtype=np.float32)
    seq = rnd(2, 8, 4, seed=1, dtype=np.float32)
    positions, first = run(lambda t, s: [flow.slice(t, begin=[None, 0, 0], size=[None, 5, -1]),
                                         flow.slice(s, [None, 0, 0], [None, 1, -1])], table, seq)
    np.testing.assert_array_equal(positions, table[:, :5, :])
    np.testing.assert_array_equal(first, seq[:, :1, :])


def test_slice_negative_begin_and_a_size_past_the_end():
    x = np.arange(30, dtype=np.float32).reshape(5, 6)
    out, = run(lambda t: flow.slice(t, [-2, 3], [None, 10 - 4]), x)    # rows 3..4, columns 3..5 (size clipped)
    np.testing.assert_array_equal(out, x[3:, 3:])


@pytest.mark.parametrize("tuples", [
    [[None, None, None], [0, 5, 2], [0, 6, 3]],     # OneFlow's docstring example
    [[1, None, None], [-1, None, -2]],              # negative step from the end; last axis taken whole
    [[None, -1, 1], [4, 0, -1], [8, -10, -4]],
])
def test_slice_v2_matches_torch_and_python_slicing(tuples):
    torch = pytest.importorskip("torch")
    x = rnd(3, 6, 9, dtype=np.float32)
    out, = run(lambda t: flow.slice_v2(t, tuples), x)
    index = tuple(slice(*t) for t in tuples)
    np.testing.assert_array_equal(out, x[index])
    if all((t[2] or 1) > 0 for t in tuples):       # torch has no negative steps
        np.testing.assert_array_equal(out, torch.from_numpy(x)[index].numpy())


@pytest.mark.parametrize("build", [
    lambda t: flow.slice(t, [None, 1, 0], [None, 3, -1]),
    lambda t: flow.slice_v2(t, [[None, None, None], [4, 0, -2], [1, None, 2]]),
], ids=["slice", "slice_v2_strided"])
def test_slice_gradient(build):
    check_grad(build, rnd(2, 5, 4))


@pytest.mark.parametrize("call,match", [
    (lambda t: flow.slice(t, [0, 0], [1, 1]), "begin must be a list with one entry per axis"),
    (lambda t: flow.slice(t, [0, 0, 7], [1, 1, 1]), r"begin\[2\] must be in \[-4, 4\)"),
    (lambda t: flow.slice(t, [0, 0, 0], [1, 0, 1]), r"size\[1\] must be -1, None or in \[1, 3\]"),
    (lambda t: flow.slice(t, [0, 0.5, 0], [1, 1, 1]), "entries of begin must be ints or None"),
    (lambda t: flow.slice_v2(t, [[0, 1, 0]]), "step of axis 0 must not be 0"),
    (lambda t: flow.slice_v2(t, [[None, None, None], [3, None, None]]), r"start of axis 1 must be in \[-3, 3\)"),
    (lambda t: flow.slice_v2(t, [[None, None, None], [2, 1, None]]), "selects nothing"),
    (lambda t: flow.slice_v2(t, [(0, 1)]), r"entry 0 of slice_tup_list must be a \(start, stop, step\)"),
])
def test_slice_bad_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        run(call, rnd(2, 3, 4, dtype=np.float32))


# ------------------------------------------------------------------------------- squeeze, expand_dims, broadcast_like

def test_squeeze_and_expand_dims_match_torch():
    torch = pytest.importorskip("torch")
    x = rnd(1, 3, 1, 2, dtype=np.float32)
    every, some, grown, grown_end = run(lambda t: [flow.squeeze(t), flow.squeeze(t, axis=[-2]),
                                                   flow.expand_dims(t, axis=1), flow.expand_dims(t, -1)], x)
    tx = torch.from_numpy(x)
    np.testing.assert_array_equal(every, tx.squeeze().numpy())
    np.testing.assert_array_equal(some, tx.squeeze(2).numpy())
    np.testing.assert_array_equal(grown, tx.unsqueeze(1).numpy())
    assert grown_end.shape == (1, 3, 1, 2, 1)


def test_squeeze_expand_dims_gradients():
    check_grad(lambda t: flow.expand_dims(flow.squeeze(t, axis=[0]), 2) * 1.5, rnd(1, 3, 2))


def test_squeeze_refuses_a_wide_axis():
    with pytest.raises(ShapeError, match="axis 1 of .* has size 3, not 1"):
        run(lambda t: flow.squeeze(t, axis=[1]), rnd(1, 3, dtype=np.float32))
    with pytest.raises(ValueError, match=r"axis must be an int in \[-3, 2\]"):
        run(lambda t: flow.expand_dims(t, 3), rnd(1, 3, dtype=np.float32))


def test_broadcast_like_keepdims_and_removed_axes():
    like = np.zeros((3, 4, 2), np.float32)
    kept = rnd(3, 1, 1, dtype=np.float32)
    removed = rnd(4, seed=1, dtype=np.float32)
    a, b = run(lambda lk, k, r: [flow.broadcast_like(k, lk, broadcast_axes=(1, 2)),
                                 flow.broadcast_like(r, lk, broadcast_axes=[0, -1])], like, kept, removed)
    np.testing.assert_array_equal(a, np.broadcast_to(kept, like.shape))
    np.testing.assert_array_equal(b, np.broadcast_to(removed[None, :, None], like.shape))
    with pytest.raises(ShapeError, match=r"must have shape \(3, 1, 2\) or \(3, 2\)"):
        run(lambda lk, k: flow.broadcast_like(k, lk, broadcast_axes=[1]), like, kept)


def test_broadcast_like_gradient_sums_the_broadcast_axes():
    like = np.zeros((2, 3, 4))
    check_grad(lambda k, lk: flow.broadcast_like(k, lk, broadcast_axes=[1]), rnd(2, 4), like, wrt=[0])


# ------------------------------------------------------------------------------------------------------------ where

def test_where_matches_torch_with_broadcasting():
    torch = pytest.importorskip("torch")
    cond = np.array([[3, 0, 1, 0]], np.int32)
    x, y = rnd(3, 4, dtype=np.float32), rnd(3, 1, seed=1, dtype=np.float32)
    out, with_number = run(lambda c, a, b: [flow.where(c, a, b), flow.where(c, a, -1.0)], cond, x, y)
    want = torch.where(torch.from_numpy(cond) != 0, torch.from_numpy(x), torch.from_numpy(y)).numpy()
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(with_number, np.where(cond != 0, x, -1.0))


def test_where_gradient():
    cond = np.array([[1, 0, 0, 2], [0, 1, 1, 0], [5, 0, 0, 0]], np.int8)
    check_grad(lambda c, a, b: flow.where(c, a, b), cond, rnd(3, 4), rnd(1, 4, seed=2))


def test_where_refuses_the_argwhere_form_and_one_sided_calls():
    with pytest.raises(ValueError, match="data-dependent shape"):
        run(lambda c: flow.where(c), np.ones(3, np.int32))
    with pytest.raises(ValueError, match="give both x and y"):
        run(lambda c: flow.where(c, c), np.ones(3, np.int32))


# --------------------------------------------------------------------------------------------------- gelu and rsqrt

def test_gelu_matches_torch_erf_form():
    """PyTorch's GELU is the erf form; flowlab's goes through erfc, so for very negative x it stays exact where
    ``1 + erf`` cancels (PyTorch's float32 GELU(-5) is off by 25%, its float64 GELU(-8) by 2%): compared with
    PyTorch in float64 to absolute 1e-15, and with the standard library's exact ``erfc`` relatively."""
    import math
    torch = pytest.importorskip("torch")
    x = np.concatenate([np.linspace(-8, 8, 161), [-30.0, 30.0]])
    exact = np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x])
    single, double = run(lambda a, b: [flow.math.gelu(a), flow.math.gelu(b)], x.astype(np.float32), x)
    np.testing.assert_allclose(double, torch.nn.functional.gelu(torch.from_numpy(x)).numpy(), rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(double, exact, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(single, exact.astype(np.float32), rtol=1e-5, atol=1e-30)


def test_gelu_keeps_float32_accurate_in_the_far_tails():
    from flowlab.ops.math import _normal_cdf
    x = np.linspace(-9, 9, 37)
    exact = np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in x])
    single = _normal_cdf(np, x.astype(np.float32))
    assert single.dtype == np.float32
    np.testing.assert_allclose(_normal_cdf(np, x), exact, rtol=1e-13)
    np.testing.assert_allclose(single, exact, rtol=1e-5)        # no cancellation at -9 (Φ ~ 1e-19)


def _exact_gelu_and_derivative(x):
    from scipy.special import erfc
    wide = x.astype(np.float64)
    cdf = 0.5 * erfc(-wide / math.sqrt(2))
    return wide * cdf, cdf + wide * np.exp(-0.5 * wide * wide) / math.sqrt(2 * math.pi)


SPECIAL = [0.0, -0.0, 1e-38, -1e-38, 1e-45, -1e-45, 3e-30, -3e-30, 3e38, -3e38]


@pytest.mark.parametrize("compiled,bounds", [
    (False, ((-1, 5.5), (-2, 7.8), (-4, 10.1), (-8, 22.2), (-np.inf, 68.5))),
    (True, ((-1, 4.0), (-2, 5.4), (-4, 8.5), (-8, 21.2), (-np.inf, 68.0)))])
def test_gelu_float32_lies_within_a_few_ulps_of_the_exact_value_everywhere(compiled, bounds):
    """The NumPy float32 kernel (a rational fit of Φ(-|x|) exp(x²/2) in float32 arithmetic, block by block), and its
    compiled twin (``runtime.jit``), against SciPy's float64 erfc at the same float32 inputs, in float32 ulps of the
    exact result: their documented bounds (found at every float32 with 2^-14 <= |x| < 16), NumPy's 5.5 for x >= -1,
    7.8 for x >= -2, 10.1 for x >= -4, 22.2 for x >= -8 and 68.5 in the far negative tail (subnormal results,
    subnormal and huge inputs included), the compiled 4.0, 5.4, 8.5, 21.2 and 68.0; PyTorch's float32 GELU, checked
    here too so that the bounds mean something, is past them below x = -1. A block holding an infinity (the clamped
    path) gives its other elements the same bits."""
    torch = pytest.importorskip("torch")
    from flowlab.runtime import jit
    if compiled and not jit.available():
        pytest.skip("numba is not installed")
    x = np.concatenate([np.linspace(-14.5, 10, 245_001, dtype=np.float32),
                        np.random.default_rng(5).uniform(-3, 3, 300_000).astype(np.float32), np.float32(SPECIAL)])
    with jit.using(compiled):                  # (a plan this small runs on the calling thread)
        got, = run(flow.math.gelu, x)
    exact, _ = _exact_gelu_and_derivative(x)
    spacing = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    ulps = np.abs(got - exact) / spacing
    for start, bound in bounds:
        worst = ulps[x >= start].max()
        assert worst <= bound, f"{worst:.2f} ulps for x >= {start} at x = {x[x >= start][ulps[x >= start].argmax()]}"
    assert ulps[x >= -1].max() > 2               # float32 rounding: a bound near the truth, not a loose one
    theirs = torch.nn.functional.gelu(torch.from_numpy(x)).numpy()
    theirs = np.abs(theirs - exact) / spacing
    assert theirs[(x >= -2) & (x < -1)].max() > 7.8 and theirs[(x >= -4) & (x < -2)].max() > 10.1
    with_inf = x[:1000].copy()
    with_inf[500] = np.inf
    with jit.using(compiled):
        clamped, = run(flow.math.gelu, with_inf)
    np.testing.assert_array_equal(np.delete(clamped, 500), np.delete(got[:1000], 500))
    with warnings.catch_warnings(), jit.using(compiled):
        warnings.simplefilter("error")                  # no inf * 0 on the way
        edges, = run(flow.math.gelu, np.float32([np.inf, -np.inf, np.nan, 3e38, -3e38]))
    np.testing.assert_array_equal(edges, np.float32([np.inf, 0.0, np.nan, 3e38, 0.0]))   # limits; NaN stays NaN


def test_gelu_float32_gradient_matches_the_exact_derivative_and_torch():
    """GeluGrad in float32 (Φ read back as y / x, an exact 0 and subnormal x at Φ(0) = 1/2): absolutely within 2e-7
    of the exact derivative (PyTorch's float32 gradient: 2.6e-7), relatively within 1e-5 in the negative tail."""
    torch = pytest.importorskip("torch")
    from flowlab.autodiff import gradients
    x = np.concatenate([np.linspace(-13, 10, 200_001, dtype=np.float32), np.float32(SPECIAL[:8])])
    upstream = np.random.default_rng(3).uniform(0.5, 2.0, x.shape).astype(np.float32)
    grad, = run(lambda t, w: gradients([flow.math.reduce_sum(flow.math.gelu(t) * w)], [t],
                                       [flow.constant(1.0, dtype=flow.float32)]), x, upstream)
    _, derivative = _exact_gelu_and_derivative(x)
    exact = derivative * upstream
    assert np.abs(grad - exact).max() <= 2e-7 * upstream.max()
    tail = (x < -3) & (np.abs(exact) > 1e-36)
    assert (np.abs(grad - exact) / np.abs(exact))[tail].max() <= 1e-5
    assert np.all(grad[-8:] == np.float32(0.5) * upstream[-8:])
    tx = torch.from_numpy(x).requires_grad_()
    (torch.nn.functional.gelu(tx) * torch.from_numpy(upstream)).sum().backward()
    np.testing.assert_allclose(grad, tx.grad.numpy(), rtol=0, atol=1e-6)


def test_gelu_gradient_matches_torch_and_finite_differences():
    torch = pytest.importorskip("torch")
    x = rnd(4, 5) * 2
    x[0, 0] = 0.0                          # Φ(0) = 1/2: the gradient reads Φ back as y / x elsewhere
    check_grad(flow.math.gelu, x)
    upstream = rnd(4, 5, seed=1)
    from flowlab.autodiff import gradients
    grad, = run(lambda t, w: gradients([flow.math.reduce_sum(flow.math.gelu(t) * w)], [t],
                                       [flow.constant(1.0, dtype=flow.float64)]), x, upstream)
    tx = torch.from_numpy(x).requires_grad_()
    (torch.nn.functional.gelu(tx) * torch.from_numpy(upstream)).sum().backward()
    np.testing.assert_allclose(grad, tx.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_gelu_gradient_of_gradient():
    """GeluGrad is differentiable (in x and in dy): a gradient penalty through a GELU."""
    from flowlab.autodiff import gradients

    def build(t):
        y = flow.math.reduce_sum(flow.math.gelu(t))
        dx, = gradients([y], [t], [flow.constant(1.0, dtype=flow.float64)])
        return dx * dx
    check_grad(build, rnd(3, 4))


def test_rsqrt_matches_torch_and_its_gradient():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).uniform(0.1, 4.0, (3, 4))
    out, = run(flow.math.rsqrt, x)
    np.testing.assert_allclose(out, torch.rsqrt(torch.from_numpy(x)).numpy(), rtol=1e-15)
    check_grad(flow.math.rsqrt, x)


# ----------------------------------------------------------------------------------------------------------- top_k

@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("axis", [-1, 0])
def test_top_k_indices_match_torch(k, axis):
    torch = pytest.importorskip("torch")
    x = rnd(8, 40, dtype=np.float32) if axis == -1 else rnd(40, 8, dtype=np.float32)
    out, = run(lambda t: flow.math.top_k(t, axis=axis, k=k), x)
    want = torch.topk(torch.from_numpy(x), k, dim=axis).indices.numpy()
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, want)


def test_top_k_ties_take_the_lower_index_and_unsorted_keeps_index_order():
    x = np.array([[1, 5, 5, 0, 5, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]], np.float32)
    top, unsorted, near_tie = run(lambda t: [flow.math.top_k(t, k=2), flow.math.top_k(t, k=3, sorted=False),
                                             flow.math.top_k(t, k=4)], x)
    np.testing.assert_array_equal(top, [[1, 2]])
    np.testing.assert_array_equal(unsorted, [[1, 2, 4]])
    np.testing.assert_array_equal(near_tie, [[1, 2, 4, 5]])      # among the many 2s, the first


def test_top_k_k_out_of_range():
    with pytest.raises(ValueError, match=r"k must be an int in \[1, 4\]"):
        run(lambda t: flow.math.top_k(t, k=5), rnd(2, 4, dtype=np.float32))


def test_argmax_matches_torch():
    torch = pytest.importorskip("torch")
    x = rnd(3, 5, 4, dtype=np.float32)
    out, = run(lambda t: flow.math.argmax(t, axis=1), x)
    np.testing.assert_array_equal(out, torch.argmax(torch.from_numpy(x), dim=1).numpy())


# ------------------------------------------------------------------------------------------------------- layer norm

@pytest.mark.parametrize("dtype,rtol", [(np.float32, 2e-5), (np.float64, 1e-12)])
def test_layer_norm_matches_torch_layer_norm(dtype, rtol):
    torch = pytest.importorskip("torch")
    x = (rnd(4, 6, 16, dtype=dtype) * 3 + 1).astype(dtype)
    gamma, beta = rnd(16, seed=1, dtype=dtype), rnd(16, seed=2, dtype=dtype)

    def build(t):
        return flow.layers.layer_norm(t, name="ln", begin_norm_axis=-1, begin_params_axis=-1)
    flow.clear_default_session()
    run(build, x)                          # declares ln-gamma / ln-beta
    variables = flow.get_all_variables()
    assert set(variables) == {"ln-gamma", "ln-beta"}
    flow.load_variables({"ln-gamma": gamma, "ln-beta": beta})
    out, = run(build, x)
    layer = torch.nn.LayerNorm(16, eps=1e-5).to(torch.float64 if dtype == np.float64 else torch.float32)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(gamma))
        layer.bias.copy_(torch.from_numpy(beta))
        want = layer(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out, want, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("offset", [0.0, 100.0])
def test_layer_norm_kernels_in_float32_match_float64_torch(offset):
    """The kernels on BERT's (tokens, hidden) block in float32 (BLAS row sums, row dots) against PyTorch in float64
    on the same values: within float32 rounding, also for rows whose mean is 100 standard deviations from zero
    (a variance taken as E[x^2] - E[x]^2 in float32 would lose all its digits there)."""
    torch = pytest.importorskip("torch")
    from flowlab.ops.normalization import LayerNorm, LayerNormGrad
    x = (rnd(256, 128, dtype=np.float32) + offset).astype(np.float32)
    upstream = rnd(256, 128, seed=5, dtype=np.float32)
    y, mean, inv = LayerNorm.forward(np, x, begin_norm_axis=1, epsilon=1e-5)
    dx = LayerNormGrad.forward(np, y, inv, upstream)
    assert y.dtype == mean.dtype == inv.dtype == dx.dtype == np.float32
    assert mean.shape == inv.shape == (256,)
    tx = torch.from_numpy(x.astype(np.float64)).requires_grad_()
    want = torch.nn.functional.layer_norm(tx, (128,), eps=1e-5)
    want.backward(torch.from_numpy(upstream.astype(np.float64)))
    np.testing.assert_allclose(y, want.detach().numpy(), rtol=0, atol=2e-4 if offset else 2e-6)
    np.testing.assert_allclose(mean, x.astype(np.float64).mean(axis=1), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(inv, 1 / np.sqrt(x.astype(np.float64).var(axis=1) + 1e-5), rtol=1e-3 if offset else 1e-5)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=0, atol=2e-4 if offset else 2e-6)


def test_layer_norm_over_several_axes_with_params_on_the_last():
    """``begin_norm_axis=1``: statistics over every axis but the batch; gamma/beta of the last axis broadcast."""
    torch = pytest.importorskip("torch")
    x = rnd(3, 5, 4)
    out, = run(lambda t: flow.layers.layer_norm(t, name="ln_wide", epsilon=1e-3), x)
    want = torch.nn.functional.layer_norm(torch.from_numpy(x), (5, 4), eps=1e-3).numpy()
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("begin_norm_axis,begin_params_axis", [(-1, -1), (1, -1), (1, 1), (2, 1)])
def test_layer_norm_gradient_wrt_input(begin_norm_axis, begin_params_axis):
    def build(t):
        return flow.layers.layer_norm(t, begin_norm_axis=begin_norm_axis, begin_params_axis=begin_params_axis,
                                      name=f"ln_grad_{begin_norm_axis}_{begin_params_axis}")
    check_grad(build, rnd(2, 3, 5) * 2 + 0.5)


def test_layer_norm_gradients_match_torch_including_gamma_and_beta():
    torch = pytest.importorskip("torch")
    from flowlab.autodiff import gradients
    x, upstream = rnd(6, 8) * 2, rnd(6, 8, seed=3)

    def build(t, w):
        y = flow.layers.layer_norm(t, name="ln_torch_grad", begin_norm_axis=-1)
        graph_vars = [v for v in (flow.get_variable("ln_torch_grad-gamma", shape=(8,), dtype=flow.float64),
                                  flow.get_variable("ln_torch_grad-beta", shape=(8,), dtype=flow.float64))]
        return gradients([flow.math.reduce_sum(y * w)], [t] + graph_vars,
                         [flow.constant(1.0, dtype=flow.float64)])
    dx, dgamma, dbeta = run(build, x, upstream)
    tx = torch.from_numpy(x).requires_grad_()
    layer = torch.nn.LayerNorm(8, eps=1e-5).double()
    (layer(tx) * torch.from_numpy(upstream)).sum().backward()
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dgamma, layer.weight.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dbeta, layer.bias.grad.numpy(), rtol=1e-10, atol=1e-12)


def _fused_grads(xp, normalized, inv, dy, gamma, begin_params_axis):
    """``(dx, dgamma, dbeta)`` of the fused layer norm from its two gradient kernels."""
    from flowlab.ops.normalization import LayerNormGrad, LayerNormParamGrad
    dx = LayerNormGrad.forward(xp, normalized, inv, dy, gamma, begin_params_axis=begin_params_axis)
    return (dx,) + LayerNormParamGrad.forward(xp, normalized, dy, begin_params_axis=begin_params_axis)


def _affine_layer_norm(t, gamma, beta, begin_norm_axis, begin_params_axis):
    """The fused op on job tensors (gamma / beta may be None), so that gamma and beta can be arbitrary inputs."""
    from flowlab.ops import apply
    from flowlab.ops.normalization import LayerNormAffine
    params = tuple(p for p in (gamma, beta) if p is not None)
    norm_axis, params_axis = begin_norm_axis % t.ndim, begin_params_axis % t.ndim
    return apply(LayerNormAffine, (t,) + params, "ln_affine", begin_norm_axis=norm_axis,
                 begin_params_axis=params_axis, epsilon=1e-5, scale=gamma is not None, center=beta is not None)[0]


@pytest.mark.parametrize("begin_norm_axis,begin_params_axis", [(-1, -1), (1, -1), (1, 1), (2, 1), (2, 2)])
@pytest.mark.parametrize("scale,center", [(True, True), (True, False), (False, True)])
def test_fused_layer_norm_gradients_by_finite_differences(begin_norm_axis, begin_params_axis, scale, center):
    """dx, dgamma and dbeta of the fused op in float64 with gamma and beta far from ones and zeros, parameters over
    the normalized axes, fewer axes (broadcast inside a row) and more axes (gamma differing between rows)."""
    x = rnd(2, 3, 5) * 2 + 0.5
    params_shape = x.shape[begin_params_axis:]
    inputs = [x]
    if scale:
        inputs.append(rnd(*params_shape, seed=7) + 0.3)
    if center:
        inputs.append(rnd(*params_shape, seed=8))

    def build(t, *params):
        gamma = params[0] if scale else None
        beta = params[-1] if center else None
        return _affine_layer_norm(t, gamma, beta, begin_norm_axis, begin_params_axis)
    check_grad(build, *inputs)


@pytest.mark.parametrize("begin_params_axis", [-1, 1])
def test_fused_layer_norm_matches_torch_with_trained_gamma_and_beta(begin_params_axis):
    """Forward, dx, dgamma and dbeta against PyTorch in float64 (``begin_params_axis=1``: gamma over both
    normalized axes, as ``torch.nn.functional.layer_norm`` with a 2-D weight)."""
    torch = pytest.importorskip("torch")
    from flowlab.autodiff import gradients
    x, upstream = rnd(4, 3, 6) * 3 + 1, rnd(4, 3, 6, seed=3)
    shape = x.shape[begin_params_axis:]
    gamma, beta = rnd(*shape, seed=4) + 1, rnd(*shape, seed=5)

    def build(t, w, gm, bt):
        y = _affine_layer_norm(t, gm, bt, 1, begin_params_axis)
        return [y] + list(gradients([flow.math.reduce_sum(y * w)], [t, gm, bt],
                                    [flow.constant(1.0, dtype=flow.float64)]))
    y, dx, dgamma, dbeta = run(build, x, upstream, gamma, beta)
    tx, tg, tb = (torch.from_numpy(a).requires_grad_() for a in (x, gamma, beta))
    want = torch.nn.functional.layer_norm(tx, (3, 6), eps=1e-5)
    want = want * tg + tb          # gamma / beta broadcast over the leading axes as flowlab's
    (want * torch.from_numpy(upstream)).sum().backward()
    np.testing.assert_allclose(y, want.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dgamma, tg.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dbeta, tb.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_fused_layer_norm_kernels_in_float32_match_float64_torch():
    """The fused kernels on BERT's (tokens, hidden) block in float32 against PyTorch's LayerNorm in float64."""
    torch = pytest.importorskip("torch")
    from flowlab.ops.normalization import LayerNormAffine
    x = rnd(256, 128, dtype=np.float32) * 2 + 3
    upstream = rnd(256, 128, seed=5, dtype=np.float32)
    gamma, beta = rnd(128, seed=6, dtype=np.float32) + 1, rnd(128, seed=7, dtype=np.float32)
    out, mean, inv, normalized = LayerNormAffine.forward(np, x, gamma, beta, begin_norm_axis=1,
                                                         begin_params_axis=1, epsilon=1e-5, scale=True, center=True)
    dx, dgamma, dbeta = _fused_grads(np, normalized, inv, upstream, gamma, begin_params_axis=1)
    assert {a.dtype for a in (out, mean, inv, normalized, dx, dgamma, dbeta)} == {np.dtype(np.float32)}
    layer = torch.nn.LayerNorm(128, eps=1e-5).double()
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(gamma.astype(np.float64)))
        layer.bias.copy_(torch.from_numpy(beta.astype(np.float64)))
    tx = torch.from_numpy(x.astype(np.float64)).requires_grad_()
    want = layer(tx)
    want.backward(torch.from_numpy(upstream.astype(np.float64)))
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(dgamma, layer.weight.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dbeta, layer.bias.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("begin_params_axis", [1, 2, 0])
def test_fused_layer_norm_array_module_path_matches_the_numpy_one(begin_params_axis):
    """The kernels' path for any array module (CuPy's), run on NumPy through a stand-in module that is not ``numpy``
    itself, against the NumPy path (BLAS products, row dots): forward and all three gradients."""
    import types
    from flowlab.ops.normalization import LayerNormAffine
    xp = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("__")})
    x, dy = rnd(4, 6, 5) * 2 + 1, rnd(4, 6, 5, seed=2)
    shape = x.shape[begin_params_axis:]
    gamma, beta = rnd(*shape, seed=3) + 1, rnd(*shape, seed=4)
    attrs = dict(begin_norm_axis=1, begin_params_axis=begin_params_axis, epsilon=1e-5, scale=True, center=True)
    generic = LayerNormAffine.forward(xp, x, gamma, beta, **attrs)
    blas = LayerNormAffine.forward(np, x, gamma, beta, **attrs)
    for a, b in zip(generic, blas):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    grads_generic = _fused_grads(xp, generic[3], generic[2], dy, gamma,
                                                begin_params_axis=begin_params_axis)
    grads_blas = _fused_grads(np, blas[3], blas[2], dy, gamma, begin_params_axis=begin_params_axis)
    for a, b in zip(grads_generic, grads_blas):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12)


def test_fused_layer_norm_float16_computes_in_float32():
    from flowlab.ops.normalization import LayerNormAffine
    x = (rnd(8, 32, dtype=np.float32) * 4).astype(np.float16)
    gamma, beta = (rnd(32, seed=2) + 1).astype(np.float16), rnd(32, seed=3).astype(np.float16)
    dy = rnd(8, 32, seed=4).astype(np.float16)
    attrs = dict(begin_norm_axis=1, begin_params_axis=1, epsilon=1e-5, scale=True, center=True)
    half = LayerNormAffine.forward(np, x, gamma, beta, **attrs)
    single = LayerNormAffine.forward(np, x.astype(np.float32), gamma.astype(np.float32), beta.astype(np.float32),
                                     **attrs)
    assert all(a.dtype == np.float16 for a in half)
    np.testing.assert_allclose(half[0].astype(np.float32), single[0], rtol=0, atol=1e-2)
    grads_half = _fused_grads(np, half[3], half[2], dy, gamma, begin_params_axis=1)
    grads_single = _fused_grads(np, single[3], single[2], dy.astype(np.float32),
                                               gamma.astype(np.float32), begin_params_axis=1)
    assert all(a.dtype == np.float16 for a in grads_half)
    for h, f in zip(grads_half, grads_single):
        np.testing.assert_allclose(h.astype(np.float32), f, rtol=1e-2, atol=2e-2)


def test_layer_norm_names_scope_and_flags():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 4))) -> tp.Numpy:
        with flow.scope.namespace("enc"):
            a = flow.layers.layer_norm(x, begin_norm_axis=-1)
        b = flow.layers.layer_norm(x, center=False, name="only_scale")
        c = flow.layers.layer_norm(x, center=False, scale=False, name="bare")
        return a + b + c
    job(np.ones((2, 4), np.float32))
    graph = job.compiled(((2, 4),)).graph
    names = {n.name for n in graph.nodes}
    assert {"enc-LayerNorm", "only_scale", "bare"} <= names
    # gamma and beta are applied inside the one op named after the layer (as OneFlow's layer_norm op does)
    assert not {"enc-LayerNorm_scale", "enc-LayerNorm_center", "only_scale_scale"} & names
    ops = {n.name: n for n in graph.nodes}
    assert [t.node.name for t in ops["enc-LayerNorm"].inputs[1:]] == ["enc-LayerNorm-gamma", "enc-LayerNorm-beta"]
    assert ops["enc-LayerNorm"].attrs["scale"] and ops["enc-LayerNorm"].attrs["center"]
    assert ops["only_scale"].attrs["scale"] and not ops["only_scale"].attrs["center"]
    assert len(ops["only_scale"].inputs) == 2 and len(ops["bare"].inputs) == 1
    declared = flow.get_all_variables()
    assert {"enc-LayerNorm-gamma", "enc-LayerNorm-beta", "only_scale-gamma"} <= set(declared)
    assert "only_scale-beta" not in declared and not any(k.startswith("bare-") for k in declared)


def test_layer_norm_float16_matches_float32():
    x = rnd(4, 32, dtype=np.float32) * 4
    half, single = run(lambda a, b: [flow.layers.layer_norm(a, name="h", begin_norm_axis=-1),
                                     flow.layers.layer_norm(b, name="s", begin_norm_axis=-1)],
                       x.astype(np.float16), x)
    assert half.dtype == np.float16
    np.testing.assert_allclose(half.astype(np.float32), single, atol=5e-3)


@pytest.mark.parametrize("kwargs,match", [
    ({"begin_norm_axis": 3}, r"begin_norm_axis must be an int in \[-2, 2\)"),
    ({"epsilon": 0}, "epsilon must be a positive number"),
    ({"name": 5}, "name must be a non-empty string"),
])
def test_layer_norm_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        run(lambda t: flow.layers.layer_norm(t, **kwargs), rnd(2, 4, dtype=np.float32))


# ------------------------------------------------------------------------ attention shapes: matmul, softmax, cast

def test_attention_scores_and_context_match_torch():
    """(B, H, S, D) batched products with transpose_b, softmax over the last axis, as BERT's self-attention."""
    torch = pytest.importorskip("torch")
    q, k, v = (rnd(2, 3, 5, 4, seed=s, dtype=np.float32) for s in range(3))
    mask = rnd(2, 1, 5, 5, seed=4, dtype=np.float32)
    scores, probs, context = run(lambda a, b, c, m: _attention(a, b, c, m), q, k, v, mask)
    tq, tk, tv, tm = map(torch.from_numpy, (q, k, v, mask))
    want_scores = tq @ tk.transpose(-1, -2) * 0.5 + tm
    want_probs = torch.softmax(want_scores, dim=-1)
    np.testing.assert_allclose(scores, want_scores.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(probs, want_probs.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(context, (want_probs @ tv).numpy(), rtol=1e-5, atol=1e-6)


def _attention(q, k, v, mask):
    scores = flow.matmul(q, k, transpose_b=True) * 0.5 + mask
    probs = flow.nn.softmax(scores)
    return [scores, probs, flow.matmul(probs, v)]


def test_attention_gradient():
    check_grad(lambda a, b, c: _attention(a, b, c, flow.constant(0.0, dtype=flow.float64))[2],
               rnd(2, 2, 3, 4), rnd(2, 2, 3, 4, seed=1), rnd(2, 2, 3, 4, seed=2))


@pytest.mark.parametrize("transpose_a,transpose_b", [(True, False), (True, True)])
def test_batched_matmul_transposes_match_torch(transpose_a, transpose_b):
    torch = pytest.importorskip("torch")
    a = rnd(2, 3, 4, 5, dtype=np.float32)
    b = rnd(2, 3, 6, 4, seed=1, dtype=np.float32) if transpose_b else rnd(2, 3, 4, 6, seed=1, dtype=np.float32)
    out, = run(lambda x, y: flow.matmul(x, y, transpose_a=transpose_a, transpose_b=transpose_b), a, b)
    ta, tb = torch.from_numpy(a).transpose(-1, -2), torch.from_numpy(b)
    want = ta @ (tb.transpose(-1, -2) if transpose_b else tb)
    np.testing.assert_allclose(out, want.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_softmax_on_any_axis_matches_torch(axis):
    torch = pytest.importorskip("torch")
    x = rnd(3, 4, 5, dtype=np.float32) * 3
    out, = run(lambda t: flow.nn.softmax(t, axis=axis), x)
    np.testing.assert_allclose(out, torch.softmax(torch.from_numpy(x), dim=axis).numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_cast_between_half_single_and_integers_matches_torch():
    torch = pytest.importorskip("torch")
    x = np.array([-2.7, -0.5, 0.4, 1.5, 65504.0, 70000.0, 3.14159], np.float32)
    half, back, ints, from_int = run(lambda t: [flow.cast(t, flow.float16), flow.cast(flow.cast(t, flow.float16),
                                                                                      flow.float32),
                                                flow.cast(t, flow.int32),
                                                flow.cast(flow.cast(t, flow.int32), flow.float16)], x)
    tx = torch.from_numpy(x)
    np.testing.assert_array_equal(half, tx.half().numpy())              # 70000 overflows to inf in both
    np.testing.assert_array_equal(back, tx.half().float().numpy())
    np.testing.assert_array_equal(ints, tx.int().numpy())                # truncation toward zero
    np.testing.assert_array_equal(from_int, tx.int().half().numpy())


def test_sparse_softmax_cross_entropy_takes_labels_with_a_trailing_axis_of_one():
    """BERT's next-sentence labels are (batch, 1) against (batch, 2) logits: OneFlow squeezes that axis."""
    logits = rnd(4, 2, dtype=np.float32)
    labels = np.array([0, 1, 1, 0], np.int32)
    flat, column = run(lambda lg, a, b: [flow.nn.sparse_softmax_cross_entropy_with_logits(a, lg),
                                         flow.nn.sparse_softmax_cross_entropy_with_logits(b, lg)],
                       logits, labels, labels[:, None])
    assert column.shape == (4,)
    np.testing.assert_array_equal(flat, column)
