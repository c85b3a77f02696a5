"""Compiled float32 kernels of a convolutional network's non-BLAS work (``runtime.jit``): batch normalization forward
and gradient (with the fused ReLU's mask), max pooling and its gradient, the ReLU gradient and the momentum SGD step.
Each against its NumPy twin (``jit.using(False)``) and float64 references, at odd sizes, on non-contiguous inputs,
with NaN and inf, and split over host threads."""
import numpy as np
import pytest

from flowlab.ops import conv as C
from flowlab.ops import nn, normalization
from flowlab.optim.optimizers import SGDUpdate, _momentum_compiled
from flowlab.runtime import host_threads, jit

needs_numba = pytest.mark.skipif(not jit.available(), reason="numba is not installed")
pytestmark = needs_numba


@pytest.fixture(params=[1, 2], ids=["one thread", "two threads"])
def threads(request, monkeypatch):
    """Kernels on one thread, or split over two with every threshold at its minimum (even tiny arrays split)."""
    monkeypatch.setattr(host_threads, "SPLIT_ELEMENTS", 1)
    monkeypatch.setattr(host_threads, "CHUNK_ELEMENTS", 1)
    monkeypatch.setattr(host_threads, "SPLIT_COMPILED", 1)
    with host_threads.using(request.param):
        yield request.param


def both(function):
    """``function()`` with the compiled kernels, and with the NumPy twins."""
    with jit.using(True):
        compiled = function()
    with jit.using(False):
        twin = function()
    return compiled, twin


def rnd(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------------------------------------- batch normalization

BN_SHAPES = [(2, 3, 3, 3),        # planes of 9: the shortest kept are 8
             (1, 7, 1, 8),
             (4, 5, 7, 7),        # ResNet's last stage, in small
             (1, 1, 131075),      # one plane, 131k+3 elements
             (3, 2, 43, 17)]


def _bn_train(x, gamma, beta, addend, relu):
    return normalization.BatchNormTrain.forward(np, x, gamma, beta, *addend, axis=1, epsilon=1e-5, relu=relu)


def _params(c, dtype=np.float32):
    return np.linspace(0.5, 2, c).astype(dtype), np.linspace(-1, 1, c).astype(dtype)


@pytest.mark.parametrize("shape", BN_SHAPES)
@pytest.mark.parametrize("form", ["plain", "relu", "add_relu"])
def test_batch_norm_forward_matches_its_twin_and_float64(threads, shape, form):
    x = rnd(*shape, seed=1) * 3 + 2
    addend = (rnd(*shape, seed=2),) if form == "add_relu" else ()
    gamma, beta = _params(shape[1])
    relu = form != "plain"
    compiled, twin = both(lambda: _bn_train(x, gamma, beta, addend, relu))
    exact = _bn_train(x.astype(np.float64), gamma.astype(np.float64), beta.astype(np.float64),
                      tuple(a.astype(np.float64) for a in addend), relu)
    for got, same, want in zip(compiled, twin, exact):
        assert got.dtype == np.float32 and got.shape == same.shape
        np.testing.assert_allclose(got, same, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if relu:
        assert (compiled[0] >= 0).all()


def test_batch_norm_forward_keeps_precision_far_from_zero(threads):
    """Per-plane centred sums, combined in float64: no cancellation for data far from zero (E[x^2] - E[x]^2 would lose
    every digit here)."""
    x = rnd(4, 3, 9, 9, seed=3) + 1000.0
    with jit.using(True):
        y, mean, inv, _, variance = _bn_train(x, np.ones(3, np.float32), np.zeros(3, np.float32), (), False)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(variance, x64.var(axis=(0, 2, 3), ddof=1), rtol=1e-5)
    np.testing.assert_allclose(mean, x64.mean(axis=(0, 2, 3)), rtol=1e-7)
    np.testing.assert_allclose(inv, 1 / np.sqrt(x64.var(axis=(0, 2, 3)) + 1e-5), rtol=1e-5)


def test_batch_norm_forward_takes_non_contiguous_inputs_and_infer_mode(threads):
    x, addend = rnd(3, 4, 10, 20, seed=4)[:, :, :, ::2], rnd(3, 4, 10, 20, seed=5)[:, :, :, 1::2]  # strided
    gamma, beta = _params(4)
    compiled, twin = both(lambda: _bn_train(x, gamma, beta, (addend,), True))
    for got, same in zip(compiled, twin):
        np.testing.assert_allclose(got, same, rtol=2e-5, atol=2e-5)
    mean, variance = np.linspace(-0.5, 0.5, 4).astype(np.float32), np.linspace(0.5, 3, 4).astype(np.float32)
    compiled, twin = both(lambda: normalization.BatchNormInfer.forward(np, x, gamma, beta, mean, variance, addend,
                                                                       axis=1, epsilon=1e-3, relu=True))
    np.testing.assert_allclose(compiled, twin, rtol=1e-6, atol=1e-6)
    want = np.maximum((x - mean[:, None, None]) / np.sqrt(variance[:, None, None] + 1e-3) * gamma[:, None, None] +
                      beta[:, None, None] + addend, 0)
    np.testing.assert_allclose(compiled, want, rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_batch_norm_forward_propagates_nan_and_inf(threads):
    x = rnd(2, 4, 3, 3, seed=6)
    x[0, 1, 1, 1] = np.nan                  # channel 1: NaN statistics, all NaN
    x[1, 2, 0, 0] = np.inf                  # channel 2: inf - inf = NaN
    addend = rnd(2, 4, 3, 3, seed=7)
    addend[1, 3, 2, 2] = -np.inf            # channel 3: one -inf, through ReLU 0
    addend[0, 0, 0, 1] = np.nan             # channel 0: one NaN survives ReLU
    gamma, beta = _params(4)
    compiled, twin = both(lambda: _bn_train(x, gamma, beta, (addend,), True))
    for got, same in zip(compiled, twin):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(same))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(same))
        finite = np.isfinite(same)
        np.testing.assert_allclose(got[finite], same[finite], rtol=2e-5, atol=2e-5)
    y = compiled[0]
    assert np.isnan(y[:, 1]).all() and np.isnan(y[:, 2]).all()
    assert y[1, 3, 2, 2] == 0 and np.isnan(y[0, 0, 0, 1])


def _bn_grad(x, dy, gamma, mean, spread, y, training):
    mask = () if y is None else (y,)
    return normalization.BatchNormGrad.forward(np, x, dy, gamma, mean, spread, *mask, axis=1, epsilon=1e-5,
                                               training=training)


@pytest.mark.parametrize("shape", BN_SHAPES)
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("relu", [False, True])
def test_batch_norm_gradient_matches_its_twin_and_float64(threads, shape, training, relu):
    x = rnd(*shape, seed=8) * 2 + 1
    dy = rnd(*shape, seed=9)
    gamma, beta = _params(shape[1])
    y, mean, inv = _bn_train(x, gamma, beta, (), True)[:3]
    spread = inv if training else np.linspace(0.5, 2, shape[1]).astype(np.float32)
    mask = y if relu else None
    compiled, twin = both(lambda: _bn_grad(x, dy, gamma, mean, spread, mask, training))
    wide = [a.astype(np.float64) for a in (x, dy, gamma, mean, spread)]
    exact = _bn_grad(*wide, None if mask is None else mask.astype(np.float64), training)
    for got, same, want in zip(compiled, twin, exact):
        assert got.dtype == np.float32
        scale = np.abs(want).max() + 1e-30
        np.testing.assert_allclose(got, same, rtol=1e-4, atol=2e-5 * scale)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * scale)
    if relu:         # the mask: where y is 0 the gradient is that of a zero dy
        dead = y == 0
        np.testing.assert_allclose(compiled[0], _bn_grad(x, np.where(dead, 0, dy), gamma, mean, spread, None,
                                                         training)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_batch_norm_gradient_of_non_contiguous_inputs_and_nan_through_the_mask(threads):
    x = rnd(2, 3, 8, 18, seed=10)[:, :, :, ::2]
    dy = rnd(2, 3, 8, 18, seed=11)[:, :, :, 1::2]
    gamma, beta = _params(3)
    y, mean, inv = _bn_train(np.ascontiguousarray(x), gamma, beta, (), True)[:3]
    compiled, twin = both(lambda: _bn_grad(x, dy, gamma, mean, inv, y, True))
    for got, same in zip(compiled, twin):
        np.testing.assert_allclose(got, same, rtol=1e-4, atol=1e-5)
    dy = np.ascontiguousarray(dy)
    dead = np.argwhere(y[:, 1] == 0)[0]
    dy[0, 1][tuple(dead[1:])] = np.nan      # masked by ReLU, but NaN * 0 is NaN (as in NumPy)
    dy[1, 2, 0, 0] = np.inf
    compiled, twin = both(lambda: _bn_grad(x, dy, gamma, mean, inv, y, True))
    for got, same in zip(compiled, twin):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(same))
        finite = np.isfinite(same)
        np.testing.assert_allclose(got[finite], same[finite], rtol=1e-4, atol=1e-5)
    assert np.isnan(compiled[0][:, 1]).all() and np.isnan(compiled[1][1])
    assert np.isfinite(compiled[0][:, 0]).all()


# -------------------------------------------------------------------------------------------------------- pooling

POOLS = [((2, 3, 7, 7), (3, 3), (2, 2), "SAME_UPPER"),
         ((2, 3, 8, 8), (3, 3), (2, 2), "SAME_LOWER"),
         ((1, 2, 9, 6), (2, 3), (1, 2), "VALID"),
         ((1, 1, 1, 1), (1, 1), (1, 1), "VALID"),
         ((2, 2, 7, 5), (3, 2), (2, 1), ((1, 1), (0, 1))),
         ((1, 1, 3, 43681), (3, 3), (2, 2), "SAME_UPPER")]       # 131k+3 elements


@pytest.mark.parametrize("shape, ksize, strides, padding", POOLS)
def test_max_pool_and_its_gradient_match_their_twins_and_float64(threads, shape, ksize, strides, padding):
    x = rnd(*shape, seed=12)
    x.reshape(-1)[::5] = 0.5                # ties: the first maximum in row-major order takes the gradient
    pool = dict(ksize=ksize, strides=strides, padding=padding, data_format="NCHW")
    compiled, twin = both(lambda: C.MaxPool2D.forward(np, x, **pool))
    np.testing.assert_array_equal(compiled, twin)
    np.testing.assert_array_equal(compiled, C.MaxPool2D.forward(np, x.astype(np.float64), **pool))
    dy = rnd(*compiled.shape, seed=13)
    compiled, twin = both(lambda: C.MaxPoolGrad.forward(np, x, dy, **pool))
    assert compiled.dtype == np.float32 and compiled.shape == x.shape
    np.testing.assert_allclose(compiled, twin, rtol=1e-6, atol=1e-6)      # overlapping windows: sums in any order
    exact = C.MaxPoolGrad.forward(np, x.astype(np.float64), dy.astype(np.float64), **pool)
    np.testing.assert_allclose(compiled, exact, rtol=1e-6, atol=1e-6)
    assert np.isclose(compiled.sum(dtype=np.float64), dy.sum(dtype=np.float64), rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_max_pool_of_non_contiguous_inputs_nan_and_infinities(threads):
    x = rnd(2, 3, 9, 18, seed=14)[:, :, :, ::2]
    x[0, 0, 1, 1] = np.nan                  # windows holding it: NaN maximum, no gradient
    x[0, 1] = -np.inf                       # all -inf: SAME_LOWER pads first, the padding takes the gradient
    x[1, 2, 4, 4] = np.inf
    pool = dict(ksize=(3, 3), strides=(2, 2), padding="SAME_LOWER", data_format="NCHW")
    compiled, twin = both(lambda: C.MaxPool2D.forward(np, x, **pool))
    np.testing.assert_array_equal(compiled, twin)
    assert np.isnan(compiled[0, 0, 0, 0]) and (compiled[0, 1] == -np.inf).all()
    dy = rnd(*compiled.shape, seed=15)[:, :, :, :]
    compiled, twin = both(lambda: C.MaxPoolGrad.forward(np, x, dy, **pool))
    np.testing.assert_allclose(compiled, twin, rtol=1e-6, atol=1e-6)
    assert compiled[0, 0, 1, 1] == 0 and np.isfinite(compiled).all()


def test_max_pool_nhwc_and_float64_stay_on_numpy():
    x = rnd(1, 5, 5, 2, seed=16)
    pool = dict(ksize=(3, 3), strides=(2, 2), padding="SAME_UPPER", data_format="NHWC")
    assert not C._jit_pool_case(np, x, "NHWC") and not C._jit_pool_case(np, x.astype(np.float64), "NCHW")
    compiled, twin = both(lambda: C.MaxPool2D.forward(np, x, **pool))
    np.testing.assert_array_equal(compiled, twin)


# ------------------------------------------------------------------------------------------ ReLU gradient and SGD

@pytest.mark.parametrize("shape", [(1,), (7,), (100, 128), (3, 5, 8731)])
def test_relu_matches_its_twin_exactly_nan_signed_zero_and_infinities_included(threads, shape):
    x = rnd(*shape, seed=19)
    flat = x.reshape(-1)
    flat[:5] = (np.nan, -0.0, 0.0, np.inf, -np.inf)[:flat.size]
    compiled, twin = both(lambda: nn.Relu.forward(np, x))
    np.testing.assert_array_equal(compiled, twin)
    np.testing.assert_array_equal(np.signbit(compiled), np.signbit(twin))       # -0.0 stays -0.0, as clip keeps it
    np.testing.assert_array_equal(compiled, np.where(x < 0, 0, x))
    inplace = x.copy()
    with jit.using(True):
        assert nn.Relu.forward(np, inplace, out=inplace) is inplace
    np.testing.assert_array_equal(inplace, twin)
    columns = np.asfortranarray(x.reshape(x.shape[0], -1))          # not C-contiguous: the twin's path
    with jit.using(True):
        np.testing.assert_array_equal(nn.Relu.forward(np, columns), np.clip(columns, 0, np.inf))


@pytest.mark.filterwarnings("ignore:invalid value encountered")
@pytest.mark.parametrize("size", [1, 7, 131075])
def test_relu_gradient_matches_its_twin_exactly(threads, monkeypatch, size):
    monkeypatch.setattr(nn, "_RELU_GRAD_COMPILED_FROM", 1)     # small arrays too
    y, dy = np.maximum(rnd(size, seed=17), 0), rnd(size, seed=18)
    if size > 5:
        y[:3], dy[3:6] = (np.nan, 0.0, np.inf), (np.nan, np.inf, -np.inf)    # y <= 0 at 1, 4: NaN * 0 is NaN
        y[4] = 0.0
    compiled, twin = both(lambda: nn.ReluGrad.forward(np, y, dy))
    np.testing.assert_array_equal(compiled, twin)
    np.testing.assert_array_equal(compiled, dy.astype(np.float64) * (y > 0))
    inplace = dy.copy()
    with jit.using(True):
        assert nn.ReluGrad.forward(np, y, inplace, out=inplace) is inplace
    np.testing.assert_array_equal(inplace, twin)


def _sgd(w, grad, m, lr=0.1, momentum=0.875):
    SGDUpdate.forward(np, w, grad, m, momentum=momentum, clipped=False, grad_scale=1.0, schedule=None, lr=lr)
    return w, m


@pytest.fixture
def compiled_from_one(monkeypatch):
    from flowlab.optim import optimizers
    monkeypatch.setattr(optimizers, "COMPILED_FROM", 1)       # small variables too


@pytest.mark.parametrize("size", [1, 7, 4096, 131075])
def test_momentum_sgd_matches_its_twin_and_float64(threads, compiled_from_one, size):
    w0, g, m0 = rnd(size, seed=19), rnd(size, seed=20), rnd(size, seed=21) * 0.1
    compiled, twin = both(lambda: _sgd(w0.copy(), g, m0.copy()))
    m64 = 0.875 * m0.astype(np.float64) - 0.1 * g.astype(np.float64)
    for got, same, want in zip(compiled, twin, (w0 + m64, m64)):
        np.testing.assert_allclose(got, same, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    w2d, m2d = w0.copy().reshape(1, -1), m0.copy().reshape(1, -1)        # any shape, updated in place
    with jit.using(True):
        _sgd(w2d, g.reshape(1, -1), m2d)
    np.testing.assert_array_equal(w2d.reshape(-1), compiled[0])


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_momentum_sgd_propagates_nan_and_inf_and_skips_non_contiguous(compiled_from_one):
    w, g, m = rnd(9, seed=22), rnd(9, seed=23), np.zeros(9, np.float32)
    g[2], g[5] = np.nan, np.inf
    compiled, twin = both(lambda: _sgd(w.copy(), g, m.copy()))
    for got, same in zip(compiled, twin):
        np.testing.assert_array_equal(got, same)
    assert np.isnan(compiled[0][2]) and compiled[0][5] == -np.inf
    wide = rnd(4, 6, seed=24)
    part = wide[:, ::2]                     # a view: the in-place update must land in ``wide``
    assert not _momentum_compiled(np, part, part.copy(), np.zeros_like(part))
    with jit.using(True):
        _sgd(part, np.ones_like(part), np.zeros_like(part))
    np.testing.assert_allclose(wide[:, ::2], rnd(4, 6, seed=24)[:, ::2] - 0.1, rtol=1e-6)


# ------------------------------------------------------------------------------------------ Winograd's col2im

@pytest.mark.parametrize("algo", [C.F43, C.F23], ids=["F43", "F23"])
@pytest.mark.parametrize("shape, padding", [((2, 3, 9, 7), "SAME_UPPER"), ((1, 5, 6, 6), "VALID"),
                                            ((1, 1, 1, 1), "SAME_LOWER"), ((2, 2, 11, 13), ((2, 0), (1, 2)))])
def test_winograd_input_gradient_adds_its_windows_as_numpy_does(threads, algo, shape, padding):
    """The compiled col2im adds in the NumPy kernel's order: the same float32 sums, bit for bit; and it matches a
    float64 direct convolution's input gradient (Winograd's transforms round at ~1e-5)."""
    torch = pytest.importorskip("torch")
    n, c, h, w = shape
    filters = rnd(4, c, 3, 3, seed=25)
    kernel, pads, out_hw = C._conv_geometry(shape, filters.shape, (1, 1), (1, 1), padding, "NCHW")
    dy = rnd(n, 4, *out_hw, seed=26)
    dy[0, 0, 0, 0] = np.nan if shape != (1, 1, 1, 1) else dy[0, 0, 0, 0]
    compiled, twin = both(lambda: C._winograd_input_grad(np, dy, filters, shape, pads, out_hw, algo))
    np.testing.assert_array_equal(compiled, twin)
    dy[0, 0, 0, 0] = 0.5
    with jit.using(True):
        got = C._winograd_input_grad(np, dy, filters, shape, pads, out_hw, algo)
    (top, bottom), (left, right) = pads
    x = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.conv2d(torch.nn.functional.pad(x, (left, right, top, bottom)),
                                   torch.tensor(filters, dtype=torch.float64))
    y.backward(torch.tensor(dy, dtype=torch.float64))
    np.testing.assert_allclose(got, x.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape, kernel, strides, dilations, padding",
                         [((2, 3, 9, 7), (3, 3), (2, 2), (1, 1), "SAME_UPPER"),
                          ((1, 2, 11, 10), (7, 7), (2, 2), (1, 1), "SAME_UPPER"),     # a ResNet stem, in small
                          ((2, 2, 8, 9), (3, 2), (1, 3), (2, 1), ((1, 2), (0, 1))),
                          ((1, 1, 1, 1), (1, 1), (1, 1), (1, 1), ((1, 0), (0, 1)))])
def test_folded_input_gradient_adds_as_numpy_does(threads, shape, kernel, strides, dilations, padding):
    """The compiled col2im of the folded route: the NumPy kernel's sums bit for bit (NaN included), and a float64
    direct convolution's input gradient."""
    torch = pytest.importorskip("torch")
    filters = rnd(4, shape[1], *kernel, seed=27)
    _, pads, out_hw = C._conv_geometry(shape, filters.shape, strides, dilations, padding, "NCHW")
    dy = rnd(shape[0], 4, *out_hw, seed=28)
    dy[-1, -1, -1, -1] = np.nan
    compiled, twin = both(lambda: C._folded_input_grad(np, dy, filters, shape, kernel, strides, dilations, pads,
                                                       out_hw))
    np.testing.assert_array_equal(compiled, twin)
    dy[-1, -1, -1, -1] = 0.25
    with jit.using(True):
        got = C._folded_input_grad(np, dy, filters, shape, kernel, strides, dilations, pads, out_hw)
    (top, bottom), (left, right) = pads
    x = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.conv2d(torch.nn.functional.pad(x, (left, right, top, bottom)),
                                   torch.tensor(filters, dtype=torch.float64), stride=strides, dilation=dilations)
    y.backward(torch.tensor(dy, dtype=torch.float64))
    np.testing.assert_allclose(got, x.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_small_momentum_steps_stay_on_numpy():
    from flowlab.optim import optimizers
    small, large = np.zeros(optimizers.COMPILED_FROM - 1, np.float32), np.zeros(optimizers.COMPILED_FROM, np.float32)
    with jit.using(True):
        assert not _momentum_compiled(np, small, small, small) and _momentum_compiled(np, large, large, large)
        assert not _momentum_compiled(np, large.astype(np.float64), large, large)
