"""flow.optimizer.loss_scale: static and dynamic loss scaling, as OneFlow 0.x's job passes and kernels do it.

The seed gradient is the scale (intermediate gradients are scaled), the model gradients are divided by it again, so
every optimizer trains as without scaling; a dynamic scale skips a step whose gradients hold NaN/Inf (no variable,
optimizer state or train step changes), divides the scale by ``multiplier`` (not below 1) and multiplies it after
``increment_period`` good steps (dynamic_loss_scale_schedule_kernel.cpp).
"""
import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.runtime import session

BATCH, IN = 8, 3


def variable(name):
    return session.default().variables[name].numpy()


def regression_job(make_optimizer, watched=None):
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((BATCH, IN)), y: tp.Numpy.Placeholder((BATCH, 1))) -> tp.Numpy:
        pred = flow.layers.dense(x, 1, kernel_initializer=flow.random_normal_initializer(stddev=0.5), name="lin")
        if watched is not None:
            flow.watch_diff(pred, watched)
        loss = flow.math.reduce_sum(flow.math.square(pred - y), axis=1)
        make_optimizer().minimize(loss)
        return loss
    return job


def batches(n, seed=0):
    rng = np.random.default_rng(seed)
    w_true = np.array([[1.5, -2.0, 0.5]], np.float32)
    out = []
    for _ in range(n):
        x = rng.standard_normal((BATCH, IN)).astype(np.float32)
        out.append((x, x @ w_true.T))
    return out


def trained(make_optimizer, n=6, watched=None):
    job = regression_job(make_optimizer, watched)
    for x, y in batches(n):
        job(x, y)
    return {k: variable(k) for k in ("lin-weight", "lin-bias")}


OPTIMIZERS = {
    "sgd": lambda **kw: flow.optimizer.SGD(0.05, momentum=None, **kw),
    "momentum": lambda **kw: flow.optimizer.SGD(0.05, momentum=0.9, **kw),
    "sgdw": lambda **kw: flow.optimizer.SGDW(0.05, momentum=0.9, weight_decay=0.2, **kw),
    "adam": lambda **kw: flow.optimizer.Adam(0.05, do_bias_correction=True, **kw),
    "adamw": lambda **kw: flow.optimizer.AdamW(0.05, weight_decay=0.1, **kw),
    "rmsprop": lambda **kw: flow.optimizer.RMSProp(0.05, centered=True, **kw),
    "lars": lambda **kw: flow.optimizer.LARS(0.05, lars_coefficient=0.5, **kw),
    "lamb": lambda **kw: flow.optimizer.LAMB(0.05, **kw),
    "lazy_adam": lambda **kw: flow.optimizer.LazyAdam(0.05, **kw),
}


@pytest.mark.parametrize("policy", ["static", "dynamic", "factor"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_every_optimizer_trains_as_without_a_loss_scale(optimizer, policy):
    make = OPTIMIZERS[optimizer]
    plain = trained(make)
    flow.clear_default_session()
    scaling = {"static": {"loss_scale_policy": flow.optimizer.loss_scale.static_loss_scale(256.0)},
               "dynamic": {"loss_scale_policy": flow.optimizer.loss_scale.dynamic_loss_scale(2 ** 12)},
               "factor": {"loss_scale_factor": 32}}[policy]
    scaled = trained(lambda: make(**scaling))
    for k in plain:
        np.testing.assert_allclose(scaled[k], plain[k], rtol=1e-5, atol=1e-6, err_msg=f"{optimizer} {policy} {k}")
    assert np.abs(plain["lin-weight"] - start_weight()).max() > 1e-2      # it trained at all


def start_weight():
    flow.clear_default_session()
    job = regression_job(lambda: flow.optimizer.SGD(0.0001, momentum=0))
    job.compiled()
    session.default().initialize_missing()
    return variable("lin-weight")


def test_intermediate_gradients_are_scaled_and_clipping_sees_unscaled_ones():
    seen = {}
    clip = flow.optimizer.grad_clipping.by_global_norm(0.5)
    plain = trained(lambda: flow.optimizer.SGD(0.1, momentum=0.9, grad_clipping=clip), n=3,
                    watched=lambda g: seen.setdefault("plain", []).append(g.copy()))
    flow.clear_default_session()
    scaled = trained(lambda: flow.optimizer.SGD(0.1, momentum=0.9, grad_clipping=clip,
                                                loss_scale_policy=flow.optimizer.loss_scale.dynamic_loss_scale(
                                                    initial_loss_scale=64, increment_period=100)),
                     n=3, watched=lambda g: seen.setdefault("scaled", []).append(g.copy()))
    for k in plain:
        np.testing.assert_allclose(scaled[k], plain[k], rtol=1e-5, atol=1e-6, err_msg=k)
    for a, b in zip(seen["plain"], seen["scaled"]):
        np.testing.assert_allclose(b, 64 * a, rtol=1e-6)      # watch_diff sees the scaled gradient, as in OneFlow


def test_a_step_with_inf_gradients_is_skipped_and_the_scale_falls():
    """SGD with momentum under dynamic_loss_scale(1024, increment_period=3, multiplier=2): a call whose gradients
    are Inf changes no variable, no momentum and not the train step of the schedule; the scale halves and the good
    step count restarts; three good steps double it again."""
    schedule = flow.optimizer.PiecewiseConstantScheduler([0, 1, 2], [1.0, 0.5, 0.25, 0.125])

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(2,), initializer=flow.constant_initializer(1.0))
        loss = w * x
        flow.optimizer.SGD(schedule, momentum=0.9, loss_scale_policy=flow.optimizer.loss_scale.dynamic_loss_scale(
            initial_loss_scale=1024, increment_period=3, multiplier=2.0)).minimize(loss)
        return loss

    scale_name = "System-Train-DynamicLossScale-job-LossScale"
    counter_name = "System-Train-DynamicLossScale-job-GoodStepCounter"
    good = np.array([1.0, -2.0], np.float32)
    w, m = np.ones(2), np.zeros(2)

    def sgd_step(x, lr):
        nonlocal w, m
        m = 0.9 * m - lr * x / 2            # gradient of sum(w * x) over loss.size 2
        w = w + m

    job(good)
    sgd_step(good, 1.0)
    assert (variable(scale_name)[0], variable(counter_name)[0]) == (1024.0, 1)
    np.testing.assert_allclose(variable("w"), w, rtol=1e-6)

    job(np.array([np.inf, 1.0], np.float32))          # skipped
    np.testing.assert_allclose(variable("w"), w, rtol=1e-6)
    np.testing.assert_allclose(variable("w-momentum"), m, rtol=1e-6)
    assert (variable(scale_name)[0], variable(counter_name)[0]) == (512.0, 0)
    assert variable(counter_name).dtype == np.int64 and variable(scale_name).dtype == np.float32

    for lr in (0.5, 0.25, 0.125):                     # train steps 1, 2, 3: the skipped call used no step
        job(good)
        sgd_step(good, lr)
        np.testing.assert_allclose(variable("w"), w, rtol=1e-6)
        np.testing.assert_allclose(variable("w-momentum"), m, rtol=1e-6)
    assert (variable(scale_name)[0], variable(counter_name)[0]) == (1024.0, 0)     # 3 good steps: doubled

    for _ in range(11):                               # NaN (0 * Inf) as well; the scale stops at 1
        job(np.array([np.nan, 0.0], np.float32))
    assert (variable(scale_name)[0], variable(counter_name)[0]) == (1.0, 0)
    np.testing.assert_allclose(variable("w"), w, rtol=1e-6)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")   # NumPy's, on the skipped steps
def test_an_overflowing_scale_falls_until_gradients_are_finite_and_training_converges():
    """Starting at 2**127 the scaled float32 gradients overflow; each such step is skipped and halves the scale,
    then the regression trains to its solution."""
    policy = flow.optimizer.loss_scale.dynamic_loss_scale(initial_loss_scale=2.0 ** 127, increment_period=10 ** 6)
    job = regression_job(lambda: flow.optimizer.Adam(0.05, loss_scale_policy=policy))
    losses = [float(job(x, y).mean()) for x, y in batches(300)]
    scale = float(variable("System-Train-DynamicLossScale-job-LossScale")[0])
    skipped = round(np.log2(2.0 ** 127 / scale))
    assert 1 <= skipped < 20
    assert losses[-1] < 1e-3 < losses[0]
    np.testing.assert_allclose(variable("lin-weight"), [[1.5, -2.0, 0.5]], atol=2e-2)


def test_policies_check_their_arguments():
    ls = flow.optimizer.loss_scale
    d = ls.dynamic_loss_scale()
    assert (d.initial_loss_scale, d.increment_period, d.multiplier) == (2.0 ** 30, 2000, 2.0)   # OneFlow's defaults
    assert ls.static_loss_scale(8).loss_scale_factor == 8.0
    for make, message in [
            (lambda: ls.dynamic_loss_scale(increment_period=0), r"increment_period must be a positive int"),
            (lambda: ls.dynamic_loss_scale(multiplier=1.0), r"multiplier must be a finite number > 1, got 1\.0"),
            (lambda: ls.dynamic_loss_scale(initial_loss_scale=0.5), r"initial_loss_scale must be a number in \[1"),
            (lambda: ls.static_loss_scale(0), r"loss_scale_factor must be a positive finite number, got 0")]:
        with pytest.raises(ValueError, match=message):
            make()
    with pytest.raises(TypeError, match=r"Adam: loss_scale_policy must be flow\.optimizer\.loss_scale\."
                                        r"static_loss_scale\(\.\.\.\) or dynamic_loss_scale\(\.\.\.\), got 128"):
        flow.optimizer.Adam(0.1, loss_scale_policy=128)


@pytest.mark.numpy_backend          # two host replicas (threads); on CuPy two devices would be needed
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")     # NumPy's, on the skipped step
def test_two_replicas_train_as_one_device_with_dynamic_scale_regularizer_and_clipping():
    """The NaN/Inf count, the clip factor and the regularized updates run once, on the all-reduced gradients."""
    def run(devices):
        flow.clear_default_session()
        flow.config.gpu_device_num(devices)

        @flow.global_function(type="train")
        def job(x: tp.Numpy.Placeholder((BATCH, IN)), y: tp.Numpy.Placeholder((BATCH, 1))) -> tp.Numpy:
            pred = flow.layers.dense(x, 1, kernel_initializer=flow.random_normal_initializer(stddev=0.5),
                                     kernel_regularizer=flow.regularizers.l1_l2(0.01, 0.1), name="lin")
            loss = flow.math.reduce_sum(flow.math.square(pred - y), axis=1)
            flow.optimizer.SGD(0.05, momentum=0.9, grad_clipping=flow.optimizer.grad_clipping.by_global_norm(1.0),
                               loss_scale_policy=flow.optimizer.loss_scale.dynamic_loss_scale(64)).minimize(loss)
            return loss

        for i, (x, y) in enumerate(batches(5)):
            if i == 2:
                x = x.copy()
                x[0, 0] = np.inf                # one skipped step (its Inf is on the first device's half)
            job(x, y)
        return {k: v.numpy() for k, v in session.default().variables.items()}

    one, two = run(1), run(2)
    assert one["System-Train-DynamicLossScale-job-LossScale"][0] == 32.0
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)
