"""Convolution and pooling: forward against plain loops, gradients against finite differences, layer names, argument
errors, and a small CNN that learns the bundled digits."""
import re
import time

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.autodiff import gradients
from flowlab.errors import ShapeError
from flowlab.runtime import session
from gradcheck import check_grad


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def distinct(*shape, seed=0, step=0.1):
    """Values at least ``step`` apart: no ties for max, even under finite-difference perturbation."""
    n = int(np.prod(shape))
    return ((np.random.default_rng(seed).permutation(n) - n / 2) * step).reshape(shape)


def run(build, *arrays):
    """Run ``build`` on float64 placeholders shaped like ``arrays`` in a predict job."""
    specs = [tp.Numpy.Placeholder(a.shape, dtype=flow.float64) for a in arrays]
    if len(arrays) == 1:
        def job(x: specs[0]) -> tp.Numpy:
            return build(x)
    else:
        def job(x: specs[0], w: specs[1]) -> tp.Numpy:
            return build(x, w)
    return flow.global_function()(job)(*arrays)


# ------------------------------------------------------------------------------------------------- slow references

def tf_same(n, k, s, d=1):
    """TensorFlow's SAME padding of one axis: output ceil(n / s), the odd pixel at the end."""
    span = (k - 1) * d + 1
    total = max((-(-n // s) - 1) * s + span - n, 0)
    return total // 2, total - total // 2


def ref_conv(x, w, strides, pads, dilations=(1, 1), groups=1):
    """NCHW cross-correlation, one output element at a time."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (dh, dw) = strides, dilations
    x = np.pad(x, ((0, 0), (0, 0)) + tuple(pads))
    ho = (x.shape[2] - (kh - 1) * dh - 1) // sh + 1
    wo = (x.shape[3] - (kw - 1) * dw - 1) // sw + 1
    out = np.zeros((n, o, ho, wo))
    for b in range(n):
        for oc in range(o):
            g = oc // (o // groups)
            for i in range(ho):
                for j in range(wo):
                    for ci in range(cg):
                        for ki in range(kh):
                            for kj in range(kw):
                                out[b, oc, i, j] += x[b, g * cg + ci, i * sh + ki * dh, j * sw + kj * dw] * \
                                    w[oc, ci, ki, kj]
    return out


def ref_pool(x, k, s, pads, reduce):
    """NCHW pooling over the input elements of each window (padding excluded)."""
    n, c, h, w = x.shape
    (top, bottom), (left, right) = pads
    ho, wo = (h + top + bottom - k) // s + 1, (w + left + right - k) // s + 1
    out = np.zeros((n, c, ho, wo))
    for i in range(ho):
        for j in range(wo):
            r0, c0 = i * s - top, j * s - left
            window = x[:, :, max(r0, 0):min(r0 + k, h), max(c0, 0):min(c0 + k, w)]
            out[:, :, i, j] = reduce(window, axis=(2, 3))
    return out


def nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def nchw(a):
    return a.transpose(0, 3, 1, 2)


# ------------------------------------------------------------------------------------------------------ conv forward

CONV_CASES = [
    # x shape (NCHW), w shape, strides, padding, dilations, groups
    ((2, 3, 7, 7), (4, 3, 3, 3), 1, "VALID", 1, 1),
    ((2, 3, 8, 8), (4, 3, 3, 3), 2, "SAME", 1, 1),
    ((1, 2, 7, 6), (3, 2, 2, 3), (2, 1), "same", 1, 1),
    ((2, 3, 7, 7), (4, 3, 3, 2), 1, [1, (0, 2)], 1, 1),
    ((1, 2, 9, 9), (3, 2, 3, 3), 1, "VALID", 2, 1),
    ((1, 2, 9, 8), (2, 2, 3, 3), 2, "SAME", 2, 1),
    ((2, 4, 6, 6), (6, 2, 3, 3), 1, "SAME", 1, 2),
    ((2, 3, 6, 6), (6, 1, 3, 3), 2, "SAME", 1, 3),   # depthwise, channel multiplier 2
]


def _ref_pads(x_shape, w_shape, strides, padding, dilations):
    s, d = np.broadcast_to(strides, 2), np.broadcast_to(dilations, 2)
    if isinstance(padding, str):
        if padding.upper() == "VALID":
            return ((0, 0), (0, 0))
        return tuple(tf_same(x_shape[2 + a], w_shape[2 + a], s[a], d[a]) for a in range(2))
    return tuple((p, p) if isinstance(p, int) else tuple(p) for p in padding)


@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
@pytest.mark.parametrize("x_shape, w_shape, strides, padding, dilations, groups", CONV_CASES)
def test_conv2d_matches_loops(x_shape, w_shape, strides, padding, dilations, groups, data_format):
    x, w = rnd(*x_shape, seed=1), rnd(*w_shape, seed=2)
    pads = _ref_pads(x_shape, w_shape, strides, padding, dilations)
    expected = ref_conv(x, w, np.broadcast_to(strides, 2), pads, np.broadcast_to(dilations, 2), groups)
    if data_format == "NHWC":
        x, w = nhwc(x), nhwc(w)     # filters (O, C/g, kh, kw) -> (O, kh, kw, C/g): the same permutation
    got = run(lambda a, b: flow.nn.conv2d(a, b, strides, padding, data_format, dilations, groups), x, w)
    np.testing.assert_allclose(nchw(got) if data_format == "NHWC" else got, expected, rtol=1e-12, atol=1e-12)


def test_same_padding_puts_the_odd_pixel_at_the_end():
    x, w = rnd(1, 1, 8, 8), rnd(1, 1, 3, 3)
    same = run(lambda a, b: flow.nn.conv2d(a, b, 2, "SAME"), x, w)
    explicit = run(lambda a, b: flow.nn.conv2d(a, b, 2, [(0, 1), (0, 1)]), x, w)
    lower = run(lambda a, b: flow.nn.conv2d(a, b, 2, "SAME_LOWER"), x, w)
    assert same.shape == (1, 1, 4, 4)
    np.testing.assert_allclose(same, explicit, rtol=1e-12)
    np.testing.assert_allclose(lower, ref_conv(x, w, (2, 2), ((1, 0), (1, 0))), rtol=1e-12)


def test_conv2d_accepts_oneflow_four_pair_padding():
    x, w = rnd(1, 2, 5, 5), rnd(3, 2, 3, 3)
    got = run(lambda a, b: flow.nn.conv2d(a, b, 1, [[0, 0], [0, 0], [1, 1], [2, 0]]), x, w)
    np.testing.assert_allclose(got, ref_conv(x, w, (1, 1), ((1, 1), (2, 0))), rtol=1e-12)
    got = run(lambda a, b: flow.nn.conv2d(a, b, 1, [[0, 0], [1, 1], [2, 0], [0, 0]], "NHWC"), nhwc(x), nhwc(w))
    np.testing.assert_allclose(nchw(got), ref_conv(x, w, (1, 1), ((1, 1), (2, 0))), rtol=1e-12)


def test_conv2d_op_name_and_float32():
    @flow.global_function()
    def f(x: tp.Numpy.Placeholder((1, 1, 4, 4)), w: tp.Numpy.Placeholder((2, 1, 3, 3))) -> tp.Numpy:
        y = flow.nn.conv2d(x, w, 1, "SAME")
        assert re.fullmatch(r"Conv2d_\d+", y.op_name) and y.dtype == np.float32
        named = flow.nn.conv2d(x, w, 1, "SAME", name="my_conv")
        assert named.op_name == "my_conv"
        return y

    x, w = rnd(1, 1, 4, 4).astype(np.float32), rnd(2, 1, 3, 3).astype(np.float32)
    np.testing.assert_allclose(f(x, w), ref_conv(x, w, (1, 1), ((1, 1), (1, 1))), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------------- pool forward

POOL_CASES = [
    # x shape (NCHW), ksize, strides, padding
    ((2, 3, 8, 8), 2, 2, "VALID"),
    ((2, 3, 7, 7), 3, 2, "SAME"),
    ((1, 2, 6, 6), 3, 1, [1, (0, 2)]),
]


@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
@pytest.mark.parametrize("x_shape, ksize, strides, padding", POOL_CASES)
@pytest.mark.parametrize("pool, reduce", [(flow.nn.max_pool2d, np.max), (flow.nn.avg_pool2d, np.mean)])
def test_pooling_matches_loops(pool, reduce, x_shape, ksize, strides, padding, data_format):
    x = rnd(*x_shape, seed=3)
    pads = _ref_pads(x_shape, (0, 0, ksize, ksize), strides, padding, 1)
    expected = ref_pool(x, ksize, strides, pads, reduce)
    feed = nhwc(x) if data_format == "NHWC" else x
    got = run(lambda a: pool(a, ksize, strides, padding, data_format), feed)
    np.testing.assert_allclose(nchw(got) if data_format == "NHWC" else got, expected, rtol=1e-12)


def test_pooling_non_square_window_and_avg_divisor():
    x = rnd(1, 2, 5, 6, seed=4)
    got = run(lambda a: flow.nn.max_pool2d(a, (2, 3), (1, 2), "SAME"), x)
    # SAME, rows: k 2 s 1 -> pads (0, 1); cols: k 3 s 2 on 6 -> out 3, total 1 -> pads (0, 1)
    padded = np.pad(x, ((0, 0), (0, 0), (0, 1), (0, 1)), constant_values=-np.inf)
    expected = np.stack([np.stack([padded[:, :, i:i + 2, 2 * j:2 * j + 3].max(axis=(2, 3)) for j in range(3)], -1)
                         for i in range(5)], -2)
    np.testing.assert_allclose(got, expected)
    # TensorFlow divides a SAME window by its input elements only: a corner 3x3 window over ones is 1, not 4/9.
    ones = run(lambda a: flow.nn.avg_pool2d(a, 3, 1, "SAME"), np.ones((1, 1, 4, 4)))
    np.testing.assert_allclose(ones, np.ones((1, 1, 4, 4)))


def test_pool_op_names():
    @flow.global_function()
    def f(x: tp.Numpy.Placeholder((1, 1, 4, 4))) -> tp.Numpy:
        a = flow.nn.max_pool2d(x, 2, 2, "VALID")
        b = flow.nn.avg_pool2d(x, 2, 2, "VALID")
        assert re.fullmatch(r"MaxPool2D_\d+", a.op_name) and re.fullmatch(r"AvgPool2D_\d+", b.op_name)
        return a + b

    assert f(np.zeros((1, 1, 4, 4), np.float32)).shape == (1, 1, 2, 2)


# ----------------------------------------------------------------------------------------------------------- gradients

@pytest.mark.parametrize("x_shape, w_shape, strides, padding, dilations, groups, data_format", [
    ((2, 3, 6, 6), (4, 3, 3, 3), 1, "VALID", 1, 1, "NCHW"),
    ((2, 3, 7, 7), (4, 3, 3, 3), 2, "SAME", 1, 1, "NCHW"),
    ((1, 2, 7, 7), (3, 2, 3, 2), (2, 1), [1, (0, 2)], 2, 1, "NCHW"),
    ((2, 4, 6, 6), (4, 2, 3, 3), 1, "SAME", 1, 2, "NCHW"),
    ((1, 3, 6, 5), (6, 1, 3, 3), 2, "SAME", 1, 3, "NCHW"),
    ((2, 6, 5, 3), (4, 3, 3, 3), 2, "SAME", 1, 1, "NHWC"),
    ((1, 7, 7, 4), (4, 2, 2, 2), 1, "VALID", 2, 2, "NHWC"),
])
def test_conv2d_gradients(x_shape, w_shape, strides, padding, dilations, groups, data_format):
    def conv(x, w):
        return flow.nn.conv2d(x, w, strides, padding, data_format, dilations, groups)
    check_grad(conv, rnd(*x_shape, seed=5), rnd(*w_shape, seed=6), max_points=30)


@pytest.mark.parametrize("ksize, strides, padding, data_format", [
    (2, 2, "VALID", "NCHW"), (3, 2, "SAME", "NCHW"), ((2, 3), 1, [1, (0, 2)], "NCHW"), (3, (1, 2), "SAME", "NHWC"),
])
@pytest.mark.parametrize("pool", [flow.nn.max_pool2d, flow.nn.avg_pool2d])
def test_pooling_gradients(pool, ksize, strides, padding, data_format):
    check_grad(lambda x: pool(x, ksize, strides, padding, data_format), distinct(2, 3, 6, 7), max_points=40)


def test_max_pool_gradient_goes_to_the_first_maximum_on_ties():
    @flow.global_function()
    def f(x: tp.Numpy.Placeholder((1, 1, 4, 4), dtype=flow.float64)) -> tp.Numpy:
        y = flow.nn.max_pool2d(x, 2, 2, "VALID")
        return gradients([y], [x], [flow.constant(np.arange(1.0, 5.0).reshape(1, 1, 2, 2))])[0]

    x = np.array([[5, 5, 1, 2], [5, 5, 3, 3], [0, 0, 7, 1], [0, 0, 7, 7]], np.float64).reshape(1, 1, 4, 4)
    expected = np.array([[1, 0, 0, 0], [0, 0, 2, 0], [3, 0, 4, 0], [0, 0, 0, 0]], np.float64)
    np.testing.assert_array_equal(f(x)[0, 0], expected)


def test_max_pool_of_a_nan_window_is_nan_and_passes_no_gradient():
    @flow.global_function()
    def f(x: tp.Numpy.Placeholder((1, 1, 4, 4), dtype=flow.float64)) -> tp.Numpy:
        y = flow.nn.max_pool2d(x, 2, 2, "VALID")
        return y, gradients([y], [x], [flow.constant(np.arange(1.0, 5.0).reshape(1, 1, 2, 2))])[0]

    x = np.arange(16.0).reshape(1, 1, 4, 4)
    x[0, 0, 0, 1] = np.nan
    y, dx = f(x)
    assert np.isnan(y[0, 0, 0, 0]) and y[0, 0].ravel()[1:].tolist() == [7.0, 13.0, 15.0]
    expected = np.zeros((4, 4))
    expected[1, 3], expected[3, 1], expected[3, 3] = 2, 3, 4
    np.testing.assert_array_equal(dx[0, 0], expected)


def test_layers_conv2d_input_gradient():
    def layer(x):
        return flow.layers.conv2d(x, 4, (3, 2), strides=(1, 2), padding="SAME", dilation_rate=(2, 1), groups=2,
                                  activation=flow.math.tanh, bias_initializer=flow.random_uniform_initializer(-1, 1))
    check_grad(layer, rnd(2, 4, 6, 7, seed=9), max_points=40)


def test_layers_conv2d_gradients_in_a_training_job():
    # float32, because the optimizer seeds float64 losses with float32 ones; the finite differences are taken in
    # float64 on the loop reference, from the layer's initial variables.
    x, target = rnd(2, 6, 6, 3, seed=7).astype(np.float32), rnd(2, 6, 6, 4, seed=8).astype(np.float32)
    lr = 0.5

    def model(images):
        return flow.layers.conv2d(images, 4, 3, padding="SAME", data_format="NHWC", activation=flow.math.tanh,
                                  name="c1", kernel_initializer=flow.random_uniform_initializer(-0.5, 0.5),
                                  bias_initializer=flow.random_uniform_initializer(-0.5, 0.5))

    @flow.global_function()
    def predict(images: tp.Numpy.Placeholder(x.shape)) -> tp.Numpy:
        return model(images)

    @flow.global_function(type="train")
    def train(images: tp.Numpy.Placeholder(x.shape)) -> tp.Numpy:
        y = model(images)
        assert y.op_name == "c1_activation"
        assert [n.name for n in y.graph.nodes if n.op.__name__ in ("Conv2d", "BiasAdd")] == \
            ["c1_conv2d", "c1_bias_add"]
        loss = flow.math.reduce_sum(flow.math.square(y - flow.constant(target)))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [lr]), momentum=0.9).minimize(loss)
        return loss

    def ref_output(weight, bias):   # weight (O, kh, kw, C) as NHWC layers store it
        y = ref_conv(nchw(x.astype(np.float64)), nchw(weight), (1, 1), ((1, 1), (1, 1))) + bias[:, None, None]
        return nhwc(np.tanh(y))

    def ref_loss(weight, bias):
        return float(np.sum((ref_output(weight, bias) - target) ** 2))

    y = predict(x)   # initialises the variables the train job shares by name
    variables = session.default().variables
    assert variables["c1-weight"].shape == (4, 3, 3, 3) and variables["c1-bias"].shape == (4,)
    before = [variables[name].numpy().astype(np.float64) for name in ("c1-weight", "c1-bias")]
    np.testing.assert_allclose(y, ref_output(*before), rtol=1e-5, atol=1e-6)
    loss = train(x)   # the first momentum step is a plain SGD step: w -= lr * grad
    np.testing.assert_allclose(loss, ref_loss(*before), rtol=1e-5)
    rng, eps = np.random.default_rng(0), 1e-6
    for i, name in enumerate(("c1-weight", "c1-bias")):
        grad = (before[i] - variables[name].numpy().astype(np.float64)).reshape(-1) / lr
        for p in rng.choice(grad.size, min(grad.size, 20), replace=False):
            plus, minus = [v.copy() for v in before], [v.copy() for v in before]
            plus[i].reshape(-1)[p] += eps
            minus[i].reshape(-1)[p] -= eps
            numeric = (ref_loss(*plus) - ref_loss(*minus)) / (2 * eps)
            np.testing.assert_allclose(grad[p], numeric, rtol=1e-4, atol=1e-4, err_msg=f"{name}[{p}]")


def test_layers_conv2d_names_shapes_and_options():
    @flow.global_function()
    def f(x: tp.Numpy.Placeholder((2, 4, 5, 5))) -> tp.Numpy:
        a = flow.layers.conv2d(x, 6, (3, 1), strides=2, padding="SAME", groups=2)
        prefix = a.op_name[:-len("_bias_add")]
        assert a.shape == (2, 6, 3, 3) and re.fullmatch(r"Conv2d_\d+_bias_add", a.op_name)
        b = flow.layers.conv2d(x, 3, use_bias=False, weight_name="shared_w")
        assert re.fullmatch(r"Conv2d_\d+_conv2d", b.op_name)
        names.extend([prefix, b.op_name[:-len("_conv2d")]])
        return a

    names = []
    f(np.zeros((2, 4, 5, 5), np.float32))
    variables = session.default().variables
    assert variables[f"{names[0]}-weight"].shape == (6, 2, 3, 1)
    assert variables[f"{names[0]}-bias"].shape == (6,)
    assert variables["shared_w"].shape == (3, 4, 1, 1) and f"{names[1]}-bias" not in variables


# ------------------------------------------------------------------------------------------------------------- errors

def trace(build, shape=(2, 3, 8, 8), w_shape=(4, 3, 3, 3)):
    @flow.global_function()
    def f(x: tp.Numpy.Placeholder(shape), w: tp.Numpy.Placeholder(w_shape)) -> tp.Numpy:
        return build(x, w)

    f.compiled()


@pytest.mark.parametrize("build, error, match", [
    (lambda x, w: flow.nn.conv2d(x, w, 1, "SAME", data_format="NCWH"), ValueError, r"data_format.*'NCWH'"),
    (lambda x, w: flow.nn.conv2d(x, w, 1, "FULL"), ValueError, r"padding must be .*'FULL'"),
    (lambda x, w: flow.nn.conv2d(x, w, 1, [1, 2, 3]), ValueError, r"padding must be .*\[1, 2, 3\]"),
    (lambda x, w: flow.nn.conv2d(x, w, 1, [[1, 1], [0, 0], [1, 1], [1, 1]]), ValueError, "padding must be"),
    (lambda x, w: flow.nn.conv2d(x, w, 0, "SAME"), ValueError, r"strides must be an int >= 1 .*got 0"),
    (lambda x, w: flow.nn.conv2d(x, w, (1, 2, 3), "SAME"), ValueError, r"strides .*\(1, 2, 3\)"),
    (lambda x, w: flow.nn.conv2d(x, w, 1, "SAME", dilations=-1), ValueError, r"dilations .*got -1"),
    (lambda x, w: flow.nn.conv2d(x, w, 1, "SAME", groups=0), ValueError, r"groups must be a positive int, got 0"),
    (lambda x, w: flow.nn.conv2d(flow.reshape(x, (6, 8, 8)), w, 1, "SAME"), ShapeError,
     r"input must be a 4-D NCHW tensor, got shape \(6, 8, 8\)"),
    (lambda x, w: flow.nn.conv2d(x, flow.reshape(w, (4, 27)), 1, "SAME"), ShapeError,
     r"filters must be 4-D .*got shape \(4, 27\)"),
    (lambda x, w: flow.nn.conv2d(x, w, 1, "SAME", groups=3), ShapeError,
     r"input \(2, 3, 8, 8\) has 3 channels .*filters \(4, 3, 3, 3\).* = 9"),
    (lambda x, w: flow.nn.conv2d(x, w, 1, "SAME", data_format="NHWC"), ShapeError,
     r"input \(2, 3, 8, 8\) has 8 channels \(NHWC\) but filters \(4, 3, 3, 3\)"),
    (lambda x, w: flow.nn.conv2d(x, flow.reshape(w, (6, 2, 3, 3)), 1, "SAME"), ShapeError,
     r"input \(2, 3, 8, 8\) has 3 channels .*filters \(6, 2, 3, 3\).* = 2"),
    (lambda x, w: flow.nn.conv2d(flow.reshape(x, (2, 4, 8, 6)), flow.reshape(w, (27, 1, 2, 2)), 1, "SAME",
                                 groups=4), ShapeError, r"filters \(27, 1, 2, 2\): out_channels 27 .* groups 4"),
    (lambda x, w: flow.nn.conv2d(x, w, 1, "VALID", dilations=4), ShapeError,
     r"filters kernel .*\(3, 3\) \(dilated: \(9, 9\)\) is larger than the padded input .*\(8, 8\)"),
    (lambda x, w: flow.nn.conv2d(x, flow.cast(w, flow.float64), 1, "SAME"), ShapeError, "one floating dtype"),
    (lambda x, w: flow.nn.max_pool2d(x, 9, 1, "VALID"), ShapeError, r"ksize \(9, 9\) .*larger than the padded"),
    (lambda x, w: flow.nn.max_pool2d(x, 2, 2, [2, 0]), ShapeError, r"padding .* smaller than ksize \(2, 2\)"),
    (lambda x, w: flow.nn.avg_pool2d(x, 2, 2, "SAME", data_format="HWC"), ValueError, r"data_format .*'HWC'"),
    (lambda x, w: flow.nn.avg_pool2d(x, (2, 0), 2, "SAME"), ValueError, r"ksize must be .*\(2, 0\)"),
    (lambda x, w: flow.nn.avg_pool2d(flow.reshape(x, (6, 8, 8)), 2, 2, "SAME"), ShapeError,
     r"input must be a 4-D NCHW tensor"),
    (lambda x, w: flow.layers.conv2d(x, 0), ValueError, r"filters must be a positive int .*got 0"),
    (lambda x, w: flow.layers.conv2d(x, 4, groups=2), ValueError, r"groups must be .*channels \(3\)"),
    (lambda x, w: flow.layers.conv2d(x, 4, kernel_size=(3, 3, 3)), ValueError, r"kernel_size .*\(3, 3, 3\)"),
    (lambda x, w: flow.layers.conv2d(flow.reshape(x, (6, 64)), 4), ValueError, r"inputs must be a 4-D"),
])
def test_bad_arguments_are_named(build, error, match):
    with pytest.raises(error, match=match):
        trace(build)


def test_shape_errors_point_at_the_user_line():
    with pytest.raises(ShapeError, match=r"flow\.nn\.conv2d: .*test_conv\.py:\d+"):
        trace(lambda x, w: flow.nn.conv2d(x, w, 1, "SAME", groups=3))


# ---------------------------------------------------------------------------------------------------------- end to end

def test_small_cnn_learns_digits():
    batch = 50
    (train_x, train_y), (test_x, test_y) = flow.data.load_digits(train_batch_size=batch, test_batch_size=batch)

    def model(images):
        h = flow.layers.conv2d(images, 16, 3, padding="SAME", activation=flow.nn.relu, name="conv1")
        h = flow.nn.max_pool2d(h, 2, 2, "VALID")
        return flow.layers.dense(flow.reshape(h, (batch, -1)), 10, name="fc")

    @flow.global_function(type="train")
    def train(images: tp.Numpy.Placeholder((batch, 1, 8, 8)),
              labels: tp.Numpy.Placeholder((batch,), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, model(images))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss)
        return loss

    @flow.global_function()
    def predict(images: tp.Numpy.Placeholder((batch, 1, 8, 8))) -> tp.Numpy:
        return flow.math.argmax(model(images))

    start = time.perf_counter()
    for _ in range(4):
        for x, y in zip(train_x, train_y):
            train(x, y)
    correct = sum(int((predict(x) == y).sum()) for x, y in zip(test_x, test_y))
    accuracy = correct / test_y.size
    assert accuracy > 0.9, accuracy
    assert time.perf_counter() - start < 20   # about half a second on two cores
