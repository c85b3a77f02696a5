"""watch, watch_diff, watch_scope: what handlers receive, when, and the errors for misuse."""
import threading
import time

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.errors import AnomalyError, TraceError, WatchCallbackError
from flowlab.watching import TensorStats


def mlp_job(watches, batch=8, features=6, classes=5, job_type="train"):
    """A small MLP job; ``watches(hidden, logits)`` adds watch calls inside it."""
    @flow.global_function(type=job_type)
    def job(x: tp.Numpy.Placeholder((batch, features)),
            y: tp.Numpy.Placeholder((batch,), dtype=flow.int32)) -> tp.Numpy:
        hidden = flow.layers.dense(x, 16, activation=flow.nn.relu, name="hidden")
        logits = flow.layers.dense(hidden, classes, name="output")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        watches(hidden, logits)
        if job_type == "train":
            flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss
    return job


def batch(seed=0, n=8, features=6, classes=5):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, features)).astype(np.float32), rng.integers(0, classes, n).astype(np.int32)


def softmax(z):
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def test_watch_diff_of_logits_is_softmax_minus_onehot_unscaled():
    got = {}

    def on_logits(v: tp.Numpy):
        got["logits"] = v

    def on_grad(v: tp.Numpy):
        got["grad"] = v

    job = mlp_job(lambda h, logits: (flow.watch(logits, on_logits), flow.watch_diff(logits, on_grad)))
    x, y = batch()
    job(x, y)
    expected = softmax(got["logits"].astype(np.float64)) - np.eye(5)[y]
    np.testing.assert_allclose(got["grad"], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["grad"].sum(1), 0, atol=1e-6)


def test_handler_argument_follows_annotation():
    seen = {}

    def as_numpy(v: tp.Numpy):
        seen["numpy"] = v

    def as_list(v: tp.ListNumpy):
        seen["list"] = v

    def as_blob(v):
        seen["blob"] = v

    job = mlp_job(lambda h, logits: (flow.watch(h, as_numpy), flow.watch(h, as_list), flow.watch(h, as_blob)))
    job(*batch())
    assert isinstance(seen["numpy"], np.ndarray) and seen["numpy"].shape == (8, 16)
    assert isinstance(seen["list"], list) and np.array_equal(seen["list"][0], seen["numpy"])
    assert np.array_equal(seen["blob"].numpy(), seen["numpy"]) and np.array_equal(seen["blob"].ndarray(), seen["numpy"])


def test_prompt_string_and_none_print(capsys):
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        y = flow.nn.relu(x)
        flow.watch(y, "relu out:")
        flow.watch(x)
        return y

    job(np.array([-1.0, 0.5, 2.0], np.float32))
    out = capsys.readouterr().out.splitlines()
    assert out == ["[-1.   0.5  2. ]", "relu out: [0.  0.5 2. ]"]   # in the order the values are computed


def test_watch_scope_same_keys_for_values_and_gradients_in_oneflow_order():
    values, grads = {}, {}

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((8, 6)), y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
        hidden = flow.layers.dense(x, 16, activation=flow.nn.relu)
        with flow.watch_scope(values, grads):
            logits = flow.layers.dense(hidden, 5)
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss

    x, y = batch()
    job(x, y)
    prefix = next(iter(values)).split("-")[0]
    assert list(values) == [f"{prefix}-bias/out", f"{prefix}-weight/out", f"{prefix}_matmul/out_0",
                            f"{prefix}_bias_add/out_0"]
    assert set(grads) == set(values)
    entry = values[f"{prefix}-weight/out"]
    assert entry["blob_def"].shape == (5, 16) and entry["blob_def"].op_name == f"{prefix}-weight"
    assert entry["blob_def"].logical_blob_name == f"{prefix}-weight/out"
    # gradient of the bias is the batch sum of the logits' gradient (before OneFlow's 1/batch model scaling)
    logits_grad = grads[f"{prefix}_bias_add/out_0"]["blob"].numpy()
    np.testing.assert_allclose(grads[f"{prefix}-bias/out"]["blob"].numpy(), logits_grad.sum(0), rtol=1e-5, atol=1e-6)
    # the weight value delivered is the one the step used, before the update
    np.testing.assert_allclose(values[f"{prefix}_matmul/out_0"]["blob"].numpy(),
                               values[f"{prefix}_bias_add/out_0"]["blob"].numpy() -
                               values[f"{prefix}-bias/out"]["blob"].numpy(), rtol=1e-5, atol=1e-6)


def test_watch_scope_callable_receives_blob_and_blob_def():
    seen = []

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        with flow.watch_scope(lambda blob, blob_def: seen.append((blob_def.logical_blob_name, blob.numpy().shape))):
            y = flow.math.square(x) + 1.0
        return y

    job(np.ones((2, 3), np.float32))
    flow.sync_default_session()
    assert [shape for _, shape in seen] == [(2, 3), (), (2, 3)]
    assert seen[0][0].startswith("Square_")


def test_callbacks_run_in_step_order_off_the_calling_thread():
    threads, steps = set(), []

    def handler(v: tp.Numpy):
        threads.add(threading.current_thread().name)
        steps.append(float(v[0]))

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((1,))) -> None:
        flow.watch(x, handler)

    for i in range(50):
        job(np.array([i], np.float32))
    flow.sync_default_session()
    assert steps == list(range(50))
    assert threads == {"flowlab-watch-dispatcher"}


def test_job_returning_a_value_waits_for_its_callbacks():
    done = []

    def slow(v: tp.Numpy):
        time.sleep(0.05)
        done.append(1)

    job = mlp_job(lambda h, logits: flow.watch(logits, slow))
    job(*batch())
    assert done == [1]


def test_every_and_stats():
    calls, stats = [], []

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        flow.watch(x, lambda v: calls.append(v.numpy()[0]), every=3)
        flow.watch(x, stats.append, stats=True)
        return x * 1.0

    for i in range(7):
        job(np.array([i, np.nan, np.inf, -2], np.float32))
    assert calls == [0, 3, 6]
    s = stats[-1]
    assert isinstance(s, TensorStats)
    assert (s.shape, s.min, s.max, s.nan_count, s.inf_count) == ((4,), -2.0, 6.0, 1, 1)
    assert s.mean == pytest.approx(2.0) and s.std == pytest.approx(4.0)


def test_statistics_of_a_watched_variable_are_of_the_value_the_call_used():
    from flowlab.widgets import WatchPanel
    whole, stats = [], []
    panel = WatchPanel(mode="terminal")

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(3, 2), initializer=flow.random_normal_initializer())
        flow.watch(w, lambda v: whole.append(v.numpy().copy()))
        flow.watch(w, stats.append, stats=True)
        flow.watch(w, panel)                           # statistics through a StatsFeed
        loss = flow.math.reduce_mean(flow.math.square(flow.matmul(x, w)))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5]), momentum=0).minimize(loss)
        return loss

    for seed in range(3):
        job(np.random.default_rng(seed).normal(size=(4, 3)).astype(np.float32))
    flow.sync_default_session()
    panel.close()
    assert not np.allclose(whole[0], whole[1])         # the updates change w in place after it is read
    trend = next(iter(panel._rows.values())).trend.columns()
    for step, value in enumerate(whole):
        assert (stats[step].min, stats[step].max) == (value.min(), value.max())
        assert stats[step].mean == pytest.approx(value.mean(dtype=np.float64), rel=1e-6)
        assert (trend["min"][step], trend["max"][step]) == (value.min(), value.max())


def test_unwatched_job_runs_the_same_plan():
    def plain(h, logits):
        pass

    source_plain = mlp_job(plain).plan().source
    flow.clear_default_session()
    watched = mlp_job(lambda h, logits: flow.watch(logits, lambda v: None))
    assert "emit(" not in source_plain and "emit(" in watched.plan().source
    strip = [line for line in watched.plan().source.splitlines() if "emit(" not in line]
    assert len(strip) == len(source_plain.splitlines())


def test_handler_error_reaches_the_user_naming_the_tensor_and_variables_stay_whole():
    def broken(v: tp.Numpy):
        raise ValueError("boom")

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((4,))) -> None:
        w = flow.get_variable("w", shape=(4,), initializer=flow.constant_initializer(1.0))
        loss = x * w
        flow.watch(loss, broken)
        flow.optimizer.SGD(1.0, momentum=0).minimize(loss)

    x = np.ones(4, np.float32)
    job(x)      # -> None: returns at once; the error waits for the next call or sync
    with pytest.raises(WatchCallbackError, match=r"flow.watch handler .*broken for the value of Mul_\d+/out_0 "
                                                 r"\(call 0 of job job\) raised ValueError: boom"):
        flow.sync_default_session()
    w = flow.runtime.session.default().variables["w"].numpy()
    np.testing.assert_allclose(w, 0.75)   # the step's update was applied in full: 1 - 1.0 * 1/4
    job(x)
    with pytest.raises(WatchCallbackError):
        job(x)   # the previous call's error surfaces at the next call, before it runs
    np.testing.assert_allclose(flow.runtime.session.default().variables["w"].numpy(), 0.5)


def test_bad_watches_are_clear_errors():
    with pytest.raises(TraceError, match="outside a job function"):
        flow.watch(np.zeros(3), print)

    def two_args(a, b):
        pass

    for watches, error, pattern in [
        (lambda h, logits: flow.watch(np.zeros(3), print), TypeError, "expects a tensor of the job"),
        (lambda h, logits: flow.watch(logits, 42), TypeError, "handler must be callable"),
        (lambda h, logits: flow.watch(logits, two_args), TypeError, "must take one argument.*requires 2: a, b"),
        (lambda h, logits: flow.watch(logits, lambda v: None, every=0), ValueError, "every must be a positive int"),
    ]:
        flow.clear_default_session()
        with pytest.raises(error, match=pattern):
            mlp_job(watches).compiled()

    def bad_annotation(v: int):
        pass

    flow.clear_default_session()
    with pytest.raises(TypeError, match="annotates its argument as <class 'int'>"):
        mlp_job(lambda h, logits: flow.watch(logits, bad_annotation)).compiled()


def test_watch_diff_without_gradient_is_an_error():
    flow.clear_default_session()
    with pytest.raises(TraceError, match="predict job and computes no gradients"):
        mlp_job(lambda h, logits: flow.watch_diff(logits, print), job_type="predict").compiled()

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(4,))
        unrelated = flow.math.exp(x)
        flow.watch_diff(unrelated, print)
        loss = x * w
        flow.optimizer.SGD(0.1).minimize(loss)
        return loss

    with pytest.raises(TraceError, match=r"watch_diff\(Exp_\d+/out_0\) at .*test_watch.py:\d+: .* no gradient"):
        job(np.zeros(4, np.float32))


def test_watch_diff_of_a_tensor_off_the_variable_path():
    got = {}

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        scaled = x * 2.0                                   # depends on no variable, but the loss depends on it
        flow.watch_diff(scaled, lambda g: got.setdefault("g", g.numpy()))
        w = flow.get_variable("w", shape=(3,), initializer=flow.constant_initializer(3.0))
        loss = flow.math.reduce_sum(scaled * w, axis=1)
        flow.optimizer.SGD(0.1).minimize(loss)
        return loss

    job(np.ones((2, 3), np.float32))
    np.testing.assert_allclose(got["g"], np.full((2, 3), 3.0))


def test_anomaly_detection_names_the_first_op_and_the_users_line():
    config = flow.function_config()
    config.detect_anomaly(True)

    @flow.global_function(function_config=config)
    def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        y = flow.math.exp(x)
        z = flow.math.log(y - 1.0)          # log(0) = -inf for x = 0: this op is first
        return flow.math.sqrt(z)

    assert np.isfinite(job(np.array([1.0, 2.0, 3.0], np.float32))).all()
    with pytest.raises(AnomalyError) as info:
        job(np.array([0.0, 2.0, 3.0], np.float32))
    message = str(info.value)
    assert message.startswith("job job: op Log_")
    assert "1 Inf" in message and "test_watch.py:" in message
    assert "Sub_" in message and "min 0 max" in message      # the input's statistics


def test_anomaly_detection_in_gradients_points_at_the_forward_op():
    config = flow.function_config()
    config.detect_anomaly(True)

    @flow.global_function(type="train", function_config=config)
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(2,), initializer=flow.constant_initializer(0.0))
        loss = flow.math.sqrt(w * w + x)     # d sqrt(u)/du = inf at u = 0
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss

    with pytest.raises(AnomalyError, match=r"op System-AutoGrad-Sqrt_\d+/.* gradient of op Sqrt_\d+"):
        job(np.array([0.0, 1.0], np.float32))


def test_anomaly_in_a_fed_argument():
    config = flow.function_config()
    config.detect_anomaly(True)

    @flow.global_function(function_config=config)
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return x + 1.0

    with pytest.raises(AnomalyError, match=r"argument Input_\d+/out_0 fed 1 NaN and 0 Inf"):
        job(np.array([np.nan, 1.0], np.float32))


def test_call_numbers_count_over_every_traced_signature():
    steps = []

    class Recorder:
        def watch_event(self, value, blob_def, kind, step):
            steps.append((step, value.shape))

    recorder = Recorder()

    @flow.global_function()
    def job(x: tp.ListNumpy.Placeholder((4,))) -> tp.ListNumpy:
        flow.watch(x, recorder)
        return x * 2.0

    for n in (4, 4, 3, 4):      # a short last batch is traced again but keeps counting
        job([np.ones(n, np.float32)])
    assert steps == [(0, (4,)), (1, (4,)), (2, (3,)), (3, (4,))]
