"""RMSProp, LARS, LazyAdam and LAMB: OneFlow 0.x's update rules, state variables, checkpoints and argument checks.

Each optimizer trains a dense layer for a few steps and is compared with a NumPy (float64) transcription of OneFlow's
kernel written here step by step; the data zero the gradient of input feature 0 from the third step on, so rules
that treat zero-gradient elements specially show it.
"""
import inspect

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.runtime import backend, session

BATCH, IN, OUT = 8, 4, 3
STEPS = 6
BOUNDARIES = [2, 4]


def lr_values(lr):
    return [lr, lr / 2, lr / 4]


def lr_at(lr, step):
    """The PiecewiseConstantScheduler(BOUNDARIES, lr_values(lr)) rate at 0-based ``step``, written out."""
    return lr_values(lr)[0 if step <= 2 else 1 if step <= 4 else 2]      # a boundary belongs to the piece before it


def build_job(make_optimizer):
    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((BATCH, IN)), y: tp.Numpy.Placeholder((BATCH, OUT))) -> tp.Numpy:
        out = flow.layers.dense(x, OUT, kernel_initializer=flow.random_normal_initializer(stddev=0.5), name="lin")
        loss = flow.math.reduce_sum(flow.math.square(out - y), axis=1)
        make_optimizer().minimize(loss)
        return loss
    return train


def batches(n, seed=0):
    rng = np.random.default_rng(seed)
    data = []
    for step in range(n):
        x = rng.standard_normal((BATCH, IN)).astype(np.float32)
        if step >= 2:
            x[:, 0] = 0                                     # the weights' column 0 gets a zero gradient
        data.append((x, rng.standard_normal((BATCH, OUT)).astype(np.float32)))
    return data


def params():
    return {name: session.default().variables[name].numpy() for name in ("lin-weight", "lin-bias")}


def numpy_grads(p, x, y):
    """Gradients of mean_i sum_j (x W^T + b - y)_ij^2 (minimize scales by 1 / loss.size)."""
    d = 2 * (x @ p["lin-weight"].T + p["lin-bias"] - y) / len(x)
    return {"lin-weight": d.T @ x, "lin-bias": d.sum(0)}


def reference(rule, start, data, lr, clip_norm=None):
    p = {k: v.astype(np.float64) for k, v in start.items()}
    state = {k: {} for k in p}
    for t, (x, y) in enumerate(data, 1):
        grads = numpy_grads(p, x.astype(np.float64), y.astype(np.float64))
        if clip_norm is not None:
            norm = np.sqrt(sum(np.sum(g * g) for g in grads.values()))
            grads = {k: g * min(1.0, clip_norm / norm) for k, g in grads.items()}
        for k in p:
            p[k] = rule(k, p[k], grads[k], lr_at(lr, t - 1), t, state[k])
    return p


# OneFlow 0.x's kernels, one step each: rule(name, w, g, lr, t, state) -> new w (t counts from 1).

def rmsprop_rule(decay_rate, epsilon, centered):
    def step(name, w, g, lr, t, s):
        s["mean_square"] = decay_rate * s.get("mean_square", 0.0) + (1 - decay_rate) * g * g
        denom = s["mean_square"]
        if centered:
            s["mean_gradient"] = decay_rate * s.get("mean_gradient", 0.0) + (1 - decay_rate) * g
            denom = s["mean_square"] - s["mean_gradient"] ** 2
        return w - lr * g / np.sqrt(denom + epsilon)
    return step


def lars_rule(momentum_beta, epsilon, lars_coefficient):
    def step(name, w, g, lr, t, s):
        w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
        lars = lars_coefficient * w_norm / (epsilon + g_norm) if w_norm > 0 and g_norm > 0 else 1.0
        s["momentum"] = momentum_beta * s.get("momentum", 0.0) - lr * lars * g
        return w + s["momentum"]
    return step


def lazy_adam_rule(beta1, beta2, epsilon):
    def step(name, w, g, lr, t, s):
        s["m"] = beta1 * s.get("m", 0.0) + (1 - beta1) * g
        s["v"] = beta2 * s.get("v", 0.0) + (1 - beta2) * g * g
        lr_t = lr * np.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
        return w - lr_t * s["m"] / (np.sqrt(s["v"]) + epsilon)
    return step


def lamb_rule(beta1, beta2, epsilon, weight_decay_of):
    def step(name, w, g, lr, t, s):
        s["m"] = beta1 * s.get("m", 0.0) + (1 - beta1) * g
        s["v"] = beta2 * s.get("v", 0.0) + (1 - beta2) * g * g
        beta1_t, beta2_t = beta1 ** (t + 1), beta2 ** (t + 1)     # OneFlow multiplies beta_t before using it
        d = (s["m"] / (1 - beta1_t)) / np.sqrt(s["v"] / (1 - beta2_t) + epsilon)
        w_norm, d_norm = np.linalg.norm(w), np.linalg.norm(d)
        trust = w_norm / d_norm if w_norm > 0 and d_norm > 0 else 1.0
        return w - lr * trust * (d + weight_decay_of(name) * w)
    return step


def schedule(lr):
    return flow.optimizer.PiecewiseConstantScheduler(BOUNDARIES, lr_values(lr))


def clip(norm):
    return flow.optimizer.grad_clipping.by_global_norm(norm)


CASES = {
    "RMSProp": (lambda: flow.optimizer.RMSProp(schedule(0.05), decay_rate=0.9, epsilon=0.1),
                rmsprop_rule(0.9, 0.1, centered=False), 0.05, None),
    "RMSProp-centered-clipped": (lambda: flow.optimizer.RMSProp(schedule(0.2), decay_rate=0.8, epsilon=0.1,
                                                                 centered=True, grad_clipping=clip(0.5)),
                                 rmsprop_rule(0.8, 0.1, centered=True), 0.2, 0.5),
    "LARS": (lambda: flow.optimizer.LARS(schedule(0.5), momentum_beta=0.8, epsilon=0.3, lars_coefficient=0.5),
             lars_rule(0.8, 0.3, 0.5), 0.5, None),
    "LARS-clipped": (lambda: flow.optimizer.LARS(schedule(0.5), lars_coefficient=0.5, grad_clipping=clip(0.5)),
                     lars_rule(0.9, 1e-9, 0.5), 0.5, 0.5),
    "LazyAdam": (lambda: flow.optimizer.LazyAdam(schedule(0.05), beta1=0.8, beta2=0.95, epsilon=0.01),
                 lazy_adam_rule(0.8, 0.95, 0.01), 0.05, None),
    "LAMB": (lambda: flow.optimizer.LAMB(schedule(0.05), beta1=0.8, beta2=0.95, epsilon=0.01, weight_decay=0.5,
                                         weight_decay_excludes="bias"),
             lamb_rule(0.8, 0.95, 0.01, lambda name: 0.0 if "bias" in name else 0.5), 0.05, None),
    "LAMB-clipped": (lambda: flow.optimizer.LAMB(schedule(0.05), grad_clipping=clip(0.5)),
                     lamb_rule(0.9, 0.999, 1e-6, lambda name: 0.0), 0.05, 0.5),
}


def sgd_rule(momentum):
    def step(name, w, g, lr, t, s):
        if not momentum:
            return w - lr * g
        s["momentum"] = momentum * s.get("momentum", 0.0) - lr * g
        return w + s["momentum"]
    return step


SGD_CASES = {
    "SGD": (lambda: flow.optimizer.SGD(schedule(0.1), momentum=0), sgd_rule(0), 0.1, None),
    "SGD-momentum": (lambda: flow.optimizer.SGD(schedule(0.1), momentum=0.8), sgd_rule(0.8), 0.1, None),
    "SGD-momentum-clipped": (lambda: flow.optimizer.SGD(schedule(0.1), momentum=0.8, grad_clipping=clip(0.5)),
                             sgd_rule(0.8), 0.1, 0.5),
}


@pytest.mark.parametrize("blas_from", [pytest.param(1, id="blas-pass", marks=pytest.mark.numpy_backend),
                                       pytest.param(None, id="numpy-passes")])
@pytest.mark.parametrize("case", SGD_CASES)
def test_sgd_matches_numpy_in_its_blas_pass_and_in_numpys(case, blas_from, monkeypatch):
    """SGD's one-pass BLAS update (``runtime.blas.axpy``/``axpby``, tensors of BLAS_PASS_FROM elements or more: here
    every tensor, or none) and NumPy's passes train alike."""
    from flowlab.optim import optimizers
    monkeypatch.setattr(optimizers, "BLAS_PASS_FROM", blas_from or 1 << 62)
    test_training_matches_numpy_transcription_of_oneflow_kernel(case, SGD_CASES)


def adam_rule(beta1, beta2, epsilon, bias_correction, weight_decay_of):
    def step(name, w, g, lr, t, s):
        s["m"] = beta1 * s.get("m", 0.0) + (1 - beta1) * g
        s["v"] = beta2 * s.get("v", 0.0) + (1 - beta2) * g * g
        lr_t = lr * np.sqrt(1 - beta2 ** t) / (1 - beta1 ** t) if bias_correction else lr
        return w - lr_t * (s["m"] / (np.sqrt(s["v"]) + epsilon) + weight_decay_of(name) * w)
    return step


ADAM_CASES = {
    "Adam": (lambda: flow.optimizer.Adam(schedule(0.05), beta1=0.8, beta2=0.95, epsilon=0.01),
             adam_rule(0.8, 0.95, 0.01, False, lambda name: 0.0), 0.05, None),
    "Adam-bias-correction-clipped": (lambda: flow.optimizer.Adam(schedule(0.05), beta1=0.8, beta2=0.95,
                                                                 epsilon=0.01, do_bias_correction=True,
                                                                 grad_clipping=clip(0.5)),
                                     adam_rule(0.8, 0.95, 0.01, True, lambda name: 0.0), 0.05, 0.5),
    "AdamW": (lambda: flow.optimizer.AdamW(schedule(0.05), beta1=0.8, beta2=0.95, epsilon=0.01, weight_decay=0.5,
                                           weight_decay_excludes="bias"),
              adam_rule(0.8, 0.95, 0.01, False, lambda name: 0.0 if "bias" in name else 0.5), 0.05, None),
}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("blas_from", [pytest.param(1, id="blas-pass", marks=pytest.mark.numpy_backend),
                                       pytest.param(None, id="numpy-passes")])
@pytest.mark.parametrize("case", ADAM_CASES)
def test_adam_matches_numpy_in_its_blas_passes_and_in_numpys(case, blas_from, threads, monkeypatch):
    """Adam's BLAS update (an ``axpy`` for each moment and one for the step, on one host thread or split over two)
    and NumPy's thirteen passes train alike: with and without bias correction, clipping and AdamW's decay."""
    from flowlab.optim import optimizers
    from flowlab.runtime import host_threads
    monkeypatch.setattr(optimizers, "BLAS_PASS_FROM", blas_from or 1 << 62)
    monkeypatch.setattr(host_threads, "SPLIT_ELEMENTS", 1)          # (these tensors are tiny)
    monkeypatch.setattr(optimizers, "SPLIT_PART_MIN", 2)
    monkeypatch.setattr(host_threads, "width", lambda: threads)
    test_training_matches_numpy_transcription_of_oneflow_kernel(case, ADAM_CASES)


@pytest.mark.parametrize("case", CASES)
def test_training_matches_numpy_transcription_of_oneflow_kernel(case, cases=CASES):
    make_optimizer, rule, lr, clip_norm = cases[case]
    train = build_job(make_optimizer)
    flow.train.CheckPoint().init()
    start, data = params(), batches(STEPS)
    for x, y in data:
        train(x, y)
    got, want = params(), reference(rule, start, data, lr, clip_norm)
    for name in got:
        assert np.abs(got[name] - start[name]).max() > 0.02, f"{name} barely moved: the comparison would say little"
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_lazy_adam_moves_elements_whose_gradient_is_zero():
    """OneFlow's dense LazyAdam is adam_update over every element: a zero gradient still moves w by its momentum."""
    train = build_job(lambda: flow.optimizer.LazyAdam(0.05))
    flow.train.CheckPoint().init()
    data = batches(3)
    train(*data[0])
    before = params()["lin-weight"][:, 0]
    train(*data[2])                                         # x[:, 0] == 0: weight column 0 has a zero gradient
    after = params()["lin-weight"][:, 0]
    m = session.default().variables["lin-weight-m"].numpy()[:, 0]
    assert np.all(np.abs(after - before) > 1e-4)
    np.testing.assert_array_equal(np.sign(before - after), np.sign(m))


def test_lamb_weight_decay_only_where_the_patterns_allow():
    data = batches(1)                                       # one step: the bias sees the same gradient in both runs
    runs = {}
    decays = {"none": {}, "weight only": {"weight_decay": 0.5, "weight_decay_includes": ["weight"]}}
    for label, kwargs in decays.items():
        flow.clear_default_session()
        train = build_job(lambda: flow.optimizer.LAMB(0.05, **kwargs))
        for x, y in data:
            train(x, y)
        runs[label] = params()
    np.testing.assert_array_equal(runs["none"]["lin-bias"], runs["weight only"]["lin-bias"])
    assert not np.allclose(runs["none"]["lin-weight"], runs["weight only"]["lin-weight"])


STATE = {
    "RMSProp": (lambda: flow.optimizer.RMSProp(0.05, centered=True), ["mean_square", "mean_gradient"]),
    "LARS": (lambda: flow.optimizer.LARS(0.5, lars_coefficient=0.5), ["momentum"]),
    "LazyAdam": (lambda: flow.optimizer.LazyAdam(0.05), ["m", "v", "beta1_t", "beta2_t"]),
    "LAMB": (lambda: flow.optimizer.LAMB(0.05, weight_decay=0.01), ["m", "v", "beta1_t", "beta2_t"]),
}


@pytest.mark.parametrize("name", STATE)
def test_state_round_trips_through_checkpoint_and_training_continues_identically(name, tmp_path):
    make_optimizer, suffixes = STATE[name]
    data = batches(6)
    train = build_job(make_optimizer)
    uninterrupted = [train(x, y) for x, y in data]

    flow.clear_default_session()
    train = build_job(make_optimizer)
    for x, y in data[:3]:
        train(x, y)
    flow.train.CheckPoint().save(tmp_path / "ckpt")
    variables = session.default().variables
    for var in ("lin-weight", "lin-bias"):
        for suffix in suffixes:
            state = variables[f"{var}-{suffix}"]
            assert not state.trainable
            assert np.abs(state.numpy()).max() > 0, f"{var}-{suffix} holds nothing worth saving"
    if "beta1_t" in suffixes:                               # starts at beta1, times beta1 per step
        np.testing.assert_allclose(variables["lin-weight-beta1_t"].numpy(), [0.9 ** 4], rtol=1e-6)
        assert variables["lin-weight-beta1_t"].value.shape == (1,)
    for x, y in batches(2, seed=100):                       # a detour that changes every variable
        train(x, y)

    flow.train.CheckPoint().load(tmp_path / "ckpt")
    resumed = [train(x, y) for x, y in data[3:]]
    for got, want in zip(resumed, uninterrupted[3:]):
        np.testing.assert_array_equal(got, want)


def test_variables_limits_what_trains_and_which_state_exists():
    train = build_job(lambda: flow.optimizer.LAMB(0.05, variables=["lin-weight"]))
    flow.train.CheckPoint().init()
    start = params()
    for x, y in batches(2):
        train(x, y)
    np.testing.assert_array_equal(params()["lin-bias"], start["lin-bias"])
    assert not np.array_equal(params()["lin-weight"], start["lin-weight"])
    assert "lin-bias-m" not in session.default().variables


def _parameters(cls):
    return [(p.name, p.default) for p in inspect.signature(cls).parameters.values()]


def test_constructor_signatures_are_oneflows():
    # OneFlow 0.x's oneflow/python/ops/optimizer.py, then flowlab's own ``variables``.
    tail = [("loss_scale_factor", None), ("grad_clipping", None), ("train_step_lbn", None),
            ("loss_scale_policy", None), ("variables", None)]
    empty = inspect.Parameter.empty
    assert _parameters(flow.optimizer.RMSProp) == [("lr_scheduler", empty), ("decay_rate", 0.99), ("epsilon", 1e-8),
                                                   ("centered", False)] + tail
    assert _parameters(flow.optimizer.LARS) == [("lr_scheduler", empty), ("momentum_beta", 0.9), ("epsilon", 1e-9),
                                                ("lars_coefficient", 0.0001)] + tail
    assert _parameters(flow.optimizer.LazyAdam) == [("lr_scheduler", empty), ("beta1", 0.9), ("beta2", 0.999),
                                                    ("epsilon", 1e-8)] + tail
    assert _parameters(flow.optimizer.LAMB) == [("lr_scheduler", empty), ("beta1", 0.9), ("beta2", 0.999),
                                                ("epsilon", 1e-6), ("loss_scale_factor", None),
                                                ("weight_decay", None), ("weight_decay_includes", None),
                                                ("weight_decay_excludes", None)] + tail[1:]
    assert _parameters(flow.optimizer.SGDW) == [("lr_scheduler", empty), ("loss_scale_factor", None),
                                                ("momentum", 0.9), ("weight_decay", None),
                                                ("weight_decay_includes", None), ("weight_decay_excludes", None)] + \
        tail[1:]


@pytest.mark.parametrize("make, error, message", [
    (lambda: flow.optimizer.RMSProp(0.1, decay_rate=1.0), ValueError,
     r"RMSProp: decay_rate must be a number in \[0, 1\), got 1\.0"),
    (lambda: flow.optimizer.RMSProp(0.1, decay_rate=-0.5), ValueError,
     r"RMSProp: decay_rate must be a number in \[0, 1\), got -0\.5"),
    (lambda: flow.optimizer.RMSProp(0.1, epsilon=0), ValueError, r"RMSProp: epsilon must be a positive number, got 0"),
    (lambda: flow.optimizer.RMSProp(0.1, centered="yes"), ValueError,
     r"RMSProp: centered must be True or False, got 'yes'"),
    (lambda: flow.optimizer.LARS(0.1, momentum_beta=1.5), ValueError,
     r"LARS: momentum_beta must be a number in \[0, 1\), got 1\.5"),
    (lambda: flow.optimizer.LARS(0.1, epsilon=-1e-9), ValueError,
     r"LARS: epsilon must be a non-negative number, got -1e-09"),
    (lambda: flow.optimizer.LARS(0.1, lars_coefficient=0.0), ValueError,
     r"LARS: lars_coefficient must be a positive number, got 0\.0"),
    (lambda: flow.optimizer.LazyAdam(0.1, beta1=1), ValueError,
     r"LazyAdam: beta1 must be a number in \[0, 1\), got 1\b"),
    (lambda: flow.optimizer.LazyAdam(0.1, beta2=True), ValueError,
     r"LazyAdam: beta2 must be a number in \[0, 1\), got True"),
    (lambda: flow.optimizer.LazyAdam(0.1, epsilon="1e-8"), ValueError,
     r"LazyAdam: epsilon must be a positive number, got '1e-8'"),
    (lambda: flow.optimizer.LAMB(0.1, beta2=-0.1), ValueError,
     r"LAMB: beta2 must be a number in \[0, 1\), got -0\.1"),
    (lambda: flow.optimizer.LAMB(0.1, weight_decay=-0.01), ValueError,
     r"LAMB: weight_decay must be a non-negative number, got -0\.01"),
    (lambda: flow.optimizer.LAMB(0.1, weight_decay=0.1, weight_decay_includes="w", weight_decay_excludes="b"),
     ValueError, r"LAMB: give weight_decay_includes or weight_decay_excludes, not both"),
    (lambda: flow.optimizer.LAMB(-0.1), TypeError,
     r"lr_scheduler: expected a scheduler .* or a positive learning rate, got -0\.1"),
    (lambda: flow.optimizer.LARS(0.1, grad_clipping=1.0), TypeError,
     r"grad_clipping: expected flow\.optimizer\.grad_clipping\.by_global_norm\(clip_norm\), got 1\.0"),
    (lambda: flow.optimizer.RMSProp(0.1, loss_scale_factor=-2), ValueError,
     r"loss_scale_factor must be a positive finite number, got -2"),
    (lambda: flow.optimizer.RMSProp(0.1, loss_scale_factor=8, loss_scale_policy=flow.optimizer.loss_scale.
                                    static_loss_scale(8)), ValueError,
     r"RMSProp: give loss_scale_factor or loss_scale_policy, not both"),
])
def test_bad_arguments_name_the_argument_what_was_expected_and_what_came(make, error, message):
    with pytest.raises(error, match=message):
        make()


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["RMSProp-centered-clipped", "LARS", "LazyAdam", "LAMB"])
def test_cupy_updates_match_numpy(case):
    make_optimizer = CASES[case][0]
    data = batches(STEPS)
    results = {}
    for device in ("cpu", "gpu"):
        flow.clear_default_session()
        backend.use(device)
        try:
            train = build_job(make_optimizer)
            for x, y in data:
                train(x, y)
            results[device] = {k: v.numpy() for k, v in session.default().variables.items()}
        finally:
            backend.use("cpu")
    for name, want in results["cpu"].items():
        np.testing.assert_allclose(results["gpu"][name], want, rtol=1e-4, atol=1e-6, err_msg=name)


def test_a_variable_is_trainable_per_job():
    """As in OneFlow (a GAN: the discriminator's job reads the generator with trainable=False, the generator's job
    trains it), whichever job is traced first."""
    flow.clear_default_session()

    def net(x, trainable):
        w = flow.get_variable("shared", shape=(3,), initializer=flow.ones_initializer(), trainable=trainable)
        return flow.math.reduce_sum(x * w)

    def sgd():
        return flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0)

    @flow.global_function(type="train")
    def frozen(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        own = flow.get_variable("own", shape=(3,), initializer=flow.ones_initializer())
        loss = net(x, False) + flow.math.reduce_sum(x * own)
        sgd().minimize(loss)
        return loss

    @flow.global_function(type="train")
    def training(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        loss = net(x, True)
        sgd().minimize(loss)
        return loss

    variables = session.default().variables
    frozen(np.ones(3, np.float32))
    np.testing.assert_array_equal(variables["shared"].numpy(), 1.0)
    np.testing.assert_allclose(variables["own"].numpy(), 0.9)
    training(np.ones(3, np.float32))
    np.testing.assert_allclose(variables["shared"].numpy(), 0.9)
    frozen(np.ones(3, np.float32))
    np.testing.assert_allclose(variables["shared"].numpy(), 0.9)
