"""SGD's compiled plain step (``optim.optimizers._sgd_step_float32``) against its twin, BLAS's ``axpy`` (and NumPy's
passes where BLAS is missing), and against a float64 reference: bit for bit where the twin is BLAS, NaN and Inf
carried as the twin carries them, and the twin kept for what the kernel does not take (momentum, float64,
non-contiguous gradients, tensors from ``COMPILED_STEP_BELOW`` elements on)."""
import numpy as np
import pytest

from flowlab.optim import optimizers
from flowlab.optim.optimizers import SGDUpdate
from flowlab.runtime import blas, jit

pytestmark = pytest.mark.skipif(not jit.available(), reason="numba is not installed")

PLAIN = dict(momentum=0, clipped=False, grad_scale=1.0, schedule=None, lr=0.1037)


def step(w, g, compiled, **attrs):
    w = w.copy()
    with jit.using(compiled):
        SGDUpdate.forward(np, w, g, **{**PLAIN, **attrs}, writable=False)
    return w


@pytest.fixture
def calls(monkeypatch):
    """How many times the compiled kernel ran."""
    count = []
    kernel = optimizers._sgd_step_float32
    monkeypatch.setattr(optimizers, "_sgd_step_float32", lambda *a: (count.append(1), kernel(*a))[1])
    return count


def pair(shape, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("shape", [(4096,), (64, 128), (4097,), (optimizers.COMPILED_STEP_BELOW - 1,)])
def test_compiled_step_matches_blas_bit_for_bit(shape, calls):
    if not blas.available(np.float32):
        pytest.skip("no BLAS to compare with")
    w, g = pair(shape)
    compiled, twin = step(w, g, True), step(w, g, False)
    assert calls, "the compiled step did not run"
    np.testing.assert_array_equal(compiled, twin)
    reference = w.astype(np.float64) - 0.1037 * g.astype(np.float64)
    np.testing.assert_allclose(compiled, reference, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("size", [1, 7])
def test_compiled_step_at_odd_sizes(size, calls, monkeypatch):
    monkeypatch.setattr(optimizers, "BLAS_PASS_FROM", 1)
    w, g = pair(size, seed=size)
    compiled = step(w, g, True)
    assert calls
    np.testing.assert_allclose(compiled, step(w, g, False), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(compiled, w.astype(np.float64) - 0.1037 * g.astype(np.float64), rtol=1e-6, atol=1e-7)


def test_compiled_step_carries_nan_and_inf_as_the_twin():
    w, g = pair(5000, seed=3)
    w[[1, 7]] = [np.nan, np.inf]
    g[[2, 8, 9]] = [np.nan, np.inf, -np.inf]
    w[9] = np.inf                                  # inf - 0.1 * (-inf) = inf; w = inf, g = inf gives NaN below
    w[10], g[10] = np.inf, np.inf / 0.1037 * 0.1037
    compiled, twin = step(w, g, True), step(w, g, False)
    np.testing.assert_array_equal(np.isnan(compiled), np.isnan(twin))
    np.testing.assert_array_equal(compiled[np.isfinite(twin)], twin[np.isfinite(twin)])
    np.testing.assert_array_equal(compiled[np.isinf(twin)], twin[np.isinf(twin)])
    assert np.isnan(compiled[[1, 2, 10]]).all() and compiled[7] == np.inf and compiled[8] == -np.inf


def test_clipped_scale_is_read_from_the_clip_factor(calls):
    w, g = pair(4096, seed=4)
    factor = np.array(0.25, np.float32)            # the global-norm clip factor, a 0-d array
    with jit.using(True):
        compiled = w.copy()
        SGDUpdate.forward(np, compiled, g, factor, **{**PLAIN, "clipped": True})
    assert calls
    with jit.using(False):
        twin = w.copy()
        SGDUpdate.forward(np, twin, g, factor, **{**PLAIN, "clipped": True})
    np.testing.assert_allclose(compiled, twin, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(compiled, w - 0.25 * 0.1037 * g.astype(np.float64), rtol=1e-6, atol=1e-6)


def test_what_the_kernel_does_not_take_keeps_the_twin(calls):
    w, g = pair((64, 256), seed=5)
    strided = np.asfortranarray(g)                 # not C-contiguous
    np.testing.assert_array_equal(step(w, strided, True), step(w, strided, False))
    w64, g64 = w.astype(np.float64), g.astype(np.float64)
    np.testing.assert_allclose(step(w64, g64, True), w64 - 0.1037 * g64, rtol=1e-12)
    momentum = np.zeros_like(w)
    with jit.using(True):
        SGDUpdate.forward(np, w.copy(), g, momentum, **{**PLAIN, "momentum": 0.9})
    large_w, large_g = pair(optimizers.COMPILED_STEP_BELOW, seed=6)
    np.testing.assert_array_equal(step(large_w, large_g, True), step(large_w, large_g, False))
    assert not calls
