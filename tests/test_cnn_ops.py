"""The ops OneFlow-Benchmark's CNN programs need: batch normalization (plain, fused with ReLU, with an addend) against
PyTorch and finite differences, one_hot, pad, clip_by_value, concat, *_like, identity_n, grouped and depthwise
convolutions and pooling against PyTorch, bad-input errors, and a small ResNet-style network that learns."""
import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.autodiff import gradients
from flowlab.errors import ShapeError
from flowlab.runtime import session
from gradcheck import check_grad


def rnd(*shape, seed=0, scale=1.0, shift=0.0):
    return np.random.default_rng(seed).standard_normal(shape) * scale + shift


def variable(name):
    return session.default().variables[name].value


def given(value):
    """An initializer that gives the variable ``value``."""
    return lambda shape, dtype, rng: np.array(value, dtype).reshape(shape)     # a copy: updates change it in place


def sgd(lr):
    return flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [lr]), momentum=0)


# ---------------------------------------------------------------------------------------------- batch normalization

def bn_train_job(shape, build, weights, dtype=flow.float64):
    """A train job (lr 0: the variables stay) returning ``[y, dloss/dx, dloss/dgamma, dloss/dbeta]`` of
    ``loss = sum(build(x) * weights)``; ``build`` names its layer ``bn``."""
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder(shape, dtype=dtype)) -> tp.Bundle[tp.Numpy]:
        y = build(x)
        loss = flow.math.reduce_sum(y * flow.constant(weights, dtype=dtype))
        graph_vars = loss.graph.variables
        gamma, beta = graph_vars["bn-gamma"], graph_vars["bn-beta"]
        sgd(0.0).minimize(loss)
        grads = gradients([loss], [x, gamma, beta], [flow.constant(1.0, dtype=dtype)])
        return [y] + grads

    return job


def torch_bn(x, axis, gamma, beta, epsilon, momentum, weights, train=True, running=None):
    """PyTorch's BatchNorm on ``x`` normalized along ``axis`` (moved to axis 1): output, gradients, running stats.
    PyTorch's momentum weighs the *new* batch (``running = (1 - m) running + m batch``), OneFlow's the old value
    (``moving = m moving + (1 - m) batch``): ``momentum_torch = 1 - momentum``. Both feed the unbiased batch
    variance to the running variance and normalize with the biased one."""
    torch = pytest.importorskip("torch")
    xt = torch.tensor(np.moveaxis(x, axis, 1), requires_grad=True)
    layer = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d}[x.ndim](
        x.shape[axis], eps=epsilon, momentum=1 - momentum).double()
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(gamma))
        layer.bias.copy_(torch.tensor(beta))
        if running is not None:
            layer.running_mean.copy_(torch.tensor(running[0]))
            layer.running_var.copy_(torch.tensor(running[1]))
    layer.train(train)
    y = layer(xt)
    (y * torch.tensor(np.moveaxis(weights, axis, 1))).sum().backward()
    return (np.moveaxis(y.detach().numpy(), 1, axis), np.moveaxis(xt.grad.numpy(), 1, axis),
            layer.weight.grad.numpy(), layer.bias.grad.numpy(), layer.running_mean.numpy(), layer.running_var.numpy())


BN_CASES = [   # shape, axis: NCHW, NHWC (axis=3 and -1), 2-D (BatchNorm1d), 3-D (N, C, L)
    ((4, 3, 5, 6), 1),
    ((3, 5, 4, 6), 3),
    ((3, 4, 5, 2), -1),
    ((16, 5), 1),
    ((3, 4, 7), 1),
]


@pytest.mark.parametrize("shape, axis", BN_CASES)
def test_batch_normalization_training_matches_torch(shape, axis):
    x = rnd(*shape, seed=1, scale=2.0, shift=0.5)
    x2 = rnd(*shape, seed=2, scale=0.5, shift=-1.0)
    weights = rnd(*shape, seed=3)
    c = shape[axis]
    momentum, epsilon = 0.9, 1e-3
    gamma0, beta0 = rnd(c, seed=4, shift=1.0), rnd(c, seed=5)

    def build(t):
        return flow.layers.batch_normalization(
            t, axis=axis, momentum=momentum, epsilon=epsilon, name="bn",
            gamma_initializer=given(gamma0), beta_initializer=given(beta0))

    job = bn_train_job(shape, build, weights)
    y, gx, gg, gb = job(x)
    ty, tgx, tgg, tgb, rm, rv = torch_bn(x, axis % len(shape), gamma0, beta0, epsilon, momentum, weights)
    np.testing.assert_allclose(y, ty, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gx, tgx, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(gg, tgg, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(gb, tgb, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(variable("bn-moving_mean"), rm, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(variable("bn-moving_variance"), rv, rtol=1e-12)
    # a second step: the moving averages go on from where they are, once per step
    job(x2)
    *_, rm2, rv2 = torch_bn(x2, axis % len(shape), gamma0, beta0, epsilon, momentum, weights, running=(rm, rv))
    np.testing.assert_allclose(variable("bn-moving_mean"), rm2, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(variable("bn-moving_variance"), rv2, rtol=1e-12)


@pytest.mark.parametrize("shape, axis", BN_CASES[:2] + BN_CASES[3:4])
def test_batch_normalization_predict_uses_the_moving_statistics(shape, axis):
    x, weights = rnd(*shape, seed=6, scale=3.0, shift=2.0), rnd(*shape, seed=7)
    c = shape[axis]
    gamma, beta = rnd(c, seed=8, shift=1.0), rnd(c, seed=9)
    mean, var = rnd(c, seed=10), np.abs(rnd(c, seed=11)) + 0.5

    @flow.global_function()
    def predict(t: tp.Numpy.Placeholder(shape, dtype=flow.float64)) -> tp.Numpy:
        return flow.layers.batch_normalization(t, axis=axis, name="bn", gamma_initializer=given(gamma),
                                               beta_initializer=given(beta), moving_mean_initializer=given(mean),
                                               moving_variance_initializer=given(var))

    ty, *_ = torch_bn(x, axis, gamma, beta, 0.001, 0.99, weights, train=False, running=(mean, var))
    np.testing.assert_allclose(predict(x), ty, rtol=1e-10, atol=1e-12)
    expected = (x - mean.reshape((-1,) + (1,) * (len(shape) - axis - 1))) / \
        np.sqrt(var.reshape((-1,) + (1,) * (len(shape) - axis - 1)) + 0.001) * \
        gamma.reshape((-1,) + (1,) * (len(shape) - axis - 1)) + beta.reshape((-1,) + (1,) * (len(shape) - axis - 1))
    np.testing.assert_allclose(predict(x), expected, rtol=1e-12)
    np.testing.assert_array_equal(variable("bn-moving_mean"), mean)   # predict jobs never update them


def test_batch_normalization_frozen_in_a_train_job_uses_moving_statistics_and_matches_torch_eval():
    shape, axis = (3, 4, 3, 3), 1
    x, weights = rnd(*shape, seed=12, shift=1.0), rnd(*shape, seed=13)
    gamma, beta, mean, var = rnd(4, seed=14), rnd(4, seed=15), rnd(4, seed=16), np.abs(rnd(4, seed=17)) + 0.2

    def build(t):
        return flow.layers.batch_normalization(t, axis=axis, training=False, name="bn", gamma_initializer=given(gamma),
                                               beta_initializer=given(beta), moving_mean_initializer=given(mean),
                                               moving_variance_initializer=given(var))

    y, gx, gg, gb = bn_train_job(shape, build, weights)(x)
    ty, tgx, tgg, tgb, rm, rv = torch_bn(x, axis, gamma, beta, 0.001, 0.99, weights, train=False, running=(mean, var))
    for got, want in ((y, ty), (gx, tgx), (gg, tgg), (gb, tgb)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(variable("bn-moving_mean"), mean)
    np.testing.assert_array_equal(variable("bn-moving_variance"), var)


def test_batch_normalization_trainable_false_in_a_train_job_is_frozen():
    @flow.global_function(type="train")
    def job(t: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        y = flow.layers.batch_normalization(t, axis=1, trainable=False, name="bn")
        w = flow.get_variable("w", shape=(4, 3), initializer=flow.ones_initializer())
        assert [n.op.__name__ for n in y.graph.nodes if n.name == "bn"] == ["BatchNormInfer"]
        loss = flow.math.reduce_sum(y * w)
        sgd(0.1).minimize(loss)
        return y

    x = rnd(4, 3, seed=18).astype(np.float32)
    np.testing.assert_allclose(job(x), x / np.sqrt(1 + 0.001), rtol=1e-6)
    assert not session.default().variables["bn-gamma"].trainable


@pytest.mark.parametrize("kind", ["plain", "relu", "add_relu"])
@pytest.mark.parametrize("shape, axis", [((3, 2, 3, 2), 1), ((2, 3, 2, 3), 3), ((6, 3), 1)])
def test_batch_normalization_vjp_by_finite_differences(kind, shape, axis):
    """The full batch-statistics VJP (input), and gamma, beta and the addend, through flowlab's own forward."""
    x = rnd(*shape, seed=19, scale=1.5, shift=0.3)
    addend = rnd(*shape, seed=20)
    weights = rnd(*shape, seed=21)
    c = shape[axis]
    gamma, beta = rnd(c, seed=22, shift=1.0), rnd(c, seed=23, scale=0.5)

    @flow.global_function(type="train")
    def job(t: tp.Numpy.Placeholder(shape, dtype=flow.float64),
            a: tp.Numpy.Placeholder(shape, dtype=flow.float64)) -> tp.Bundle[tp.Numpy]:
        options = dict(axis=axis, epsilon=0.01, momentum=0.5, name="bn", gamma_initializer=given(gamma),
                       beta_initializer=given(beta))
        if kind == "plain":
            y = flow.layers.batch_normalization(t, **options) + a
        elif kind == "relu":
            y = flow.layers.batch_normalization_relu(t, **options) + a
        else:
            y = flow.layers.batch_normalization_add_relu(t, a, **options)
        assert y.op_name == ("bn" if kind == "add_relu" else "Add_4")
        loss = flow.math.reduce_sum(y * flow.constant(weights, dtype=flow.float64))
        sgd(0.0).minimize(loss)
        variables = loss.graph.variables
        grads = gradients([loss], [t, a, variables["bn-gamma"], variables["bn-beta"]],
                          [flow.constant(1.0, flow.float64)])
        return [loss] + grads

    _, *analytic = job(x, addend)
    eps, rng = 1e-6, np.random.default_rng(0)

    def loss_at(x_, a_, g_, b_):
        variable("bn-gamma")[...] = g_
        variable("bn-beta")[...] = b_
        return float(job(x_, a_)[0])

    values = [x, addend, gamma, beta]
    for i, (name, value) in enumerate(zip(("x", "addend", "gamma", "beta"), values)):
        flat = value.reshape(-1)
        for p in rng.choice(flat.size, min(flat.size, 12), replace=False):
            plus, minus = [v.copy() for v in values], [v.copy() for v in values]
            plus[i].reshape(-1)[p] += eps
            minus[i].reshape(-1)[p] -= eps
            numeric = (loss_at(*plus) - loss_at(*minus)) / (2 * eps)
            np.testing.assert_allclose(analytic[i].reshape(-1)[p], numeric, rtol=1e-5, atol=1e-7,
                                       err_msg=f"{kind}: d loss / d {name}[{p}]")


@pytest.mark.parametrize("axis", [1, 3])
def test_fused_forms_equal_batch_norm_then_relu(axis):
    shape = (4, 3, 4, 3) if axis == 1 else (4, 4, 3, 3)
    x, addend, weights = rnd(*shape, seed=24), rnd(*shape, seed=25), rnd(*shape, seed=26)

    def run(build):
        flow.clear_default_session()

        @flow.global_function(type="train")
        def job(t: tp.Numpy.Placeholder(shape, dtype=flow.float64),
                a: tp.Numpy.Placeholder(shape, dtype=flow.float64)) -> tp.Bundle[tp.Numpy]:
            y = build(t, a)
            loss = flow.math.reduce_sum(y * flow.constant(weights, dtype=flow.float64))
            sgd(0.0).minimize(loss)
            variables = loss.graph.variables
            return [y] + gradients([loss], [t, a, variables["bn-gamma"]], [flow.constant(1.0, flow.float64)])

        out = job(x, addend)
        return out + [variable("bn-moving_mean").copy(), variable("bn-moving_variance").copy()]

    def bn(t):
        return flow.layers.batch_normalization(t, axis=axis, name="bn")

    fused_relu = run(lambda t, a: flow.layers.batch_normalization_relu(t, axis=axis, name="bn") + a)
    plain_relu = run(lambda t, a: flow.nn.relu(bn(t)) + a)
    fused_add = run(lambda t, a: flow.layers.batch_normalization_add_relu(t, a, axis=axis, name="bn"))
    plain_add = run(lambda t, a: flow.nn.relu(bn(t) + a))
    for got, want in zip(fused_relu, plain_relu):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    for got, want in zip(fused_add, plain_add):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_batch_normalization_names_defaults_and_options():
    @flow.global_function(type="train")
    def job(t: tp.Numpy.Placeholder((2, 3, 4, 4))) -> tp.Numpy:
        y = flow.layers.batch_normalization(t, axis=1)       # OneFlow's default name: "BatchNorm"
        assert y.logical_blob_name == "BatchNorm/y_0"
        with flow.scope.namespace("block"):
            z = flow.layers.batch_normalization_relu(y, axis=1, center=False, scale=False, name="bn2")
        assert z.logical_blob_name == "block-bn2/y_0"
        loss = flow.math.reduce_mean(z)
        sgd(0.1).minimize(loss)
        return z

    job(rnd(2, 3, 4, 4, seed=27).astype(np.float32))
    variables = session.default().variables
    assert {name: (v.shape, v.trainable) for name, v in variables.items()} == {
        "BatchNorm-gamma": ((3,), True), "BatchNorm-beta": ((3,), True),
        "BatchNorm-moving_mean": ((3,), False), "BatchNorm-moving_variance": ((3,), False),
        "block-bn2-moving_mean": ((3,), False), "block-bn2-moving_variance": ((3,), False)}
    np.testing.assert_array_equal(variables["BatchNorm-moving_variance"].numpy() != 1, True)   # updated in place


def test_batch_normalization_keeps_float32_and_matches_torch():
    torch = pytest.importorskip("torch")
    x, weights = rnd(8, 6, 5, 5, seed=28, scale=3, shift=4).astype(np.float32), rnd(8, 6, 5, 5, seed=29)

    def build(t):
        return flow.layers.batch_normalization_add_relu(t, t, axis=1, epsilon=1e-5, momentum=0.9, name="bn")

    y, gx, gg, gb = bn_train_job(x.shape, build, weights.astype(np.float32), dtype=flow.float32)(x)
    assert y.dtype == gx.dtype == gg.dtype == np.float32
    xt = torch.tensor(x, requires_grad=True)
    layer = torch.nn.BatchNorm2d(6, eps=1e-5, momentum=0.1)
    out = torch.relu(layer(xt) + xt)
    (out * torch.tensor(weights, dtype=torch.float32)).sum().backward()
    np.testing.assert_allclose(y, out.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(gg, layer.weight.grad.numpy(), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(variable("bn-moving_variance"), layer.running_var.numpy(), rtol=1e-5)


@pytest.mark.parametrize("build, error, match", [
    (lambda t: flow.layers.batch_normalization(t, axis=4), ValueError, r"axis must be an int in \[-4, 4\), got 4"),
    (lambda t: flow.layers.batch_normalization(t, momentum=1.5), ValueError, r"momentum must be a number in"),
    (lambda t: flow.layers.batch_normalization(t, epsilon=0), ValueError, "epsilon must be > 0"),
    (lambda t: flow.layers.batch_normalization(t, name=""), TypeError, "name must be a non-empty string"),
    (lambda t: flow.layers.batch_normalization(flow.cast(t, flow.int32)), TypeError, "must be floating point"),
    (lambda t: flow.layers.batch_normalization_add_relu(t, flow.reshape(t, (2, 4, 3, 3)), axis=1), ValueError,
     r"addend must have the shape of inputs \(2, 3, 4, 3\)"),
    (lambda t: [flow.layers.batch_normalization(t, axis=1), flow.layers.batch_normalization(t, axis=1, name=None)],
     ValueError, "a batch normalization named 'BatchNorm' already exists"),
])
def test_batch_normalization_bad_arguments(build, error, match):
    @flow.global_function()
    def job(t: tp.Numpy.Placeholder((2, 3, 4, 3))) -> tp.Numpy:
        build(t)
        return t

    with pytest.raises(error, match=match):
        job(np.zeros((2, 3, 4, 3), np.float32))


def test_batch_statistics_need_two_values_per_channel():
    @flow.global_function(type="train")
    def job(t: tp.Numpy.Placeholder((1, 3))) -> tp.Numpy:
        y = flow.layers.batch_normalization(t, axis=1)
        sgd(0.1).minimize(flow.math.reduce_sum(y))
        return y

    with pytest.raises(ShapeError, match="more than one value per channel"):
        job(np.zeros((1, 3), np.float32))


# ------------------------------------------------------------------------------------------------ one_hot, pad, clip

def predict(build, *arrays):
    """``build`` on placeholders shaped and typed like ``arrays``, in a predict job; returns its list of results."""
    specs = [tp.Numpy.Placeholder(a.shape, dtype=a.dtype) for a in arrays]
    names = [f"a{i}" for i in range(len(arrays))]
    namespace = {"build": build, "tp": tp, "specs": specs}
    signature = ", ".join(f"{n}: specs[{i}]" for i, n in enumerate(names))
    exec(f"def job({signature}) -> tp.Bundle[tp.Numpy]:\n    out = build({', '.join(names)})\n"
         f"    return list(out) if isinstance(out, (list, tuple)) else [out]", namespace)
    return flow.global_function()(namespace["job"])(*arrays)


@pytest.mark.parametrize("axis", [-1, 0, 1, 2])
def test_one_hot_matches_numpy(axis):
    indices = np.array([[0, 3, 1], [2, 4, 3]], np.int32)
    eye = np.where(np.eye(5, dtype=bool)[indices], 0.9, 0.025).astype(np.float32)   # label smoothing's values
    expected = np.moveaxis(eye, -1, axis)
    out, = predict(lambda i: flow.one_hot(i, depth=5, on_value=0.9, off_value=0.025, axis=axis), indices)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, expected)


def test_one_hot_dtypes_and_out_of_range_rows():
    labels = np.array([1, -1, 3, 7], np.int64)
    ints, doubles = predict(lambda i: [flow.one_hot(i, 4, dtype=flow.int32),
                                       flow.one_hot(i, 4, on_value=2.5, dtype=flow.float64)], labels)
    np.testing.assert_array_equal(ints, [[0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0]])
    assert ints.dtype == np.int32 and doubles.dtype == np.float64
    np.testing.assert_array_equal(doubles, ints * 2.5)


def test_one_hot_label_smoothing_trains_through_softmax_cross_entropy():
    """OneFlow-Benchmark's label smoothing: one_hot labels into softmax_cross_entropy_with_logits; the logits'
    gradient is softmax - smoothed labels (the labels themselves get no gradient: integer input)."""
    labels, logits0 = np.array([0, 2, 1], np.int32), rnd(3, 3, seed=30).astype(np.float32)

    @flow.global_function(type="train")
    def job(y: tp.Numpy.Placeholder((3,), dtype=flow.int32)) -> tp.Numpy:
        logits = flow.get_variable("logits", shape=(3, 3), initializer=given(logits0))
        smooth = flow.one_hot(y, depth=3, on_value=1 - 0.3 + 0.1, off_value=0.1, dtype=logits.dtype)
        loss = flow.nn.softmax_cross_entropy_with_logits(smooth, logits)
        sgd(1.0).minimize(loss)
        return loss

    loss = job(labels)
    smooth = np.where(np.eye(3, dtype=bool)[labels], 0.8, 0.1)
    prob = np.exp(logits0) / np.exp(logits0).sum(1, keepdims=True)
    np.testing.assert_allclose(loss, -(smooth * np.log(prob)).sum(1), rtol=1e-5)
    step = logits0 - variable("logits")      # lr 1, gradients of a per-example loss scaled by 1 / 3
    np.testing.assert_allclose(step, (prob - smooth) / 3, rtol=1e-4, atol=1e-6)


def test_pad_matches_numpy_and_its_gradient_is_a_crop():
    x = rnd(2, 3, 4, seed=31)
    paddings = ((1, 0), (0, 2), (3, 1))
    out, = predict(lambda t: flow.pad(t, paddings, constant_value=5), x)
    np.testing.assert_array_equal(out, np.pad(x, paddings, constant_values=5))
    ints, = predict(lambda t: flow.pad(t, [[0, 1], [2, 0]], constant_value=7.9), np.ones((2, 2), np.int32))
    np.testing.assert_array_equal(ints, np.pad(np.ones((2, 2), np.int32), [[0, 1], [2, 0]], constant_values=7))
    check_grad(lambda t: flow.math.square(flow.pad(t, paddings, constant_value=-1.5)), x)
    # second order: the crop's gradient is a pad
    check_grad(lambda t: flow.math.square(flow.identity(flow.pad(t, paddings)) * 2.0), x, max_points=10)


@pytest.mark.parametrize("lo, hi", [(0.0, 6.0), (-0.5, None), (None, 0.25), (0.5, 0.5)])
def test_clip_by_value_forward_and_gradient(lo, hi):
    # points on the bounds themselves: OneFlow's gradient passes there (lo <= x <= hi)
    x = np.array([-2.0, -0.5, 0.0, 0.25, 0.5, 3.0, 6.0, 7.5])
    out, = predict(lambda t: flow.clip_by_value(t, lo, hi), x)
    np.testing.assert_array_equal(out, np.clip(x, lo, hi))
    weights = rnd(x.size, seed=32)

    @flow.global_function()
    def grad(t: tp.Numpy.Placeholder(x.shape, dtype=flow.float64)) -> tp.Numpy:
        clipped = flow.math.clip_by_value(t, min_value=lo, max_value=hi)
        y = flow.math.reduce_sum(clipped * flow.constant(weights, flow.float64))
        return gradients([y], [t], [flow.constant(1.0, flow.float64)])[0]

    inside = ((x >= (-np.inf if lo is None else lo)) & (x <= (np.inf if hi is None else hi)))
    np.testing.assert_array_equal(grad(x), weights * inside)
    away = x + 0.1 * (x == 0.5) + 0.1 * (x == 0.25) + 0.1 * (x == 0.0) - 0.1 * (x == -0.5) + 0.1 * (x == 6.0)
    check_grad(lambda t: flow.clip_by_value(t, lo, hi), away)


def test_clip_aliases_and_integer_tensors():
    assert flow.clip is flow.clamp is flow.clip_by_scalar is flow.math.clip_by_value is flow.clip_by_value
    ints, = predict(lambda t: flow.clip(t, 0, 3.7), np.array([-4, 1, 5], np.int32))
    np.testing.assert_array_equal(ints, [0, 1, 3])
    assert ints.dtype == np.int32


def test_concat_takes_values_any_number_of_inputs_and_max_dim_size():
    a, b, c = rnd(2, 1, 3, seed=33), rnd(2, 2, 3, seed=34), rnd(2, 4, 3, seed=35)
    out, = predict(lambda x, y, z: flow.concat(values=[x, y, z], axis=1, max_dim_size=9, name="cat"), a, b, c)
    np.testing.assert_array_equal(out, np.concatenate([a, b, c], axis=1))
    out, = predict(lambda x: flow.concat([x], axis=-1), a)
    np.testing.assert_array_equal(out, a)
    check_grad(lambda x, y, z: flow.math.square(flow.concat(values=[x, y, z], axis=1)), a, b, c)


def test_like_ops_and_identity_n():
    x = rnd(2, 3, seed=36)
    ones, zeros, ints, first, second = predict(
        lambda t, u: [flow.ones_like(t), flow.zeros_like(t), flow.ones_like(t, dtype=flow.int8)] +
        flow.identity_n([t, u], name="ids"), x, x * 2)
    np.testing.assert_array_equal(ones, np.ones((2, 3)))
    np.testing.assert_array_equal(zeros, np.zeros((2, 3)))
    assert ones.dtype == np.float64 and ints.dtype == np.int8
    np.testing.assert_array_equal(first, x)
    np.testing.assert_array_equal(second, x * 2)
    # ones_like depends on the shape only: zero gradient, not an error
    check_grad(lambda t: flow.math.square(t) + flow.ones_like(t) * 3.0, x)


@pytest.mark.parametrize("build, error, match", [
    (lambda t: flow.one_hot(t, 0), ValueError, "depth must be a positive int, got 0"),
    (lambda t: flow.one_hot(t, 3, axis=3), ValueError, r"axis must be an int in \[-3, 3\)"),
    (lambda t: flow.one_hot(flow.cast(t, flow.float32), 3), ShapeError, "indices must be integers"),
    (lambda t: flow.one_hot(t, 3, on_value="hot"), TypeError, "on_value must be a number"),
    (lambda t: flow.pad(t, [(1, 1)]), ValueError, r"paddings must be a list of 2 \(before, after\) pairs"),
    (lambda t: flow.pad(t, [(1, 1), (0, -1)]), ValueError, "non-negative ints"),
    (lambda t: flow.pad(t, [(1, 1), (0, 1)], constant_value=None), TypeError, "constant_value must be a number"),
    (lambda t: flow.clip_by_value(t), ValueError, "min_value and max_value cannot both be None"),
    (lambda t: flow.clip_by_value(t, 2, 1), ValueError, "min_value 2 must not exceed max_value 1"),
    (lambda t: flow.clip_by_value(t, "0"), TypeError, "min_value must be a number or None"),
    (lambda t: flow.concat(values=[t, t], inputs=[t]), ValueError, "not both"),
    (lambda t: flow.concat([t, t], axis=1, max_dim_size=3), ValueError, "max_dim_size must be an int >= 4"),
    (lambda t: flow.concat(t), TypeError, "inputs must be a list of tensors"),
    (lambda t: flow.identity_n([]), ValueError, "inputs must be a non-empty list"),
])
def test_bad_arguments_are_named(build, error, match):
    with pytest.raises(error, match=match):
        predict(build, np.zeros((2, 2), np.int32))


# ------------------------------------------------------------------------------------- convolutions and pooling

def torch_padding(x_hw, k, s, padding):
    """(top, bottom, left, right) of flowlab's padding argument, for F.pad."""
    if padding == "VALID":
        return (0, 0, 0, 0)
    if padding == "SAME":
        out = []
        for n, kk, ss in zip(x_hw, k, s):
            total = max((-(-n // ss) - 1) * ss + kk - n, 0)
            out += [total // 2, total - total // 2]
        return tuple(out)
    (t, b), (l, r) = padding
    return (t, b, l, r)


CONV_CASES = [   # groups: 1, 2, 32 (ResNeXt), C (depthwise); strides 1 and 2; SAME, VALID, explicit padding
    (1, 8, 8, 1, "SAME"),
    (2, 8, 6, 2, "VALID"),
    (32, 64, 64, 1, "SAME"),
    (32, 32, 64, 2, [[1, 0], [0, 2]]),
    ("C", 12, 12, 1, "SAME"),
    ("C", 12, 12, 2, "SAME"),
    ("C", 8, 8, 2, [[1, 1], [1, 1]]),
    ("C", 8, 8, 1, "VALID"),
]


@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
@pytest.mark.parametrize("groups, c_in, c_out, stride, padding", CONV_CASES)
def test_grouped_and_depthwise_conv2d_match_torch(monkeypatch, groups, c_in, c_out, stride, padding, data_format):
    """(Depthwise kernels run in blocks of images on NumPy: here one image a block, so the blocks add up.)"""
    torch = pytest.importorskip("torch")
    from flowlab.ops import conv
    monkeypatch.setattr(conv, "_DEPTHWISE_BLOCK", 1)
    F = torch.nn.functional
    groups = c_in if groups == "C" else groups
    x = rnd(2, c_in, 7, 6, seed=40)
    w = rnd(c_out, c_in // groups, 3, 3, seed=41)
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    top, bottom, left, right = torch_padding((7, 6), (3, 3), (stride, stride), padding)
    yt = F.conv2d(F.pad(xt, (left, right, top, bottom)), wt, stride=stride, groups=groups)
    dy = rnd(*yt.shape, seed=42)
    yt.backward(torch.tensor(dy))
    dy_shape = yt.shape

    to_layout = (lambda a: a) if data_format == "NCHW" else (lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 1)))
    back = (lambda a: a) if data_format == "NCHW" else (lambda a: a.transpose(0, 3, 1, 2))

    @flow.global_function()
    def job(t: tp.Numpy.Placeholder(to_layout(x).shape, dtype=flow.float64),
            f: tp.Numpy.Placeholder(to_layout(w).shape, dtype=flow.float64)) -> tp.Bundle[tp.Numpy]:
        y = flow.nn.conv2d(t, f, stride, padding, data_format, groups=groups)
        loss = flow.math.reduce_sum(y * flow.constant(to_layout(dy), flow.float64))
        return [y] + gradients([loss], [t, f], [flow.constant(1.0, flow.float64)])

    y, dx, dw = job(to_layout(x), to_layout(w))
    assert back(y).shape == tuple(dy_shape)
    np.testing.assert_allclose(back(y), yt.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(back(dx), xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(back(dw), wt.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
def test_depthwise_conv2d_by_finite_differences_and_layers_conv2d(data_format):
    x = rnd(2, 4, 5, 5, seed=43) if data_format == "NCHW" else rnd(2, 5, 5, 4, seed=43)
    check_grad(lambda t: flow.math.tanh(flow.layers.conv2d(
        t, 4, 3, strides=2, padding="SAME", data_format=data_format, groups=4,
        kernel_initializer=flow.random_uniform_initializer(-1, 1), name="dw")), x, max_points=30)


@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
@pytest.mark.parametrize("pool, ksize, stride, padding", [
    ("avg", 3, 2, "SAME"), ("avg", 3, 1, "SAME"), ("avg", 2, 2, "VALID"), ("avg", 3, 2, [[1, 1], [1, 0]]),
    ("max", 3, 2, "SAME"), ("max", 3, 2, "VALID"), ("max", 2, 1, [[0, 1], [1, 0]]), ("avg", 7, 1, "VALID"),
])
def test_pooling_matches_torch(pool, ksize, stride, padding, data_format):
    """avg_pool2d excludes the padded cells from each window's average, as OneFlow and TensorFlow do (PyTorch's
    ``count_include_pad=False``); max pooling never picks padding."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = rnd(2, 3, 7, 8, seed=44)
    xt = torch.tensor(x, requires_grad=True)
    top, bottom, left, right = torch_padding((7, 8), (ksize, ksize), (stride, stride), padding)
    if pool == "max":
        yt = F.max_pool2d(F.pad(xt, (left, right, top, bottom), value=-np.inf), ksize, stride)
    else:   # the mean over the input cells of each window: window sums over window counts
        padded = F.pad(xt, (left, right, top, bottom))
        counts = F.avg_pool2d(F.pad(torch.ones_like(xt), (left, right, top, bottom)), ksize, stride, divisor_override=1)
        yt = F.avg_pool2d(padded, ksize, stride, divisor_override=1) / counts
    dy = rnd(*yt.shape, seed=45)
    yt.backward(torch.tensor(dy))
    nhwc = data_format == "NHWC"
    to_layout = (lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 1))) if nhwc else (lambda a: a)
    back = (lambda a: a.transpose(0, 3, 1, 2)) if nhwc else (lambda a: a)
    op = flow.nn.max_pool2d if pool == "max" else flow.nn.avg_pool2d

    @flow.global_function()
    def job(t: tp.Numpy.Placeholder(to_layout(x).shape, dtype=flow.float64)) -> tp.Bundle[tp.Numpy]:
        y = op(t, ksize, stride, padding, data_format)
        loss = flow.math.reduce_sum(y * flow.constant(to_layout(dy), flow.float64))
        return [y, gradients([loss], [t], [flow.constant(1.0, flow.float64)])[0]]

    y, dx = job(to_layout(x))
    np.testing.assert_allclose(back(y), yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(back(dx), xt.grad.numpy(), rtol=1e-12, atol=1e-12)
    if pool == "avg" and padding == "SAME" and ksize == 3 and stride == 1:   # the corner averages 4 cells, not 9
        np.testing.assert_allclose(back(y)[:, :, 0, 0], x[:, :, :2, :2].mean(axis=(2, 3)), rtol=1e-12)


@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_global_average_pool_and_its_gradient_match_torch(data_format, dtype):
    """One window over each whole image (ResNet's pool5) takes a shortcut: a mean over the pixels, and dy / (H*W)
    broadcast back; the values stay those of PyTorch's adaptive average pool."""
    torch = pytest.importorskip("torch")
    x, dy = rnd(3, 5, 6, 7, seed=46), rnd(3, 5, 1, 1, seed=47)
    xt = torch.tensor(x, requires_grad=True)
    yt = torch.nn.functional.adaptive_avg_pool2d(xt, 1)
    yt.backward(torch.tensor(dy))
    nhwc = data_format == "NHWC"
    to_layout = (lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 1))) if nhwc else (lambda a: a)
    back = (lambda a: a.transpose(0, 3, 1, 2)) if nhwc else (lambda a: a)
    kind = flow.float64 if dtype == np.float64 else flow.float32

    @flow.global_function()
    def job(t: tp.Numpy.Placeholder(to_layout(x).shape, dtype=kind)) -> tp.Bundle[tp.Numpy]:
        y = flow.nn.avg_pool2d(t, (6, 7), 1, "VALID", data_format)
        loss = flow.math.reduce_sum(y * flow.constant(to_layout(dy).astype(dtype), kind))
        return [y, gradients([loss], [t], [flow.constant(1.0, kind)])[0]]

    y, dx = job(to_layout(x).astype(dtype))
    tolerance = 1e-12 if dtype == np.float64 else 1e-6
    assert y.dtype == dx.dtype == dtype and back(y).shape == (3, 5, 1, 1) and back(dx).shape == x.shape
    np.testing.assert_allclose(back(y), yt.detach().numpy(), rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(back(dx), xt.grad.numpy(), rtol=tolerance, atol=tolerance)
    if dtype == np.float64:     # and by finite differences, through a square so that dy varies per image
        check_grad(lambda t: flow.math.square(flow.nn.avg_pool2d(t, (6, 7), 1, "VALID", data_format)),
                   to_layout(x), max_points=30)


# ------------------------------------------------------------------------------------- a small ResNet-style network

CLASSES, BATCH = 4, 16


def synthetic_batch(rng):
    """8x8 RGB images in noise holding a bright 3x3 square somewhere: red, green or blue for classes 0-2, white for
    class 3 (global pooling keeps colour, not position)."""
    labels = rng.integers(0, CLASSES, BATCH).astype(np.int32)
    images = rng.normal(0, 0.5, (BATCH, 3, 8, 8)).astype(np.float32)
    for i, label in enumerate(labels):
        r, c = rng.integers(0, 6, 2)
        images[i, slice(None) if label == 3 else label, r:r + 3, c:c + 3] += 1.5
    return images, labels


def conv(x, name, filters, kernel, strides=1, padding="SAME", groups=1):
    weight = flow.get_variable(f"{name}-weight", shape=(filters, x.shape[1] // groups, kernel, kernel),
                               initializer=flow.variance_scaling_initializer(2, "fan_in", "random_normal"))
    return flow.nn.conv2d(x, weight, strides, padding, "NCHW", groups=groups, name=name)


def small_resnet(images, training=True):
    """OneFlow-0.x style: a padded stem, one bottleneck block (grouped 3x3) closed by batch_normalization_add_relu,
    a depthwise stride-2 convolution with relu6 (clip_by_value), global average pooling and a dense classifier."""
    bn = dict(axis=1, momentum=0.9, epsilon=1e-5, training=training)
    x = flow.pad(images, [[0, 0], [0, 0], [1, 1], [1, 1]])
    x = conv(x, "stem", 16, 3, padding="VALID")
    x = flow.layers.batch_normalization_relu(x, name="stem_bn_relu", **bn)
    a = flow.layers.batch_normalization_relu(conv(x, "block_a", 8, 1), name="block_a_bn_relu", **bn)
    b = flow.layers.batch_normalization_relu(conv(a, "block_b", 8, 3, groups=2), name="block_b_bn_relu", **bn)
    c = conv(b, "block_c", 16, 1)
    x = flow.layers.batch_normalization_add_relu(c, x, name="block_c_bn_add_relu", **bn)
    d = flow.layers.batch_normalization(conv(x, "dw", 16, 3, strides=2, groups=16), name="dw_bn", **bn)
    d = flow.clip_by_value(d, 0, 6, name="dw-relu6")
    pooled = flow.nn.avg_pool2d(d, 4, 1, "VALID", "NCHW", name="pool")
    return flow.layers.dense(flow.reshape(pooled, (BATCH, 16)), CLASSES, name="fc")


def numpy_small_resnet(images, v):
    """The network of ``small_resnet`` in plain NumPy with the variables ``v`` (moving statistics for BN)."""
    def conv_ref(x, name, strides=1, pads=(1, 1), groups=1):
        w = v[f"{name}-weight"]
        x = np.pad(x, ((0, 0), (0, 0), pads, pads))
        windows = np.lib.stride_tricks.sliding_window_view(x, w.shape[2:], axis=(2, 3))[:, :, ::strides, ::strides]
        per = w.shape[0] // groups
        cg = x.shape[1] // groups
        return np.concatenate([np.einsum("nchwij,ocij->nohw", windows[:, g * cg:(g + 1) * cg],
                                         w[g * per:(g + 1) * per]) for g in range(groups)], axis=1)

    def bn_ref(x, name):
        shape = (1, -1, 1, 1)
        mean, var = v[f"{name}-moving_mean"].reshape(shape), v[f"{name}-moving_variance"].reshape(shape)
        return (x - mean) / np.sqrt(var + 1e-5) * v[f"{name}-gamma"].reshape(shape) + v[f"{name}-beta"].reshape(shape)

    relu = lambda t: np.maximum(t, 0)   # noqa: E731
    x = np.pad(images, ((0, 0), (0, 0), (1, 1), (1, 1)))
    x = relu(bn_ref(conv_ref(x, "stem", pads=(0, 0)), "stem_bn_relu"))
    a = relu(bn_ref(conv_ref(x, "block_a", pads=(0, 0)), "block_a_bn_relu"))
    b = relu(bn_ref(conv_ref(a, "block_b", groups=2), "block_b_bn_relu"))
    x = relu(bn_ref(conv_ref(b, "block_c", pads=(0, 0)), "block_c_bn_add_relu") + x)
    d = np.clip(bn_ref(conv_ref(x, "dw", strides=2, pads=(0, 1), groups=16), "dw_bn"), 0, 6)
    return d.mean(axis=(2, 3)) @ v["fc-weight"].T + v["fc-bias"]


def test_small_resnet_trains_and_predicts_with_the_moving_statistics():
    @flow.global_function(type="train")
    def train(images: tp.Numpy.Placeholder((BATCH, 3, 8, 8)),
              labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        logits = small_resnet(images)
        smooth = flow.one_hot(labels, depth=CLASSES, on_value=1 - 0.1 + 0.1 / CLASSES, off_value=0.1 / CLASSES,
                              dtype=logits.dtype)
        loss = flow.math.reduce_mean(flow.nn.softmax_cross_entropy_with_logits(smooth, logits, name="loss"))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss)
        return loss

    @flow.global_function()
    def infer(images: tp.Numpy.Placeholder((BATCH, 3, 8, 8))) -> tp.Numpy:
        return small_resnet(images, training=True)   # a predict job: moving statistics whatever training says

    rng = np.random.default_rng(0)
    losses = [float(train(*synthetic_batch(rng))) for _ in range(50)]
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses
    variables = {name: v.numpy().astype(np.float64) for name, v in flow.get_all_variables().items()}
    assert not np.allclose(variables["dw_bn-moving_mean"], 0)
    assert not np.allclose(variables["stem_bn_relu-moving_variance"], 1)
    images, labels = synthetic_batch(rng)
    logits = infer(images)
    np.testing.assert_allclose(logits, numpy_small_resnet(images.astype(np.float64), variables), rtol=1e-4, atol=1e-4)
    assert (logits.argmax(1) == labels).mean() >= 0.75


@pytest.mark.parametrize("block", [5, 64, 1 << 18])
@pytest.mark.parametrize("shape, axis", [((3, 4, 5, 6), 1), ((3, 5, 6, 4), 3), ((40, 3), 1)])
def test_batch_normalization_blocks_combine_exactly_and_stay_stable(monkeypatch, block, shape, axis):
    """The kernels work block by block (cache-sized on NumPy); with tiny blocks every way of cutting (rows, channel
    ranges) is taken. Per-block moments combine stably: float32 inputs far from zero (mean 1000, std 1) still
    normalize to float32 precision, where E[x^2] - E[x]^2 would lose every digit."""
    from flowlab.ops import normalization
    monkeypatch.setattr(normalization, "_BLOCK", block)
    x = rnd(*shape, seed=50, shift=1000.0)
    weights = rnd(*shape, seed=51)
    gamma, beta = rnd(shape[axis], seed=52, shift=1.0), rnd(shape[axis], seed=53)

    def build(t):
        return flow.layers.batch_normalization(t, axis=axis, momentum=0.5, name="bn", gamma_initializer=given(gamma),
                                               beta_initializer=given(beta))

    want = torch_bn(x, axis, gamma, beta, 0.001, 0.5, weights)
    got = bn_train_job(shape, build, weights)(x)
    for a, b in zip(got, want[:4]):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)
    flow.clear_default_session()
    got = bn_train_job(shape, build, weights.astype(np.float32), dtype=flow.float32)(x.astype(np.float32))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-3, atol=2e-3)       # 1000 + N(0, 1) in float32: ~6e-5 steps
    np.testing.assert_allclose(got[1], want[1], rtol=1e-2, atol=2e-2)
    np.testing.assert_allclose(variable("bn-moving_variance"), want[5], rtol=1e-3)


@pytest.mark.numpy_backend
@pytest.mark.parametrize("reduce", [flow.math.reduce_mean, flow.math.reduce_sum])
def test_moving_statistics_on_two_devices_average_each_devices_batch_statistics(reduce):
    """Each device normalizes its half of the batch; the moving statistics take the mean of the halves'
    statistics, also under a loss summed over the batch, whose gradients the devices sum."""
    flow.clear_default_session()
    flow.config.cpu_device_num(2)
    try:
        @flow.global_function(type="train")
        def job(x: tp.Numpy.Placeholder((8, 3, 4, 4), dtype=flow.float64)) -> tp.Numpy:
            y = flow.layers.batch_normalization(x, axis=1, momentum=0.5, name="bn")
            loss = reduce(flow.math.square(y))
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0]), momentum=0).minimize(loss)
            return loss

        x = np.random.default_rng(4).normal(2.0, 3.0, size=(8, 3, 4, 4))
        job(x)
        halves = np.split(x, 2)
        means = np.mean([h.mean(axis=(0, 2, 3)) for h in halves], axis=0)
        variances = np.mean([h.var(axis=(0, 2, 3), ddof=1) for h in halves], axis=0)
        variables = flow.get_all_variables()
        np.testing.assert_allclose(variables["bn-moving_mean"].numpy(), 0.5 * means, rtol=1e-12)
        np.testing.assert_allclose(variables["bn-moving_variance"].numpy(), 0.5 + 0.5 * variances, rtol=1e-12)
    finally:
        flow.clear_default_session()
