"""``flow.watch_health``'s block path: a handler with ``health_block`` (``HealthPanel``) gets ``HealthBlock``s that
hold, call for call, what one ``HealthReport`` a call holds: the same tables (norms, ratios and counts to the bit; the
moments of layer outputs summarised in bulk to rounding), the same alerts with the same steps and messages, the same
first op with NaN. Each job here watches its health twice, once per call and once in blocks, so both see the same
tensors."""
import math

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.health import ACTIVATION_STATISTICS, HealthBlock, HealthReport
from flowlab.ops.stats import SquaresStats, activation_rows, activation_vector, square_vector
from flowlab.runtime import jit
from flowlab.summary import health_log
from flowlab.widgets import HealthPanel
from test_health import BATCH, CLASSES, FEATURES, data

pytestmark = pytest.mark.numpy_backend        # the block path is the host's


class Blocks:
    """A block handler: keeps every ``HealthBlock``; ``flush()`` asks for the calls not given yet."""

    def __init__(self):
        self.blocks, self._flush, self.one_by_one = [], [], []

    def __call__(self, report):        # where the block path does not run (a GPU, a writer): one report a call
        self.one_by_one.append(report)

    def health_block(self, block):
        self.blocks.append(block)

    def health_source(self, flush):
        self._flush.append(flush)

    def flush(self):
        for f in self._flush:
            f()


def both_ways(layers, steps=40, batches=None, flush_at=(), every=1, optimizer=None, predict=False, **thresholds):
    """``(reports, blocks)`` of a job of ``layers(x)`` (its logits) watched per call and in blocks; the block
    handler is also flushed after the calls in ``flush_at`` (blocks that end there, alert windows across them)."""
    reports, blocks = [], Blocks()

    def watched(x):
        logits = layers(x)
        flow.watch_health(reports.append, every=every, **thresholds)
        flow.watch_health(blocks, every=every, **thresholds)
        return logits

    if predict:
        @flow.global_function()
        def job(x: tp.Numpy.Placeholder((BATCH, FEATURES))) -> tp.Numpy:
            return watched(x)
    else:
        @flow.global_function(type="train")
        def job(x: tp.Numpy.Placeholder((BATCH, FEATURES)),
                y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, watched(x))
            (optimizer or flow.optimizer.SGD(0.1, momentum=0)).minimize(loss)
            return loss

    for i, (x, y) in enumerate(batches or data(steps)):
        job(x) if predict else job(x, y)
        if i in flush_at:
            blocks.flush()
    blocks.flush()
    flow.sync_default_session()
    assert blocks.one_by_one == []
    return reports, blocks.blocks


def dense_stack(depth=2, width=32, activation=flow.nn.relu, bias=0.0):
    def layers(x):
        h = x
        for i in range(depth):
            h = flow.layers.dense(h, width, activation=activation, name=f"hidden_{i}",
                                  bias_initializer=flow.constant_initializer(bias) if i == 0 else None)
        return flow.layers.dense(h, CLASSES, name="output")
    return layers


def sgd_job(*handlers, bias=0.0, function_config=None, **watch_options):
    """A train job of ``dense_stack(bias=bias)`` under plain SGD (0.1), its health watched by each of ``handlers``
    (``watch_options`` passed to each ``watch_health``)."""
    @flow.global_function(type="train", function_config=function_config)
    def job(x: tp.Numpy.Placeholder((BATCH, FEATURES)), y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)
            ) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, dense_stack(bias=bias)(x))
        for handler in handlers:
            flow.watch_health(handler, **watch_options)
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss
    return job


def assert_same(reports, blocks):
    """Every report's numbers, alerts and first NaN op are its call's in the blocks."""
    assert all(isinstance(b, HealthBlock) for b in blocks)
    steps = np.concatenate([b.steps for b in blocks])
    assert steps.tolist() == [r.step for r in reports]
    block_alerts = [a for b in blocks for a in b.alerts]
    assert block_alerts == [a for r in reports for a in r.alerts]
    made = [b.report(i) for b in blocks for i in range(len(b))]
    for report, mine in zip(reports, made):
        assert list(mine.table) == list(report.table)
        statistics = blocks[0].statistics
        assert statistics == health_log.columns(report.table)
        assert mine.alerts == report.alerts and mine.first_nonfinite == report.first_nonfinite
        assert mine.loss == report.loss or math.isnan(mine.loss) and math.isnan(report.loss)
        assert mine.attention == report.attention and mine.residual.keys() == report.residual.keys()
        for layer, row in report.table.items():
            for stat, value in row.items():
                got = mine.table[layer][stat]
                if stat in ACTIVATION_STATISTICS[:2] or stat == "act_max_abs":
                    assert got == pytest.approx(value, rel=1e-5, nan_ok=True), (report.step, layer, stat)
                else:
                    assert got == value or (math.isnan(got) and math.isnan(value)), (report.step, layer, stat)
    # the blocks' arrays are the tables
    values = np.concatenate([b.values for b in blocks])
    expected = np.array([health_log.matrix(r.table, blocks[0].statistics) for r in reports])
    exact = [j for j, s in enumerate(blocks[0].statistics) if s not in ("act_mean_abs", "act_std", "act_max_abs")]
    np.testing.assert_array_equal(values[:, :, exact], expected[:, :, exact])
    np.testing.assert_allclose(values, expected, rtol=1e-5)
    if reports[0].loss is not None:
        np.testing.assert_array_equal(np.concatenate([b.loss for b in blocks]), [r.loss for r in reports])
    else:
        assert all(b.loss is None for b in blocks)


# ------------------------------------------------------------------------------------------------ same reports

def test_a_healthy_net_in_blocks_is_its_reports_with_windows_across_blocks(monkeypatch):
    from flowlab import health
    made = []
    original = health._BlockLayout._report

    def counting(self, monitor, row, values, step, nonfinite):
        made.append(step)
        return original(self, monitor, row, values, step, nonfinite)
    monkeypatch.setattr(health._BlockLayout, "_report", counting)
    reports, blocks = both_ways(dense_stack(), steps=60, flush_at=(0, 5, 6, 30))
    assert len(blocks) >= 5 and sum(len(b) for b in blocks) == 60
    # no alert: the screen flagged (almost) no call, so (almost) no report was made in blocks
    assert not any(r.alerts for r in reports) and len(made) <= 3
    monkeypatch.undo()
    assert_same(reports, blocks)


def test_a_dead_relu_layer_alerts_on_every_call_in_blocks():
    reports, blocks = both_ways(dense_stack(bias=-100.0), steps=25, flush_at=(3,))
    assert {a.kind for r in reports for a in r.alerts} >= {"dead_relu", "vanishing_gradient"}
    assert_same(reports, blocks)


def test_nan_names_the_same_first_op_in_blocks():
    def poisoned():
        for i, (x, y) in enumerate(data(30)):
            if i == 17:
                x = x.copy()
                x[0, 0] = np.nan
            yield x, y
    reports, blocks = both_ways(dense_stack(), batches=poisoned(), flush_at=(10,))
    assert reports[17].first_nonfinite is not None and reports[17].first_nonfinite["op"]
    assert_same(reports, blocks)
    assert any(a.kind == "nan" and a.step == 17 for b in blocks for a in b.alerts)


def mislabelled(steps, bad):
    """``data(steps)`` with the labels of the batches in ``bad`` all wrong: their loss spikes."""
    for i, (x, y) in enumerate(data(steps)):
        yield x, ((y + 1) % CLASSES if i in bad else y)


def test_a_mislabelled_batch_spikes_the_loss_on_its_own_step():
    reports, blocks = both_ways(dense_stack(), batches=mislabelled(50, (33, 47)), flush_at=(20, 40), window=8)
    fired = {(a.kind, a.step) for r in reports for a in r.alerts}
    assert ("loss_spike", 33) in fired and ("loss_spike", 47) in fired
    assert_same(reports, blocks)


def test_gradients_exploding_over_time_in_blocks():
    def batches():           # a batch far out of scale, all labels wrong: the softmax saturates the wrong way
        for i, (x, y) in enumerate(mislabelled(30, (25,))):
            yield (x * 1e3 if i == 25 else x), y
    reports, blocks = both_ways(dense_stack(), batches=batches(), flush_at=(12,))
    assert ("exploding_gradient", None) in {(a.kind, a.layer) for a in reports[25].alerts}
    assert_same(reports, blocks)


@pytest.mark.parametrize("lr", [1e-9, 50.0])
def test_update_ratio_alerts_in_blocks(lr):
    reports, blocks = both_ways(dense_stack(), steps=24, optimizer=flow.optimizer.SGD(lr, momentum=0))
    assert any(a.kind in ("update_ratio", "nan") for r in reports for a in r.alerts)
    assert_same(reports, blocks)


def test_a_rule_firing_every_call_runs_alone_and_hides_no_other(monkeypatch):
    """A net whose update ratio alerts on every call (as a converged one's does): the calls only that rule may alert
    on are decided over the block at once, with no report made and no rule run; on the bad batch the screen also
    flags the loss spike and the gradients, whose rules run and still fire on its own step."""
    from flowlab import health
    ran = []
    original = health.health_alerts

    def recording(history, report, *args, rules=None, **kwargs):
        if rules is not None:                             # the block path's (one report a call runs them all)
            ran.append((report.step, [rule.__name__ for rule in rules]))
        return original(history, report, *args, rules=rules, **kwargs)
    monkeypatch.setattr(health, "health_alerts", recording)
    def batches():           # at step 29 a batch far out of scale, all labels wrong: the loss and gradients leap
        for i, (x, y) in enumerate(mislabelled(40, (29,))):
            yield (x * 1e3 if i == 29 else x), y
    reports, blocks = both_ways(dense_stack(), batches=batches(), flush_at=(12,), window=8,
                                optimizer=flow.optimizer.SGD(1e-9, momentum=0))
    monkeypatch.undo()
    assert all("update_ratio" in {a.kind for a in r.alerts} for r in reports)
    assert {("loss_spike", None), ("exploding_gradient", None)} <= {(a.kind, a.layer) for a in reports[29].alerts}
    assert_same(reports, blocks)
    rules = dict(ran)
    assert len(ran) == len(rules) and 29 in rules        # each call at most once
    assert {"_loss_spike_alert", "_total_gradient_alerts"} <= set(rules[29])
    assert len(rules) <= 8, rules                          # the rest: the update ratio alone, in bulk


def test_an_update_of_zero_alerts_only_once_it_stays_zero_in_blocks():
    """A learning rate of 0 (a warm-up's first step, if it lasted): the update ratio is exactly 0 despite a gradient,
    which the rule lets pass until it stayed 0 over the reports before; the block path defers those calls to it."""
    reports, blocks = both_ways(dense_stack(), steps=12, flush_at=(1, 5), optimizer=flow.optimizer.SGD(
        flow.optimizer.PiecewiseConstantScheduler([], [0.0]), momentum=0))
    fired = [r.step for r in reports if any(a.kind == "update_ratio" for a in r.alerts)]
    assert fired == list(range(3, 12))
    assert_same(reports, blocks)


def test_deep_sigmoid_vanishing_gradients_in_blocks():
    reports, blocks = both_ways(dense_stack(depth=8, width=16, activation=flow.math.sigmoid), steps=20)
    assert any(a.kind == "vanishing_gradient" for r in reports for a in r.alerts)
    assert_same(reports, blocks)


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_optimizers_whose_update_is_measured_and_every_third_call(optimizer):
    opt = flow.optimizer.SGD(0.1, momentum=0.9) if optimizer == "momentum" else flow.optimizer.Adam(1e-2)
    reports, blocks = both_ways(dense_stack(), steps=30, optimizer=opt, every=3, flush_at=(14,))
    assert [r.step for r in reports] == list(range(0, 30, 3))
    assert all(math.isfinite(r.table["output"]["update_ratio"]) for r in reports)
    assert_same(reports, blocks)


def test_a_predict_job_in_blocks():
    reports, blocks = both_ways(dense_stack(), steps=20, predict=True)
    assert reports[0].loss is None and "grad_norm" not in reports[0].table["output"]
    assert_same(reports, blocks)


def test_a_conv_net_with_batch_norms_in_blocks():
    def layers(x):
        images = flow.reshape(x, [BATCH, 1, 4, 5])
        h = flow.layers.conv2d(images, 6, 3, padding="SAME", name="conv")
        h = flow.layers.batch_normalization(h, axis=1, name="conv_bn")
        h = flow.nn.relu(h)
        return flow.layers.dense(flow.reshape(h, [BATCH, -1]), CLASSES, name="output")
    reports, blocks = both_ways(layers, steps=20, flush_at=(2,),
                                optimizer=flow.optimizer.SGD(0.05, momentum=0.9))
    assert "moving_var_min" in blocks[0].statistics
    assert_same(reports, blocks)


def test_a_resnets_closed_gates_raise_no_update_ratio_alert_in_blocks():
    """OneFlow's ResNet starts each residual branch behind a closed gate (a zero gamma): the branch's update ratio is
    tiny by design, and the rule, knowing the layers' roles, lets it pass. The block path decides the update ratio
    in bulk only for layers whose rule relaxes nothing; these calls go to the rule, as one report a call does."""
    from test_health_cnn import images, resnet
    reports, blocks = [], Blocks()

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((8, 3, 12, 12)), y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, resnet(x))
        flow.watch_health(reports.append)
        flow.watch_health(blocks)
        flow.optimizer.SGD(0.1, momentum=0.9).minimize(loss)
        return loss
    for i, (x, y) in enumerate(images(12, 8, 12)):
        job(x, y)
        if i == 4:
            blocks.flush()
    blocks.flush()
    flow.sync_default_session()
    assert not any(a.kind == "update_ratio" for r in reports for a in r.alerts)
    assert_same(reports, blocks.blocks)


def test_a_transformers_attention_and_residual_rows_in_blocks():
    from test_health_transformer import watched_bert
    blocks = Blocks()
    reports, _ = watched_bert(6, window=3, before_health=lambda: flow.watch_health(blocks, window=3))
    blocks.flush()
    assert reports[0].attention and reports[0].residual
    assert_same(reports, blocks.blocks)
    for name, row in reports[-1].residual.items():
        for stat, value in row.items():
            assert blocks.blocks[-1].residual[name][stat][-1] == pytest.approx(value, rel=1e-12)
    block = blocks.blocks[-1]
    assert {k: v[-1].tolist() for k, v in block.attention.items()} == reports[-1].attention


def test_a_failed_call_leaves_no_row():
    reports, blocks = [], Blocks()
    config = flow.function_config()
    config.detect_anomaly(True)
    job = sgd_job(reports.append, blocks, function_config=config)

    batches = list(data(4))
    for i, (x, y) in enumerate(batches):
        if i == 2:       # the first product overflows: the call stops there, the weights' squares already taken
            with pytest.raises(flow.errors.AnomalyError, match="hidden_0_matmul"):
                job(np.full_like(x, 3e38), y)
        job(x, y)
    blocks.flush()
    flow.sync_default_session()
    assert [r.step for r in reports] == [0, 1, 3, 4]
    assert_same(reports, blocks.blocks)


# ------------------------------------------------------------------------------------------------ the panel

def test_the_panel_in_blocks_shows_what_it_shows_report_by_report():
    def batches():
        return mislabelled(70, (50,))
    per_call = HealthPanel(mode="notebook", max_steps=16)
    per_call._refresher.stop()
    in_blocks = HealthPanel(mode="notebook", max_steps=16)

    def handler(report):       # not a block handler: reports one at a time
        per_call(report)

    job = sgd_job(handler, in_blocks, bias=-0.5)

    for x, y in batches():
        job(x, y)
    flow.sync_default_session()
    a, b = per_call.grid, in_blocks.grid            # reading the grid takes every call recorded so far
    assert a.layers == b.layers and a.statistics == b.statistics and len(b) <= 16
    for s in a.statistics:
        ca, cb = a.cells(s), b.cells(s)
        for key in ("first", "last", "nonfinite"):
            np.testing.assert_array_equal(ca[key], cb[key])
        for key in ("lo", "hi", "mean"):
            np.testing.assert_allclose(cb[key], ca[key], rtol=1e-5)
    assert list(in_blocks.alerts) == list(per_call.alerts) and in_blocks.counts == per_call.counts
    assert 50 in {a.step for a in in_blocks.alerts if a.kind == "loss_spike"}
    assert in_blocks.step == per_call.step == 69
    assert in_blocks.default_layer() == per_call.default_layer()
    np.testing.assert_array_equal(in_blocks.cells_columns()["hi|grad_norm"], per_call.cells_columns()["hi|grad_norm"])
    in_blocks.close()
    per_call.close()


def test_the_panels_refresh_thread_pulls_the_calls_as_they_come():
    import time
    panel = HealthPanel(mode="notebook", refresh_hz=20)
    job = sgd_job(panel)

    for x, y in data(12):          # far fewer calls than a block: only the refresh thread's pulls deliver them
        job(x, y)
    deadline = time.monotonic() + 10
    while (panel._grid is None or panel._grid.last_step != 11) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert panel._grid.last_step == 11 and panel._step == 11
    panel.close()


def test_a_panel_with_a_writer_takes_reports_one_at_a_time(tmp_path):
    from flowlab.summary import SummaryWriter
    panel = HealthPanel(mode="terminal", file=__import__("io").StringIO())
    with SummaryWriter(tmp_path / "run") as writer:
        job = sgd_job(panel, writer=writer)
        calls = []
        panel.health_block = calls.append           # would be called on the block path
        for x, y in data(5):
            job(x, y)
        flow.sync_default_session()
    assert calls == [] and panel.step == 4 and len(panel.grid) == 5


# ------------------------------------------------------------------------------------------------ kernels

@pytest.mark.parametrize("shape, unit_axis, nonnegative, dtype", [
    ((40, 32, 10), 1, False, np.float32), ((40, 16, 64), 1, True, np.float32), ((9, 4, 3, 5, 5), 1, True, np.float64),
    ((9, 4, 5, 5, 3), -1, False, np.float32), ((9, 7), 0, False, np.float32), ((1500, 8, 4), 1, False, np.float32)])
def test_activation_rows_is_activation_vector_of_each_row(shape, unit_axis, nonnegative, dtype):
    rng = np.random.default_rng(3)
    rows = rng.standard_normal(shape).astype(dtype)
    if nonnegative:
        rows = np.maximum(rows, 0)
    rows[0] = 0                                               # all zero: every unit dead
    rows[1].reshape(-1)[:3] = [np.nan, np.inf, -np.inf] if not nonnegative else [np.nan, np.inf, 1.0]
    rows[2] += 1e4                                            # a variance that E[x^2] - mean^2 would lose
    rows[3] *= 1e20 if dtype == np.float32 else 1e160         # squares that would overflow
    rows[4].reshape(-1)[::2] = 0                              # half zeros (a unit each way along the last axis)
    for compiled in (False, True):      # the vectorised NumPy pass, and the compiled one a row (float32)
        with jit.using(compiled):
            got = activation_rows(rows, unit_axis, nonnegative)
            want = np.array([activation_vector(np, r, unit_axis, nonnegative) for r in rows])
        np.testing.assert_array_equal(got[:, 2:], want[:, 2:])        # zeros, max |x|, dead units, NaN, Inf: exact
        np.testing.assert_allclose(got[:, :2], want[:, :2], rtol=1e-5)
        if compiled and jit.available() and dtype == np.float32:       # the pass activation_vector takes: to the bit
            np.testing.assert_array_equal(got, want)
        assert got[0, 4] == 1.0 and got[1, 5] == 1


def test_squares_stats_is_square_vector_of_each_input_and_keeps_them():
    class Keep:
        array = None

        def save(self, xp, w):
            self.array = w.copy()
    rng = np.random.default_rng(0)
    tensors = [rng.standard_normal((30, 7)).astype(np.float32), np.array([np.nan, 1.0, np.inf], np.float32),
               rng.standard_normal(5), np.array([3e200, 1.0])]
    keep = Keep()
    got = SquaresStats.forward(np, *tensors, keeps=(None, keep, None, None))
    np.testing.assert_array_equal(got, np.concatenate([square_vector(np, t) for t in tensors]))
    np.testing.assert_array_equal(keep.array, tensors[1])


def test_squares_stats_memo_follows_its_inputs():
    """A node's ``FlatViews`` memo keeps the views of the arrays it was last given: values changed in place are
    read through them, and other arrays (a new plan's buffers, another dtype) are taken afresh."""
    from flowlab.ops.stats import FlatViews
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((6, 5)).astype(np.float32), rng.standard_normal(7).astype(np.float32)
    memo, keeps = FlatViews(), (None, None)

    def squares(*tensors):
        return SquaresStats.forward(np, *tensors, keeps=keeps, memo=memo)
    np.testing.assert_array_equal(squares(a, b), np.concatenate([square_vector(np, a), square_vector(np, b)]))
    a *= 3
    b[2] = np.nan
    np.testing.assert_array_equal(squares(a, b), np.concatenate([square_vector(np, a), square_vector(np, b)]))
    c = rng.standard_normal((2, 3))                        # float64: not the compiled pass's
    np.testing.assert_array_equal(squares(c, b), np.concatenate([square_vector(np, c), square_vector(np, b)]))
    d = rng.standard_normal((4, 4)).astype(np.float32)
    np.testing.assert_array_equal(squares(d, b), np.concatenate([square_vector(np, d), square_vector(np, b)]))


def test_sync_delivers_every_call_recorded_and_a_handler_error_surfaces():
    class Failing(Blocks):
        def health_block(self, block):
            super().health_block(block)
            if block.steps[-1] == 6:
                raise ValueError("block boom")

    blocks = Failing()
    job = sgd_job(blocks)

    for x, y in data(5):
        job(x, y)
    assert [b.steps.tolist() for b in blocks.blocks] == [[0]]      # the first call's, at once; the rest wait
    flow.sync_default_session()
    assert [b.steps.tolist() for b in blocks.blocks] == [[0], [1, 2, 3, 4]]
    for x, y in data(2):
        job(x, y)
    with pytest.raises(flow.errors.WatchCallbackError,
                       match=r"Failing.* \(steps 5 … 6\) raised ValueError: block boom"):
        flow.sync_default_session()


def test_a_block_makes_each_calls_report():
    reports, blocks = both_ways(dense_stack(), steps=5)
    made = [b.report(i) for b in blocks for i in range(len(b))]
    assert all(isinstance(r, HealthReport) for r in made) and blocks[-1].report(-1).step == 4
    assert [r.step for b in blocks for r in b.reports()] == [0, 1, 2, 3, 4]
    assert "HealthBlock(steps" in repr(blocks[-1])


@pytest.mark.parametrize("sparse", [True, False])
def test_embedding_rows_and_the_stale_rows_alert_in_blocks(sparse):
    """Embedding tables tracked row by row (issue 30's row statistics) in blocks: the same rows touched, fractions and
    stale rows as one report a call, and the stale_rows alert on the same calls with the same message. The job is run
    twice from the same seeds, once watched per call and once by a block handler (its watch_health takes one
    handler); the deep ids reach only rows 0 and 1, so from call 5 on every call alerts."""
    from test_health_embedding import BATCH as ROWS_A_CALL, run, wide_and_deep
    only_two = lambda step: np.array([[0, 1]] * ROWS_A_CALL, np.int32)      # noqa: E731
    reports, blocks = [], Blocks()
    run(wide_and_deep(reports, stale_steps=5, sparse=sparse), 12, deep=only_two)
    run(wide_and_deep(None, stale_steps=5, sparse=sparse, handler=blocks), 12, deep=only_two)
    blocks.flush()
    assert blocks.blocks and not blocks.one_by_one                 # the block path ran
    assert [r.step for r in reports if any(a.kind == "stale_rows" for a in r.alerts)] == list(range(5, 12))
    assert "stale_fraction" in blocks.blocks[0].statistics
    assert_same(reports, blocks.blocks)


# ------------------------------------------------------------------------------------------------ the squares op

@pytest.mark.parametrize("large", [False, True], ids=["small-gradients", "large-gradients"])
def test_weights_and_small_gradients_are_squared_by_one_op_before_the_updates(large, monkeypatch):
    """Small gradients: one SquaresStats op reads every weight and gradient, after the last gradient and before
    the first update (its weights are this call's, as the per-call reports' are); large ones: the weights' op
    after the variable reads, one op a gradient."""
    from flowlab import health
    if large:
        monkeypatch.setattr(health, "FUSED_GRADIENT_BYTES", 0)
    alone = sgd_job(Blocks())                   # the plan of the block path alone
    alone(*next(data(1)))
    lines = str(alone.compiled().plan).splitlines()
    squares = [i for i, line in enumerate(lines) if "(SquaresStats)" in line]
    singles = [i for i, line in enumerate(lines) if "(SquareStats)" in line]
    updates = [i for i, line in enumerate(lines) if "(SGDUpdate)" in line]
    gradients = [i for i, line in enumerate(lines) if "System-AutoGrad" in line and "(MatMul)" in line]
    if large:
        assert len(squares) == 1 and squares[0] < gradients[0] and len(singles) == 6     # 3 kernels, 3 biases
    else:
        assert len(squares) == 1 and not singles and gradients[-1] < squares[0] < updates[0]
        assert lines[squares[0]].count(", t") == 2 * 2 * 3      # 3 layers' kernels and biases, and their gradients
    # the numbers: every weight and gradient norm as the per-call reports have them
    blocks, reports = Blocks(), []
    job = sgd_job(blocks, reports.append)
    for x, y in data(6):
        job(x, y)
    blocks.flush()
    flow.sync_default_session()
    assert_same(reports, blocks.blocks)
