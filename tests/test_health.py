"""flow.watch_health: per-layer statistics checked against NumPy on the same tensors, alerts on deliberately broken
networks (and none on a healthy one), delivery every N calls, bad input, and plans untouched without it."""
import math
import re
import threading

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.errors import WatchCallbackError
from flowlab.health import HealthAlert, HealthReport, health_alerts
from flowlab.ops.stats import activation_vector
from flowlab.runtime import backend

BATCH, FEATURES, CLASSES = 32, 20, 5


def data(steps, seed=0, batch=BATCH, features=FEATURES, classes=CLASSES):
    """``steps`` batches ``(x, labels)`` of ``classes`` separable clusters (the health tests' data)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, features)) * 2
    for _ in range(steps):
        y = rng.integers(0, classes, batch).astype(np.int32)
        yield (centres[y] + rng.normal(size=(batch, features))).astype(np.float32), y


def train(job, steps, seed=0):
    for x, y in data(steps, seed):
        job(x, y)
    flow.sync_default_session()


def mlp(reports, depth=1, width=64, activation=flow.nn.relu, lr=0.1, optimizer=None, bias=0.0, every=1,
        scope=None, handler=None, diff_scope=None, **thresholds):
    """A train job of ``depth`` hidden dense layers ``hidden_<i>`` and an ``output`` layer, watched for health;
    ``scope(blob, blob_def)`` (optional) watches every tensor and gradient of the layers too."""
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((BATCH, FEATURES)),
            y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        def layers():
            h = x
            for i in range(depth):
                h = flow.layers.dense(h, width, activation=activation, name=f"hidden_{i}",
                                      bias_initializer=flow.constant_initializer(bias) if i == 0 else None)
            return flow.layers.dense(h, CLASSES, name="output")
        if scope is None:
            logits = layers()
        else:
            with flow.watch_scope(scope, diff_scope or scope):
                logits = layers()
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.watch_health(handler or (None if reports is None else reports.append), every=every, **thresholds)
        (optimizer or flow.optimizer.SGD(lr, momentum=0)).minimize(loss)
        return loss
    return job


def kinds(reports):
    return {(a.kind, a.layer) for r in reports for a in r.alerts}


# ------------------------------------------------------------------------------------------------ statistics

class Recorder:
    """A watch_scope callable keeping every value and gradient of each tensor, in call order."""

    def __init__(self):
        self.values = {}

    def __call__(self, blob, blob_def):
        self.values.setdefault(blob_def.logical_blob_name, []).append(blob.numpy().astype(np.float64))


def norm(*arrays):
    return math.sqrt(sum(float(np.sum(a * a)) for a in arrays))


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_statistics_match_numpy_on_the_same_tensors(optimizer):
    # plain SGD takes the update from the gradient; momentum and Adam measure it from the weights themselves
    make = {"sgd": lambda: flow.optimizer.SGD(0.1, momentum=0), "momentum": lambda: flow.optimizer.SGD(0.1),
            "adam": lambda: flow.optimizer.Adam(0.01)}[optimizer]
    values, grads, reports = Recorder(), Recorder(), []

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((BATCH, FEATURES)),
            y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        with flow.watch_scope(values, grads):
            h = flow.layers.dense(x, 64, activation=flow.nn.relu, name="hidden",
                                  bias_initializer=flow.constant_initializer(-0.5))
            logits = flow.layers.dense(h, CLASSES, name="output")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.watch_health(reports.append)
        make().minimize(loss)
        return loss

    steps = 4
    train(job, steps)
    assert [r.step for r in reports] == list(range(steps))
    v, d = values.values, grads.values
    for s, report in enumerate(reports[:-1]):
        assert list(report.table) == ["hidden", "output"]
        for layer, act in [("hidden", "hidden_activation/out_0"), ("output", "output_bias_add/out_0")]:
            row, a = report.table[layer], v[act][s]
            assert row["act_mean_abs"] == pytest.approx(np.abs(a).mean(), rel=1e-5)
            assert row["act_std"] == pytest.approx(a.std(), rel=1e-4)
            assert row["act_zero_fraction"] == pytest.approx((a == 0).mean())
            assert row["act_max_abs"] == pytest.approx(np.abs(a).max(), rel=1e-6)
            assert row["dead_fraction"] == pytest.approx((a == 0).all(axis=0).mean())
            assert row["act_nan"] == row["act_inf"] == 0
            w, b = v[f"{layer}-weight/out"], v[f"{layer}-bias/out"]
            assert row["weight_norm"] == pytest.approx(norm(w[s], b[s]), rel=1e-5)
            assert row["grad_norm"] == pytest.approx(norm(d[f"{layer}-weight/out"][s], d[f"{layer}-bias/out"][s]),
                                                     rel=1e-4)
            # the update is what the next call's weights show
            assert row["update_ratio"] == pytest.approx(norm(w[s + 1] - w[s], b[s + 1] - b[s]) / norm(w[s], b[s]),
                                                        rel=1e-3)
    hidden = v["hidden_activation/out_0"][0]
    assert 0 < reports[0].table["hidden"]["act_zero_fraction"] < 1 and (hidden == 0).all(axis=0).any(), \
        "the -0.5 bias should leave some zeros and some dead units, so the counts are tested"


def test_conv_layers_count_channels_as_units_and_a_dead_conv_layer_is_named():
    """A conv layer's units are its channels (NCHW axis 1): statistics against NumPy on the same tensors, and a conv
    layer pushed below zero by its bias is reported dead, by name."""
    values, reports = Recorder(), []

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((8, 1, 12, 12)), y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
        with flow.watch_scope(values):
            h = flow.layers.conv2d(x, 6, 3, padding="SAME", activation=flow.nn.relu, name="features",
                                   bias_initializer=flow.constant_initializer(-0.3))
            dead = flow.layers.conv2d(h, 4, 3, padding="SAME", activation=flow.nn.relu, name="dead_conv",
                                      bias_initializer=flow.constant_initializer(-100.0))
            logits = flow.layers.dense(flow.reshape(dead, [8, -1]), CLASSES, name="output")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.watch_health(reports.append)
        flow.optimizer.SGD(0.01, momentum=0).minimize(loss)
        return loss

    rng = np.random.default_rng(3)
    for _ in range(3):
        job(rng.normal(size=(8, 1, 12, 12)).astype(np.float32), rng.integers(0, CLASSES, 8).astype(np.int32))
    flow.sync_default_session()
    assert list(reports[0].table) == ["features", "dead_conv", "output"]
    a = values.values["features_activation/out_0"][0]
    row = reports[0].table["features"]
    assert row["act_mean_abs"] == pytest.approx(np.abs(a).mean(), rel=1e-5)
    assert row["act_zero_fraction"] == pytest.approx((a == 0).mean())
    assert row["dead_fraction"] == pytest.approx((a == 0).all(axis=(0, 2, 3)).mean())
    assert reports[0].table["dead_conv"]["dead_fraction"] == 1.0
    assert ("dead_relu", "dead_conv") in kinds(reports) and ("dead_relu", "features") not in kinds(reports)
    # channels, not rows or columns: channel 1 is zero everywhere, column 0 of every channel too
    x = np.abs(np.random.default_rng(0).normal(size=(2, 3, 4, 5))).astype(np.float32) + 0.1
    x[:, 1] = 0
    x[..., 0] = 0
    for nonnegative in (True, False):
        assert activation_vector(np, x, 1, nonnegative)[4] == pytest.approx(1 / 3)
        assert activation_vector(np, x.transpose(0, 2, 3, 1), -1, nonnegative)[4] == pytest.approx(1 / 3)   # NHWC


def test_a_conv_op_named_as_its_layer_is_that_layers_output():
    """OneFlow's ResNet names its ``flow.nn.conv2d`` exactly like the weight's layer (``res2_0_branch2a`` beside
    ``res2_0_branch2a-weight``): the conv output is the layer's activation, and a longer layer name
    (``res2_0_branch2a_relu``) keeps its own ops."""
    reports, seen = [], []

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((4, 2, 6, 6)), y: tp.Numpy.Placeholder((4,), dtype=flow.int32)) -> tp.Numpy:
        weight = flow.get_variable("res2_0_branch2a-weight", shape=(3, 2, 3, 3),
                                   initializer=flow.random_normal_initializer(stddev=0.3))
        flow.watch(weight, seen.append)
        conv = flow.nn.conv2d(x, weight, 1, "SAME", "NCHW", name="res2_0_branch2a")
        scale = flow.get_variable("res2_0_branch2a_relu-scale", shape=(3, 1, 1), initializer=flow.ones_initializer())
        h = flow.nn.relu(conv * scale, name="res2_0_branch2a_relu_out")
        logits = flow.layers.dense(flow.reshape(h, [4, -1]), CLASSES, name="output")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.watch_health(reports.append)
        flow.optimizer.SGD(0.01, momentum=0).minimize(loss)
        return loss

    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 2, 6, 6)).astype(np.float32)
    job(x, rng.integers(0, CLASSES, 4).astype(np.int32))
    flow.sync_default_session()
    table = reports[0].table
    assert list(table) == ["res2_0_branch2a", "res2_0_branch2a_relu", "output"]
    conv = numpy_conv(x, seen[0].numpy())      # the weights this call read
    assert table["res2_0_branch2a"]["act_mean_abs"] == pytest.approx(np.abs(conv).mean(), rel=1e-4)
    assert table["res2_0_branch2a_relu"]["act_zero_fraction"] == pytest.approx((conv <= 0).mean())


def numpy_conv(x, w):
    """A stride-1 SAME NCHW convolution of odd square kernels in NumPy."""
    k = w.shape[-1] // 2
    padded = np.pad(x, ((0, 0), (0, 0), (k, k), (k, k)))
    out = np.zeros((x.shape[0], w.shape[0]) + x.shape[2:], np.float64)
    for i in range(w.shape[2]):
        for j in range(w.shape[3]):
            window = padded[:, :, i:i + x.shape[2], j:j + x.shape[3]]
            out += np.einsum("nchw,oc->nohw", window, w[:, :, i, j])
    return out


def _reference_activation(x, unit_axis):
    """activation_vector's numbers as their definitions say, in float64."""
    x = x.astype(np.float64)
    axes = tuple(a for a in range(x.ndim) if a != unit_axis % x.ndim)
    return [np.abs(x).mean(), x.std(), (x == 0).mean(), np.abs(x).max(), (x == 0).all(axis=axes).mean(), 0, 0]


@pytest.mark.parametrize("layout", ["dense", "nchw", "nhwc", "nhwc-view", "vector"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("relu", [True, False])
def test_activation_statistics_against_their_definitions(layout, dtype, relu):
    """Every layout the host path takes (per-unit sums through products with ones where the layout has them, else
    per-unit maxima) against the definitions; units 1 and 3 are zero for the whole batch."""
    rng = np.random.default_rng(7)
    shape, unit_axis = {"dense": ((16, 6), 1), "nchw": ((4, 6, 3, 5), 1), "nhwc": ((4, 3, 5, 6), -1),
                        "nhwc-view": ((4, 3, 5, 6), -1), "vector": ((6,), 0)}[layout]
    x = rng.normal(size=shape).astype(dtype)
    if relu:
        x = np.maximum(x, 0)
    units = np.moveaxis(x, unit_axis, 0)
    units[[1, 3]] = 0
    if layout == "nhwc-view":            # the same numbers through a strided view: no product, maxima
        x = np.ascontiguousarray(np.moveaxis(x, -1, 1)).transpose(0, 2, 3, 1)
    got = activation_vector(np, x, unit_axis, relu)
    assert got.tolist() == pytest.approx(_reference_activation(x, unit_axis), rel=1e-5, abs=1e-7)
    if layout != "vector":
        from flowlab.ops.stats import host_unit_sums
        sums = host_unit_sums(np.abs(x), unit_axis)
        axes = tuple(a for a in range(x.ndim) if a != unit_axis % x.ndim)
        if layout == "nhwc-view":
            assert sums is None
        else:
            assert sums == pytest.approx(np.abs(x).astype(np.float64).sum(axis=axes), rel=1e-5)


def test_report_loss_is_the_mean_loss_of_the_call():
    reports = []
    job = mlp(reports)
    losses = [float(np.mean(job(x, y))) for x, y in data(3)]
    flow.sync_default_session()
    assert [r.loss for r in reports] == pytest.approx(losses, rel=1e-6)


def test_activation_statistics_of_negative_and_non_finite_values():
    from flowlab.ops.stats import activation_vector, square_vector
    x = np.array([[0.0, -2.0, 0.0], [0.0, 1.0, 3.0]], np.float32)
    got = activation_vector(np, x)
    assert got.tolist() == pytest.approx([1.0, x.std(), 0.5, 3.0, 1 / 3, 0, 0])
    x[1, 2] = np.nan
    x[0, 1] = np.inf
    got = activation_vector(np, x)
    finite = np.array([0.0, 0.0, 0.0, 1.0])
    assert got.tolist() == pytest.approx([np.abs(finite).mean(), finite.std(), 0.5, 1.0, 1 / 3, 1, 1])
    assert square_vector(np, x).tolist() == [1.0, 1.0, 1.0]
    assert square_vector(np, np.array([1e30, 1e30], np.float32)).tolist() == pytest.approx([2e60, 0, 0])


# ------------------------------------------------------------------------------------------------ alerts

def test_healthy_network_gets_no_alert():
    reports = []
    train(mlp(reports), 40)
    assert len(reports) == 40 and kinds(reports) == set()
    assert reports[-1].loss < reports[0].loss / 2         # it did learn


def test_relu_layer_with_large_negative_bias_is_dead():
    reports = []
    train(mlp(reports, depth=2, bias=-100.0), 3)
    assert ("dead_relu", "hidden_0") in kinds(reports)
    # the first dead layer in forward order is the culprit (the layers after it only see its zeros)
    alert = next(a for a in reports[0].alerts if a.kind == "dead_relu")
    assert alert.step == 0 and "100% of the units of layer hidden_0" in alert.message and "bias" in alert.message
    assert reports[0].table["hidden_0"]["dead_fraction"] == 1.0
    # the linear output layer fed only zeros has dead units too, but no ReLU: no dead_relu for it
    assert reports[0].table["output"]["dead_fraction"] == 1.0 and ("dead_relu", "output") not in kinds(reports)
    # the dead layer's weights do not move because no gradient reaches them, not because of the learning rate
    ratio = next(a for a in reports[1].alerts if a.kind == "update_ratio" and a.layer == "hidden_0")
    assert "gradient is exactly zero" in ratio.message and "learning rate" not in ratio.message
    vanishing = next(a for a in reports[1].alerts if a.kind == "vanishing_gradient")
    assert "no gradient reaches it" in vanishing.message and "sigmoid" not in vanishing.message


def test_dead_relu_threshold_is_an_argument():
    reports = []
    train(mlp(reports, depth=2, bias=-100.0, dead_fraction=1.0), 2)     # "above" 100%: never
    assert ("dead_relu", "hidden_0") not in kinds(reports)


def test_deep_sigmoid_network_has_vanishing_gradients():
    reports = []
    train(mlp(reports, depth=20, width=32, activation=flow.math.sigmoid), 2)
    vanishing = [a for r in reports for a in r.alerts if a.kind == "vanishing_gradient"]
    assert vanishing and vanishing[0].layer in {f"hidden_{i}" for i in range(10)}
    assert "sigmoid" in vanishing[0].message
    first = reports[0].table
    assert first["hidden_0"]["grad_norm"] < 1e-3 * first["output"]["grad_norm"]
    relu = []
    train(mlp(relu, depth=3, width=32), 2)                 # a shallow ReLU net does not vanish
    assert not any(a.kind == "vanishing_gradient" for r in relu for a in r.alerts)


def test_learning_rate_of_ten_explodes_and_names_the_first_op_with_nan():
    reports = []
    job = mlp(reports, depth=2, lr=10.0)
    with np.errstate(all="ignore"):
        train(job, 30)
    found = {a.kind for r in reports for a in r.alerts}
    assert "exploding_gradient" in found or "update_ratio" in found
    nan = [a for r in reports for a in r.alerts if a.kind == "nan"]
    assert nan, "lr 10 should reach NaN/Inf within 30 steps"
    first = next(r for r in reports if r.first_nonfinite)
    op = first.first_nonfinite["op"]
    # the op named is a real node of the job, named as detect_anomaly names ops, with the user's line
    assert op in {n.name for n in job.graph().nodes}
    assert f"op {op} " in nan[0].message and "test_health.py" in nan[0].message
    assert "learning rate" in nan[0].message


def test_tiny_learning_rate_gives_update_ratio_alert():
    reports = []
    train(mlp(reports, lr=1e-7), 3)
    alerts = [a for r in reports for a in r.alerts if a.kind == "update_ratio"]
    assert {a.layer for a in alerts} == {"hidden_0", "output"}
    assert "learning rate far too low" in alerts[0].message
    assert reports[0].table["hidden_0"]["update_ratio"] < 1e-5


def report(step, table, loss=None, first=None):
    return HealthReport(step, table, loss, first)


def test_alerts_are_a_function_of_the_numbers():
    history = [report(s, {"a": {"grad_norm": 1.0}, "b": {"grad_norm": 1.0}}, loss=1.0) for s in range(5)]
    assert health_alerts(history, report(5, {"a": {"grad_norm": 1.0}, "b": {"grad_norm": 1.0}}, 1.1)) == []
    spike = health_alerts(history, report(5, {"a": {"grad_norm": 1.0}, "b": {"grad_norm": 1.0}}, 5.0))
    assert [(a.kind, a.layer, a.step) for a in spike] == [("loss_spike", None, 5)]
    assert "5 times its median 1" in spike[0].message
    assert health_alerts(history, report(5, {"a": {"grad_norm": 1.0}, "b": {"grad_norm": 1.0}}, 5.0),
                         {"loss_spike_factor": 10.0}) == []
    assert health_alerts(history[:2], report(5, {"a": {"grad_norm": 1.0}}, 5.0)) == []   # too little history
    grown = health_alerts(history, report(5, {"a": {"grad_norm": 500.0}, "b": {"grad_norm": 500.0}}, 1.0))
    assert [(a.kind, a.layer) for a in grown] == [("exploding_gradient", None)]
    deep = health_alerts([], report(0, {"a": {"grad_norm": 5e3}, "b": {"grad_norm": 1.0}}))
    assert [(a.kind, a.layer) for a in deep] == [("exploding_gradient", "a")]
    ratios = health_alerts([], report(0, {"a": {"update_ratio": 0.9}, "b": {"update_ratio": 1e-3}}))
    assert [(a.kind, a.layer) for a in ratios] == [("update_ratio", "a")] and "too high" in ratios[0].message
    nan = health_alerts([], report(3, {"a": {}}, first={"op": "a_matmul", "tensor": "a_matmul/out_0", "layer": "a",
                                                          "what": "activation", "source": "x.py:1", "nan": 2,
                                                          "inf": 0}))
    assert nan == [HealthAlert("nan", "a", 3, nan[0].message)] and "op a_matmul (a_matmul/out_0, at x.py:1)" in \
        nan[0].message


# ------------------------------------------------------------------------------------------------ delivery

def test_every_ten_delivers_every_tenth_call():
    reports = []
    job = mlp(reports, every=10)
    train(job, 25)
    assert [r.step for r in reports] == [0, 10, 20]
    # calls that deliver nothing compute nothing: every statistic in the plan sits behind the step test
    puts = [line for line in job.plan().source.splitlines() if re.search(r"\bp\d+\(step", line)]
    assert puts and all(line.strip().startswith("if step % 10 == 0: p") for line in puts)
    statistics = [line for line in job.plan().source.splitlines() if "# System-Health-" in line]
    assert statistics and all(line.strip().startswith("if step % 10 == 0: t") for line in statistics)


def test_handler_error_surfaces_at_the_next_call_naming_the_handler():
    def broken_handler(report):
        raise RuntimeError("boom")

    @flow.global_function(type="train")
    def failing(x: tp.Numpy.Placeholder((BATCH, FEATURES)),
                y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> None:
        logits = flow.layers.dense(x, CLASSES, name="output")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.watch_health(broken_handler)
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)

    batches = list(data(2))
    failing(*batches[0])
    with pytest.raises(WatchCallbackError, match="watch_health handler .*broken_handler.* raised RuntimeError: boom"):
        failing(*batches[1])


def test_reports_overlap_the_next_call_and_are_delivered_by_its_end():
    """A handler of the user's runs on the dispatcher while the next call computes (a trailing batch): a call does
    not wait for its own report, the next one hands it over before it returns, and sync delivers the last."""
    gate, seen = threading.Event(), []

    def slow(report):
        gate.wait(10)
        seen.append(report.step)

    job = mlp(None, handler=slow)
    (x0, y0), (x1, y1) = data(2)
    assert job(x0, y0).shape == (BATCH,)       # returns a value, without waiting for report 0 (blocked in slow)
    assert seen == []
    gate.set()
    job(x1, y1)
    assert seen[:1] == [0]                     # report 0 was waited for once call 1's plan had run
    flow.sync_default_session()
    assert seen == [0, 1]


@pytest.mark.numpy_backend      # on a GPU every report is made on the dispatcher thread, beside the next call
def test_a_handler_marked_delivered_inline_is_called_on_the_jobs_thread_within_the_call():
    """A handler of the user's that only records can say so (``delivered_inline = True``, as ``HealthPanel`` does):
    it is called where the report is made, on the job's thread before the call returns, without a hand-off to the
    dispatcher thread; its error still surfaces, naming it, and the job goes on."""
    calls = []

    def record(report):
        calls.append((report.step, threading.current_thread()))
        if report.step == 1:
            raise ValueError("inline boom")

    record.delivered_inline = True
    job = mlp(None, handler=record)
    (x0, y0), (x1, y1), (x2, y2) = data(3)
    job(x0, y0)
    assert calls == [(0, threading.current_thread())]
    with pytest.raises(WatchCallbackError, match=r"handler .*record \(step 1\) raised ValueError: inline boom"):
        job(x1, y1)
    job(x2, y2)
    assert [step for step, _ in calls] == [0, 1, 2]


def test_a_slow_handler_error_still_surfaces_in_the_next_call():
    gate = threading.Event()

    def late_failure(report):
        gate.wait(10)
        raise ValueError(f"bad report {report.step}")

    job = mlp(None, handler=late_failure)
    (x0, y0), (x1, y1), (x2, y2) = data(3)
    job(x0, y0)
    threading.Timer(0.05, gate.set).start()    # fails while call 1 runs: call 1 raises it, naming the handler
    with pytest.raises(WatchCallbackError, match=r"handler .*late_failure \(step 0\) raised ValueError: bad "
                                                 r"report 0"):
        job(x1, y1)
    with pytest.raises(WatchCallbackError, match="bad report 1"):
        flow.sync_default_session()
    job(x2, y2)                                # the job still runs after its handler's errors
    with pytest.raises(WatchCallbackError, match="bad report 2"):
        flow.sync_default_session()


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(every=0), ValueError, "every must be a positive int, got 0"),
    (dict(every=2.5), ValueError, "every must be a positive int, got 2.5"),
    (dict(every=True), ValueError, "every must be a positive int, got True"),
    (dict(dead_fractoin=0.3), TypeError, "unknown threshold 'dead_fractoin'"),
    (dict(vanishing_ratio=-1), ValueError, "threshold vanishing_ratio must be a positive number"),
    (dict(window=0), ValueError, "window must be a positive int"),
    (dict(handler=42), TypeError, "handler must be callable"),
    (dict(handler=None), TypeError, "give a handler (it receives a flowlab.HealthReport), a writer"),
    (dict(writer=object()), TypeError, "writer must be a flowlab.summary.SummaryWriter (something with add_health), "
                                       "got object"),
    (dict(histogram_every=-1), ValueError, "histogram_every must be an int >= 0 (0: no histograms), got -1"),
])
def test_bad_arguments_are_named(kwargs, error, match):
    handler = kwargs.pop("handler", print)

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((BATCH, FEATURES)),
            y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        logits = flow.layers.dense(x, CLASSES, name="output")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.watch_health(handler, **kwargs)
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss

    with pytest.raises(error, match=re.escape(match)):
        job.compiled()


def test_a_job_without_watch_health_compiles_to_the_same_plan(monkeypatch):
    from flowlab.compiler import fold_update
    monkeypatch.setattr(fold_update, "FOLD_MIN_ELEMENTS", 0)      # these kernels fold when nothing reads their gradients

    def make(watched):
        flow.clear_default_session()

        @flow.global_function(type="train")
        def job(x: tp.Numpy.Placeholder((BATCH, FEATURES)),
                y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
            h = flow.layers.dense(x, 64, activation=flow.nn.relu, name="hidden")
            logits = flow.layers.dense(h, CLASSES, name="output")
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
            if watched:
                flow.watch_health(print)
            flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
            return loss
        return str(job.plan())

    def node_names(source):
        # "tN = kM(...)  # name (Op)"; a folded update's name joins its product's and its own with "+"
        names = re.findall(r"  # (\S+) \(\w+\)$", source, re.MULTILINE)
        return sorted(part for name in names for part in name.split("+"))

    plain, watched = make(False), make(True)
    assert "p0(step" not in plain and "emit(" not in plain
    assert "p0(step" in watched
    # watch_health adds its statistics nodes and their delivery lines, nothing else; it reads the kernels'
    # gradients, so their plain SGD updates are not folded into the gradient products as they are without it (on
    # NumPy: CuPy folds no update either way)
    health = [name for name in node_names(watched) if name.startswith("System-Health-")]
    assert [name for name in node_names(watched) if name not in health] == node_names(plain)
    layers = ("hidden", "output")
    assert health == sorted(["System-Health-loss"] + [f"System-Health-activation-{layer}" for layer in layers]
                            + [f"System-Health-{what}-{layer}-{part}" for what in ("weight", "gradient")
                               for layer in layers for part in ("weight", "bias")])
    if backend.current().is_gpu:
        assert "# fold_sgd_into_gemm: skipped: CuPy" in plain and "# fold_sgd_into_gemm: skipped: CuPy" in watched
    else:
        assert "# fold_sgd_into_gemm: 2 updates folded" in plain and "# fold_sgd_into_gemm: nothing to do" in watched


def test_predict_job_reports_activations_and_weights():
    reports = []
    train(mlp([]), 1)

    @flow.global_function(type="predict")
    def infer(x: tp.Numpy.Placeholder((BATCH, FEATURES))) -> tp.Numpy:
        h = flow.layers.dense(x, 64, activation=flow.nn.relu, name="hidden_0")
        logits = flow.layers.dense(h, CLASSES, name="output")
        flow.watch_health(reports.append)
        return logits

    x, _ = next(data(1))
    infer(x)
    flow.sync_default_session()
    (r,) = reports
    assert r.loss is None and set(r.table) == {"hidden_0", "output"}
    assert "grad_norm" not in r.table["output"] and r.table["output"]["weight_norm"] > 0


@pytest.mark.numpy_backend     # NumPy's thread replicas: on CuPy two devices are two GPUs
def test_several_devices_report_statistics_of_the_whole():
    one, two = [], []
    for devices, reports in [(1, one), (2, two)]:
        flow.clear_default_session()
        flow.config.cpu_device_num(devices)
        try:
            train(mlp(reports), 3)
        finally:
            flow.config.cpu_device_num(1)
    assert [r.step for r in two] == [0, 1, 2]
    for a, b in zip(one, two):
        assert list(a.table) == list(b.table)
        for layer in a.table:
            for stat in ("act_mean_abs", "act_max_abs", "weight_norm", "grad_norm", "update_ratio"):
                assert b.table[layer][stat] == pytest.approx(a.table[layer][stat], rel=1e-3), (layer, stat)
