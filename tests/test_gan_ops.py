"""DCGAN's ops: ``nn.conv2d_transpose`` (output shapes and padding as OneFlow 0.3.4 derives them), ``nn.compat_conv2d``,
``nn.leaky_relu`` and ``nn.sigmoid_cross_entropy_with_logits``: kernels against PyTorch, gradients against finite
differences in float64, and their argument errors."""
import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.errors import ShapeError
from gradcheck import check_grad
from test_conv import nchw, nhwc, rnd, run


# -------------------------------------------------------------------------------------------- conv2d_transpose

def torch_transpose(x, w, strides, dilations, out_hw, padding):
    """PyTorch's full transposed convolution, cropped as OneFlow 0.3.4 crops it: ``SAME`` drops ``needed // 2``
    leading pixels (``needed = max(0, (in - 1) * stride + span - out)``), ``VALID`` none; outputs past the full
    result (OneFlow's ``output_padding``) are 0."""
    torch = pytest.importorskip("torch")
    full = torch.nn.functional.conv_transpose2d(torch.tensor(x), torch.tensor(w), stride=strides,
                                                dilation=dilations).numpy()
    out = np.zeros(x.shape[:1] + w.shape[1:2] + tuple(out_hw))
    index = []
    for axis in range(2):
        n, k, s, d = x.shape[2 + axis], w.shape[2 + axis], strides[axis], dilations[axis]
        needed = max(0, (n - 1) * s + (k - 1) * d + 1 - out_hw[axis]) if padding == "SAME" else 0
        start = needed // 2
        stop = min(full.shape[2 + axis], start + out_hw[axis])
        index.append((start, stop))
    (r0, r1), (c0, c1) = index
    out[:, :, :r1 - r0, :c1 - c0] = full[:, :, r0:r1, c0:c1]
    return out


TRANSPOSE_CASES = [
    # x shape (NCHW), filters (C_in, C_out, kh, kw), strides, dilations, padding, output (h, w)
    ((2, 4, 7, 7), (4, 3, 5, 5), (2, 2), (1, 1), "SAME", (14, 14)),      # DCGAN's layers: odd crop (1, 2)
    ((2, 4, 7, 7), (4, 3, 5, 5), (1, 1), (1, 1), "SAME", (7, 7)),        # even crop (2, 2)
    ((1, 2, 4, 5), (2, 3, 3, 2), (2, 3), (1, 1), "SAME", (7, 15)),       # output below in * stride
    ((1, 2, 3, 3), (2, 2, 1, 1), (3, 3), (1, 1), "SAME", (9, 8)),        # nothing to crop: zeros at the end
    ((2, 3, 4, 4), (3, 2, 3, 3), (1, 1), (1, 1), "VALID", (6, 6)),
    ((1, 3, 4, 3), (3, 2, 3, 2), (2, 2), (1, 1), "VALID", (10, 7)),      # output_padding 1 on both axes
    ((1, 2, 4, 4), (2, 2, 3, 3), (2, 1), (2, 2), "VALID", (11, 8)),      # dilated
    ((1, 2, 5, 4), (2, 3, 4, 3), (2, 2), (2, 1), "SAME", (10, 8)),       # dilated, SAME
]


@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
@pytest.mark.parametrize("x_shape, w_shape, strides, dilations, padding, out_hw", TRANSPOSE_CASES)
def test_conv2d_transpose_matches_pytorch(x_shape, w_shape, strides, dilations, padding, out_hw, data_format):
    x, w = rnd(*x_shape, seed=1), rnd(*w_shape, seed=2)
    expected = torch_transpose(x, w, strides, dilations, out_hw, padding)
    output_shape = (x_shape[0], w_shape[1]) + out_hw
    if data_format == "NHWC":
        x, w = nhwc(x), nhwc(w)          # filters (C_in, C_out, kh, kw) -> (C_in, kh, kw, C_out)
        output_shape = (output_shape[0],) + out_hw + (output_shape[1],)
    got = run(lambda a, b: flow.nn.conv2d_transpose(a, b, output_shape=output_shape, strides=strides,
                                                    padding=padding, data_format=data_format, dilations=dilations),
              x, w)
    np.testing.assert_allclose(nchw(got) if data_format == "NHWC" else got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", [0, 2, 3, 5, 7])
def test_conv2d_transpose_gradients(case, data_format):
    x_shape, w_shape, strides, dilations, padding, out_hw = TRANSPOSE_CASES[case]
    x, w = rnd(*x_shape, seed=3), rnd(*w_shape, seed=4)
    output_shape = (x_shape[0], w_shape[1]) + out_hw
    if data_format == "NHWC":
        x, w = nhwc(x), nhwc(w)
        output_shape = (output_shape[0],) + out_hw + (output_shape[1],)
    check_grad(lambda a, b: flow.nn.conv2d_transpose(a, b, output_shape=output_shape, strides=strides,
                                                     padding=padding, data_format=data_format,
                                                     dilations=dilations), x, w)


def test_conv2d_transpose_is_the_input_gradient_of_the_convolution_back():
    """<conv2d_transpose(y, w), x> == <y, conv2d(x, w)> for the padding it derives: the two are adjoint."""
    y, w, x = rnd(2, 4, 7, 7, seed=5), rnd(4, 3, 5, 5, seed=6), rnd(2, 3, 14, 14, seed=7)
    up = run(lambda a, b: flow.nn.conv2d_transpose(a, b, output_shape=(2, 3, 14, 14), strides=2, padding="SAME"),
             y, w)
    down = run(lambda a, b: flow.nn.conv2d(a, b, 2, [(1, 2), (1, 2)]), x, w)
    assert np.isclose(np.vdot(up, x), np.vdot(y, down), rtol=1e-12)


def test_conv2d_transpose_default_output_shape_aliases_and_channels_from_filters():
    x, w = rnd(1, 4, 3, 5, seed=8), rnd(4, 2, 3, 3, seed=9)
    same = run(lambda a, b: flow.nn.conv2d_transpose(input=a, filters=b, strides=2, padding="same"), x, w)
    assert same.shape == (1, 2, 6, 10)
    valid = run(lambda a, b: flow.nn.conv2d_transpose(a, b, strides=2), x, w)
    assert valid.shape == (1, 2, 7, 11)
    # DCGAN's layers pass the input's channel count in output_shape; the filters decide (OneFlow 0.2 and 0.3.5)
    dcgan = run(lambda a, b: flow.nn.conv2d_transpose(a, b, output_shape=(1, 4, 6, 10), strides=[2, 2],
                                                      padding="SAME"), x, w)
    np.testing.assert_array_equal(dcgan, same)


def test_conv2d_transpose_names_its_node_like_oneflow():
    flow.clear_default_session()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((1, 2, 3, 3))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(2, 1, 3, 3), initializer=flow.ones_initializer())
        unnamed = flow.nn.conv2d_transpose(x, w, output_shape=(1, 1, 6, 6), strides=2, padding="SAME")
        named = flow.nn.conv2d_transpose(x, w, output_shape=(1, 1, 6, 6), strides=2, padding="SAME", name="up")
        return unnamed + named

    assert job(np.ones((1, 2, 3, 3), np.float32)).dtype == np.float32
    names = [n.name for n in job.graph().nodes]
    assert "up" in names and any(n.startswith("Deconv2d_") for n in names)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(output_shape=(1, 2, 7, 6)), ValueError, r"output_shape's height 7 cannot come from input height 3 .*"
                                                   r"padding 'SAME': expected 5\.\.6"),
    (dict(output_shape=(1, 2, 6, 6), padding="VALID"), ValueError, r"height 6 .* expected 7\.\.8"),
    (dict(output_shape=(2, 2, 6, 6)), ValueError, "must keep the input's batch size 1"),
    (dict(output_shape=(1, 2, 6)), ValueError, "output_shape must be 4 positive ints in NCHW order"),
    (dict(padding="FULL"), ValueError, "padding must be 'SAME' or 'VALID', got 'FULL'"),
    (dict(strides=0), ValueError, "strides must be an int >= 1"),
    (dict(data_format="CHWN"), ValueError, "data_format must be 'NCHW' or 'NHWC'"),
])
def test_conv2d_transpose_argument_errors_are_named(kwargs, error, match):
    args = dict(output_shape=(1, 2, 6, 6), strides=2, padding="SAME")
    args.update(kwargs)
    with pytest.raises(error, match=match):
        run(lambda a, b: flow.nn.conv2d_transpose(a, b, **args), rnd(1, 4, 3, 3), rnd(4, 2, 3, 3))


def test_conv2d_transpose_shape_errors():
    with pytest.raises(ShapeError, match=r"input \(1, 3, 3, 3\) has 3 channels \(NCHW\) but filters \(4, 2, 3, 3\)"):
        run(lambda a, b: flow.nn.conv2d_transpose(a, b, strides=2, padding="SAME"), rnd(1, 3, 3, 3), rnd(4, 2, 3, 3))
    with pytest.raises(ValueError, match="exactly one of value= and input="):
        run(lambda a, b: flow.nn.conv2d_transpose(a, b, input=a, strides=2), rnd(1, 4, 3, 3), rnd(4, 2, 3, 3))


# ------------------------------------------------------------------------------------------------- compat_conv2d

def test_compat_conv2d_pads_as_tensorflow():
    torch = pytest.importorskip("torch")
    x, w = rnd(2, 3, 8, 7, seed=10), rnd(4, 3, 5, 5, seed=11)
    got = run(lambda a, b: flow.nn.compat_conv2d(a, b, strides=[2, 2], padding="same"), x, w)
    # TensorFlow's SAME: output ceil(in / 2); padding 8 -> (1, 2) rows, 7 -> (2, 2) columns (odd pixel at the end)
    padded = torch.nn.functional.pad(torch.tensor(x), (2, 2, 1, 2))
    expected = torch.nn.functional.conv2d(padded, torch.tensor(w), stride=2).numpy()
    assert got.shape == (2, 4, 4, 4)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    valid = run(lambda a, b: flow.nn.compat_conv2d(a, b, 1, "VALID"), x, w)
    np.testing.assert_allclose(valid, torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w)).numpy(),
                               rtol=1e-12, atol=1e-12)
    check_grad(lambda a, b: flow.nn.compat_conv2d(a, b, 2, "SAME"), rnd(1, 2, 6, 5, seed=12), rnd(3, 2, 3, 3))


def test_compat_conv2d_takes_only_padding_words():
    with pytest.raises(ValueError, match=r"compat_conv2d: padding must be 'SAME' or 'VALID'.*got \[1, 1\]"):
        run(lambda a, b: flow.nn.compat_conv2d(a, b, 1, [1, 1]), rnd(1, 2, 5, 5), rnd(3, 2, 3, 3))


# -------------------------------------------------------------------------------------------------- leaky_relu

def test_leaky_relu_matches_oneflow_and_pytorch():
    torch = pytest.importorskip("torch")
    # OneFlow's documented example
    np.testing.assert_array_equal(run(lambda a: flow.nn.leaky_relu(a, alpha=0.2), np.array([-10., -5, 0, 5, 10])),
                                  [-2., -1, 0, 5, 10])
    x = rnd(4, 5, seed=13)
    for alpha in (0.3, 0.0, 1.5, -0.1):
        got = run(lambda a: flow.nn.leaky_relu(a, alpha), x)
        np.testing.assert_allclose(got, torch.nn.functional.leaky_relu(torch.tensor(x), alpha).numpy(), rtol=1e-15)
    assert np.isnan(run(lambda a: flow.nn.leaky_relu(a), np.array([np.nan, 1.0])))[0]


def test_leaky_relu_gradient():
    x = rnd(3, 4, seed=14)
    x[np.abs(x) < 0.05] = 0.5           # away from the kink, where finite differences straddle it
    check_grad(lambda a: flow.nn.leaky_relu(a, 0.3), x)
    check_grad(lambda a: flow.nn.leaky_relu(a, -0.5), x)


def test_leaky_relu_is_nonnegative_only_without_a_slope():
    flow.clear_default_session()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        return flow.nn.leaky_relu(x, 0.0, name="flat") + flow.nn.leaky_relu(x, name="leaky")

    job(np.ones((2, 3), np.float32))
    nodes = {n.name: n for n in job.graph().nodes}
    assert nodes["flat"].op.is_nonnegative(nodes["flat"]) and not nodes["leaky"].op.is_nonnegative(nodes["leaky"])
    with pytest.raises(ValueError, match="leaky_relu: alpha must be a finite number, got 'a'"):
        run(lambda a: flow.nn.leaky_relu(a, "a"), np.ones(2))


# ---------------------------------------------------------------------------------- sigmoid_cross_entropy_with_logits

def test_sigmoid_cross_entropy_matches_oneflow_and_pytorch():
    torch = pytest.importorskip("torch")
    logits = np.array([[4., 1], [3, 2], [1, 5]])
    labels = np.array([[0.7, 0.3], [0.4, 0.6], [0.2, 0.8]])
    got = run(lambda z, x: flow.nn.sigmoid_cross_entropy_with_logits(z, x), labels, logits)
    # OneFlow's kernel (sigmoid_cross_entropy_kernel.cu) computes -x (z - [x >= 0]) + log(1 + exp(-|x|)), the
    # textbook loss below; the output printed in its docstring for these inputs is not what that kernel gives
    p = 1 / (1 + np.exp(-logits))
    np.testing.assert_allclose(got, -labels * np.log(p) - (1 - labels) * np.log(1 - p), rtol=1e-12)
    assert np.isclose(got[0, 0], 1.2181499, rtol=1e-7)
    x, z = rnd(5, 7, seed=15) * 30, np.random.default_rng(16).uniform(0, 1, (5, 7))
    expected = torch.nn.functional.binary_cross_entropy_with_logits(torch.tensor(x), torch.tensor(z),
                                                                    reduction="none").numpy()
    np.testing.assert_allclose(run(lambda a, b: flow.nn.sigmoid_cross_entropy_with_logits(a, b), z, x), expected,
                               rtol=1e-12, atol=1e-12)


def test_sigmoid_cross_entropy_is_stable_at_extreme_logits():
    x = np.array([-1000., -40, 0, 40, 1000])
    z = np.array([0., 1, 0.5, 0, 1])
    loss = run(lambda a, b: flow.nn.sigmoid_cross_entropy_with_logits(a, b), z, x)
    np.testing.assert_allclose(loss, [0, 40, np.log(2), 40, 0], rtol=1e-12, atol=1e-15)
    grads = check_grad(lambda a, b: flow.nn.sigmoid_cross_entropy_with_logits(a, b), z, x, wrt=[])
    assert np.all(np.isfinite(grads[0])) and np.all(np.isfinite(grads[1]))


def test_sigmoid_cross_entropy_gradients():
    x, z = rnd(4, 3, seed=17) * 3, np.random.default_rng(18).uniform(0, 1, (4, 3))
    check_grad(lambda a, b: flow.nn.sigmoid_cross_entropy_with_logits(a, b), z, x)


def test_sigmoid_cross_entropy_takes_integer_labels_and_trains():
    """Wide & Deep feeds int32 click labels: read as 0/1 numbers; logistic regression learns a separable set."""
    flow.clear_default_session()
    rng = np.random.default_rng(19)
    features = rng.standard_normal((64, 3)).astype(np.float32)
    labels = (features @ np.array([2.0, -1.0, 0.5]) > 0).astype(np.int32)[:, None]

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((64, 3)), y: tp.Numpy.Placeholder((64, 1), dtype=flow.int32)) -> tp.Numpy:
        logits = flow.layers.dense(x, 1, name="logit")
        loss = flow.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]), momentum=0).minimize(loss)
        return loss

    first = train(features, labels).mean()
    for _ in range(100):
        last = train(features, labels).mean()
    assert np.isfinite(last) and last < 0.3 * first
    with pytest.raises(ShapeError, match=r"labels shape \(64,\) must equal logits shape \(64, 1\)"):
        @flow.global_function()
        def bad(x: tp.Numpy.Placeholder((64, 1)), y: tp.Numpy.Placeholder((64,), dtype=flow.int32)) -> tp.Numpy:
            return flow.nn.sigmoid_cross_entropy_with_logits(y, x)
        bad(np.ones((64, 1), np.float32), np.ones(64, np.int32))
