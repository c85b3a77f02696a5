"""The CPU fast paths of the seed train step's kernels give the numbers of the general computation.

Each fast path (``benchmarks/RESULTS.md``, "CPU step at the limit") is checked against a plain NumPy reference on
contiguous and non-contiguous inputs, float32 and float64, and on the inputs that must take the general path.
"""
import numpy as np
import pytest

from flowlab.ops.math import MatMul, ReduceSum, SumToShape, _swapped_gemm_pays
from flowlab.ops.nn import Relu, Softmax, SoftmaxGrad, SparseSoftmaxCrossEntropy, SparseSoftmaxCrossEntropyGrad

rng = np.random.default_rng(7)


def _strided(shape, dtype):
    """A non-contiguous array of ``shape``: every other column of a wider one."""
    wide = rng.standard_normal(shape[:-1] + (2 * shape[-1],)).astype(dtype)
    view = wide[..., ::2]
    assert not view.flags.c_contiguous
    return view


# ------------------------------------------------------------------------------------------------------------ matmul

@pytest.mark.parametrize("m,n,k", [(100, 512, 784), (32, 300, 256), (1, 2, 256)])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("with_out", [True, False])
def test_swapped_matmul_equals_the_direct_product(m, n, k, layout, with_out):
    make = (lambda s: rng.standard_normal(s).astype(np.float32)) if layout == "contiguous" else \
        (lambda s: _strided(s, np.float32))
    a, b = make((m, k)), make((n, k))
    assert _swapped_gemm_pays(np, a, b)
    out = np.full((m, n), np.nan, np.float32) if with_out else None
    got = MatMul.forward(np, a, b, transpose_a=False, transpose_b=True, alpha=0.5, out=out)
    reference = 0.5 * (a.astype(np.float64) @ b.astype(np.float64).T)
    assert got.shape == (m, n) and got.dtype == np.float32 and got.flags.c_contiguous
    if with_out:
        assert got is out
    np.testing.assert_allclose(got, reference, rtol=2e-5, atol=2e-5 * np.abs(reference).max())


@pytest.mark.parametrize("a_shape,b_shape,dtype", [
    ((100, 784), (512, 784), np.float64),   # float64 runs slower swapped
    ((128, 784), (512, 784), np.float32),   # more rows
    ((100, 100), (512, 100), np.float32),   # short inner dimension
    ((100, 512), (10, 512), np.float32),    # few columns
])
def test_other_products_take_the_direct_path(a_shape, b_shape, dtype):
    a = rng.standard_normal(a_shape).astype(dtype)
    b = rng.standard_normal(b_shape).astype(dtype)
    assert not _swapped_gemm_pays(np, a, b)
    got = MatMul.forward(np, a, b, transpose_a=False, transpose_b=True, alpha=1.0)
    np.testing.assert_array_equal(got, np.matmul(a, b.T))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m, k, n", [(100, 784, 512), (1, 7, 5), (6, 1, 4), (5, 3, 1), (300, 64, 10)])
@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul_on_cupy_through_cublas_equals_numpy(dtype, m, k, n, ta, tb):
    """runtime.cublas.gemm (what a CUDA graph can capture) in every layout MatMul hands it, vectors included;
    strided operands and batches take cupy.matmul."""
    import cupy
    from flowlab.runtime import cublas
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)
    want = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
    got = MatMul.forward(cupy, cupy.asarray(a), cupy.asarray(b), transpose_a=ta, transpose_b=tb, alpha=0.5)
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(cupy.asnumpy(got), 0.5 * want, rtol=tol, atol=tol)
    out = cupy.empty((m, n), dtype)
    assert cublas.gemm(cupy, cupy.asarray(a.T if ta else a), cupy.asarray(b.T if tb else b), out) is out
    np.testing.assert_allclose(cupy.asnumpy(out), want, rtol=tol, atol=tol)
    strided = cupy.asarray(np.repeat(a.T if ta else a, 2, axis=-1))[:, ::2]      # (m, k), every other column
    done = cublas.gemm(cupy, strided, cupy.asarray(b.T if tb else b), out)
    assert done is None if not (strided.flags.c_contiguous or strided.flags.f_contiguous) else done is out


# --------------------------------------------------------------------------------------------- softmax cross-entropy

def _reference_ce(labels, logits, dy):
    """Loss and gradient in float64, row by row; rows with an out-of-range label give zero loss and gradient."""
    classes = logits.shape[-1]
    flat_logits = logits.reshape(-1, classes).astype(np.float64)
    flat_labels, flat_dy = labels.ravel(), np.broadcast_to(dy, labels.shape).ravel().astype(np.float64)
    loss, grad = np.zeros(len(flat_labels)), np.zeros_like(flat_logits)
    for i, (row, label) in enumerate(zip(flat_logits, flat_labels)):
        if 0 <= label < classes:
            prob = np.exp(row - row.max())
            prob /= prob.sum()
            loss[i] = -np.log(prob[label])
            grad[i] = flat_dy[i] * (prob - np.eye(classes)[label])
    return loss.reshape(labels.shape), grad.reshape(logits.shape)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("label_shape", [(100,), (3, 4), ()])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "transposed"])
@pytest.mark.parametrize("out_of_range", [False, True])
def test_sparse_softmax_cross_entropy_fast_and_masked_paths(dtype, label_shape, layout, out_of_range):
    shape = label_shape + (10,)
    if layout == "transposed":   # an F-ordered array: the softmax and gradient come out F-ordered too
        logits = 3 * np.asfortranarray(rng.standard_normal(shape).astype(dtype))
    else:
        logits = 3 * (rng.standard_normal(shape).astype(dtype) if layout == "contiguous" else _strided(shape, dtype))
    labels = rng.integers(0, 10, size=label_shape).astype(np.int32)
    if out_of_range:
        labels.flat[0] = 10 if labels.size % 2 else -1
    dy = rng.random(label_shape).astype(dtype) + 0.5
    if layout == "transposed" and dy.ndim:
        dy = np.asfortranarray(dy)
    if out_of_range:
        with pytest.warns(RuntimeWarning, match="outside"):
            loss, prob = SparseSoftmaxCrossEntropy.forward(np, labels, logits, name="ce")
    else:
        loss, prob = SparseSoftmaxCrossEntropy.forward(np, labels, logits, name="ce")
    grad = SparseSoftmaxCrossEntropyGrad.forward(np, labels, prob, dy)
    want_loss, want_grad = _reference_ce(labels, logits, dy)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert isinstance(loss, np.ndarray) and loss.shape == label_shape and loss.dtype == dtype
    assert grad.shape == shape and grad.dtype == dtype
    np.testing.assert_allclose(loss, want_loss, rtol=tol, atol=tol)
    np.testing.assert_allclose(grad, want_grad, rtol=tol, atol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("label_shape", [(100,), (3, 4), ()])
@pytest.mark.parametrize("labels_dtype", [np.int32, np.int64])
def test_sparse_softmax_cross_entropy_cupy_kernels(dtype, label_shape, labels_dtype):
    """CuPy's one-kernel forward and gradient: the reference's numbers, out-of-range labels (negative, = classes,
    far) masked in the kernel with no host synchronisation, NaN and Inf logits as the NumPy path has them."""
    import cupy
    shape = label_shape + (10,)
    logits = 3 * rng.standard_normal(shape).astype(dtype)
    labels = rng.integers(0, 10, size=label_shape).astype(labels_dtype)
    if labels.size > 3:
        labels.flat[:3] = [-1, 10, 1 << 20]
        logits.reshape(-1, 10)[3, 2] = np.nan
        logits.reshape(-1, 10)[4, 5] = np.inf
    dy = rng.random(label_shape).astype(dtype) + 0.5
    loss, prob = SparseSoftmaxCrossEntropy.forward(cupy, cupy.asarray(labels), cupy.asarray(logits), name="ce")
    grad = SparseSoftmaxCrossEntropyGrad.forward(cupy, cupy.asarray(labels), prob, cupy.asarray(dy))
    ref_loss, ref_grad = _reference_ce(labels, logits, dy)
    if labels.size > 3:     # the NaN row is NaN, the Inf row NaN (inf - inf), as on NumPy; masked rows are 0
        with pytest.warns(RuntimeWarning, match="outside"):
            want_loss, want_prob = SparseSoftmaxCrossEntropy.forward(np, labels, logits, name="ce")
        ref_loss.flat[3:5] = want_loss.flat[3:5]
        ref_grad.reshape(-1, 10)[3:5] = SparseSoftmaxCrossEntropyGrad.forward(np, labels, want_prob, dy).reshape(
            -1, 10)[3:5]
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert loss.shape == label_shape and loss.dtype == dtype and grad.shape == shape and grad.dtype == dtype
    np.testing.assert_allclose(cupy.asnumpy(loss), ref_loss, rtol=tol, atol=tol)
    np.testing.assert_allclose(cupy.asnumpy(grad), ref_grad, rtol=tol, atol=tol)


# ------------------------------------------------------------------------------------------------------ relu and sum

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_relu_equals_maximum(dtype, layout):
    x = 5 * (rng.standard_normal((7, 9)) if layout == "contiguous" else _strided((7, 9), np.float64))
    x = x.astype(dtype)
    if dtype != np.int32:
        x[0, :3] = [np.nan, np.inf, -np.inf]
    out = np.empty(x.shape, dtype)
    got = Relu.forward(np, x, out=out)
    assert got is out
    np.testing.assert_array_equal(got, np.maximum(x, 0))   # NaN in the same places
    np.testing.assert_array_equal(Relu.forward(np, x), np.maximum(x, 0))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("with_out", [False, True])
def test_relu_grad_on_cupy_is_numpys_product_in_one_kernel(dtype, with_out):
    import cupy
    from flowlab.ops.nn import ReluGrad
    y = np.maximum(rng.standard_normal((50, 30)), 0).astype(dtype)
    dy = rng.standard_normal((50, 30)).astype(dtype)
    dy[0, :4], y[0, :4] = [np.nan, np.inf, np.nan, -np.inf], [0, 0, 1, 2]      # NaN where y is 0 stays NaN
    out = cupy.empty(y.shape, dtype) if with_out else None
    got = ReluGrad.forward(cupy, cupy.asarray(y), cupy.asarray(dy), out=out)
    assert out is None or got is out
    np.testing.assert_array_equal(cupy.asnumpy(got), ReluGrad.forward(np, y, dy))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, axes", [((300, 70), (0,)), ((4, 5, 6), (0, 1)), ((4, 5, 6), (0,)), ((0, 3), (0,)),
                                         ((5, 4), (1,)), ((3, 4, 5), (0, 2))])
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("with_out", [False, True])
def test_reduce_sum_on_cupy_over_leading_axes_is_a_product_with_ones(dtype, shape, axes, keepdims, with_out):
    import cupy
    x = rng.standard_normal(shape).astype(dtype)
    want = np.sum(x.astype(np.float64), axis=axes, keepdims=keepdims)
    out = cupy.empty(want.shape, dtype) if with_out else None
    got = ReduceSum.forward(cupy, cupy.asarray(x), axes=axes, keepdims=keepdims, out=out)
    assert got.shape == want.shape and got.dtype == dtype and (out is None or got is out)
    np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, axes", [((256, 128), (0,)), ((4, 5, 6), (0, 1)), ((4, 5, 6), (0,)), ((0, 3), (0,)),
                                         ((5, 4), (1,)), ((3, 4, 5), (0, 2)), ((70000, 2), (0,))])
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("with_out", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_reduce_sum_and_sum_to_shape_on_numpy_over_leading_axes(dtype, shape, axes, keepdims, with_out, layout):
    """Leading sums of contiguous float arrays run as products with ones (a bias gradient); every case gives the
    float64 sum within rounding, in the input's dtype, into ``out`` when given; the others take ``np.add.reduce``."""
    if layout == "strided" and 0 in shape:
        pytest.skip("an empty array is contiguous")
    x = rng.standard_normal(shape).astype(dtype) if layout == "contiguous" else _strided(shape, dtype)
    want = np.sum(x.astype(np.float64), axis=axes, keepdims=keepdims)
    tolerance = dict(rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-3 if dtype == np.float32 else 1e-10)
    out = np.full(want.shape, np.nan, dtype) if with_out else None
    got = ReduceSum.forward(np, x, axes=axes, keepdims=keepdims, out=out)
    assert got.shape == want.shape and got.dtype == dtype and (out is None or got is out)
    np.testing.assert_allclose(got, want, **tolerance)
    lead = next(i for i in range(len(shape) + 1) if i not in axes)    # SumToShape drops the leading summed axes
    target = tuple(1 if i in axes else d for i, d in enumerate(shape))[lead:]
    out = np.full(target, np.nan, dtype) if with_out else None
    got = SumToShape.forward(np, x, shape=target, out=out)
    assert got.shape == tuple(target) and got.dtype == dtype and (out is None or got is out)
    np.testing.assert_allclose(got, want.reshape(target), **tolerance)


@pytest.mark.parametrize("dtype", [np.float32, np.int8])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduce_sum_keeps_dtype_and_writes_out(dtype, keepdims):
    x = _strided((6, 5, 4), np.float64)
    x = (x * 3).astype(dtype)
    want = np.sum(x, axis=(0, 2), keepdims=keepdims, dtype=dtype)
    out = np.empty(want.shape, dtype)
    got = ReduceSum.forward(np, x, axes=(0, 2), keepdims=keepdims, out=out)
    assert got is out and got.dtype == dtype
    np.testing.assert_array_equal(got, want)
    fresh = ReduceSum.forward(np, x, axes=(0, 2), keepdims=keepdims)
    assert fresh.dtype == dtype
    np.testing.assert_array_equal(fresh, want)


@pytest.mark.gpu
@pytest.mark.parametrize("shape, unit_axis", [((100, 512), 1), ((32, 16, 28, 28), 1), ((4, 3, 5, 6), -1), ((7,), 0),
                                              ((3, 1000, 1000), 1)])
def test_health_statistics_kernels_on_cupy_match_numpy_and_leave_their_scratch_zeroed(shape, unit_axis):
    """``watch_health``'s one-kernel statistics (float32 on CuPy) against the float64 host path, three calls on one
    ``Scratch`` (the kernel zeroes its accumulators for the next call): NaN, Inf, zeros and dead units included."""
    import cupy
    from flowlab.ops.stats import Scratch, activation_vector, square_vector
    activation, squares = Scratch(), Scratch()
    for call in range(3):
        x = np.maximum(rng.standard_normal(shape), 0).astype(np.float32) * (call + 1)
        units = np.moveaxis(x, unit_axis, 0)
        units[1 % units.shape[0]] = 0                 # a dead unit
        if call == 1:
            x.reshape(-1)[[0, -1]] = np.nan, np.inf
        if call == 2:
            x.reshape(-1)[:] = np.nan                 # nothing finite
        want = activation_vector(np, x.astype(np.float64), unit_axis)
        got = cupy.asnumpy(activation_vector(cupy, cupy.asarray(x), unit_axis, scratch=activation))
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12, err_msg=f"call {call}")
        got = cupy.asnumpy(square_vector(cupy, cupy.asarray(x), scratch=squares))
        np.testing.assert_allclose(got, square_vector(np, x.astype(np.float64)), rtol=1e-9, err_msg=f"call {call}")
    assert not activation.array.any() and not squares.array.any()


# ----------------------------------------------------------------------------------------------------------- softmax

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(8, 2, 32, 32), (3, 7), (200, 5), (64, 300), (1, 1)])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_softmax_and_its_gradient_over_the_last_axis_match_float64(dtype, shape, layout):
    """The host path over the last axis (row maxima down a transposed copy for short rows, sums as a product with
    ones, row dots in the gradient) against the float64 formulas, on logits spread wide enough that a row's
    largest logit matters; NaN stays in its row, a row of -inf and finite values ignores the -inf."""
    if layout == "strided" and shape[-1] == 1:
        pytest.skip("every other column of a two-column array is contiguous")
    x = (rng.standard_normal(shape) * 20).astype(dtype) if layout == "contiguous" else _strided(shape, dtype) * 20
    if x.size > 3:
        x[(0,) * (x.ndim - 1) + (0,)] = np.nan
        x[(0,) * (x.ndim - 2) + (1, 0)] = -np.inf
    wide = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(wide - wide.max(axis=-1, keepdims=True))
        want = e / e.sum(axis=-1, keepdims=True)
    got = Softmax.forward(np, x, axis=x.ndim - 1)
    assert got.dtype == dtype and got.shape == x.shape
    tolerance = dict(rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6 if dtype == np.float32 else 1e-15)
    np.testing.assert_allclose(got, want, **tolerance)       # (NaN where the reference has NaN)
    y, dy = got, rng.standard_normal(shape).astype(dtype)
    with np.errstate(invalid="ignore"):
        want = y.astype(np.float64) * (dy - (dy.astype(np.float64) * y).sum(axis=-1, keepdims=True))
    dx = SoftmaxGrad.forward(np, y, dy, axis=y.ndim - 1)
    assert dx.dtype == dtype and dx.shape == y.shape
    np.testing.assert_allclose(dx, want, **tolerance)
