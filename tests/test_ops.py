"""Forward values of the ops against NumPy references (float32 and float64), numerical edge cases, and the errors
shape rules raise (which name the op, the offending shapes and the caller's source line)."""
import inspect
import warnings

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.autodiff import gradients
from flowlab.errors import ShapeError, TraceError
from flowlab.runtime import backend

FLOATS = [np.float32, np.float64]


def tol(dtype):
    return {"rtol": 2e-6, "atol": 1e-6} if np.dtype(dtype) == np.float32 else {"rtol": 1e-12, "atol": 1e-12}


def make_job(build, specs, name="job"):
    """A predict job taking placeholders of ``specs`` ((shape, dtype) pairs) and returning ``build``'s tensors."""
    def job(*xs):
        out = build(*xs)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    params = [inspect.Parameter(f"x{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                annotation=tp.Numpy.Placeholder(shape, dtype=dtype))
              for i, (shape, dtype) in enumerate(specs)]
    job.__signature__ = inspect.Signature(params, return_annotation=tp.Bundle[tp.Numpy])
    job.__name__ = name
    return flow.global_function()(job)


def run(build, *arrays, via_buffer=False):
    """Outputs of ``build(*arrays)`` in a predict job, each checked against the shape and dtype its op declared.

    ``via_buffer`` routes every output through ``flow.identity``, so the op itself writes into a buffer the
    compiler preallocated (its ``out=`` path) instead of returning a fresh array.
    """
    def wrapped(*xs):
        out = build(*xs)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        return [flow.identity(o) for o in outs] if via_buffer else outs

    job = make_job(wrapped, [(a.shape, a.dtype) for a in arrays])
    results = job(*arrays)
    declared = job.graph().outputs
    for r, t in zip(results, declared):
        assert r.shape == t.shape, f"{t.logical_blob_name}: declared shape {t.shape}, computed {r.shape}"
        assert r.dtype == t.dtype, f"{t.logical_blob_name}: declared dtype {t.dtype}, computed {r.dtype}"
    return results if len(results) > 1 else results[0]


def rnd(*shape, dtype=np.float64, seed=0, low=None, high=None):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape) if low is None else rng.uniform(low, high, shape)
    return np.asarray(a, dtype=dtype)


def assert_error(exc, build, specs, *fragments):
    """Tracing ``build`` raises ``exc``; its message names every fragment and points at this file."""
    job = make_job(build, specs)
    with pytest.raises(exc) as info:
        job.compiled()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert "test_ops.py:" in message, f"no source line of the caller in {message!r}"
    return message


# ------------------------------------------------------------------------------------------------- binary elementwise

BINARY = {
    "add": (flow.math.add, np.add),
    "subtract": (flow.math.subtract, np.subtract),
    "multiply": (flow.math.multiply, np.multiply),
    "divide": (flow.math.divide, np.divide),
    "maximum": (flow.math.maximum, np.maximum),
    "minimum": (flow.math.minimum, np.minimum),
}
SHAPE_PAIRS = [((3, 4), (3, 4)), ((3, 4), (4,)), ((4,), (3, 4)), ((3, 1), (1, 4)), ((2, 3, 4), (3, 1)), ((3, 4), ())]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", list(BINARY))
@pytest.mark.parametrize("shapes", SHAPE_PAIRS, ids=lambda s: f"{s[0]}-{s[1]}")
@pytest.mark.parametrize("via_buffer", [False, True], ids=["fresh", "buffer"])
def test_binary(dtype, name, shapes, via_buffer):
    fn, ref = BINARY[name]
    a = rnd(*shapes[0], dtype=dtype, seed=1)
    b = rnd(*shapes[1], dtype=dtype, seed=2, low=0.5, high=2.0)
    out = run(fn, a, b, via_buffer=via_buffer)
    np.testing.assert_allclose(out, ref(a.astype(np.float64), b.astype(np.float64)), **tol(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_with_python_numbers(dtype, name):
    fn, ref = BINARY[name]
    a = rnd(3, 4, dtype=dtype, low=0.5, high=2.0)
    left, right = run(lambda x: (fn(x, 1.5), fn(-0.75, x)), a)
    np.testing.assert_allclose(left, ref(a.astype(np.float64), 1.5), **tol(dtype))
    np.testing.assert_allclose(right, ref(-0.75, a.astype(np.float64)), **tol(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_python_operators(dtype):
    x = rnd(3, 4, dtype=dtype, seed=3, low=0.5, high=2.0)
    y = rnd(3, 4, dtype=dtype, seed=4)
    outs = run(lambda a, b: (a * 2 + 1, 1 / a, a - b, -a, a ** 3, 3 - a, a / b, a @ flow.transpose(b)), x, y)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    refs = [x64 * 2 + 1, 1 / x64, x64 - y64, -x64, x64 ** 3, 3 - x64, x64 / y64, x64 @ y64.T]
    for out, ref in zip(outs, refs):
        np.testing.assert_allclose(out, ref, rtol=tol(dtype)["rtol"] * 10, atol=tol(dtype)["atol"] * 10)


def test_integer_arithmetic_keeps_integer_dtype():
    a = np.array([[1, -2, 3], [4, 5, -6]], np.int32)
    b = np.array([2, 3, 4], np.int32)
    total, product, biggest, shifted = run(lambda x, y: (x + y, x * y, flow.math.maximum(x, y), x - 7), a, b)
    np.testing.assert_array_equal(total, a + b)
    np.testing.assert_array_equal(product, a * b)
    np.testing.assert_array_equal(biggest, np.maximum(a, b))
    np.testing.assert_array_equal(shifted, a - 7)


@pytest.mark.parametrize("build,fragment", [
    (lambda i: flow.math.equal(i, 2.5), "flow.math.equal: y=2.5"),
    (lambda i: flow.math.greater(0.5, i), "flow.math.greater: x=0.5"),
    (lambda i: i + 1.25, "flow.math.add: y=1.25"),
    (lambda i: flow.cast(i, flow.int8) * 300, "flow.math.multiply: y=300"),
], ids=["equal", "greater", "add", "overflow"])
def test_numbers_that_an_integer_tensor_cannot_hold_are_refused(build, fragment):
    # Silently turning 2.5 into 2 would make equal(labels, 2.5) true for label 2.
    with pytest.raises(TypeError) as info:
        make_job(build, [((3,), np.int32)]).compiled()
    assert fragment in str(info.value) and "test_ops.py:" in str(info.value)


def test_integral_numbers_with_integer_tensors():
    a = np.array([1, 2, 3], np.int32)
    eq, gt, added = run(lambda i: (flow.math.equal(i, 2.0), flow.math.greater(i, np.int64(1)), i + 1.0), a)
    np.testing.assert_array_equal(eq, [0, 1, 0])
    np.testing.assert_array_equal(gt, [0, 1, 1])
    np.testing.assert_array_equal(added, [2, 3, 4])
    assert added.dtype == np.int32


def test_binary_needs_a_tensor():
    with pytest.raises(TypeError, match="flow.math.add: at least one operand must be a tensor"):
        flow.math.add(1.0, 2.0)


# -------------------------------------------------------------------------------------------------- unary elementwise

def np_sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


UNARY = [
    ("negative", flow.math.negative, np.negative, None),
    ("exp", flow.math.exp, np.exp, None),
    ("log", flow.math.log, np.log, (0.1, 5.0)),
    ("sqrt", flow.math.sqrt, np.sqrt, (0.0, 5.0)),
    ("square", flow.math.square, np.square, None),
    ("abs", flow.math.abs, np.abs, None),
    ("sign", flow.math.sign, np.sign, None),
    ("sigmoid", flow.math.sigmoid, np_sigmoid, None),
    ("tanh", flow.math.tanh, np.tanh, None),
    ("relu", flow.nn.relu, lambda x: np.maximum(x, 0), None),
    ("identity", flow.identity, lambda x: x, None),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name,fn,ref,domain", UNARY, ids=[u[0] for u in UNARY])
@pytest.mark.parametrize("via_buffer", [False, True], ids=["fresh", "buffer"])
def test_unary(dtype, name, fn, ref, domain, via_buffer):
    x = rnd(4, 5, dtype=dtype, seed=5) * 3 if domain is None else rnd(4, 5, dtype=dtype, seed=5, low=domain[0],
                                                                        high=domain[1])
    out = run(fn, x, via_buffer=via_buffer)
    np.testing.assert_allclose(out, ref(x.astype(np.float64)), **tol(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_sigmoid_stays_finite_and_exact_at_extremes(dtype):
    x = np.array([-1e4, -100.0, -80.0, -30.0, 0.0, 30.0, 100.0, 1e4], dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # no overflow warning from exp
        out = run(flow.math.sigmoid, x)
    np.testing.assert_allclose(out, np_sigmoid(x.astype(np.float64)), rtol=1e-6, atol=np.finfo(dtype).tiny)
    assert 0 < out[2] < 1e-30      # tiny (a normal number in float32 too), not lost in 1 - (1 - tiny)
    if not (backend.current().is_gpu and dtype == np.float32):
        assert 0 < out[1] < 1e-40  # subnormal in float32, not flushed to zero (CuPy's kernels flush float32's)
    assert out[0] == 0 and out[-1] == 1 and out[4] == 0.5


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("exponent", [2, 3, 0.5, -1.5, 0])
def test_pow(dtype, exponent):
    x = rnd(3, 4, dtype=dtype, seed=6, low=0.2, high=3.0)
    out = run(lambda t: flow.math.pow(t, exponent), x)
    np.testing.assert_allclose(out, np.power(x.astype(np.float64), exponent), **tol(dtype))


def test_pow_of_integers():
    x = np.array([0, 1, 2, -3], np.int32)
    np.testing.assert_array_equal(run(lambda t: t ** 3, x), x ** 3)


# ---------------------------------------------------------------------------------------------------------- reductions

REDUCTIONS = {"sum": (flow.math.reduce_sum, np.sum), "mean": (flow.math.reduce_mean, np.mean),
              "max": (flow.math.reduce_max, np.max)}
AXES = [None, 0, 1, -1, [0, 2], (2, 1), [0, 1, 2]]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", list(REDUCTIONS))
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(dtype, name, axis, keepdims):
    fn, ref = REDUCTIONS[name]
    x = rnd(2, 3, 4, dtype=dtype, seed=7)
    np_axis = None if axis is None else (axis if isinstance(axis, int) else tuple(axis))
    expected = ref(x.astype(np.float64), axis=np_axis, keepdims=keepdims)
    for via_buffer in (False, True):
        out = run(lambda t: fn(t, axis=axis, keepdims=keepdims), x, via_buffer=via_buffer)
        np.testing.assert_allclose(out, expected, **tol(dtype))


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_integer_sums_keep_their_dtype(dtype):
    x = np.arange(-12, 12, dtype=dtype).reshape(2, 3, 4)
    total, rows, biggest = run(lambda t: (flow.math.reduce_sum(t), flow.math.reduce_sum(t, axis=1),
                                          flow.math.reduce_max(t, axis=[0, 2])), x)
    np.testing.assert_array_equal(total, x.sum())
    np.testing.assert_array_equal(rows, x.sum(axis=1))
    np.testing.assert_array_equal(biggest, x.max(axis=(0, 2)))


# -------------------------------------------------------------------------------------------------------------- matmul

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("batch", [(), (2,)], ids=["2d", "3d"])
def test_matmul(dtype, transpose_a, transpose_b, batch):
    m, k, n = 3, 4, 5
    a = rnd(*batch, *((k, m) if transpose_a else (m, k)), dtype=dtype, seed=8)
    b = rnd(*batch, *((n, k) if transpose_b else (k, n)), dtype=dtype, seed=9)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    expected = np.matmul(np.swapaxes(a64, -1, -2) if transpose_a else a64,
                         np.swapaxes(b64, -1, -2) if transpose_b else b64)
    for alpha in (1.0, -0.5):
        for via_buffer in (False, True):
            out = run(lambda x, y: flow.matmul(x, y, transpose_a, transpose_b, alpha=alpha), a, b,
                      via_buffer=via_buffer)
            np.testing.assert_allclose(out, alpha * expected, rtol=tol(dtype)["rtol"] * 5, atol=tol(dtype)["atol"] * 5)


# --------------------------------------------------------------------------------------------------------- shape ops

@pytest.mark.parametrize("shape,expected", [((-1, 4), (6, 4)), ((6, -1), (6, 4)), ((24,), (24,)),
                                            ((4, 3, 2), (4, 3, 2)), ((2, -1, 3, 1), (2, 4, 3, 1))], ids=str)
def test_reshape(shape, expected):
    x = rnd(2, 3, 4)
    out = run(lambda t: flow.reshape(t, shape), x)
    assert out.shape == expected
    np.testing.assert_array_equal(out, x.reshape(expected))


def test_reshape_of_a_transpose_keeps_logical_order():
    x = rnd(2, 3, 4)
    out = run(lambda t: flow.reshape(flow.transpose(t, (2, 0, 1)), (4, 6)), x)
    np.testing.assert_array_equal(out, x.transpose(2, 0, 1).reshape(4, 6))


@pytest.mark.parametrize("perm", [(1, 0, 2), (2, 0, 1), (0, 2, 1), None], ids=str)
def test_transpose(perm):
    x = rnd(2, 3, 4, dtype=np.float32)
    np.testing.assert_array_equal(run(lambda t: flow.transpose(t, perm), x), np.transpose(x, perm))


@pytest.mark.parametrize("dtype", FLOATS + [np.int32])
@pytest.mark.parametrize("axis,shapes", [(0, [(2, 3), (1, 3), (4, 3)]), (1, [(2, 1), (2, 3), (2, 2)]),
                                         (-1, [(2, 3, 1), (2, 3, 2), (2, 3, 3)])], ids=["axis0", "axis1", "axis-1"])
def test_concat(dtype, axis, shapes):
    arrays = [(rnd(*s, seed=i) * 10).astype(dtype) for i, s in enumerate(shapes)]
    for via_buffer in (False, True):
        out = run(lambda a, b, c: flow.concat([a, b, c], axis=axis), *arrays, via_buffer=via_buffer)
        np.testing.assert_array_equal(out, np.concatenate(arrays, axis=axis))


@pytest.mark.parametrize("axis,start,stop", [(0, 1, 3), (1, 0, 2), (-1, 2, 4)])
def test_slice_axis(axis, start, stop):
    from flowlab.ops.array import slice_axis
    x = rnd(3, 4, 4)
    index = [slice(None)] * 3
    index[axis] = slice(start, stop)
    np.testing.assert_array_equal(run(lambda t: slice_axis(t, axis, start, stop), x), x[tuple(index)])


@pytest.mark.parametrize("src,dst", [((4,), (3, 4)), ((3, 1), (2, 3, 4)), ((), (2, 2))], ids=str)
def test_broadcast_to_and_sum_to_shape(src, dst):
    from flowlab.ops.math import broadcast_to, sum_to_shape
    x, big = rnd(*src, seed=1), rnd(*dst, seed=2)
    for via_buffer in (False, True):
        spread, summed = run(lambda t, u: (broadcast_to(t, dst), sum_to_shape(u, src)), x, big, via_buffer=via_buffer)
        np.testing.assert_array_equal(spread, np.broadcast_to(x, dst))
        lead = len(dst) - len(src)
        axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(src) if d == 1 and dst[lead + i] != 1)
        np.testing.assert_allclose(summed, big.sum(axis=axes).reshape(src), rtol=1e-12)


# --------------------------------------------------------------------------------------------------------------- nn

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape,data_format,axis", [
    ((4, 3), None, 1), ((2, 3, 4, 5), "NCHW", 1), ((2, 3, 4, 5), None, 1), ((2, 4, 5, 3), "NHWC", 3),
    ((2, 5, 3), "NWC", 2), ((3,), None, 0),
], ids=["2d", "NCHW", "default", "NHWC", "NWC", "1d"])
def test_bias_add(dtype, shape, data_format, axis):
    x = rnd(*shape, dtype=dtype, seed=10)
    b = rnd(shape[axis], dtype=dtype, seed=11)
    expected = x + b.reshape((-1,) + (1,) * (x.ndim - axis - 1))
    for via_buffer in (False, True):
        out = run(lambda t, u: flow.nn.bias_add(t, u, data_format=data_format), x, b, via_buffer=via_buffer)
        np.testing.assert_allclose(out, expected, **tol(dtype))


def np_softmax(x, axis=-1):
    z = np.exp(x - x.max(axis=axis, keepdims=True))
    return z / z.sum(axis=axis, keepdims=True)


def np_log_softmax(x, axis=-1):
    z = x - x.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape,axis,np_axis", [((3, 5), None, -1), ((3, 5), -1, -1), ((3, 5), 0, 0),
                                                ((2, 3, 4), 1, 1)], ids=str)
def test_softmax(dtype, shape, axis, np_axis):
    x = rnd(*shape, dtype=dtype, seed=12) * 3
    out = run(lambda t: flow.nn.softmax(t, axis=axis), x)
    np.testing.assert_allclose(out, np_softmax(x.astype(np.float64), np_axis), **tol(dtype))
    np.testing.assert_allclose(out.sum(axis=np_axis), 1.0, **tol(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_softmax_is_stable_for_huge_logits(dtype):
    x = np.array([[1e4, 0.0, -1e4], [1e4, 1e4, 1e4 - 1.0], [-1e4, -1e4, -1e4]], dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")           # no overflow/invalid warnings
        out = run(flow.nn.softmax, x)
    assert np.isfinite(out).all()
    e = np.exp(-1.0)
    np.testing.assert_allclose(out, [[1, 0, 0], [1 / (2 + e), 1 / (2 + e), e / (2 + e)], [1 / 3] * 3],
                               rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("logits_shape", [(5, 4), (2, 3, 4)], ids=str)
def test_sparse_softmax_cross_entropy(dtype, logits_shape):
    rng = np.random.default_rng(13)
    labels = rng.integers(0, logits_shape[-1], logits_shape[:-1]).astype(np.int32)
    logits = rnd(*logits_shape, dtype=dtype, seed=14) * 3
    out = run(lambda lab, lg: flow.nn.sparse_softmax_cross_entropy_with_logits(lab, lg), labels, logits)
    expected = -np.take_along_axis(np_log_softmax(logits.astype(np.float64)), labels[..., None].astype(np.int64),
                                   axis=-1)[..., 0]
    np.testing.assert_allclose(out, expected, **tol(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_cross_entropies_are_stable_for_huge_logits(dtype):
    logits = np.array([[1e4, 0.0, -1e4], [-1e4, 1e4, 0.0]], dtype)
    labels = np.array([0, 2], np.int32)
    soft_labels = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]], dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sparse, dense = run(lambda lab, soft, lg: (flow.nn.sparse_softmax_cross_entropy_with_logits(lab, lg),
                                                   flow.nn.softmax_cross_entropy_with_logits(soft, lg)),
                            labels, soft_labels, logits)
    np.testing.assert_allclose(sparse, [0.0, 1e4], rtol=1e-6)
    np.testing.assert_allclose(dense, [0.0, 1e4], rtol=1e-6)


def _sparse_ce_with_grad(labels, logits):
    def build(lab, lg):
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(lab, lg)
        (grad,) = gradients([loss], [lg], [flow.constant(np.ones(loss.shape), dtype=loss.dtype)])
        return loss, grad
    return run(build, labels, logits)


@pytest.mark.parametrize("bad", [-1, 4, 100], ids=["negative", "classes", "far"])
def test_sparse_cross_entropy_out_of_range_labels(bad):
    """Zero loss and gradient for such a row; NumPy warns, CuPy's kernel masks it without a host synchronisation
    (and so without a warning)."""
    labels = np.array([1, bad, 3], np.int32)
    logits = rnd(3, 4, seed=15)
    if backend.current().is_gpu:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loss, grad = _sparse_ce_with_grad(labels, logits)
    else:
        with pytest.warns(RuntimeWarning, match=r"labels outside \[0, 4\)"):
            loss, grad = _sparse_ce_with_grad(labels, logits)
    assert loss[1] == 0.0
    np.testing.assert_array_equal(grad[1], 0.0)
    ref_loss = -np_log_softmax(logits)[[0, 2], [1, 3]]
    np.testing.assert_allclose(loss[[0, 2]], ref_loss, rtol=1e-12)
    onehot = np.eye(4)[[1, 3]]
    np.testing.assert_allclose(grad[[0, 2]], np_softmax(logits[[0, 2]]) - onehot, rtol=1e-12, atol=1e-15)


def test_sparse_cross_entropy_in_range_labels_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss, grad = _sparse_ce_with_grad(np.array([0, 3], np.int32), rnd(2, 4, seed=16))
    assert (loss > 0).all()


@pytest.mark.parametrize("dtype", FLOATS)
def test_softmax_cross_entropy(dtype):
    labels = rnd(4, 5, dtype=dtype, seed=17, low=0.0, high=1.0)
    labels /= labels.sum(axis=1, keepdims=True)
    logits = rnd(4, 5, dtype=dtype, seed=18) * 3
    out = run(lambda lab, lg: flow.nn.softmax_cross_entropy_with_logits(lab, lg), labels, logits)
    expected = -(labels.astype(np.float64) * np_log_softmax(logits.astype(np.float64))).sum(axis=-1)
    np.testing.assert_allclose(out, expected, **tol(dtype))


def test_dropout_in_predict_job_and_argument_checks():
    x = rnd(3, 4, dtype=np.float32)
    np.testing.assert_array_equal(run(lambda t: flow.nn.dropout(t, 0.3), x), x)
    with pytest.raises(ValueError, match=r"flow.nn.dropout: rate must be a number in \[0, 1\), got 1.0"):
        run(lambda t: flow.nn.dropout(t, 1.0), x)
    for noise_shape in [(3, 5), (2, 3, 4)]:                  # does not broadcast / would grow the output
        assert_error(ShapeError, lambda t: flow.nn.dropout(t, 0.5, noise_shape=noise_shape), [((3, 4), F32)],
                     "flow.nn.dropout", str(noise_shape), "(3, 4)")


# ------------------------------------------------------------------------------------------------- non-differentiable

@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_argmax(axis):
    x = rnd(4, 5, dtype=np.float32, seed=19)
    x[1, :] = 7.0                                        # ties: the first index wins, as in NumPy
    out = run(lambda t: flow.math.argmax(t, axis=axis), x)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, np.argmax(x, axis=axis))


@pytest.mark.parametrize("name,ref", [("equal", np.equal), ("greater", np.greater), ("less", np.less)])
def test_comparisons(name, ref):
    fn = getattr(flow.math, name)
    a = np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]], np.float32)
    b = np.array([2.0, 2.0, 2.0], np.float32)
    with_tensor, with_number, int_tensor = run(lambda x, y, i: (fn(x, y), fn(x, 2.0), fn(i, 2)), a, b,
                                               a.astype(np.int32))
    for out in (with_tensor, with_number, int_tensor):
        assert out.dtype == np.int8
        np.testing.assert_array_equal(out, ref(a, b).astype(np.int8))


def test_constant():
    a, b, c, d = run(lambda x: (flow.constant(1.5), flow.constant(2, dtype=flow.int32, shape=(2, 3)),
                                flow.constant(0.25, dtype=flow.float64, shape=(4,)) + x,
                                flow.constant([1.0, 2.0, 3.0])),
                     np.ones(4))
    assert a.dtype == np.float32 and a.shape == () and a == 1.5
    assert b.dtype == np.int32
    np.testing.assert_array_equal(b, np.full((2, 3), 2))
    np.testing.assert_array_equal(c, np.full(4, 1.25))
    assert d.dtype == np.float32
    np.testing.assert_array_equal(d, [1.0, 2.0, 3.0])


def test_cast():
    x = np.array([-2.7, -0.5, 0.0, 1.9, 3.5], np.float64)
    as_int, as_f32, back, same = run(lambda t: (flow.cast(t, flow.int32), flow.cast(t, flow.float32),
                                                flow.cast(flow.cast(t, flow.int32), flow.float64),
                                                flow.cast(t, flow.float64)), x)
    assert as_int.dtype == np.int32 and as_f32.dtype == np.float32 and back.dtype == np.float64
    np.testing.assert_array_equal(as_int, [-2, 0, 0, 1, 3])       # truncation toward zero, as in C and NumPy
    np.testing.assert_array_equal(as_f32, x.astype(np.float32))
    np.testing.assert_array_equal(back, [-2.0, 0.0, 0.0, 1.0, 3.0])
    np.testing.assert_array_equal(same, x)


def test_cast_rejects_unknown_dtypes():
    with pytest.raises(TypeError, match="dtype"):
        run(lambda t: flow.cast(t, "not-a-dtype"), np.ones(3))


# ----------------------------------------------------------------------------------------------------------- errors

F32 = np.float32


def test_error_mismatched_broadcast():
    assert_error(ShapeError, lambda x, y: x + y, [((3, 4), F32), ((3,), F32)], "flow.math.add", "(3, 4)", "(3,)",
                 "do not broadcast")


def test_error_binary_dtype_mismatch():
    assert_error(ShapeError, lambda x, y: flow.math.multiply(x, y), [((3,), F32), ((3,), np.float64)],
                 "flow.math.multiply", "float32", "float64")


@pytest.mark.parametrize("ta,tb,fragment", [(False, False, "has 4"), (True, False, "transposed"),
                                            (False, True, "transposed")])
def test_error_matmul_inner_dims(ta, tb, fragment):
    assert_error(ShapeError, lambda a, b: flow.matmul(a, b, transpose_a=ta, transpose_b=tb),
                 [((3, 4), F32), ((5, 6), F32)], "flow.matmul", "inner dimensions", "(3, 4)", "(5, 6)", fragment)


def test_error_matmul_ranks_and_batches():
    assert_error(ShapeError, lambda a, b: flow.matmul(a, b), [((3, 4), F32), ((4,), F32)], "flow.matmul", "(4,)")
    assert_error(ShapeError, lambda a, b: flow.matmul(a, b), [((2, 3, 4), F32), ((3, 4, 5), F32)], "flow.matmul",
                 "batch", "(2,)", "(3,)")


@pytest.mark.parametrize("shape", [(5, 5), (-1, 7), (2, -1, -1)], ids=str)
def test_error_reshape_element_count(shape):
    assert_error(ShapeError, lambda x: flow.reshape(x, shape), [((2, 3, 4), F32)], "flow.reshape", "(2, 3, 4)",
                 str(shape))


def test_error_concat_mismatch():
    assert_error(ShapeError, lambda a, b: flow.concat([a, b], axis=1), [((2, 3), F32), ((4, 3), F32)],
                 "flow.concat", "(2, 3)", "(4, 3)", "axis 1")
    assert_error(ShapeError, lambda a, b: flow.concat([a, b]), [((2, 3), F32), ((2, 3), np.float64)], "flow.concat",
                 "float32", "float64")


@pytest.mark.parametrize("shape,bias,data_format", [((4, 3), (4,), None), ((2, 3, 4, 5), (5,), "NCHW"),
                                                    ((2, 4, 5, 3), (4,), "NHWC"), ((4, 3), (1, 3), None)], ids=str)
def test_error_bias_add_size(shape, bias, data_format):
    assert_error(ShapeError, lambda x, b: flow.nn.bias_add(x, b, data_format=data_format),
                 [(shape, F32), (bias, F32)], "flow.nn.bias_add", str(shape), str(bias))


def test_error_bias_add_data_format():
    with pytest.raises(ValueError, match="data_format"):
        make_job(lambda x, b: flow.nn.bias_add(x, b, data_format="CHWN"), [((2, 3), F32), ((3,), F32)]).compiled()


def test_error_labels_logits_shape_mismatch():
    assert_error(ShapeError, lambda lab, lg: flow.nn.sparse_softmax_cross_entropy_with_logits(lab, lg),
                 [((4,), np.int32), ((5, 3), F32)], "flow.nn.sparse_softmax_cross_entropy_with_logits", "(4,)",
                 "(5, 3)")
    assert_error(ShapeError, lambda lab, lg: flow.nn.softmax_cross_entropy_with_logits(lab, lg),
                 [((5, 4), F32), ((5, 3), F32)], "flow.nn.softmax_cross_entropy_with_logits", "(5, 4)", "(5, 3)")


def test_error_sparse_labels_must_be_integers():
    assert_error(ShapeError, lambda lab, lg: flow.nn.sparse_softmax_cross_entropy_with_logits(lab, lg),
                 [((5,), F32), ((5, 3), F32)], "flow.nn.sparse_softmax_cross_entropy_with_logits", "labels",
                 "float32")


@pytest.mark.parametrize("name,build", [
    ("flow.math.exp", flow.math.exp),
    ("flow.math.log", flow.math.log),
    ("flow.math.sqrt", flow.math.sqrt),
    ("flow.math.sigmoid", flow.math.sigmoid),
    ("flow.math.tanh", flow.math.tanh),
    ("flow.nn.softmax", flow.nn.softmax),
    ("flow.math.reduce_mean", flow.math.reduce_mean),
    ("flow.math.divide", lambda x: x / x),
    ("flow.math.pow", lambda x: x ** 0.5),
], ids=lambda v: v if isinstance(v, str) else "")
def test_error_float_op_on_int_tensor(name, build):
    assert_error(ShapeError, build, [((3,), np.int32)], name, "int32")


@pytest.mark.parametrize("name,build", [
    ("flow.math.reduce_sum", lambda x: flow.math.reduce_sum(x, axis=2)),
    ("flow.math.reduce_mean", lambda x: flow.math.reduce_mean(x, axis=[0, -3])),
    ("flow.math.reduce_max", lambda x: flow.math.reduce_max(x, axis=[1, -1])),   # repeats an axis
    ("flow.nn.softmax", lambda x: flow.nn.softmax(x, axis=2)),
    ("flow.math.argmax", lambda x: flow.math.argmax(x, axis=-3)),
    ("flow.concat", lambda x: flow.concat([x, x], axis=2)),
    ("flow.transpose", lambda x: flow.transpose(x, (0, 0))),
    ("flow.transpose", lambda x: flow.transpose(x, (1, 0, 2))),
], ids=lambda v: v if isinstance(v, str) else "")
def test_error_bad_axis(name, build):
    assert_error(ShapeError, build, [((3, 4), F32)], name, "axis" if "transpose" not in name else "perm")


def test_error_reshape_shape_not_ints():
    with pytest.raises(TypeError, match="flow.reshape: shape must be a sequence of ints"):
        make_job(lambda x: flow.reshape(x, 6), [((2, 3), F32)]).compiled()


def test_error_pow_exponent_must_be_number():
    with pytest.raises(TypeError, match="flow.math.pow: exponent must be a number"):
        make_job(lambda x: flow.math.pow(x, x), [((2, 3), F32)]).compiled()


@pytest.mark.parametrize("call", [
    lambda: flow.constant(1.0),
    lambda: flow.math.exp(np.ones(3)),
    lambda: flow.math.reduce_sum([1.0, 2.0]),
    lambda: flow.nn.softmax(np.ones((2, 3))),
    lambda: flow.reshape(np.ones(4), (2, 2)),
    lambda: flow.nn.dropout(np.ones(3), 0.5),
    lambda: flow.get_variable("w", shape=(2,)),
])
def test_ops_outside_a_job_raise_trace_error(call):
    with pytest.raises(TraceError, match="outside a job function.*global_function"):
        call()


def test_tensor_of_another_job_is_rejected():
    leaked = []

    def first(x):
        leaked.append(x)
        return x * 1.0
    make_job(first, [((2,), F32)], name="first").compiled()
    with pytest.raises(TraceError, match="belongs to job 'first'"):
        make_job(lambda y: y + leaked[0], [((2,), F32)], name="second").compiled()
