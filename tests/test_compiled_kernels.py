"""The compiled float32 kernels of the BERT step (``runtime.jit``) against their NumPy twins (``jit.using(False)``)
and float64 references: GELU and its gradient, Adam's step, layer norm's forward, dx and parameter gradients,
softmax and its gradient, and the scatter-add of gather's gradient. Odd sizes, non-contiguous inputs, NaN and inf."""
import math

import numpy as np
import pytest

from flowlab.runtime import host_threads, jit

needs_numba = pytest.mark.skipif(not jit.available(), reason="numba is not installed")
pytestmark = needs_numba

SIZES = (1, 7, 131_075)


@pytest.fixture(autouse=True)
def compiled_kernels_on():
    """The compiled kernels are what this file tests: on even under ``FLOWLAB_JIT=0`` (``both`` runs the twins)."""
    with jit.using(True):
        yield


class _Ran:
    """``with _Ran() as ran:`` the names of the compiled kernels called inside (``ran.names``)."""

    def __enter__(self):
        self.names, self._call = [], jit.Kernel.__call__
        names, call = self.names, self._call

        def recording(kernel, *args):
            names.append(kernel.__name__)
            return call(kernel, *args)
        jit.Kernel.__call__ = recording
        return self

    def __exit__(self, *exc):
        jit.Kernel.__call__ = self._call


def both(function, *args, **kwargs):
    """``(compiled, NumPy twin)`` results of ``function(*args, **kwargs)`` (copies of the inputs each time); checks
    that the first ran a compiled kernel and the second none."""
    with jit.using(True), _Ran() as ran:
        compiled = function(*(a.copy() if isinstance(a, np.ndarray) else a for a in args), **kwargs)
    assert ran.names, "no compiled kernel ran"
    with jit.using(False), _Ran() as ran:
        twin = function(*(a.copy() if isinstance(a, np.ndarray) else a for a in args), **kwargs)
    assert not ran.names, f"{ran.names} ran under jit.using(False)"
    return compiled, twin


def ulps(got, exact):
    """``|got - exact|`` in float32 ulps of the exact value."""
    return np.abs(got.astype(np.float64) - exact) / np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)


# ------------------------------------------------------------------------------------------------------------- gelu

def _exact_gelu(x):
    from scipy.special import erfc
    wide = x.astype(np.float64)
    cdf = 0.5 * erfc(-wide / math.sqrt(2))
    return wide * cdf, cdf + wide * np.exp(-0.5 * wide * wide) / math.sqrt(2 * math.pi)


@pytest.mark.parametrize("size", SIZES)
def test_compiled_gelu_matches_its_twin_and_the_exact_value(size):
    """Within the compiled form's documented ulps (found at every float32 with 2^-14 <= |x| < 16), and within the
    twin's bounds of the twin's result."""
    from flowlab.ops.math import Gelu
    x = np.random.default_rng(size).uniform(-13, 9, size).astype(np.float32)
    compiled, twin = both(Gelu.forward, np, x)
    exact, _ = _exact_gelu(x)
    error = ulps(compiled, exact)
    for start, bound in ((0, 3.7), (-1, 4.0), (-2, 5.4), (-4, 8.5), (-8, 21.2), (-np.inf, 68.0)):
        if (x >= start).any():
            assert error[x >= start].max() <= bound
    assert np.all(ulps(compiled, twin.astype(np.float64))[x >= -1] <= 11)
    assert compiled.dtype == np.float32 and compiled.shape == x.shape


def test_compiled_gelu_keeps_nan_and_infinities_in_every_vector_lane():
    """NaN stays NaN, GELU(inf) = inf, GELU(-inf) = 0 (its limit), huge values their limits, at positions across a
    vector's lanes and the loop's remainder; the other elements are those of the clean run."""
    from flowlab.ops.math import Gelu
    x = np.random.default_rng(1).standard_normal(1037).astype(np.float32)
    clean = Gelu.forward(np, x)
    dirty = x.copy()
    spots = {3: np.nan, 17: np.inf, 18: -np.inf, 500: 3e38, 501: -3e38, 1036: np.nan}
    for i, v in spots.items():
        dirty[i] = v
    got, twin = both(Gelu.forward, np, dirty)
    want = {3: np.nan, 17: np.inf, 18: 0.0, 500: 3e38, 501: 0.0, 1036: np.nan}
    for i, v in want.items():
        np.testing.assert_array_equal(got[i], np.float32(v))
        np.testing.assert_array_equal(twin[i], np.float32(v))
    others = np.setdiff1d(np.arange(x.size), list(spots))
    np.testing.assert_array_equal(got[others], clean[others])


def test_compiled_gelu_takes_non_contiguous_inputs_and_outputs():
    from flowlab.ops.math import Gelu
    x = np.random.default_rng(2).standard_normal((64, 40)).astype(np.float32)
    view = x[:, ::2].T                                     # neither C- nor F-contiguous
    out = np.empty((40, 64), np.float32)[::2]              # a strided out
    result = Gelu.forward(np, view, out=out)
    assert result is out
    with jit.using(False):
        twin = Gelu.forward(np, np.ascontiguousarray(view))
    np.testing.assert_allclose(out, twin, rtol=2e-6, atol=1e-37)


def test_compiled_gelu_split_over_threads_equals_one_call():
    """From ``SPLIT_COMPILED`` on, the pieces on two host threads give the one call's bits."""
    from flowlab.ops.math import Gelu, GeluGrad
    from flowlab.runtime.host_threads import SPLIT_COMPILED
    x = np.random.default_rng(3).standard_normal(SPLIT_COMPILED + 3).astype(np.float32)
    dy = np.random.default_rng(4).standard_normal(x.size).astype(np.float32)
    whole, grad = Gelu.forward(np, x), GeluGrad.forward(np, x, Gelu.forward(np, x), dy)
    with host_threads.using(2):
        np.testing.assert_array_equal(Gelu.forward(np, x), whole)
        np.testing.assert_array_equal(GeluGrad.forward(np, x, whole, dy), grad)


@pytest.mark.parametrize("size", SIZES)
def test_compiled_gelu_gradient_matches_its_twin_and_the_exact_derivative(size):
    from flowlab.ops.math import Gelu, GeluGrad
    rng = np.random.default_rng(10 + size)
    x = rng.uniform(-13, 10, size).astype(np.float32)
    dy = rng.uniform(0.5, 2.0, size).astype(np.float32)
    y = Gelu.forward(np, x)
    compiled, twin = both(GeluGrad.forward, np, x, y, dy)
    _, derivative = _exact_gelu(x)
    exact = derivative * dy
    assert np.abs(compiled - exact).max() <= 2e-7 * dy.max()          # GeluGrad's documented bound
    np.testing.assert_allclose(compiled, twin, rtol=0, atol=4e-7)


def test_compiled_gelu_gradient_at_zero_subnormals_nan_and_inf():
    """Φ(0) = 1/2 at an exact or subnormal 0 (y / x would be 0 / 0); NaN in x or dy gives NaN, and x = ±inf gives
    NaN (inf / inf read back), as in the twin."""
    from flowlab.ops.math import Gelu, GeluGrad
    x = np.float32([0.0, -0.0, 1e-45, -1e-45, 1e-38, np.nan, 1.0, np.inf, -np.inf])
    dy = np.float32([2.0, 2.0, 2.0, 2.0, 2.0, 1.0, np.nan, 1.0, 1.0])
    with np.errstate(invalid="ignore"):
        y = Gelu.forward(np, x)
        compiled, twin = both(GeluGrad.forward, np, x, y, dy)
    np.testing.assert_array_equal(compiled[:5], np.float32(1.0))
    np.testing.assert_array_equal(np.isnan(compiled), np.isnan(twin))
    assert np.isnan(compiled[5:]).all()


# ------------------------------------------------------------------------------------------------------------- adam

ADAM = dict(beta1=0.9, beta2=0.999, epsilon=1e-8, do_bias_correction=True, clipped=False, schedule=None, lr=1e-3,
            step=3)


def _adam_float64(w, g, m, v, scale, lr, weight_decay, beta1=0.9, beta2=0.999, epsilon=1e-8):
    w, g, m, v = (a.astype(np.float64) for a in (w, g, m, v))
    g = g * scale
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    return w - lr * (m / (np.sqrt(v) + epsilon) + weight_decay * w), m, v


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("weight_decay,clip", [(0.0, None), (0.01, 0.5)])
def test_compiled_adam_matches_its_twin_and_float64(size, weight_decay, clip):
    from flowlab.optim.optimizers import AdamUpdate, _bias_corrected
    rng = np.random.default_rng(size)
    w, g, m = (rng.standard_normal(size).astype(np.float32) for _ in range(3))
    v = rng.uniform(0, 2, size).astype(np.float32)
    extras = (np.float32(clip),) if clip is not None else ()
    attrs = dict(ADAM, weight_decay=weight_decay, clipped=clip is not None, grad_scale=0.25)
    results = {}
    for on in (True, False):
        arrays = [a.copy() for a in (w, g, m, v)]
        with jit.using(on), _Ran() as ran:
            AdamUpdate.forward(np, *arrays, *extras, **attrs)
        assert ran.names == (["_adam_float32_compiled"] if on else [])
        results[on] = arrays
    lr = float(_bias_corrected(1e-3, 0.9, 0.999, 3))
    want = _adam_float64(w, g, m, v, 0.25 * (clip or 1.0), lr, weight_decay)
    for got, twin, exact in zip([results[True][i] for i in (0, 2, 3)], [results[False][i] for i in (0, 2, 3)], want):
        # float32 rounding at the array's scale (a weight near 0 after its step has no relative accuracy left)
        atol = 2.5e-7 * np.abs(exact).max()
        np.testing.assert_allclose(got, exact, rtol=2e-6, atol=atol)
        np.testing.assert_allclose(got, twin, rtol=2e-6, atol=atol)
    np.testing.assert_array_equal(results[True][1], g)                # the gradient is only read


def test_compiled_adam_group_gives_each_member_its_own_step():
    """A group of small float32 variables steps each element as the member's own compiled update does (bits)."""
    from flowlab.optim.optimizers import AdamGroupUpdate, AdamUpdate
    rng = np.random.default_rng(7)
    members = []
    for shape in ((7,), (2, 3), (128,), (1,)):
        w, g, m = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
        members += [w, g, m, rng.uniform(0, 1, shape).astype(np.float32)]
    attrs = dict(ADAM, weight_decay=0.0, grad_scale=0.125)
    grouped = [a.copy() for a in members]
    with _Ran() as ran:
        AdamGroupUpdate.forward(np, *grouped, count=4, **attrs)
    assert ran.names == ["_adam_float32_compiled"]                   # once, over the members laid end to end
    for i in range(0, 16, 4):
        alone = [a.copy() for a in members[i:i + 4]]
        AdamUpdate.forward(np, *alone, **attrs)
        for k in (0, 2, 3):
            np.testing.assert_array_equal(grouped[i + k], alone[k])


def test_compiled_adam_nan_gradient_and_split_over_threads():
    """A NaN gradient makes its own element NaN (weight and moments) and no other; a large update split over two
    host threads gives the one call's bits."""
    from flowlab.runtime.host_threads import SPLIT_COMPILED
    from flowlab.optim.optimizers import AdamUpdate
    rng = np.random.default_rng(8)
    size = SPLIT_COMPILED + 5
    w, g, m = (rng.standard_normal(size).astype(np.float32) for _ in range(3))
    v = rng.uniform(0, 1, size).astype(np.float32)
    g[[0, 77, size - 1]] = [np.nan, np.inf, np.nan]
    attrs = dict(ADAM, weight_decay=0.0, grad_scale=1.0)
    one = [a.copy() for a in (w, g, m, v)]
    AdamUpdate.forward(np, *one, **attrs)
    split = [a.copy() for a in (w, g, m, v)]
    with host_threads.using(2):
        AdamUpdate.forward(np, *split, **attrs)
    for a, b in zip(one, split):
        np.testing.assert_array_equal(a, b)
    twin = [a.copy() for a in (w, g, m, v)]
    with jit.using(False), np.errstate(invalid="ignore"):
        AdamUpdate.forward(np, *twin, **attrs)
    for a, b in zip(one, twin):
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    assert np.isnan(one[0][[0, 77, size - 1]]).all() and np.isfinite(np.delete(one[0], [0, 77, size - 1])).all()


# ------------------------------------------------------------------------------------------------------- layer norm

def _layer_norm_float64(x, gamma, beta, dy, eps=1e-5):
    x, gamma, beta, dy = (a.astype(np.float64) for a in (x, gamma, beta, dy))
    mean = x.mean(axis=-1, keepdims=True)
    inv = 1 / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
    y = (x - mean) * inv
    g = dy * gamma
    dx = inv * (g - g.mean(axis=-1, keepdims=True) - y * (g * y).mean(axis=-1, keepdims=True))
    rows = dy.reshape(-1, dy.shape[-1])
    return (y * gamma + beta, mean[..., 0], inv[..., 0], y, dx, (rows * y.reshape(rows.shape)).sum(0),
            rows.sum(0))


def _layer_norm_all(x, gamma, beta, dy):
    from flowlab.ops.normalization import LayerNormAffine, LayerNormGrad, LayerNormParamGrad
    axis = x.ndim - 1
    out, mean, inv, normalized = LayerNormAffine.forward(np, x, gamma, beta, begin_norm_axis=axis,
                                                         begin_params_axis=axis, epsilon=1e-5, scale=True,
                                                         center=True)
    dx = LayerNormGrad.forward(np, normalized, inv, dy, gamma, begin_params_axis=axis)
    dgamma, dbeta = LayerNormParamGrad.forward(np, normalized, dy, begin_params_axis=axis)
    return out, mean, inv, normalized, dx, dgamma, dbeta


@pytest.mark.parametrize("shape", [(1, 1), (7, 7), (3, 5, 131), (256, 128), (1025, 129)])
def test_compiled_layer_norm_matches_its_twin_and_float64(shape):
    """Forward, dx and the parameter gradients against float64 (the tolerance of the NumPy twin's float32 test, which
    PyTorch's LayerNorm also meets) and against the twin, an offset mean included (no cancellation)."""
    rng = np.random.default_rng(shape[-1])
    x = (rng.standard_normal(shape) * 3 + 50).astype(np.float32)
    gamma, beta = rng.uniform(0.5, 1.5, shape[-1]).astype(np.float32), rng.standard_normal(shape[-1]).astype(
        np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    compiled, twin = both(_layer_norm_all, x, gamma, beta, dy)
    exact = _layer_norm_float64(x, gamma, beta, dy)
    rows = math.prod(shape[:-1])
    names = ("out", "mean", "inv", "normalized", "dx", "dgamma", "dbeta")
    # dx is a difference of terms of size inv |dy gamma| (exactly 0 for rows of one value): its error scales so
    inv_g = (exact[2][..., None] * np.abs(dy * gamma)).max()
    for name, got, other, want in zip(names, compiled, twin, exact):
        assert got.dtype == np.float32 and got.shape == other.shape, name
        scale = inv_g if name == "dx" else np.abs(want).max()
        tolerance = 3e-6 * (math.sqrt(rows) if name in ("dgamma", "dbeta") else 1)       # column sums of rows
        assert np.abs(got - want).max() <= tolerance * scale, name
        assert np.abs(got - other).max() <= 2 * tolerance * scale, name


def test_compiled_layer_norm_matches_torch_and_takes_non_contiguous_input():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    base = rng.standard_normal((20, 64)).astype(np.float32)
    x = base[::2, ::2]                                     # (10, 32), strided
    gamma, beta = rng.uniform(0.5, 1.5, 32).astype(np.float32), rng.standard_normal(32).astype(np.float32)
    dy = rng.standard_normal((10, 32)).astype(np.float32)
    out, _, _, _, dx, dgamma, dbeta = _layer_norm_all(x, gamma, beta, dy)
    tx = torch.from_numpy(np.ascontiguousarray(x)).double().requires_grad_()
    layer = torch.nn.LayerNorm(32, eps=1e-5).double()
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(gamma))
        layer.bias.copy_(torch.from_numpy(beta))
    want = layer(tx)
    want.backward(torch.from_numpy(dy).double())
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(dgamma, layer.weight.grad.numpy(), rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(dbeta, layer.bias.grad.numpy(), rtol=1e-5, atol=2e-6)


def test_compiled_layer_norm_nan_and_inf_stay_in_their_rows():
    """A NaN or an infinity makes its own row NaN (forward and dx) and leaves the others as in the clean run; the
    parameter gradients are NaN in every column the bad row reaches, as in the twin."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((9, 33)).astype(np.float32)
    gamma, beta = np.ones(33, np.float32), np.zeros(33, np.float32)
    dy = rng.standard_normal((9, 33)).astype(np.float32)
    clean = _layer_norm_all(x, gamma, beta, dy)
    x[2, 5], x[6, 32] = np.nan, np.inf
    with np.errstate(invalid="ignore"):
        compiled, twin = both(_layer_norm_all, x, gamma, beta, dy)
    for got, other, good in zip(compiled, twin, clean):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(other))
    out, dx = compiled[0], compiled[4]
    for a, good in ((out, clean[0]), (dx, clean[4])):
        assert np.isnan(a[[2, 6]]).all()
        np.testing.assert_array_equal(np.delete(a, [2, 6], axis=0), np.delete(good, [2, 6], axis=0))


# ---------------------------------------------------------------------------------------------------------- softmax

def _softmax_and_grad(x, dy):
    from flowlab.ops.nn import Softmax, SoftmaxGrad
    y = Softmax.forward(np, x, axis=x.ndim - 1)
    return y, SoftmaxGrad.forward(np, y, dy, axis=x.ndim - 1)


@pytest.mark.parametrize("shape", [(1, 1), (7, 7), (8, 2, 32, 32), (3, 131_075)])
def test_compiled_softmax_and_gradient_match_their_twin_and_float64(shape):
    rng = np.random.default_rng(shape[-1])
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    (y, dx), (twin_y, twin_dx) = both(_softmax_and_grad, x, dy)
    wide = x.astype(np.float64)
    exact = np.exp(wide - wide.max(-1, keepdims=True))
    exact /= exact.sum(-1, keepdims=True)
    exact_dx = exact * (dy - (dy * exact).sum(-1, keepdims=True))
    n = shape[-1]
    np.testing.assert_allclose(y, exact, rtol=1e-6 * max(1, math.log2(n)), atol=1e-37)
    np.testing.assert_allclose(y, twin_y, rtol=2e-6 * max(1, math.log2(n)), atol=1e-37)
    assert np.abs(dx - exact_dx).max() <= 1e-6 * np.abs(dy).max()
    np.testing.assert_allclose(dx, twin_dx, rtol=0, atol=2e-6 * np.abs(dy).max())


def test_compiled_softmax_non_contiguous_rows_nan_and_inf():
    """A strided input; a NaN or +inf makes its row NaN (as the twin), -inf gives an exact 0, and huge logits do
    not overflow."""
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((12, 40)) * 3).astype(np.float32)[::2, 1::2]        # (6, 20), strided
    x[1, 0], x[2, 19], x[3, 4], x[4, :] = np.nan, np.inf, -np.inf, 1e38
    dy = rng.standard_normal(x.shape).astype(np.float32)
    with np.errstate(invalid="ignore"):
        (y, dx), (twin_y, twin_dx) = both(_softmax_and_grad, x, dy)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(twin_y))
    assert np.isnan(y[1]).all() and np.isnan(y[2]).all()
    assert y[3, 4] == 0 and np.isfinite(y[[0, 3, 4, 5]]).all()
    np.testing.assert_allclose(y[4], np.full(20, 0.05, np.float32), rtol=1e-6)
    good = [0, 3, 4, 5]
    np.testing.assert_allclose(y[good], twin_y[good], rtol=3e-6, atol=1e-37)
    np.testing.assert_allclose(dx[good], twin_dx[good], rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------------------------ scatter-add

@pytest.mark.parametrize("n_ids,n_rows,width", [(1, 1, 1), (7, 3, 7), (256, 100, 128), (131_075, 1000, 3)])
def test_compiled_scatter_add_matches_its_twin_and_float64(n_ids, n_rows, width):
    """Repeated ids add up, ids outside the table (negative or too large) add nothing."""
    from flowlab.ops.scatter import sum_rows
    rng = np.random.default_rng(n_ids)
    ids = rng.integers(-2, n_rows + 2, n_ids).astype(np.int32)
    rows = rng.standard_normal((n_ids, width)).astype(np.float32)
    compiled, twin = both(sum_rows, np, ids, rows, n_rows)
    exact = np.zeros((n_rows, width))
    inside = (ids >= 0) & (ids < n_rows)
    np.add.at(exact, ids[inside], rows[inside].astype(np.float64))
    repeats = np.bincount(ids[inside], minlength=n_rows).max(initial=1)
    tolerance = 2e-7 * repeats * np.abs(rows).max()
    assert compiled.dtype == np.float32 and compiled.shape == (n_rows, width)
    assert np.abs(compiled - exact).max() <= tolerance
    assert np.abs(compiled - twin).max() <= 2 * tolerance


def test_compiled_scatter_add_keeps_nan_in_its_own_row_and_takes_strided_rows():
    """A NaN or inf row reaches only its id's row (the twin's one-hot product is not used for non-finite rows)."""
    from flowlab.ops.indexing import GatherGrad
    rng = np.random.default_rng(11)
    ids = rng.integers(0, 10, (4, 6)).astype(np.int32)
    ids[0, 0], ids[1, 1] = 3, 7
    ids[ids == 3] = 3
    dy = rng.standard_normal((4, 6, 16)).astype(np.float32)[:, :, ::-1]          # strided
    dy[0, 0, 2], dy[1, 1, 5] = np.nan, np.inf
    compiled, twin = both(GatherGrad.forward, np, ids, dy, axis=0, batch_dims=0, shape=(10, 16))
    np.testing.assert_array_equal(np.isnan(compiled), np.isnan(twin))
    np.testing.assert_array_equal(np.isinf(compiled), np.isinf(twin))
    assert np.isnan(compiled[3, 2]) and np.isinf(compiled[7, 5])
    finite = np.isfinite(twin)
    np.testing.assert_allclose(compiled[finite], twin[finite], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------- sparse cross-entropy

def _cross_entropy_and_grad(labels, logits, dy):
    from flowlab.ops.nn import SparseSoftmaxCrossEntropy, SparseSoftmaxCrossEntropyGrad
    loss, prob = SparseSoftmaxCrossEntropy.forward(np, labels, logits, name="ce")
    return loss, prob, SparseSoftmaxCrossEntropyGrad.forward(np, labels, prob, dy)


@pytest.mark.parametrize("shape", [(1, 1), (7, 7), (40, 100), (8, 2), (3, 131_075), (2, 3, 5)])
@pytest.mark.parametrize("label_dtype", [np.int32, np.int64])
def test_compiled_sparse_cross_entropy_matches_its_twin_and_float64(shape, label_dtype):
    rng = np.random.default_rng(shape[-1])
    logits = (rng.standard_normal(shape) * 4).astype(np.float32)
    labels = rng.integers(0, shape[-1], shape[:-1]).astype(label_dtype)
    dy = rng.uniform(0.5, 2, shape[:-1]).astype(np.float32)
    (loss, prob, grad), (twin_loss, twin_prob, twin_grad) = both(_cross_entropy_and_grad, labels, logits, dy)
    wide = logits.astype(np.float64)
    top = wide.max(-1, keepdims=True)
    log_total = np.log(np.exp(wide - top).sum(-1, keepdims=True))
    exact_prob = np.exp(wide - top - log_total)
    exact_loss = (log_total + top)[..., 0] - np.take_along_axis(wide, labels[..., None].astype(np.int64), -1)[..., 0]
    onehot = np.zeros(shape)
    np.put_along_axis(onehot, labels[..., None].astype(np.int64), 1.0, -1)
    exact_grad = (exact_prob - onehot) * dy[..., None]
    n = shape[-1]
    assert loss.dtype == prob.dtype == grad.dtype == np.float32 and loss.shape == shape[:-1]
    np.testing.assert_allclose(loss, exact_loss, rtol=1e-6 * max(1, math.log2(n)), atol=2e-6)
    np.testing.assert_allclose(prob, exact_prob, rtol=1e-6 * max(1, math.log2(n)), atol=1e-37)
    assert np.abs(grad - exact_grad).max() <= 1e-6 * max(1, math.log2(n)) * dy.max()
    np.testing.assert_allclose(loss, twin_loss, rtol=2e-6 * max(1, math.log2(n)), atol=4e-6)
    np.testing.assert_allclose(grad, twin_grad, rtol=0, atol=2e-6 * max(1, math.log2(n)) * dy.max())


def test_compiled_sparse_cross_entropy_labels_out_of_range_nan_and_strided_logits():
    """A label outside the classes gives zero loss and gradient (and the warning), a NaN logit a NaN row, as in the
    twin; strided logits are taken."""
    rng = np.random.default_rng(12)
    logits = (rng.standard_normal((6, 20)) * 3).astype(np.float32)[:, ::2]        # (6, 10), strided
    logits[2, 3] = np.nan
    labels = np.array([1, 10, 4, -1, 0, 9], np.int32)
    dy = rng.uniform(0.5, 2, 6).astype(np.float32)
    with pytest.warns(RuntimeWarning, match="outside"), np.errstate(invalid="ignore"):
        (loss, prob, grad), (twin_loss, twin_prob, twin_grad) = both(_cross_entropy_and_grad, labels, logits, dy)
    assert loss[1] == 0 and loss[3] == 0 and not grad[[1, 3]].any()
    assert np.isnan(loss[2]) and np.isnan(prob[2]).all() and np.isnan(grad[2]).all()
    for got, twin in ((loss, twin_loss), (prob, twin_prob), (grad, twin_grad)):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(twin))
        np.testing.assert_allclose(got[[0, 4, 5]], twin[[0, 4, 5]], rtol=3e-6, atol=3e-6)


# --------------------------------------------------------------------------------------------------------- bias add

@pytest.mark.parametrize("shape", [(1, 8192), (8193, 1), (256, 128), (8, 32, 128), (1031, 127)])
def test_compiled_bias_add_matches_its_twin_and_float64(shape):
    from flowlab.ops.nn import _BIAS_COMPILED_FROM, BiasAdd
    assert math.prod(shape) >= _BIAS_COMPILED_FROM
    rng = np.random.default_rng(sum(shape))
    x, b = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape[-1]).astype(np.float32)
    compiled, twin = both(BiasAdd.forward, np, x, b, axis=len(shape) - 1)
    np.testing.assert_array_equal(compiled, twin)          # one rounded addition an element in both
    np.testing.assert_array_equal(compiled, (x.astype(np.float64) + b).astype(np.float32))
    assert compiled.dtype == np.float32 and compiled.shape == shape


def test_compiled_bias_add_in_place_split_over_threads_nan_inf_and_other_layouts():
    from flowlab.ops.nn import BiasAdd
    from flowlab.runtime.host_threads import SPLIT_COMPILED
    rng = np.random.default_rng(5)
    x = rng.standard_normal((SPLIT_COMPILED // 100 + 3, 100)).astype(np.float32)
    b = rng.standard_normal(100).astype(np.float32)
    x[3, 4], x[5, 6], x[5, 7], b[7] = np.nan, np.inf, np.inf, -np.inf
    with np.errstate(invalid="ignore"):                                 # inf + -inf
        want = x.astype(np.float64) + b
    with host_threads.using(2), _Ran() as ran, np.errstate(invalid="ignore"):
        inplace = x.copy()
        got = BiasAdd.forward(np, inplace, b, axis=1, out=inplace)      # the plan's in-place call (input dies)
    assert got is inplace and ran.names and ran.names[0] == "_bias_add_rows_float32"
    np.testing.assert_array_equal(got, want.astype(np.float32))         # NaN where x or b is, inf + -inf: NaN
    assert np.isnan(got[3, 4]) and got[5, 6] == np.inf and np.isneginf(got[0, 7]) and np.isnan(got[5, 7])
    # a strided input, a strided output, the bias on axis 1 of a 4-D array, a small array, an output that is the
    # input's memory but not the input: NumPy's add
    alias = x.copy()
    for args, kwargs in (((np.ascontiguousarray(x[:7, :3]), b[:3]), dict(axis=1)),
                         ((x[:, ::2], b[:50]), dict(axis=1)),
                         ((x[:, :50], b[:50]), dict(axis=1, out=np.empty((x.shape[0], 100), np.float32)[:, ::2])),
                         ((x[:8].reshape(2, 100, 2, 2), b), dict(axis=1)),
                         ((alias[:], b), dict(axis=1, out=alias))):      # x's memory, another array object
        shape = [1] * args[0].ndim
        shape[kwargs["axis"]] = -1
        with _Ran() as ran, np.errstate(invalid="ignore"):
            want = args[0] + args[1].reshape(shape)
            got = BiasAdd.forward(np, *args, **kwargs)
        assert not ran.names
        np.testing.assert_array_equal(got, want)
