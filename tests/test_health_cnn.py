"""flow.watch_health on convolutional networks with batch normalization, built as OneFlow 0.x users build them
(OneFlow-Benchmark's ResNet names: a conv op named as its layer, ``<block>_branch2a`` with ``-weight``; its batch
norm ``<block>_branch2a_bn_relu``): the batch norms' moving statistics against NumPy, no alert on a healthy ResNet,
the alerts that must still fire (a learning rate far too high, batch norm removed, a dead batch-norm ReLU), and
watch / watch_diff / watch_scope / watch_health on a network of ResNet-50's depth."""
import math
import re

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.health import BATCH_NORM_STATISTICS, LayerRole, find_layers, health_alerts, roles_of

CLASSES = 4


# ------------------------------------------------------------------------------------- a OneFlow-style ResNet

def conv(x, name, filters, kernel, stride=1, initializer=None):
    weight = flow.get_variable(name + "-weight", shape=(filters, x.shape[1], kernel, kernel), dtype=x.dtype,
                               initializer=initializer or flow.variance_scaling_initializer(
                                   2, "fan_in", "random_normal", data_format="NCHW"))
    padding = "SAME" if stride > 1 or kernel > 1 else "VALID"
    return flow.nn.conv2d(x, weight, stride, padding, "NCHW", 1, name=name)


def bn_relu(x, name, bn=True, beta=None):
    if not bn:
        return flow.nn.relu(x, name=name + "_relu")
    return flow.layers.batch_normalization_relu(x, axis=1, momentum=0.9, epsilon=1e-5, name=name + "_bn_relu",
                                                beta_initializer=beta)


def bottleneck(x, name, filters, stride, bn=True):
    """A ResNet-50 block: 1x1, 3x3 (stride), 1x1 convolutions; a projection shortcut when the shape changes; the
    last batch norm's gamma (and moving variance) start at zero, as OneFlow's ResNet does."""
    inner = filters // 4
    shortcut = x
    if stride != 1 or x.shape[1] != filters:
        shortcut = conv(x, name + "_branch1", filters, 1, stride)
        if bn:
            shortcut = flow.layers.batch_normalization(shortcut, axis=1, momentum=0.9, epsilon=1e-5,
                                                       name=name + "_branch1_bn")
    a = bn_relu(conv(x, name + "_branch2a", inner, 1), name + "_branch2a", bn)
    b = bn_relu(conv(a, name + "_branch2b", inner, 3, stride), name + "_branch2b", bn)
    c = conv(b, name + "_branch2c", filters, 1)
    if not bn:
        return flow.nn.relu(c + shortcut, name=name + "_relu")
    return flow.layers.batch_normalization_add_relu(c, shortcut, axis=1, momentum=0.9, epsilon=1e-5,
                                                    gamma_initializer=flow.zeros_initializer(),
                                                    moving_variance_initializer=flow.zeros_initializer(),
                                                    name=name + "_branch2c_bn_add_relu")


def resnet(images, counts=(1, 1), filters=(32, 64), stem=16, bn=True, classes=CLASSES):
    """``conv1`` (+ its batch norm), stages ``res2``, ``res3``, ... of bottleneck blocks, global average pooling and
    a dense layer ``fc``."""
    h = bn_relu(conv(images, "conv1", stem, 3), "conv1", bn)
    for stage, (count, width) in enumerate(zip(counts, filters)):
        for i in range(count):
            h = bottleneck(h, f"res{stage + 2}_{i}", width, 2 if i == 0 and stage > 0 else 1, bn)
    h = flow.nn.avg_pool2d(h, ksize=h.shape[2], strides=1, padding="VALID", data_format="NCHW", name="pool5")
    return flow.layers.dense(flow.reshape(h, (h.shape[0], -1)), classes, name="fc")


def images(steps, batch, size, seed=0):
    """``steps`` batches of ``CLASSES`` noisy image prototypes (a CNN separates them in a few dozen steps)."""
    rng = np.random.default_rng(seed)
    prototypes = rng.normal(size=(CLASSES, 3, size, size)).astype(np.float32)
    for _ in range(steps):
        y = rng.integers(0, CLASSES, batch).astype(np.int32)
        yield (prototypes[y] + rng.normal(size=(batch, 3, size, size))).astype(np.float32), y


def train_job(model, reports, batch, size, lr=0.1, momentum=0.9, **thresholds):
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((batch, 3, size, size)),
            y: tp.Numpy.Placeholder((batch,), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, model(x))
        flow.watch_health(reports.append, **thresholds)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [lr]), momentum=momentum).minimize(loss)
        return loss
    return job


def run(job, steps, batch, size):
    with np.errstate(all="ignore"):            # the diverging cases overflow on purpose
        losses = [float(job(x, y).mean()) for x, y in images(steps, batch, size)]
    flow.sync_default_session()
    return losses


def alerts(reports):
    return {(a.kind, a.layer) for r in reports for a in r.alerts}


def plain_stack(images, depth=10, width=16, bn=True, classes=CLASSES):
    """``depth`` 3x3 convolutions ``conv<i>`` initialised N(0, 0.01) as VGG was, each followed by a batch norm and
    ReLU (``conv<i>_bn_relu``) or, without ``bn``, a ReLU alone; then ``fc``."""
    h = images
    for i in range(depth):
        h = bn_relu(conv(h, f"conv{i}", width, 3, initializer=flow.random_normal_initializer(stddev=0.01)),
                    f"conv{i}", bn)
    return flow.layers.dense(flow.reshape(h, (h.shape[0], -1)), classes, name="fc")


# ------------------------------------------------------------------------------------- batch norm statistics

def test_batch_norm_statistics_match_numpy_on_the_same_tensors():
    """The moving statistics a report shows are those before this call's update (the ones a predict job would use
    now); the gaps compare them with this call's batch statistics. Reference: the moving averages worked out here
    from the conv outputs the job normalized (watch_scope), as OneFlow defines them (momentum 0.9, unbiased batch
    variance)."""
    values, reports = {}, []
    batch, size, steps, epsilon = 8, 6, 4, 1e-5

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((batch, 3, size, size)),
            y: tp.Numpy.Placeholder((batch,), dtype=flow.int32)) -> tp.Numpy:
        with flow.watch_scope(lambda blob, blob_def: values.setdefault(blob_def.logical_blob_name, []).append(
                blob.numpy().astype(np.float64))):
            h = conv(x, "conv1", 5, 3)
        h = bn_relu(h, "conv1")
        logits = flow.layers.dense(flow.reshape(h, (batch, -1)), CLASSES, name="fc")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.watch_health(reports.append)
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss

    run(job, steps, batch, size)
    mean, var = np.zeros(5), np.ones(5)                 # OneFlow's initial moving statistics
    for s, report in enumerate(reports):
        assert list(report.table) == ["conv1", "conv1_bn_relu", "fc"]
        row = report.table["conv1_bn_relu"]
        x = values["conv1/out_0"][s]
        batch_mean, batch_var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3), ddof=1)
        expected = [np.abs(mean).mean(), var.mean(), var.min(),
                    (np.abs(batch_mean - mean) / np.sqrt(var + epsilon)).mean(),
                    ((batch_var + epsilon) / (var + epsilon)).mean(), 0, 0]
        assert [row[k] for k in BATCH_NORM_STATISTICS] == pytest.approx(expected, rel=1e-4, abs=1e-6)
        assert "moving_mean_abs" not in report.table["conv1"] and "moving_mean_abs" not in report.table["fc"]
        mean, var = 0.9 * mean + 0.1 * batch_mean, 0.9 * var + 0.1 * batch_var
    assert reports[-1].table["conv1_bn_relu"]["batch_var_ratio"] != pytest.approx(1.0, abs=0.05), \
        "the test data should leave a gap to measure"

    # a predict job normalizes with the moving statistics: those, and no gap (NaN)
    predicted = []

    @flow.global_function(type="predict")
    def watched(x: tp.Numpy.Placeholder((batch, 3, size, size))) -> tp.Numpy:
        h = bn_relu(conv(x, "conv1", 5, 3), "conv1")
        logits = flow.layers.dense(flow.reshape(h, (batch, -1)), CLASSES, name="fc")
        flow.watch_health(predicted.append)
        return logits
    watched(next(images(1, batch, size))[0])
    flow.sync_default_session()
    row = predicted[0].table["conv1_bn_relu"]
    variables = flow.get_all_variables()
    moving_mean, moving_var = (variables[f"conv1_bn_relu-{m}"].numpy() for m in ("moving_mean", "moving_variance"))
    assert row["moving_mean_abs"] == pytest.approx(np.abs(moving_mean).mean(), rel=1e-5)
    assert row["moving_var_min"] == pytest.approx(moving_var.min(), rel=1e-5)
    assert moving_var.mean() == pytest.approx(var.mean(), rel=1e-4)      # the updates this test worked out
    assert math.isnan(row["batch_mean_gap"]) and math.isnan(row["batch_var_ratio"])


def test_batch_norm_vector_counts_non_finite_moving_statistics():
    """A NaN batch poisons the moving statistics for good: counted, and the averages say so too."""
    from flowlab.ops.stats import batch_norm_vector
    mean = np.array([0.5, -1.0, np.nan], np.float32)
    var = np.array([1.0, np.inf, 4.0], np.float32)
    v = batch_norm_vector(np, mean, var)
    assert np.isnan(v[0]) and v[1] == np.inf and v[2] == 1 and np.isnan(v[3:5]).all() and v[5:].tolist() == [1, 1]
    mean, var, bm, bv = (np.array(a, np.float32) for a in ([0.5, -1.0], [1.0, 3.0], [1.5, -1.0], [2.0, 3.0]))
    v = batch_norm_vector(np, mean, var, bm, bv, epsilon=1.0)
    assert v.tolist() == pytest.approx([0.75, 2.0, 1.0, (1 / math.sqrt(2) + 0) / 2, (1.5 + 1) / 2, 0, 0])


# ------------------------------------------------------------------------------------- alerts on normalised nets

BATCH, SIZE = 16, 12


def test_a_healthy_resnet_gets_no_alert_where_the_plain_rules_cried_wolf():
    """A small OneFlow-style ResNet (bottleneck blocks, batch_normalization_relu / _add_relu, zero-initialised last
    gamma) learning an easy task: no alert. The same numbers read as if every layer were plain (the rules before
    they knew a layer's role) raise alerts: the residual branches behind their closed gates get no gradient at the
    first step and tiny ones after (vanishing_gradient, update_ratio)."""
    reports = []
    losses = run(train_job(resnet, reports, BATCH, SIZE), 30, BATCH, SIZE)
    assert np.mean(losses[-5:]) < 0.75 * np.mean(losses[:5]), "it learns"
    assert alerts(reports) == set()
    plain = set()
    for i, report in enumerate(reports):
        plain |= {(a.kind, a.layer) for a in health_alerts(reports[:i], report)}
    assert ("vanishing_gradient", "res2_0_branch2a") in plain
    assert {kind for kind, _ in plain} >= {"vanishing_gradient", "update_ratio"}
    # the roles the monitor read from the graph
    table = reports[0].table
    assert {layer for layer, row in table.items() if "moving_var_min" in row} == {
        "conv1_bn_relu", "res2_0_branch1_bn", "res2_0_branch2a_bn_relu", "res2_0_branch2b_bn_relu",
        "res2_0_branch2c_bn_add_relu", "res3_0_branch1_bn", "res3_0_branch2a_bn_relu", "res3_0_branch2b_bn_relu",
        "res3_0_branch2c_bn_add_relu"}
    # the gates start closed: zero gamma and beta; their moving variance starts at zero too (OneFlow's ResNet)
    assert table["res2_0_branch2c_bn_add_relu"]["weight_norm"] == 0
    assert table["res2_0_branch2c_bn_add_relu"]["moving_var_min"] == 0


def test_the_roles_change_only_what_they_explain():
    """``health_alerts`` on hand-made numbers: a closed gate explains its branch's zero gradient, an open one does
    not; a normalised layer's high update ratio alerts only when it stays high; a pre-activation is never dead."""
    roles = {"conv": LayerRole(relu=False, normalised=True, gate="gate", size=100),
             "gate": LayerRole(batch_norm=True, size=8), "fc": LayerRole(relu=False, size=50)}

    def report(step, gate_norm, conv_ratio=1e-3, conv_grad=0.0, dead=1.0):
        from flowlab.health import HealthReport
        return HealthReport(step, {
            "conv": {"dead_fraction": dead, "weight_norm": 1.0, "grad_norm": conv_grad, "update_ratio": conv_ratio},
            "gate": {"weight_norm": gate_norm, "grad_norm": 1.0, "update_ratio": 1e-2},
            "fc": {"weight_norm": 1.0, "grad_norm": 1.0, "update_ratio": 1e-2}}, loss=1.0)

    closed = health_alerts([], report(0, gate_norm=0.0), roles=roles)
    assert closed == []                                   # rms 0 < closed_gate: the zero-init residual
    opened = health_alerts([], report(0, gate_norm=0.5 * math.sqrt(8)), roles=roles)   # rms 0.5
    assert {(a.kind, a.layer) for a in opened} == {("vanishing_gradient", "conv")}
    # a high ratio on a scale-invariant layer: once is the norm growing; MIN_HISTORY + 1 times in a row is the rate
    history = []
    for step in range(4):
        r = report(step, 1.0, conv_ratio=2.0, conv_grad=1.0)
        r.alerts = health_alerts(history, r, roles=roles)
        history.append(r)
    assert [[a.kind for a in r.alerts] for r in history] == [[], [], [], ["update_ratio"]]
    # without roles the same first report alerts at once, and the dead pre-activation counts as dead ReLUs
    plain = health_alerts([], report(0, 1.0, conv_ratio=2.0, conv_grad=1.0))
    assert {a.kind for a in plain} == {"update_ratio", "dead_relu"}


def test_a_learning_rate_far_too_high_names_the_unnormalised_layer_first():
    """SGD at 10 (100x the healthy rate). Batch norm keeps the convolutions finite (scale invariance), but the
    last dense layer, which nothing normalizes, is overwritten at the first step; then the batch norms' gamma and
    beta are (update_ratio), and beta is pushed so far that a block's ReLU dies (dead_relu). It never learns."""
    reports = []
    losses = run(train_job(resnet, reports, BATCH, SIZE, lr=10.0), 12, BATCH, SIZE)
    first = reports[0].alerts
    assert [(a.kind, a.layer) for a in first] == [("update_ratio", "fc")]
    assert "overwritten" in first[0].message
    seen = alerts(reports)
    assert any(kind == "update_ratio" and layer.endswith("_bn_relu") for kind, layer in seen)
    assert any(kind == "dead_relu" and "_bn_" in layer for kind, layer in seen)
    assert min(losses[1:]) > losses[0]


def test_a_learning_rate_that_diverges_names_the_first_layer_with_nan():
    """SGD at 1e4: fc and the batch norms are overwritten at once (update_ratio at step 0), the total gradient
    explodes and the loss spikes, then float32 overflows in the weights, gradients or activations of some layer, or
    in a batch norm's moving variance (which one first depends on rounding, and on whether the batch statistics are
    summed in float32 or, as the compiled kernels do, in float64): the nan alert names that layer and its op."""
    reports = []
    run(train_job(resnet, reports, BATCH, SIZE, lr=1e4, momentum=0.0), 8, BATCH, SIZE)
    assert {a.kind for a in reports[0].alerts} == {"update_ratio"}
    assert "fc" in {a.layer for a in reports[0].alerts}
    nan = [a for r in reports for a in r.alerts if a.kind == "nan"]
    assert nan, "a rate of 1e4 overflows"
    exploding = [a.step for r in reports for a in r.alerts if a.kind == "exploding_gradient" and a.layer is None]
    assert exploding and exploding[0] <= nan[0].step
    first = nan[0]
    assert first.layer in reports[0].table and first.layer.startswith("res")
    assert re.search(r"(NaN|Inf) in the (gradient|weight|activation|moving statistics) of layer res\w+: op \S+",
                     first.message), \
        first.message


@pytest.mark.parametrize("bn", [True, False], ids=["batch_norm", "removed"])
def test_batch_norm_removed_from_a_deep_plain_stack_lets_gradients_vanish(bn):
    """Eight 3x3 convolutions initialised N(0, 0.01), as VGG was. With batch norm the scale of the weights does not
    matter (each layer's output is renormalised) and it learns with no gradient alert. Without it each layer
    shrinks the signal ~10x on its way forward and the gradient as much on its way back, so every convolution's
    weight gradient is ~1e-7 of the dense layer's (whose bias gradient is the loss's own; threshold 1e-3)."""
    reports = []
    losses = run(train_job(lambda x: plain_stack(x, depth=8, width=8, bn=bn), reports, BATCH, 6, lr=0.05), 15,
                 BATCH, 6)
    gradient_alerts = {(kind, layer) for kind, layer in alerts(reports) if kind.endswith("_gradient")}
    if bn:
        assert gradient_alerts == set() and np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5])
    else:
        vanishing = {layer for kind, layer in gradient_alerts if kind == "vanishing_gradient"}
        assert vanishing and all(layer.startswith("conv") for layer in vanishing), vanishing
        assert len([r for r in reports if any(a.kind == "vanishing_gradient" for a in r.alerts)]) == len(reports)


def test_a_dead_batch_norm_relu_is_named_and_its_conv_is_not():
    """A beta of -10 on one batch norm + ReLU: its output (gamma * xhat + beta, xhat of unit variance) is zero for
    the whole batch in nearly every channel, so dead_relu names that layer; the batch norms after it are dead too,
    fed only zeros, but it is the first in forward order. The convolutions after it output only zeros too, but as
    pre-activations they get no dead_relu."""
    def model(x):
        h = bn_relu(conv(x, "conv1", 16, 3), "conv1", beta=flow.constant_initializer(-10.0))
        return resnet_tail(h)

    def resnet_tail(h):
        h = bottleneck(h, "res2_0", 32, 1)
        h = flow.nn.avg_pool2d(h, ksize=h.shape[2], strides=1, padding="VALID", data_format="NCHW", name="pool5")
        return flow.layers.dense(flow.reshape(h, (h.shape[0], -1)), CLASSES, name="fc")

    reports = []
    run(train_job(model, reports, BATCH, SIZE, lr=0.05), 6, BATCH, SIZE)
    first = [a.layer for a in reports[0].alerts if a.kind == "dead_relu"]
    order = list(reports[0].table)
    assert first and min(first, key=order.index) == "conv1_bn_relu"       # the first dead layer is the culprit
    assert reports[0].table["conv1_bn_relu"]["dead_fraction"] > 0.9
    # the convolutions after it are fed only zeros, so their outputs are all zeros: but they are pre-activations
    dead = {layer for kind, layer in alerts(reports) if kind == "dead_relu"}
    assert reports[-1].table["res2_0_branch2a"]["dead_fraction"] == 1 and "res2_0_branch2a" not in dead
    # nothing reaches the conv before the dead ReLU: named as such, pointing at dead_relu
    vanishing = [a for a in reports[-1].alerts if a.kind == "vanishing_gradient"]
    assert [a.layer for a in vanishing] == ["conv1"] and "dead ReLUs" in vanishing[0].message


# ------------------------------------------------------------------------------------- ResNet-50's depth

def resnet50_layers():
    """ResNet-50's layers in forward order, as OneFlow names them: 53 convolutions, 53 batch norms, ``fc``."""
    names = ["conv1", "conv1_bn_relu"]
    for stage, count in enumerate((3, 4, 6, 3)):
        for i in range(count):
            block = f"res{stage + 2}_{i}"
            if i == 0:
                names += [f"{block}_branch1", f"{block}_branch1_bn"]
            names += [f"{block}_branch2a", f"{block}_branch2a_bn_relu", f"{block}_branch2b",
                      f"{block}_branch2b_bn_relu", f"{block}_branch2c", f"{block}_branch2c_bn_add_relu"]
    return names + ["fc"]


def test_watch_functions_on_a_network_of_resnet50s_depth():
    """ResNet-50's depth (3, 4, 6, 3 bottleneck blocks) at a quarter of its widths (full widths take ~15 s here,
    mostly initialising 25M weights), 32-pixel images, batch 2: the health table lists every conv and batch norm
    in forward order with finite statistics (the batch norms with their moving statistics); watch_scope around a
    block delivers its tensors and their gradients; watch and watch_diff deliver one tensor and its gradient."""
    batch, size = 2, 32
    reports, scoped, scoped_diff, watched, diffs = [], {}, {}, [], []

    def model(x):
        h = bn_relu(conv(x, "conv1", 16, 3, stride=2), "conv1")
        for stage, (count, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
            for i in range(count):
                name = f"res{stage + 2}_{i}"
                stride = 2 if i == 0 and stage > 0 else 1
                if name == "res4_2":
                    with flow.watch_scope(scoped, scoped_diff):
                        h = bottleneck(h, name, width, stride)
                else:
                    h = bottleneck(h, name, width, stride)
                if name == "res3_0":
                    flow.watch(h, lambda blob: watched.append(blob.numpy()))
                    flow.watch_diff(h, lambda blob: diffs.append(blob.numpy()))
        h = flow.nn.avg_pool2d(h, ksize=h.shape[2], strides=1, padding="VALID", data_format="NCHW", name="pool5")
        return flow.layers.dense(flow.reshape(h, (batch, -1)), 10, name="fc")

    job = train_job(model, reports, batch, size)
    run(job, 2, batch, size)
    expected = resnet50_layers()
    assert sum(n.startswith(("conv", "res")) and not n.endswith(("_bn", "_relu")) for n in expected) == 53
    assert sum(n.endswith(("_bn", "_bn_relu", "_bn_add_relu")) for n in expected) == 53
    assert [r.step for r in reports] == [0, 1]
    for report in reports:
        assert list(report.table) == expected
        for layer, row in report.table.items():
            # (a gate's update ratio at step 0 is NaN: its gamma and beta start at zero, a ratio to nothing)
            finite = {k: v for k, v in row.items() if not (k == "update_ratio" and row["weight_norm"] == 0)}
            assert all(math.isfinite(v) for v in finite.values()), (layer, row)
            batch_norm = layer.endswith(("_bn", "_bn_relu", "_bn_add_relu"))
            assert ("moving_var_min" in row) == batch_norm and "grad_norm" in row and "act_std" in row
        assert report.alerts == []
    # watch / watch_diff: the block's output and its gradient, one a call (the stem halves 32 pixels, res3 16)
    assert len(watched) == len(diffs) == 2
    assert watched[0].shape == diffs[0].shape == (batch, 128, 8, 8)
    assert (watched[0] >= 0).all() and np.abs(diffs[0]).sum() > 0
    # watch_scope: every tensor the block made, with the gradients of those the loss depends on
    for lbn in ("res4_2_branch2a/out_0", "res4_2_branch2b_bn_relu/y_0", "res4_2_branch2c_bn_add_relu/y_0",
                "res4_2_branch2a-weight/out", "res4_2_branch2c_bn_add_relu-gamma/out"):
        assert lbn in scoped and lbn in scoped_diff, lbn
    assert "res4_2_branch2a_bn_relu-moving_mean/out" in scoped
    assert scoped["res4_2_branch2b_bn_relu/y_0"]["blob"].numpy().shape == (batch, 64, 4, 4)


def test_several_devices_report_the_batch_norms_of_the_whole():
    """On two devices the statistics are made on the host from the delivered tensors: each device's batch
    statistics averaged (as the moving averages are updated), the moving ones alike on both. The first batch
    norm's moving mean after one step is then exactly the one-device run's (the mean of two halves' means is the
    batch mean); the rest differ a little (each half is normalised alone)."""
    runs = {}
    for devices in (1, 2):
        flow.clear_default_session()
        flow.config.cpu_device_num(devices)
        try:
            reports = runs[devices] = []
            run(train_job(resnet, reports, BATCH, SIZE), 3, BATCH, SIZE)
        finally:
            flow.config.cpu_device_num(1)
    for step, (one, two) in enumerate(zip(runs[1], runs[2])):
        assert list(one.table) == list(two.table)
        for layer, row in one.table.items():
            if "moving_mean_abs" not in row:
                continue
            other = two.table[layer]
            # exact for the first batch norm while the weights are the same (step 0's statistics); each half
            # normalised alone makes the later layers' inputs, and later steps' weights, differ a little
            exact = layer == "conv1_bn_relu" and step < 2
            assert other["moving_mean_abs"] == pytest.approx(row["moving_mean_abs"], rel=1e-4 if exact else 0.1,
                                                             abs=1e-6), layer
            assert other["moving_var_mean"] == pytest.approx(row["moving_var_mean"], rel=0.1, abs=1e-6), layer
            assert other["batch_mean_gap"] == pytest.approx(row["batch_mean_gap"], rel=0.1, abs=1e-3), layer
            assert other["moving_nan"] == other["moving_inf"] == 0
    assert runs[2][-1].alerts == []


def test_the_moving_statistics_reach_the_log_and_the_panel(tmp_path):
    """The batch norms' statistics are columns of the SummaryWriter's health record (NaN in the rows of layers
    without them, as the dashboard's Health tab reads them) and statistics HealthPanel can show."""
    import io

    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    from flowlab.summary import SummaryWriter, health_log
    from flowlab.widgets import HealthPanel

    panel = HealthPanel(mode="terminal", file=io.StringIO(), statistic="moving_var_min")
    reports = []

    def both(report):
        reports.append(report)
        panel(report)
    both.delivered_inline = True

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((BATCH, 3, SIZE, SIZE)),
            y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, resnet(x))
        flow.watch_health(both, writer=writer)
        flow.optimizer.SGD(0.1, momentum=0.9).minimize(loss)
        return loss

    with SummaryWriter(tmp_path / "run") as writer:
        run(job, 3, BATCH, SIZE)
    acc = event_accumulator.EventAccumulator(str(tmp_path / "run"), size_guidance={"tensors": 0})
    acc.Reload()
    content = acc.SummaryMetadata("health").plugin_data.content
    records = [health_log.decode(tensor_util.make_ndarray(r.tensor_proto), content) for r in acc.Tensors("health")]
    assert len(records) == len(reports) == 3
    for record, report in zip(records, reports):
        assert set(BATCH_NORM_STATISTICS) <= set(record.statistics)
        for i, layer in enumerate(record.layers):
            for j, statistic in enumerate(record.statistics):
                np.testing.assert_equal(record.matrix[i, j], report.table[layer].get(statistic, np.nan))
    assert set(BATCH_NORM_STATISTICS) <= set(panel.grid.statistics) and panel.statistic == "moving_var_min"
    trend = panel.grid.trend_columns("conv1_bn_relu", "moving_var_mean")
    np.testing.assert_array_equal(trend["mean"], [r.table["conv1_bn_relu"]["moving_var_mean"] for r in reports])
    # the trend shown before a click is of a layer that has the statistic: conv1 has no moving statistics
    assert panel.default_layer() == "conv1" and panel.default_layer("moving_var_min") == "conv1_bn_relu"
    assert panel.default_layer("grad_norm") == "conv1"
    panel.close()

    # the dashboard's Health tab offers every statistic of the log, with its meaning
    from flowlab.dashboard.runs import RunSelection
    from flowlab.dashboard.store import Store
    from flowlab.dashboard.views.health import HealthView
    store = Store(tmp_path)
    store.poll()
    view = HealthView(store)
    view.runs = RunSelection(store)
    view.runs.update()
    view.update()
    assert set(BATCH_NORM_STATISTICS) <= set(view.statistic.options)
    view.statistic.value = "batch_var_ratio"
    view.update()
    assert "train/eval gap" in view.meaning.text


def test_a_batch_norm_counts_its_channels_as_units_along_its_axis_and_a_frozen_one_is_a_layer():
    """NHWC input normalized along axis 3: two of its four channels are constant, so they normalize to 0 and, with
    beta 0, stay 0 after the ReLU: half the units dead (counted along the normalized axis, not NCHW's axis 1). A
    frozen batch norm (trainable=False: no trainable variable, the moving statistics normalize) is a layer too, with
    its activation and moving statistics, no weights, and no batch statistics to compare with (NaN gaps)."""
    reports, batch = [], 8

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((batch, 5, 5, 4)), y: tp.Numpy.Placeholder((batch,), dtype=flow.int32)) -> tp.Numpy:
        h = flow.layers.batch_normalization_relu(x, axis=3, name="input_bn_relu")
        h = flow.layers.batch_normalization(h, axis=3, trainable=False, name="frozen_bn")
        logits = flow.layers.dense(flow.reshape(h, (batch, -1)), CLASSES, name="fc")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.watch_health(reports.append, histogram_every=1)
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss

    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, 5, 5, 4)).astype(np.float32)
    x[..., :2] = 3.0                                     # channels 0 and 1: constant
    job(x, rng.integers(0, CLASSES, batch).astype(np.int32))
    flow.sync_default_session()
    table = reports[0].table
    assert list(table) == ["input_bn_relu", "frozen_bn", "fc"]
    assert table["input_bn_relu"]["dead_fraction"] == 0.5
    assert [a.layer for a in reports[0].alerts if a.kind == "dead_relu"] == []       # 50% is not above 50%
    frozen = table["frozen_bn"]
    assert "weight_norm" not in frozen and "grad_norm" not in frozen and "act_std" in frozen
    assert frozen["moving_mean_abs"] == 0 and frozen["moving_var_mean"] == frozen["moving_var_min"] == 1
    assert math.isnan(frozen["batch_mean_gap"]) and math.isnan(frozen["batch_var_ratio"])
    assert set(reports[0].histograms["frozen_bn"]) == {"activation"}


def test_the_unfused_resnet50_of_flowlab_examples_gets_no_alert():
    """``flowlab.examples.resnet`` with ``fused=False`` writes OneFlow-Benchmark's unfused form: ``conv`` -> ``conv_bn``
    (batch_normalization) -> ``conv_relu``, and a block ends in ``relu(add(branch2c_bn, shortcut))``. The ReLU named
    after the convolution makes its layer's output, yet the convolution is still seen as normalised, and the
    ``_add`` of two same-shaped tensors as the residual merge behind which a branch's zero-scaled batch norm is a
    closed gate: no alert, where the plain rules alert from the first step."""
    from flowlab.examples import resnet

    class Reports:
        def __init__(self):
            self.reports = []

        def add_health(self, report):
            self.reports.append(report)

    log = Reports()
    job = resnet.train_job(**resnet.SMALL, health_writer=log)
    for x, y in images(6, 2, 32):
        job(x, (y * 2).astype(np.int32))
    flow.sync_default_session()
    reports = log.reports
    assert len(reports[0].table) == 107 and all(r.alerts == [] for r in reports)
    assert [a.kind for a in health_alerts([], reports[0])] != []
    table = reports[0].table
    assert table["Resnet-res2_0_branch2c_bn"]["weight_norm"] == 0            # the closed gate
    assert table["Resnet-res2_0_branch2a"]["act_zero_fraction"] > 0          # its output is the ReLU's
    roles = roles_of(find_layers(job.graph()))
    # (base width 8: res2's blocks are 8 -> 8 -> 32 channels; res5's output of 256 feeds fc1001's 10 classes)
    assert roles["Resnet-res2_0_branch2a"] == LayerRole(relu=True, normalised=True, gate="Resnet-res2_0_branch2c_bn",
                                                        size=8 * 8)
    assert roles["Resnet-res2_0_branch2b_bn"].gate == "Resnet-res2_0_branch2c_bn"
    assert roles["Resnet-res2_0_branch2c"] == LayerRole(relu=False, normalised=True, gate="Resnet-res2_0_branch2c_bn",
                                                        size=32 * 8)
    # a projection shortcut is a branch of the sum too, behind its own batch norm (open: gamma starts at one)
    assert roles["Resnet-res2_0_branch1"] == LayerRole(relu=False, normalised=True, gate="Resnet-res2_0_branch1_bn",
                                                       size=32 * 8)
    assert roles["Resnet-res3_0_branch2a"].gate == "Resnet-res3_0_branch2c_bn"
    assert roles["Resnet-fc1001"] == LayerRole(relu=False, size=256 * 10 + 10)


def test_the_roles_of_a_fused_resnets_layers():
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((2, 3, 8, 8)), y: tp.Numpy.Placeholder((2,), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, resnet(x, counts=(2,)))
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss
    roles = roles_of(find_layers(job.graph()))
    assert roles["conv1"] == LayerRole(relu=False, normalised=True, size=16 * 3 * 9)
    assert roles["conv1_bn_relu"] == LayerRole(relu=True, batch_norm=True, size=32)
    for block in ("res2_0", "res2_1"):
        gate = f"{block}_branch2c_bn_add_relu"
        assert roles[gate] == LayerRole(relu=True, batch_norm=True, size=64)       # not in its own branch
        for layer in ("branch2a", "branch2a_bn_relu", "branch2b", "branch2b_bn_relu", "branch2c"):
            assert roles[f"{block}_{layer}"].gate == gate, layer
    assert roles["res2_0_branch1"].gate is None and roles["res2_0_branch1_bn"].gate is None   # the shortcut


def test_the_exported_graph_leaves_out_the_watch_statistics_ops():
    """watch_health adds its statistics ops when the job compiles (a batch norm's reads its moving statistics,
    which otherwise only their updates read); the structure graph and the GraphDef are the user's job, the same
    before the first call as after it."""
    from flowlab.summary import graph_export

    reports = []
    job = train_job(resnet, reports, BATCH, SIZE)
    before = graph_export.structure_json(job)
    before_def = graph_export.graph_def(job)
    run(job, 1, BATCH, SIZE)
    assert reports and any(node.name.startswith("System-Health-moving-") for node in job.graph().nodes)
    assert graph_export.structure_json(job) == before
    assert graph_export.graph_def(job) == before_def
    assert not any(layer["name"].startswith("System-Health") for layer in before["layers"])
