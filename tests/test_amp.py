"""Auto mixed precision (``enable_auto_mixed_precision``, ``compiler.amp``): the products' float16 kernels against
float64 references, the rewrite itself (which ops compute in float16, what stays float32, one cast a tensor),
training against float32, a dynamic loss scale that skips float16 overflows, watches and health, and plans without
the flag left exactly as they were. The rewrite is off on NumPy by default; these tests turn it on (``ON_NUMPY``).

Tolerances: a float16 product rounds its inputs and its output to 11 significant bits (relative error <= 2**-11 each,
accumulating in float32): kernels are checked to 4e-3 of the output's scale against the float64 product of the
same float16 values. Training carries that rounding into the weights: over 10-12 steps the losses stay within 1% of
float32's, step by step, for the MLP and for the conv + batch norm net (measured: 0.17% and 0.15% at most).
"""
import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.compiler import amp
from flowlab.ops.array import Cast
from flowlab.ops.conv import Conv2d, ConvFilterGrad, ConvInputGrad
from flowlab.ops.math import MatMul
from flowlab.runtime import session

BATCH, FEATURES, HIDDEN, CLASSES = 16, 12, 24, 4
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)


@pytest.fixture
def amp_on_numpy(monkeypatch):
    monkeypatch.setattr(amp, "ON_NUMPY", True)


def amp_config(enabled=True):
    config = flow.FunctionConfig()
    if enabled:
        config.enable_auto_mixed_precision(True)
    return config


def variable(name):
    return session.default().variables[name].numpy()


def half(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float16)


def assert_close_to(got, reference, rel=4e-3):
    """``got`` (float16) within ``rel`` of the reference's largest magnitude."""
    assert got.dtype == F16
    np.testing.assert_allclose(got.astype(np.float64), reference, rtol=0, atol=rel * np.abs(reference).max())


# ------------------------------------------------------------------------------------------------ float16 kernels

@pytest.mark.parametrize("transpose_a,transpose_b", [(False, False), (False, True), (True, False), (True, True)])
def test_matmul_computes_float16_products_with_float32_accumulation(transpose_a, transpose_b):
    a, b = half(*((96, 40) if transpose_a else (40, 96))), half(*((30, 96) if transpose_b else (96, 30)), seed=1)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    reference = 0.5 * (a64.T if transpose_a else a64) @ (b64.T if transpose_b else b64)
    got = MatMul.forward(np, a, b, transpose_a, transpose_b, 0.5)
    assert_close_to(got, reference)
    out = np.empty((40, 30), np.float16)
    assert MatMul.forward(np, a, b, transpose_a, transpose_b, 0.5, out=out) is out
    np.testing.assert_array_equal(out, got)
    # NumPy's own float16 matmul (no BLAS) computes the same rounded values
    assert np.abs(got.astype(np.float64) - np.matmul(a64.T if transpose_a else a64, b64.T if transpose_b else b64)
                  .astype(np.float16) * 0.5).max() <= 2e-3 * np.abs(reference).max()


def test_batched_matmul_in_float16():
    a, b = half(3, 8, 20), half(3, 20, 5, seed=1)
    got = MatMul.forward(np, a, b, False, False, 1.0)
    assert_close_to(got, a.astype(np.float64) @ b.astype(np.float64))


@pytest.mark.parametrize("groups,stride,pad,channels", [(1, 1, 1, 6), (2, 2, 0, 6), (6, 1, 1, 6)])
def test_convolution_and_its_gradients_in_float16_against_torch(groups, stride, pad, channels):
    torch = pytest.importorskip("torch")
    x, w = half(2, channels, 9, 9), half(channels, channels // groups, 3, 3, seed=1)
    conv = dict(strides=(stride, stride), dilations=(1, 1), padding=((pad, pad), (pad, pad)), groups=groups,
                data_format="NCHW")
    xt, wt = torch.tensor(x.astype(np.float64)), torch.tensor(w.astype(np.float64))
    reference = torch.nn.functional.conv2d(xt, wt, stride=stride, padding=pad, groups=groups).numpy()
    y = Conv2d.forward(np, x, w, **conv)
    assert_close_to(y, reference)
    dy = half(*y.shape, seed=2)
    dyt = torch.tensor(dy.astype(np.float64))
    dx = ConvInputGrad.forward(np, dy, w, input_shape=x.shape, **conv)
    assert_close_to(dx, torch.nn.grad.conv2d_input(x.shape, wt, dyt, stride=stride, padding=pad,
                                                   groups=groups).numpy())
    dw = ConvFilterGrad.forward(np, x, dy, filter_shape=w.shape, **conv)
    assert_close_to(dw, torch.nn.grad.conv2d_weight(xt, w.shape, dyt, stride=stride, padding=pad,
                                                    groups=groups).numpy())


def test_the_float16_list_is_an_op_trait():
    assert [op.amp for op in (MatMul, Conv2d, ConvInputGrad, ConvFilterGrad)] == ["float16"] * 4
    assert Cast.amp is None


# --------------------------------------------------------------------------------------------------- the rewrite

def data(steps, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(CLASSES, FEATURES)) * 1.5
    out = []
    for _ in range(steps):
        y = rng.integers(0, CLASSES, BATCH).astype(np.int32)
        out.append(((centres[y] + rng.normal(size=(BATCH, FEATURES))).astype(np.float32), y))
    return out


def mlp_job(config, watch=None, watch_diff=None, watch_weight=None, lr=0.1):
    """Two dense layers; the hidden layer's product is an explicit ``flow.matmul`` so that it can be watched."""
    @flow.global_function(type="train", function_config=config)
    def job(x: tp.Numpy.Placeholder((BATCH, FEATURES)),
            y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        w = flow.get_variable("hidden-weight", shape=(HIDDEN, FEATURES),
                              initializer=flow.random_normal_initializer(stddev=0.3, seed=1))
        product = flow.matmul(x, w, transpose_b=True, name="hidden_matmul")
        if watch_weight is not None:
            flow.watch(w, watch_weight)
        if watch is not None:
            flow.watch(product, watch)
        if watch_diff is not None:
            flow.watch_diff(product, watch_diff)
        h = flow.nn.relu(product)
        logits = flow.layers.dense(h, CLASSES, kernel_initializer=flow.random_normal_initializer(stddev=0.3, seed=2),
                                   name="output")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.optimizer.SGD(lr, momentum=0.9).minimize(loss)
        return loss
    return job


def test_products_compute_in_float16_between_casts_and_everything_else_stays_float32(amp_on_numpy, monkeypatch):
    seen = []
    forward = MatMul.forward

    def recording(xp, a, b, *args, **kwargs):
        seen.append((a.dtype, b.dtype))
        result = forward(xp, a, b, *args, **kwargs)
        seen[-1] += (result.dtype,)
        return result
    monkeypatch.setattr(MatMul, "forward", staticmethod(recording))
    job = mlp_job(amp_config())
    x, y = data(1)[0]
    job(x, y)
    plan = job.plan()
    # forward: 2 products; backward: output layer's dx and dw, hidden layer's dw (its dx is not needed)
    assert seen == [(F16, F16, F16)] * 5
    products = [n for n in plan.nodes if n.op is MatMul]
    assert len(products) == 5 and all(t.dtype == F16 for n in products for t in (*n.inputs, *n.outputs))
    casts = [n for n in plan.nodes if n.op is Cast]
    down = [n for n in casts if n.attrs["dtype"] == F16]
    up = [n for n in casts if n.attrs["dtype"] == F32]
    assert len(up) == 5                                 # each product's output back to float32
    # one float16 copy a tensor: x, both weights, h, the logits' gradient, the hidden product's gradient
    assert len({n.inputs[0].id for n in down}) == len(down) == 6
    readers = {n.outputs[0].id: sum(t.id == n.outputs[0].id for p in products for t in p.inputs) for n in down}
    output_weight_copy = next(n for n in down if n.name == "output-weight-out-cast_f2h").outputs[0].id
    assert readers[output_weight_copy] == 2             # forward product and input gradient share it
    assert all(n.op.amp is None for n in plan.nodes if n.op is not MatMul)
    assert all(t.dtype == F32 for n in plan.nodes if n.op is not Cast and n.op is not MatMul
               for t in (*n.inputs, *n.outputs) if t.dtype.kind == "f")
    assert "# auto_mixed_precision: 5 products in float16, 11 casts" in str(plan)
    assert "hidden-weight-out-cast_f2h (Cast)" in plan.source and "hidden_matmul-out_0-cast_h2f (Cast)" in plan.source
    for name in ("hidden-weight", "output-weight", "output-bias", "hidden-weight-momentum"):
        assert variable(name).dtype == F32


def train(job, steps=12):
    return [float(job(x, y).mean()) for x, y in data(steps)]


def test_mlp_trains_as_in_float32_and_gradients_reach_the_master_weights(amp_on_numpy):
    mixed = train(mlp_job(amp_config()))
    mixed_weights = {k: variable(k) for k in ("hidden-weight", "output-weight", "output-bias")}
    flow.clear_default_session()
    plain = train(mlp_job(amp_config(False)))
    plain_weights = {k: variable(k) for k in ("hidden-weight", "output-weight", "output-bias")}
    assert plain[-1] < 0.5 * plain[0]
    np.testing.assert_allclose(mixed, plain, rtol=1e-2)
    assert mixed != plain                               # float16 really changed the arithmetic
    for name, w in plain_weights.items():
        assert mixed_weights[name].dtype == F32
        np.testing.assert_allclose(mixed_weights[name], w, rtol=0, atol=1e-2 * np.abs(w).max())


def cnn_job(config):
    @flow.global_function(type="train", function_config=config)
    def job(x: tp.Numpy.Placeholder((8, 3, 10, 10)), y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
        init = flow.random_normal_initializer(stddev=0.2, seed=3)
        h = flow.layers.conv2d(x, 6, 3, padding="SAME", use_bias=False, kernel_initializer=init, name="conv")
        h = flow.layers.batch_normalization(h, axis=1, name="bn")
        h = flow.nn.relu(h)
        h = flow.nn.max_pool2d(h, 2, 2, "VALID")
        h = flow.reshape(h, (8, -1))
        logits = flow.layers.dense(h, CLASSES, kernel_initializer=flow.random_normal_initializer(stddev=0.1, seed=4),
                                   name="fc")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.optimizer.SGD(0.05, momentum=0.9).minimize(loss)
        return loss
    return job


def cnn_data(steps):
    rng = np.random.default_rng(5)
    patterns = rng.normal(size=(CLASSES, 3, 10, 10))
    out = []
    for _ in range(steps):
        y = rng.integers(0, CLASSES, 8).astype(np.int32)
        out.append(((patterns[y] + 0.5 * rng.normal(size=(8, 3, 10, 10))).astype(np.float32), y))
    return out


def test_conv_and_batch_norm_net_trains_as_in_float32(amp_on_numpy):
    losses = {}
    for enabled in (True, False):
        flow.clear_default_session()
        job = cnn_job(amp_config(enabled))
        losses[enabled] = [float(job(x, y).mean()) for x, y in cnn_data(10)]
        if enabled:
            plan = job.plan()
            convs = [n for n in plan.nodes if n.op in (Conv2d, ConvInputGrad, ConvFilterGrad)]
            assert {n.op for n in convs} == {Conv2d, ConvFilterGrad}   # the input's gradient is not needed
            assert all(t.dtype == F16 for n in convs for t in (*n.inputs, *n.outputs))
            batch_norm = [n for n in plan.nodes if n.op.__module__ == "flowlab.ops.normalization"]
            assert len(batch_norm) >= 2             # forward and gradient
            assert all(t.dtype == F32 for n in batch_norm for t in (*n.inputs, *n.outputs) if t.dtype.kind == "f")
            for name in ("conv-weight", "bn-gamma", "bn-beta", "bn-moving_mean", "bn-moving_variance"):
                assert variable(name).dtype == F32
    assert losses[False][-1] < 0.5 * losses[False][0]
    # float16 steps drift from float32 ones: relative to each loss while it is large, within 0.005 once it is tiny
    # (with another seed the last losses, ~3e-4, differed by 7 %)
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-2, atol=5e-3)


# -------------------------------------------------------------------------------------------------- loss scaling

@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")   # NumPy's, on the skipped step
def test_a_dynamic_loss_scale_skips_a_step_whose_float16_gradients_overflow(amp_on_numpy):
    """A regression with a huge target: the loss (float32) is finite, but its scaled gradient cast to float16 for
    the weight gradient's product is Inf. That step is skipped (weights, momentum unchanged) and the scale halves;
    training then goes on. Without AMP the same call trains normally: the overflow is float16's."""
    def job_for(config):
        @flow.global_function(type="train", function_config=config)
        def job(x: tp.Numpy.Placeholder((BATCH, 3)), y: tp.Numpy.Placeholder((BATCH, 1))) -> tp.Numpy:
            pred = flow.layers.dense(x, 1, kernel_initializer=flow.random_normal_initializer(stddev=0.5, seed=1),
                                     name="lin")
            loss = flow.math.reduce_sum(flow.math.square(pred - y), axis=1)
            flow.optimizer.SGD(0.05, momentum=0.9, loss_scale_policy=flow.optimizer.loss_scale.dynamic_loss_scale(
                initial_loss_scale=16.0, increment_period=1000)).minimize(loss)
            return loss
        return job

    rng = np.random.default_rng(0)
    w_true = np.array([[1.5, -2.0, 0.5]], np.float32)
    xs = [rng.standard_normal((BATCH, 3)).astype(np.float32) for _ in range(150)]
    scale_name = "System-Train-DynamicLossScale-job-LossScale"

    flow.clear_default_session()
    plain = job_for(amp_config(False))
    plain(xs[0], np.full((BATCH, 1), 1e4, np.float32))
    assert float(variable(scale_name)[0]) == 16.0       # float32 gradients of 3e5 overflow nothing

    flow.clear_default_session()
    job = job_for(amp_config())
    job(xs[0], xs[0] @ w_true.T)
    before = {k: variable(k) for k in ("lin-weight", "lin-bias", "lin-weight-momentum")}
    loss = job(xs[1], np.full((BATCH, 1), 1e4, np.float32))
    assert np.isfinite(loss).all() and loss.min() > 1e7  # the forward pass is fine
    for name, value in before.items():
        np.testing.assert_array_equal(variable(name), value)
    assert float(variable(scale_name)[0]) == 8.0
    for x in xs[2:]:
        job(x, x @ w_true.T)
    assert float(variable(scale_name)[0]) == 8.0        # no other step overflowed
    np.testing.assert_allclose(variable("lin-weight"), w_true, atol=2e-2)


# ------------------------------------------------------------------------------------------------------- watches

def test_watches_see_float32_values(amp_on_numpy):
    """``watch`` on a product's output gets the float16 product (of float16 copies of x and the weight) in float32;
    ``watch_diff`` gets its float32 gradient; a watched variable is the float32 master weight."""
    values, grads, weights = [], [], []
    job = mlp_job(amp_config(), watch=values.append, watch_diff=grads.append, watch_weight=weights.append)
    (x, y), = data(1)
    job(x, y)
    flow.sync_default_session()
    assert values[0].dtype == grads[0].dtype == weights[0].dtype == F32
    weight = weights[0]
    assert not np.array_equal(weight.astype(np.float16).astype(np.float32), weight)   # not a float16 copy
    reference = x.astype(np.float16).astype(np.float64) @ weight.astype(np.float16).astype(np.float64).T
    np.testing.assert_array_equal(values[0].astype(np.float16).astype(np.float32), values[0])
    np.testing.assert_allclose(values[0], reference, rtol=0, atol=4e-3 * np.abs(reference).max())
    assert not np.array_equal(values[0], x @ weight.T)     # not the float32 product
    assert np.isfinite(grads[0]).all() and np.abs(grads[0]).max() > 0


def test_watch_health_reports_under_amp(amp_on_numpy):
    reports, values = [], {}

    def keep(blob, blob_def):
        values.setdefault(blob_def.logical_blob_name, []).append(blob.numpy())

    @flow.global_function(type="train", function_config=amp_config())
    def job(x: tp.Numpy.Placeholder((BATCH, FEATURES)),
            y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        with flow.watch_scope(keep):
            h = flow.layers.dense(x, HIDDEN, activation=flow.nn.relu, name="hidden")
            logits = flow.layers.dense(h, CLASSES, name="output")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.watch_health(reports.append)
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss

    for x, y in data(3):
        job(x, y)
    flow.sync_default_session()
    assert len(reports) == 3 and list(reports[0].table) == ["hidden", "output"]
    assert all(v[0].dtype == F32 for v in values.values())
    matmul = values["hidden_matmul/out_0"][0]
    np.testing.assert_array_equal(matmul.astype(np.float16).astype(np.float32), matmul)   # made in float16
    act = values["hidden_activation/out_0"][0]
    row = reports[0].table["hidden"]
    assert row["act_mean_abs"] == pytest.approx(np.abs(act).mean(), rel=1e-5)
    assert row["act_nan"] == row["act_inf"] == 0 and row["grad_norm"] > 0 and row["update_ratio"] > 0


# ---------------------------------------------------------------------------------------------- plans untouched

@pytest.mark.numpy_backend      # on CuPy the rewrite is always on
def test_a_job_without_the_flag_compiles_to_the_same_plan(monkeypatch):
    sources = {}
    for on_numpy, enabled in ((True, False), (False, False), (False, True)):
        monkeypatch.setattr(amp, "ON_NUMPY", on_numpy)
        flow.clear_default_session()
        job = mlp_job(amp_config(enabled))
        (x, y), = data(1)
        job(x, y)
        plan = job.plan()
        assert not any(n.op is Cast for n in plan.nodes)
        sources[on_numpy, enabled] = plan.source
        note = dict(plan.passes)["auto_mixed_precision"]
        assert note == ("skipped: NumPy (no fast float16; compiler.amp.ON_NUMPY turns it on)" if enabled else None)
    assert len(set(sources.values())) == 1


def test_the_pass_is_active_on_cupy_and_on_numpy_only_when_asked(monkeypatch):
    class Backend:
        is_gpu = False
    monkeypatch.setattr(amp, "ON_NUMPY", False)
    assert not amp.active(Backend())
    Backend.is_gpu = True
    assert amp.active(Backend())
    monkeypatch.setattr(amp, "ON_NUMPY", True)
    Backend.is_gpu = False
    assert amp.active(Backend())


def test_a_variable_updated_in_place_is_cast_again_for_products_after_the_update(amp_on_numpy):
    """Two optimizers in one job: the first updates ``w``; the second loss's gradient ``dh = dz @ wᵀ`` comes after
    that update in the plan and reads the updated ``w`` (in float32 too), so the float16 copy of ``w`` made for the
    forward product is not reused for it: ``w`` is cast again after its update."""
    def run(enabled):
        flow.clear_default_session()
        read = {}

        @flow.global_function(type="train", function_config=amp_config(enabled))
        def job(x: tp.Numpy.Placeholder((BATCH, FEATURES))) -> tp.Numpy:
            u = flow.get_variable("u", shape=(FEATURES, FEATURES),
                                  initializer=flow.random_normal_initializer(stddev=0.3, seed=1))
            w = flow.get_variable("w", shape=(FEATURES, 3), initializer=flow.random_normal_initializer(seed=2))
            flow.watch(u, lambda value: read.setdefault("u", value))
            z = flow.matmul(flow.matmul(x, u, name="h"), w, name="z")
            flow.optimizer.SGD(0.5, momentum=0, variables=[w]).minimize(
                flow.math.reduce_sum(flow.math.square(z), axis=1))
            flow.optimizer.SGD(0.5, momentum=0, variables=[u]).minimize(flow.math.reduce_sum(z, axis=1))
            return z
        x = data(1)[0][0]
        job(x)
        flow.sync_default_session()
        return job.plan(), x, read["u"], {k: variable(k) for k in ("u", "w")}

    plan, x, u0, mixed = run(True)
    casts_of_w = [i for i, n in enumerate(plan.nodes) if n.op is Cast and n.inputs[0].op_name == "w"]
    update_of_w = next(i for i, n in enumerate(plan.nodes) if n.op.updates_variable and n.inputs[0].op_name == "w")
    assert len(casts_of_w) == 2 and casts_of_w[0] < update_of_w < casts_of_w[1]
    _, _, _, plain = run(False)
    for name in ("u", "w"):
        np.testing.assert_allclose(mixed[name], plain[name], rtol=0, atol=1e-2 * np.abs(plain[name]).max())
    # u's step from the updated w (dz = 1, model gradients / batch): u0 - lr xᵀ 1 wᵀ / batch
    expected = u0 - 0.5 * x.T @ np.ones((BATCH, 3)) @ mixed["w"].T / BATCH
    np.testing.assert_allclose(mixed["u"], expected, rtol=0, atol=1e-2 * np.abs(expected - u0).max())


@pytest.mark.numpy_backend      # two NumPy devices (threads); on CuPy cpu_device_num(2) means two GPUs
def test_two_devices_under_amp_train_as_one(amp_on_numpy):
    """Each replica plan casts its own products; the float32 gradients are all-reduced as without AMP."""
    results = {}
    for devices in (1, 2):
        flow.clear_default_session()
        flow.config.cpu_device_num(devices)
        job = mlp_job(amp_config())
        results[devices] = train(job, steps=6), {k: variable(k) for k in ("hidden-weight", "output-weight")}
        plan = job.plan()       # device 0's replica plan on two devices
        assert sum(n.op is MatMul for n in plan.nodes) == 5 and sum(n.op is Cast for n in plan.nodes) == 11
        assert ("R.all_reduce(0," in plan.source) == (devices == 2)
    (one_losses, one), (two_losses, two) = results[1], results[2]
    # the weight gradients' products sum half batches in float16 on each device: rounding apart, the same
    np.testing.assert_allclose(two_losses, one_losses, rtol=1e-2)
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=0, atol=1e-2 * np.abs(one[name]).max())


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_anomaly_detection_names_the_cast_that_overflows_float16(amp_on_numpy):
    from flowlab.errors import AnomalyError
    config = amp_config()
    config.detect_anomaly(True)
    job = mlp_job(config)
    (x, y), = data(1)
    job(x, y)
    x[0, 0] = 1e5               # finite in float32, Inf in float16
    with pytest.raises(AnomalyError, match=r"op Input_\d+-out_0-cast_f2h \(Cast\) produced 0 NaN and 1 Inf in "
                                           r"Input_\d+-out_0-cast_f2h/out_0"):
        job(x, y)
