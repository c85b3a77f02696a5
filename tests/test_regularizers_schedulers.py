"""flow.regularizers inside every optimizer's update, and the learning-rate schedules, against NumPy references.

Regularization (OneFlow 0.x, ``CastScaleRegularizeGradientFunctor`` and the job pass order in
``generate_backward_and_optimizer_op_confs.cpp``): the update applies ``g * (1 / loss.size) + l1 * sign(w) + l2 * w``
(``l2 * w``, not ``2 * l2 * w``; ``sign(0) = 0``), and a global-norm clip is taken over that sum. Each optimizer below
trains a dense layer whose kernel carries the regularizer for a few steps; the reference is a float64 transcription of
OneFlow's kernel fed that gradient. Schedules are compared with closed forms of OneFlow's learning_rate_schedule
kernel, alone and combined with warmups the way OneFlow-Benchmark's optimizer_util.py combines them.
"""
import math

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.runtime import session

BATCH, IN, OUT = 8, 4, 3
STEPS = 5
LR = 0.05

REGULARIZERS = {
    "l1": (lambda: flow.regularizers.l1(0.03), 0.03, 0.0),
    "l2": (lambda: flow.regularizers.l2(0.2), 0.0, 0.2),
    "l1_l2": (lambda: flow.regularizers.l1_l2(0.03, 0.2), 0.03, 0.2),
}


def data(seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((BATCH, IN)).astype(np.float32), rng.standard_normal((BATCH, OUT)).astype(np.float32))
            for _ in range(STEPS)]


def start_values():
    """The initial parameters, from a predict job in a fresh session (initializers are seeded by variable name)."""
    flow.clear_default_session()

    @flow.global_function()
    def probe(x: tp.Numpy.Placeholder((BATCH, IN))) -> tp.Numpy:
        return dense(x, None, None)

    probe(np.zeros((BATCH, IN), np.float32))
    values = {k: session.default().variables[k].numpy().astype(np.float64) for k in ("lin-weight", "lin-bias")}
    flow.clear_default_session()
    return values


def dense(x, kernel_regularizer, bias_regularizer):
    return flow.layers.dense(x, OUT, kernel_initializer=flow.random_normal_initializer(stddev=0.5),
                             bias_initializer=flow.constant_initializer(0.1), kernel_regularizer=kernel_regularizer,
                             bias_regularizer=bias_regularizer, name="lin")


def train(make_optimizer, kernel_regularizer, bias_regularizer=None, batches=None):
    """Train the layer over ``batches``; returns its variables afterwards."""
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((BATCH, IN)), y: tp.Numpy.Placeholder((BATCH, OUT))) -> tp.Numpy:
        out = dense(x, kernel_regularizer, bias_regularizer)
        loss = flow.math.reduce_sum(flow.math.square(out - y), axis=1)
        make_optimizer().minimize(loss)
        return loss

    for x, y in batches or data():
        job(x, y)
    return {k: session.default().variables[k].numpy() for k in ("lin-weight", "lin-bias")}


def loss_grads(p, x, y):
    """Gradients of the loss mean (minimize scales the summed gradient by 1 / loss.size)."""
    d = 2 * (x @ p["lin-weight"].T + p["lin-bias"] - y) / len(x)
    return {"lin-weight": d.T @ x, "lin-bias": d.sum(0)}


def reference(start, rule_of, regularization, batches=None, clip_norm=None, lr_at=lambda step: LR):
    """Each variable's ``rule_of[name](w, g, lr, t, state)`` over the steps; gradients regularized first, then
    clipped by their global norm (OneFlow's order)."""
    p = dict(start)
    state = {k: {} for k in p}
    for t, (x, y) in enumerate(batches or data(), 1):
        grads = loss_grads(p, x.astype(np.float64), y.astype(np.float64))
        for k, (l1, l2) in regularization.items():
            grads[k] = grads[k] + l1 * np.sign(p[k]) + l2 * p[k]
        if clip_norm is not None:
            norm = math.sqrt(sum(np.sum(g * g) for g in grads.values()))
            grads = {k: g * min(1.0, clip_norm / norm) for k, g in grads.items()}
        for k in p:
            p[k] = rule_of[k](p[k], grads[k], lr_at(t - 1), t, state[k])
    return p


# OneFlow 0.x's update kernels, one step each (t counts from 1)

def sgd(w, g, lr, t, s):
    return w - lr * g


def momentum(beta):
    def step(w, g, lr, t, s):
        s["m"] = beta * s.get("m", 0.0) - lr * g
        return w + s["m"]
    return step


def sgdw(momentum_beta, weight_decay):
    """OneFlow's sgd_update / momentum_update with weight_decay: the decay from the weight before the step."""
    def step(w, g, lr, t, s):
        if not momentum_beta:
            return w - lr * (g + weight_decay * w)
        s["m"] = momentum_beta * s.get("m", 0.0) - lr * g
        return w + s["m"] - lr * weight_decay * w
    return step


def adam(beta1=0.9, beta2=0.999, epsilon=1e-8, bias_correction=False, weight_decay=0.0):
    def step(w, g, lr, t, s):
        s["m"] = beta1 * s.get("m", 0.0) + (1 - beta1) * g
        s["v"] = beta2 * s.get("v", 0.0) + (1 - beta2) * g * g
        if bias_correction:
            lr = lr * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
        return w - lr * (s["m"] / (np.sqrt(s["v"]) + epsilon) + weight_decay * w)
    return step


def rmsprop(decay_rate=0.99, epsilon=1e-8, centered=False):
    def step(w, g, lr, t, s):
        s["ms"] = decay_rate * s.get("ms", 0.0) + (1 - decay_rate) * g * g
        denom = s["ms"]
        if centered:
            s["mg"] = decay_rate * s.get("mg", 0.0) + (1 - decay_rate) * g
            denom = s["ms"] - s["mg"] ** 2
        return w - lr * g / np.sqrt(denom + epsilon)
    return step


def lars(momentum_beta=0.9, epsilon=1e-9, coefficient=0.0001):
    def step(w, g, lr, t, s):
        w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)      # of the regularized gradient, as OneFlow
        local = coefficient * w_norm / (epsilon + g_norm) if w_norm > 0 and g_norm > 0 else 1.0
        s["m"] = momentum_beta * s.get("m", 0.0) - lr * local * g
        return w + s["m"]
    return step


def lamb(beta1=0.9, beta2=0.999, epsilon=1e-6):
    def step(w, g, lr, t, s):
        s["m"] = beta1 * s.get("m", 0.0) + (1 - beta1) * g
        s["v"] = beta2 * s.get("v", 0.0) + (1 - beta2) * g * g
        d = (s["m"] / (1 - beta1 ** (t + 1))) / np.sqrt(s["v"] / (1 - beta2 ** (t + 1)) + epsilon)
        w_norm, d_norm = np.linalg.norm(w), np.linalg.norm(d)
        return w - lr * (w_norm / d_norm if w_norm > 0 and d_norm > 0 else 1.0) * d
    return step


OPTIMIZERS = {
    "sgd": (lambda: flow.optimizer.SGD(LR, momentum=0), sgd),
    "sgd_none_momentum": (lambda: flow.optimizer.SGD(LR, momentum=None), sgd),
    "momentum": (lambda: flow.optimizer.SGD(LR, momentum=0.9), momentum(0.9)),
    "sgdw": (lambda: flow.optimizer.SGDW(LR, momentum=0, weight_decay=0.3, weight_decay_includes="weight"), None),
    "sgdw_momentum": (lambda: flow.optimizer.SGDW(LR, momentum=0.9, weight_decay=0.3, weight_decay_excludes="bias"),
                      None),
    "adam": (lambda: flow.optimizer.Adam(LR), adam()),
    "adam_bias_correction": (lambda: flow.optimizer.Adam(LR, do_bias_correction=True), adam(bias_correction=True)),
    "adamw": (lambda: flow.optimizer.AdamW(LR, weight_decay=0.01, weight_decay_includes="weight"), None),
    "rmsprop": (lambda: flow.optimizer.RMSProp(LR), rmsprop()),
    "rmsprop_centered": (lambda: flow.optimizer.RMSProp(LR, centered=True), rmsprop(centered=True)),
    "lars": (lambda: flow.optimizer.LARS(LR, lars_coefficient=0.5), lars(coefficient=0.5)),
    "lamb": (lambda: flow.optimizer.LAMB(LR), lamb()),
    "lazy_adam": (lambda: flow.optimizer.LazyAdam(LR), adam(bias_correction=True)),
}


@pytest.mark.parametrize("regularizer", sorted(REGULARIZERS))
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_every_optimizer_adds_the_regularizer_to_the_scaled_gradient(optimizer, regularizer):
    make_optimizer, rule = OPTIMIZERS[optimizer]
    make_regularizer, l1, l2 = REGULARIZERS[regularizer]
    if optimizer == "adamw":        # decoupled decay on the kernel only (its name pattern), on top of regularization
        rule_of = {"lin-weight": adam(weight_decay=0.01), "lin-bias": adam()}
    elif optimizer.startswith("sgdw"):
        beta = 0.9 if optimizer == "sgdw_momentum" else 0.0
        rule_of = {"lin-weight": sgdw(beta, 0.3), "lin-bias": sgdw(beta, 0.0)}
    else:
        rule_of = {"lin-weight": rule, "lin-bias": rule}
    start = start_values()
    got = train(make_optimizer, make_regularizer())
    expected = reference(start, rule_of, {"lin-weight": (l1, l2)})
    for k in expected:
        np.testing.assert_allclose(got[k], expected[k], rtol=2e-5, atol=2e-6, err_msg=f"{optimizer} {regularizer} {k}")
    # the regularization made a difference the comparison can see
    unregularized = reference(start, rule_of, {})
    assert np.abs(unregularized["lin-weight"] - got["lin-weight"]).max() > 1e-4


def test_bias_regularizer_and_clipping_take_the_norm_of_the_regularized_gradients():
    start = start_values()
    regularization = {"lin-weight": (0.0, 0.5), "lin-bias": (0.2, 0.0)}
    got = train(lambda: flow.optimizer.SGD(LR, momentum=0.9,
                                           grad_clipping=flow.optimizer.grad_clipping.by_global_norm(0.3)),
                flow.regularizers.l2(0.5), flow.regularizers.l1(0.2))
    expected = reference(start, {"lin-weight": momentum(0.9), "lin-bias": momentum(0.9)}, regularization,
                         clip_norm=0.3)
    for k in expected:
        np.testing.assert_allclose(got[k], expected[k], rtol=2e-5, atol=2e-6, err_msg=k)
    # clipping the unregularized gradients and regularizing after (the other order) gives other values
    other = reference(start, {"lin-weight": momentum(0.9), "lin-bias": momentum(0.9)}, {}, clip_norm=0.3)
    assert np.abs(other["lin-weight"] - got["lin-weight"]).max() > 1e-4


def test_regularization_follows_the_loss_scale_and_sign_of_zero_is_zero():
    """A static loss scale changes nothing but rounding (the regularizer is added after unscaling), and a zero
    weight under l1 stays where it is (sign(0) = 0, as OneFlow's GPU and fused kernels compute it)."""
    start = start_values()
    expected = reference(start, {"lin-weight": sgd, "lin-bias": sgd}, {"lin-weight": (0.03, 0.2)})
    got = train(lambda: flow.optimizer.SGD(LR, momentum=0, loss_scale_factor=1024.0),
                flow.regularizers.l1_l2(0.03, 0.2))
    for k in expected:
        np.testing.assert_allclose(got[k], expected[k], rtol=2e-5, atol=2e-6, err_msg=k)

    @flow.global_function(type="train")
    def zero(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(2,), initializer=flow.zeros_initializer(),
                              regularizer=flow.regularizers.l1(1.0))
        v = flow.get_variable("v", shape=(2,), initializer=flow.constant_initializer(2.0),
                              regularizer=flow.regularizers.l1(1.0))
        loss = flow.math.reduce_sum(w * 0.0 + v * x)
        flow.optimizer.SGD(0.5, momentum=0).minimize(loss)
        return loss

    zero(np.zeros(2, np.float32))
    np.testing.assert_array_equal(session.default().variables["w"].numpy(), [0.0, 0.0])
    np.testing.assert_allclose(session.default().variables["v"].numpy(), [1.5, 1.5])     # 2 - 0.5 * 1 * sign(2)


def test_conv2d_kernel_regularizer_adds_exactly_its_term():
    """One plain SGD step with and without ``kernel_regularizer``: the kernels differ by ``lr * (l1 sign(w) + l2 w)``
    of the initial kernel, and the bias (no regularizer) not at all."""
    x = np.random.default_rng(3).standard_normal((2, 3, 6, 6)).astype(np.float32)

    def step(regularizer):
        flow.clear_default_session()

        @flow.global_function(type="train")
        def job(images: tp.Numpy.Placeholder((2, 3, 6, 6))) -> tp.Numpy:
            out = flow.layers.conv2d(images, 4, 3, kernel_initializer=flow.random_normal_initializer(stddev=0.3),
                                     kernel_regularizer=regularizer, name="conv")
            loss = flow.math.reduce_mean(flow.math.square(out), axis=[1, 2, 3])
            flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
            return loss

        graph_weight = job.compiled().graph.variables["conv-weight"]
        assert graph_weight.node.attrs.get("regularizer") == regularizer
        job(x)
        return {k: session.default().variables[k].numpy().astype(np.float64) for k in ("conv-weight", "conv-bias")}

    w0 = start_conv_weight()
    plain, regularized = step(None), step(flow.regularizers.l1_l2(0.05, 0.3))
    np.testing.assert_allclose(plain["conv-weight"] - regularized["conv-weight"],
                               0.1 * (0.05 * np.sign(w0) + 0.3 * w0), rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(plain["conv-bias"], regularized["conv-bias"])


def start_conv_weight():
    @flow.global_function()
    def probe(images: tp.Numpy.Placeholder((2, 3, 6, 6))) -> tp.Numpy:
        return flow.layers.conv2d(images, 4, 3, kernel_initializer=flow.random_normal_initializer(stddev=0.3),
                                  name="conv")

    probe(np.zeros((2, 3, 6, 6), np.float32))
    w0 = session.default().variables["conv-weight"].numpy().astype(np.float64)
    flow.clear_default_session()
    return w0


def test_regularizer_constructors_are_oneflows():
    assert (flow.regularizers.l1().l1, flow.regularizers.l1().l2) == (0.01, 0.0)
    assert (flow.regularizers.l2().l1, flow.regularizers.l2().l2) == (0.0, 0.01)
    assert (flow.regularizers.l1_l2().l1, flow.regularizers.l1_l2().l2) == (0.01, 0.01)
    assert flow.regularizers.l2(l=0.5).l2 == 0.5 and flow.regularizers.l1(l=0.25).l1 == 0.25
    with pytest.raises(ValueError, match=r"flow\.regularizers: l2 must be a finite number >= 0, got -1"):
        flow.regularizers.l2(-1)
    with pytest.raises(ValueError, match=r"l1 must be a finite number >= 0, got 'a'"):
        flow.regularizers.l1("a")

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return flow.get_variable("w", shape=(2,), regularizer=0.1) + x

    with pytest.raises(TypeError, match=r"flow\.get_variable\('w'\): regularizer: expected a regularizer from "
                                        r"flow\.regularizers\.l1 / l2 / l1_l2 or None, got 0\.1"):
        job(np.zeros(2, np.float32))


# ----------------------------------------------------------------------------------------------- learning rates

T = np.arange(0, 120)
W = 10          # warmup steps


def polynomial(base, steps, end, power, cycle, t):
    if cycle:
        t = np.maximum(t, 1)
        decay = steps * np.ceil(t / steps)
    else:
        t, decay = np.minimum(t, steps), steps
    return (base - end) * (1 - t / decay) ** power + end


# name -> (constructor taking warmup=, base rate (what a warmup scales), closed form over T)
SCHEDULES = {
    "piecewise_constant": (lambda w: flow.optimizer.PiecewiseConstantScheduler([30, 60], [0.3, 0.1, 0.01], warmup=w),
                           0.3, lambda t: np.array([0.3, 0.1, 0.01])[np.searchsorted([30, 60], t, side="left")]),
    "piecewise_scaling": (lambda w: flow.optimizer.PiecewiseScalingScheduler(0.2, [30, 60, 80], [0.1, 0.01, 0.001],
                                                                             warmup=w),
                          0.2, lambda t: 0.2 * np.array([1, 0.1, 0.01, 0.001])[np.searchsorted([30, 60, 80], t)]),
    "cosine": (lambda w: flow.optimizer.CosineScheduler(0.4, 100, alpha=0.05, warmup=w), 0.4,
               lambda t: 0.4 * (0.95 * 0.5 * (1 + np.cos(np.pi * np.minimum(t, 100) / 100)) + 0.05)),
    "polynomial": (lambda w: flow.optimizer.PolynomialSchduler(0.5, 90, end_learning_rate=0.00001, power=1.0,
                                                               cycle=False, warmup=w),
                   0.5, lambda t: polynomial(0.5, 90, 0.00001, 1.0, False, t)),
    "polynomial_cycle": (lambda w: flow.optimizer.PolynomialScheduler(0.5, 25, end_learning_rate=0.01, power=2.0,
                                                                      cycle=True, warmup=w),
                         0.5, lambda t: polynomial(0.5, 25, 0.01, 2.0, True, t)),
    "exponential": (lambda w: flow.optimizer.ExponentialScheduler(0.3, 20, 0.94, warmup=w), 0.3,
                    lambda t: 0.3 * 0.94 ** (t / 20)),
    "exponential_staircase": (lambda w: flow.optimizer.ExponentialScheduler(0.3, 20, 0.5, staircase=True, warmup=w),
                              0.3, lambda t: 0.3 * 0.5 ** np.floor(t / 20)),
    "inverse_time": (lambda w: flow.optimizer.InverseTimeScheduler(0.3, 10, 0.5, staircase=True, warmup=w), 0.3,
                     lambda t: 0.3 / (1 + 0.5 * np.floor(t / 10))),
    "natural_exp": (lambda w: flow.optimizer.NaturalExpScheduler(0.3, 10, 0.2, warmup=w), 0.3,
                    lambda t: 0.3 * np.exp(-0.2 * t / 10)),
    "linear_cosine": (lambda w: flow.optimizer.LinearCosineScheduler(0.3, 100, num_periods=2.0, alpha=0.1, beta=0.01,
                                                                     warmup=w),
                      0.3, lambda t: 0.3 * ((0.1 + (100 - np.minimum(t, 100)) / 100) *
                                            0.5 * (1 + np.cos(4 * np.pi * np.minimum(t, 100) / 100)) + 0.01)),
}

WARMUPS = {
    "none": (lambda: None, lambda base, t, decayed: decayed),
    # optimizer_util.py's warmup: linear from 0, then the decay at the *global* step (not counted after warmup)
    "linear": (lambda: flow.optimizer.warmup.linear(W, 0), lambda base, t, decayed:
               np.where(t < W, base * t / W, decayed)),
    "linear_from_quarter": (lambda: flow.optimizer.warmup.linear(W, 0.25), lambda base, t, decayed:
                            np.where(t < W, base * (0.25 + 0.75 * t / W), decayed)),
    "constant": (lambda: flow.optimizer.warmup.constant(W, 0.1), lambda base, t, decayed:
                 np.where(t < W, base * 0.1, decayed)),
}


@pytest.mark.parametrize("warmup", sorted(WARMUPS))
@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_schedule_over_steps_is_oneflows_closed_form(schedule, warmup):
    make, base, closed_form = SCHEDULES[schedule]
    make_warmup, warmed = WARMUPS[warmup]
    scheduler = make(make_warmup())
    np.testing.assert_allclose([scheduler(int(t)) for t in T], warmed(base, T, closed_form(T)), rtol=1e-12,
                               atol=1e-15)


def test_a_boundary_step_belongs_to_the_piece_before_it():
    s = flow.optimizer.PiecewiseScalingScheduler(1.0, [30, 60, 80], [0.1, 0.01, 0.001])
    assert [s(30), s(31), s(60), s(61), s(80), s(81)] == [1.0, 0.1, 0.1, 0.01, 0.01, 0.001]
    s = flow.optimizer.PiecewiseScalingScheduler(1.0, [5], 0.5)         # one number scales every boundary
    assert [s(5), s(6)] == [1.0, 0.5]


def test_train_job_uses_the_rate_of_each_train_step():
    """``SGD(momentum=None)`` (optimizer_util's no-momentum form) with optimizer_util's cosine + linear warmup: the
    step each call takes is ``lr(step) * gradient``, step counted from 0."""
    scheduler = flow.optimizer.CosineScheduler(base_lr=0.8, steps=12, warmup=flow.optimizer.warmup.linear(4, 0))

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(4,), initializer=flow.zeros_initializer())
        loss = w * x
        flow.optimizer.SGD(scheduler, momentum=None).minimize(loss)
        return loss

    x = np.array([1.0, 2.0, -1.0, 0.5], np.float32)
    steps = []
    for _ in range(20):
        before = session.default().variables["w"].numpy() if session.default().variables else np.zeros(4)
        job(x)
        steps.append((before - session.default().variables["w"].numpy()) / (x / 4))   # lr * dloss/dw / loss.size
    rates = [float(np.mean(s)) for s in steps]
    t = np.arange(20)
    expected = np.where(t < 4, 0.8 * t / 4, 0.8 * 0.5 * (1 + np.cos(np.pi * np.minimum(t, 12) / 12)))
    np.testing.assert_allclose(rates, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("make, message", [
    (lambda: flow.optimizer.warmup.constant(5, 1.5), r"warmup\.constant: multiplier must lie in \(0, 1\), got 1\.5"),
    (lambda: flow.optimizer.warmup.constant(5, 0), r"warmup\.constant: multiplier must lie in \(0, 1\), got 0"),
    (lambda: flow.optimizer.warmup.linear(5, 1.0), r"warmup\.linear: start_multiplier must lie in \[0, 1\), got 1\.0"),
    (lambda: flow.optimizer.warmup.linear(-1, 0.0), r"warmup steps must be a non-negative int, got -1"),
    (lambda: flow.optimizer.PolynomialScheduler(0.1, 0), r"PolynomialScheduler: steps: expected a positive int"),
    (lambda: flow.optimizer.PolynomialSchduler(0.1, 10, cycle=1), r"PolynomialSchduler: cycle: expected True or "
                                                                  r"False, got 1"),
    (lambda: flow.optimizer.ExponentialScheduler(0.1, 10, "0.9"), r"ExponentialScheduler: decay_rate: expected a "
                                                                  r"number, got '0\.9'"),
    (lambda: flow.optimizer.CosineScheduler(-1.0, 10), r"CosineScheduler: base_lr: expected a positive number"),
    (lambda: flow.optimizer.PiecewiseScalingScheduler(0.1, [2.5], [0.1]), r"boundaries must be ints"),
    (lambda: flow.optimizer.PiecewiseConstantScheduler([5, 3], [1, 2, 3]), r"boundaries must increase"),
])
def test_bad_schedule_arguments_say_what_was_expected(make, message):
    with pytest.raises(ValueError, match=message):
        make()
