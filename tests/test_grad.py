"""Gradients of every differentiable op against central finite differences (float64), through the real tracer,
autodiff and executor (``gradcheck.check_grad``). Dropout, whose mask changes per call, is checked by its semantics."""
import inspect

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.autodiff import gradients
from flowlab.errors import TraceError
from gradcheck import check_grad


def rnd(*shape, seed=0, low=None, high=None):
    rng = np.random.default_rng(seed)
    if low is not None:
        return rng.uniform(low, high, shape)
    return rng.standard_normal(shape)


def away_from_zero(*shape, seed=0, low=0.5, high=2.0):
    """Values with |x| in [low, high] and random signs: kinks at 0 are never probed."""
    rng = np.random.default_rng(seed)
    return rng.choice([-1.0, 1.0], shape) * rng.uniform(low, high, shape)


def distinct(*shape, seed=0, step=0.1):
    """Values at least ``step`` apart: no ties for max/min, even under finite-difference perturbation."""
    n = int(np.prod(shape, dtype=np.int64))
    return ((np.random.default_rng(seed).permutation(n) - n / 2) * step).reshape(shape)


def autodiff(build, inputs, seed_value):
    """Analytic gradients of ``sum(seed_value * build(*inputs))`` w.r.t. every input (``None`` where none flows)."""
    def job(*xs):
        y = build(*xs)
        loss = flow.math.reduce_sum(y * flow.constant(seed_value, dtype=y.dtype))
        grads = gradients([loss], list(xs), [flow.constant(1.0, dtype=loss.dtype)])
        return [loss] + [flow.constant(np.nan) if gr is None else gr for gr in grads]

    params = [inspect.Parameter(f"x{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                annotation=tp.Numpy.Placeholder(a.shape, dtype=a.dtype)) for i, a in enumerate(inputs)]
    job.__signature__ = inspect.Signature(params, return_annotation=tp.Bundle[tp.Numpy])
    return flow.global_function()(job)(*inputs)[1:]


# ------------------------------------------------------------------------------------------------- binary elementwise

BINARY = {
    "add": flow.math.add,
    "subtract": flow.math.subtract,
    "multiply": flow.math.multiply,
    "divide": flow.math.divide,
    "maximum": flow.math.maximum,
    "minimum": flow.math.minimum,
}

SHAPE_PAIRS = [
    ((3, 4), (3, 4)),
    ((3, 4), (4,)),       # y broadcast along rows
    ((4,), (3, 4)),       # x broadcast along rows
    ((3, 1), (1, 4)),     # both broadcast
    ((2, 3, 4), (3, 1)),  # rank and size-1 broadcast at once
    ((3, 4), ()),         # scalar tensor
]


@pytest.mark.parametrize("name", list(BINARY))
@pytest.mark.parametrize("shapes", SHAPE_PAIRS, ids=lambda s: f"{s[0]}-{s[1]}")
def test_binary_broadcast(name, shapes):
    fn = BINARY[name]
    a = rnd(*shapes[0], seed=1)
    b = away_from_zero(*shapes[1], seed=2) if name == "divide" else rnd(*shapes[1], seed=2)
    check_grad(fn, a, b)


@pytest.mark.parametrize("name", list(BINARY))
@pytest.mark.parametrize("scalar_first", [False, True])
def test_binary_with_python_number(name, scalar_first):
    fn = BINARY[name]
    a = away_from_zero(3, 4, seed=3)
    if scalar_first:
        def build(x):
            return fn(0.7, x)
    else:
        def build(x):
            return fn(x, 0.7)
    check_grad(build, a)


@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_max_min_ties_go_to_first_operand(name):
    x = np.array([1.0, 2.0, 3.0])
    y = np.array([1.0, 5.0, 0.0])           # tie, y wins max / x wins min, x wins max / y wins min
    w = np.array([0.5, -2.0, 3.0])
    dx, dy = autodiff(BINARY[name], [x, y], w)
    if name == "maximum":
        np.testing.assert_array_equal(dx, [0.5, 0.0, 3.0])
        np.testing.assert_array_equal(dy, [0.0, -2.0, 0.0])
    else:
        np.testing.assert_array_equal(dx, [0.5, -2.0, 0.0])
        np.testing.assert_array_equal(dy, [0.0, 0.0, 3.0])


# -------------------------------------------------------------------------------------------------- unary elementwise

UNARY = [
    ("negative", flow.math.negative, rnd(3, 4)),
    ("exp", flow.math.exp, rnd(3, 4)),
    ("log", flow.math.log, rnd(3, 4, low=0.2, high=3.0)),
    ("sqrt", flow.math.sqrt, rnd(3, 4, low=0.2, high=3.0)),
    ("square", flow.math.square, rnd(3, 4)),
    ("abs", flow.math.abs, away_from_zero(3, 4)),
    ("sigmoid", flow.math.sigmoid, rnd(3, 4) * 3),
    ("sigmoid_large", flow.math.sigmoid, np.array([-30.0, -8.0, -1.0, 0.0, 1.0, 8.0, 30.0])),
    ("tanh", flow.math.tanh, rnd(3, 4) * 2),
    ("relu", flow.nn.relu, away_from_zero(3, 4)),
    ("identity", flow.identity, rnd(3, 4)),
]


@pytest.mark.parametrize("name,fn,x", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name, fn, x):
    check_grad(fn, x)


@pytest.mark.parametrize("exponent", [2, 3, 0.5, -1.5, 1, 0])
def test_pow(exponent):
    x = rnd(3, 4, low=0.3, high=2.0)
    check_grad(lambda t: flow.math.pow(t, exponent), x)


def test_pow_negative_base_integer_exponent():
    check_grad(lambda t: flow.math.pow(t, 3), away_from_zero(2, 5))


PYTHON_OPERATORS = [
    ("x*2+1", lambda x, y: x * 2 + 1),
    ("1/x", lambda x, y: 1 / x),
    ("x-y", lambda x, y: x - y),
    ("2-x", lambda x, y: 2 - x),
    ("-x", lambda x, y: -x),
    ("x**3", lambda x, y: x ** 3),
    ("x/y", lambda x, y: x / y),
    ("x*y+x", lambda x, y: x * y + x),                  # x used twice: gradients accumulate
    ("(x+y)*(x-y)", lambda x, y: (x + y) * (x - y)),
    ("x@y^T", lambda x, y: x @ flow.transpose(y)),
    ("exp(x)*x/y", lambda x, y: flow.math.exp(x) * x / y),
]


@pytest.mark.parametrize("name,build", PYTHON_OPERATORS, ids=[p[0] for p in PYTHON_OPERATORS])
def test_python_operators(name, build):
    x = away_from_zero(3, 4, seed=5)
    y = away_from_zero(3, 4, seed=6)
    check_grad(build, x, y, wrt=[0, 1] if "y" in name else [0])


def test_gradient_accumulates_over_branches_of_different_shapes():
    def build(x, b):
        row = flow.math.reduce_sum(x, axis=1, keepdims=True)      # (3, 1)
        return flow.math.tanh(x * row + b) + flow.math.reduce_max(x, axis=0) * b
    check_grad(build, distinct(3, 4, seed=7), rnd(4, seed=8))


# ---------------------------------------------------------------------------------------------------------- reductions

REDUCTIONS = {"sum": flow.math.reduce_sum, "mean": flow.math.reduce_mean, "max": flow.math.reduce_max}
AXES = [None, 0, 1, -1, [0, 2], (1, 2), [0, 1, 2]]


@pytest.mark.parametrize("name", list(REDUCTIONS))
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(name, axis, keepdims):
    x = distinct(2, 3, 4, seed=9)
    check_grad(lambda t: REDUCTIONS[name](t, axis=axis, keepdims=keepdims), x)


def test_reduce_max_ties_share_the_gradient():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])
    w = np.array([1.0, -3.0])
    (dx,) = autodiff(lambda t: flow.math.reduce_max(t, axis=1), [x], w)
    np.testing.assert_allclose(dx, [[0.0, 0.5, 0.5], [-1.0, -1.0, -1.0]])


# -------------------------------------------------------------------------------------------------------------- matmul

@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("batch", [(), (2,)], ids=["2d", "3d"])
def test_matmul(transpose_a, transpose_b, batch):
    m, k, n = 3, 4, 5
    a = rnd(*batch, *((k, m) if transpose_a else (m, k)), seed=10)
    b = rnd(*batch, *((n, k) if transpose_b else (k, n)), seed=11)
    check_grad(lambda x, y: flow.matmul(x, y, transpose_a=transpose_a, transpose_b=transpose_b), a, b)


def test_matmul_alpha():
    check_grad(lambda x, y: flow.matmul(x, y, transpose_b=True, alpha=-2.5), rnd(3, 4, seed=1), rnd(2, 4, seed=2))


# --------------------------------------------------------------------------------------------------------- shape ops

@pytest.mark.parametrize("shape", [(-1, 4), (6, -1), (24,), (4, 3, 2), (2, -1, 3, 1)], ids=str)
def test_reshape(shape):
    # The weights of check_grad differ per output position, so a wrong element order in the VJP would show.
    check_grad(lambda t: flow.reshape(t, shape), rnd(2, 3, 4))


@pytest.mark.parametrize("perm", [(1, 0, 2), (2, 0, 1), (0, 2, 1), None], ids=str)
def test_transpose(perm):
    check_grad(lambda t: flow.transpose(t, perm), rnd(2, 3, 4))


@pytest.mark.parametrize("axis,shapes", [
    (0, [(2, 3), (1, 3), (4, 3)]),
    (1, [(2, 1), (2, 3), (2, 2)]),
    (-1, [(2, 3, 1), (2, 3, 2), (2, 3, 3)]),
], ids=["axis0", "axis1", "axis-1"])
def test_concat(axis, shapes):
    arrays = [rnd(*s, seed=i) for i, s in enumerate(shapes)]
    check_grad(lambda a, b, c: flow.concat([a, b, c], axis=axis), *arrays)


def test_concat_then_reuse_one_input():
    check_grad(lambda a, b: flow.concat([a, flow.math.tanh(b) + a, a], axis=1), rnd(2, 3, seed=1), rnd(2, 3, seed=2))


@pytest.mark.parametrize("axis,start,stop", [(0, 1, 3), (1, 0, 2), (-1, 2, 4)])
def test_slice_axis(axis, start, stop):
    # Not public API, but concat's VJP is built from it, so its own VJP (PadAxis) is what second users rely on.
    from flowlab.ops.array import slice_axis
    check_grad(lambda t: slice_axis(t, axis, start, stop), rnd(3, 4, 4))


@pytest.mark.parametrize("src,dst", [((4,), (3, 4)), ((3, 1), (2, 3, 4)), ((), (2, 2))], ids=str)
def test_broadcast_to_and_sum_to_shape(src, dst):
    from flowlab.ops.math import broadcast_to, sum_to_shape
    check_grad(lambda t: broadcast_to(t, dst), rnd(*src))
    check_grad(lambda t: sum_to_shape(t, src), rnd(*dst))


def test_add_n():
    check_grad(lambda a, b, c: flow.math.add_n([a, b, c, a]), rnd(2, 3, seed=1), rnd(2, 3, seed=2), rnd(2, 3, seed=3))


def test_non_differentiable_op_on_the_path_is_an_error():
    with pytest.raises(TraceError, match=r"Sign_\d+ \(flow.math.sign\) has no gradient"):
        autodiff(lambda t: flow.math.sign(t) * t, [rnd(3, 4)], np.ones((3, 4)))


def test_integer_results_carry_no_gradient():
    # argmax -> cast to float: the cast from int32 stops the gradient, so x gets none (the helper returns NaN).
    (dx,) = autodiff(lambda t: flow.cast(flow.math.argmax(t), flow.float64), [rnd(3, 4)], np.ones(3))
    assert np.isnan(dx)


@pytest.mark.parametrize("dtype_chain", [("float32",), ("float32", "float64"), ("float16",)])
def test_cast_chain_passes_gradient_through(dtype_chain):
    x = rnd(3, 4)
    w = rnd(3, 4, seed=1)

    def build(t):
        for dt in dtype_chain:
            t = flow.cast(t, dt)
        return flow.cast(t, flow.float64)
    (dx,) = autodiff(build, [x], w)
    expected = w
    for dt in reversed(dtype_chain):      # the backward pass casts the gradient through the chain in reverse
        expected = expected.astype(dt)
    assert dx.dtype == np.float64
    np.testing.assert_array_equal(dx, expected.astype(np.float64))
    np.testing.assert_allclose(dx, w, rtol=1e-3)


def test_cast_to_int_blocks_the_gradient():
    x = rnd(3, 4) * 3
    (dx,) = autodiff(lambda t: flow.cast(flow.cast(t, flow.int32), flow.float64) + t, [x], rnd(3, 4, seed=1))
    # Only the direct "+ t" path carries a gradient; the integer path contributes nothing.
    np.testing.assert_allclose(dx, rnd(3, 4, seed=1))


# --------------------------------------------------------------------------------------------------------------- nn

@pytest.mark.parametrize("shape,data_format,bias_len", [
    ((4, 3), None, 3),
    ((2, 3, 4, 5), "NCHW", 3),
    ((2, 3, 4, 5), None, 3),
    ((2, 4, 5, 3), "NHWC", 3),
    ((2, 5, 3), "NWC", 3),
], ids=["2d", "NCHW", "default-NC", "NHWC", "NWC"])
def test_bias_add(shape, data_format, bias_len):
    check_grad(lambda x, b: flow.nn.bias_add(x, b, data_format=data_format), rnd(*shape, seed=1),
               rnd(bias_len, seed=2))


@pytest.mark.parametrize("shape,axis", [((3, 5), -1), ((3, 5), 0), ((3, 5), None), ((2, 3, 4), 1)], ids=str)
def test_softmax(shape, axis):
    check_grad(lambda t: flow.nn.softmax(t, axis=axis), rnd(*shape) * 2)


@pytest.mark.parametrize("logits_shape", [(5, 4), (2, 3, 4)], ids=str)
def test_sparse_softmax_cross_entropy_wrt_logits(logits_shape):
    rng = np.random.default_rng(12)
    labels = rng.integers(0, logits_shape[-1], logits_shape[:-1]).astype(np.int32)
    logits = rnd(*logits_shape, seed=13) * 2
    check_grad(lambda lab, lg: flow.nn.sparse_softmax_cross_entropy_with_logits(lab, lg), labels, logits, wrt=[1])


@pytest.mark.filterwarnings("ignore:.*labels outside:RuntimeWarning")
def test_sparse_softmax_cross_entropy_out_of_range_labels_have_zero_gradient():
    labels = np.array([1, -1, 4, 0, 7], np.int32)     # 4 classes: rows 1, 2 and 4 are out of range
    logits = rnd(5, 4, seed=14)
    grads = check_grad(lambda lab, lg: flow.nn.sparse_softmax_cross_entropy_with_logits(lab, lg), labels, logits,
                       wrt=[1])
    np.testing.assert_array_equal(grads[1][[1, 2, 4]], 0.0)
    assert np.abs(grads[1][[0, 3]]).min() > 0


@pytest.mark.parametrize("normalized", [True, False], ids=["probabilities", "unnormalized"])
def test_softmax_cross_entropy_wrt_labels_and_logits(normalized):
    labels = rnd(4, 5, seed=15, low=0.05, high=1.0)
    if normalized:
        labels /= labels.sum(axis=1, keepdims=True)
    logits = rnd(4, 5, seed=16) * 2
    check_grad(lambda lab, lg: flow.nn.softmax_cross_entropy_with_logits(lab, lg), labels, logits)


def test_softmax_cross_entropy_3d():
    labels = rnd(2, 3, 4, seed=17, low=0.0, high=1.0)
    labels /= labels.sum(axis=-1, keepdims=True)
    check_grad(lambda lab, lg: flow.nn.softmax_cross_entropy_with_logits(lab, lg), labels, rnd(2, 3, 4, seed=18))


def test_small_network_end_to_end():
    """dense -> bias -> relu -> dense -> sparse cross entropy -> mean, gradient w.r.t. both weights."""
    rng = np.random.default_rng(19)
    x = rnd(6, 5, seed=20)
    labels = rng.integers(0, 3, 6).astype(np.int32)

    def build(xs, lab, w1, b1, w2):
        h = flow.nn.relu(flow.nn.bias_add(flow.matmul(xs, w1, transpose_b=True), b1))
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(lab, flow.matmul(h, w2))
        return flow.math.reduce_mean(loss)
    check_grad(build, x, labels, rnd(4, 5, seed=21), rnd(4, seed=22) + 0.5, rnd(4, 3, seed=23), wrt=[0, 2, 3, 4])


# ----------------------------------------------------------------------------------------------------------- dropout

def _dropout_train_job(shape, rate, noise_shape=None):
    """A train job returning (x, dropout(x), d sum(seed * dropout(x)) / dx) and training a dummy variable."""
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder(shape, dtype=flow.float64),
            seed: tp.Numpy.Placeholder(shape, dtype=flow.float64)) -> tp.Bundle[tp.Numpy]:
        y = flow.nn.dropout(x, rate=rate, noise_shape=noise_shape)
        loss = flow.math.reduce_sum(y * seed)
        (dx,) = gradients([loss], [x], [flow.constant(1.0, dtype=flow.float64)])
        w = flow.get_variable("dummy", shape=(1,), dtype=flow.float32)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(
            flow.math.reduce_sum(w * w))
        return y, dx
    return job


@pytest.mark.parametrize("rate", [0.25, 0.6])
def test_dropout_train_semantics_and_gradient(rate):
    shape = (200, 50)
    x = rnd(*shape, seed=24, low=0.5, high=2.0)      # nonzero, so the mask can be read off the output
    seed = rnd(*shape, seed=25)
    job = _dropout_train_job(shape, rate)
    y, dx = job(x, seed)
    mask = y / x
    kept = mask != 0
    scale = 1.0 / (1.0 - rate)
    # Each element is either dropped or scaled by exactly 1 / (1 - rate).
    np.testing.assert_allclose(mask[kept], scale, rtol=1e-12)
    # About `rate` of the elements are dropped: 10000 Bernoulli draws, 5 standard deviations.
    n = mask.size
    assert abs((~kept).sum() / n - rate) < 5 * np.sqrt(rate * (1 - rate) / n)
    # The gradient is the seed times the same scaled mask that made the output.
    np.testing.assert_allclose(dx, seed * mask, rtol=1e-12)
    # A second call draws a new mask.
    y2, _ = job(x, seed)
    assert not np.array_equal(y2 != 0, kept)


def test_dropout_noise_shape_broadcasts_one_mask_over_an_axis():
    shape = (64, 32)
    x = rnd(*shape, seed=26, low=0.5, high=2.0)
    y, dx = _dropout_train_job(shape, 0.5, noise_shape=(1, 32))(x, np.ones(shape))
    mask = y / x
    np.testing.assert_allclose(mask, np.broadcast_to(mask[:1], shape))   # one mask per column
    assert set(np.round(np.unique(mask), 12)) <= {0.0, 2.0}
    assert 0 < (mask[0] == 0).sum() < 32
    np.testing.assert_allclose(dx, mask)


def test_dropout_is_identity_in_predict_jobs():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4, 5), dtype=flow.float64)) -> tp.Numpy:
        return flow.nn.dropout(x, rate=0.5) * 1.0

    x = rnd(4, 5)
    np.testing.assert_array_equal(job(x), x)
    assert not any(n.op.__name__ == "Dropout" for n in job.graph().nodes)
    check_grad(lambda t: flow.nn.dropout(t, rate=0.5), x)   # predict-job gradient: the identity's
