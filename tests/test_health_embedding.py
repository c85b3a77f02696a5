"""``flow.watch_health`` on embedding tables updated row by row (a wide-and-deep model): each sparse table's rows
touched this step, the fraction of the table touched so far and its stale rows, against a reference worked out here
from the ids fed; the rows are tracked on calls that deliver no report too; the ``stale_rows`` alert on ids that only
ever reach a few rows (and not on a healthy table); the numbers in the health log, the ``HealthPanel`` and the
dashboard's Health tab."""
import html
import io

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.health import ROW_STATISTICS, STATISTICS
from flowlab.ops.stats import RowTouches, RowTracker, row_coverage_vector
from flowlab.summary import SummaryWriter

pytestmark = pytest.mark.numpy_backend

WIDE_ROWS, DEEP_ROWS, DIM, BATCH, FIELDS = 30, 40, 4, 4, 2


def wide_and_deep(reports, every=1, stale_steps=3, writer=None, handler=None, devices=1, sparse=True, **thresholds):
    """A train job: a wide part (``wide-weight``, one weight a feature id, gathered: a dense Adam update of a gather's
    gradient) and a deep part (``deep-embedding``, updated sparsely through ``indexed_slices_optimizer_conf`` when
    ``sparse``) under a dense layer ``mlp``, with ``watch_health``."""
    flow.clear_default_session()
    flow.config.gpu_device_num(devices)
    cfg = flow.FunctionConfig()
    if sparse:
        cfg.indexed_slices_optimizer_conf(dict(include_op_names=dict(op_name=["deep-embedding"])))

    @flow.global_function(type="train", function_config=cfg)
    def job(wide_ids: tp.Numpy.Placeholder((BATCH, FIELDS), dtype=flow.int32),
            deep_ids: tp.Numpy.Placeholder((BATCH, FIELDS), dtype=flow.int32),
            y: tp.Numpy.Placeholder((BATCH, 1))) -> tp.Numpy:
        wide = flow.get_variable("wide-weight", shape=(WIDE_ROWS, 1),
                                 initializer=flow.random_uniform_initializer(-0.1, 0.1))
        deep = flow.get_variable("deep-embedding", shape=(DEEP_ROWS, DIM),
                                 initializer=flow.random_uniform_initializer(-1, 1))
        wide_part = flow.math.reduce_sum(flow.gather(wide, wide_ids), axis=[1, 2])
        deep_part = flow.layers.dense(flow.reshape(flow.gather(deep, deep_ids), (BATCH, FIELDS * DIM)), 1,
                                      name="mlp")
        logits = flow.reshape(deep_part, (BATCH,)) + wide_part
        loss = flow.math.square(logits - flow.reshape(y, (BATCH,)))
        flow.watch_health(handler or reports.append, every=every, writer=writer, stale_steps=stale_steps,
                          **thresholds)
        flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [0.01])).minimize(loss)
        return loss
    return job


def deep_ids_at(step):
    """Known ids for the deep table: rows 0-3 early, then a few new rows now and then, an id outside the table
    (gathers zeros, updates nothing), repeats within a step."""
    schedule = {0: [[0, 1], [1, 2], [2, 0], [1, 1]], 1: [[2, 3], [3, 3], [2, 2], [3, 2]],
                2: [[4, 4], [4, 4], [4, 4], [4, 4]], 3: [[0, 0], [0, 99], [0, 0], [0, 0]]}
    if step in schedule:
        return np.array(schedule[step], np.int32)
    return np.array([[5 + step % 3, 5 + step % 3]] * BATCH, np.int32)          # rows 5, 6, 7 in turn


def wide_ids_at(step):
    """The wide table: 8 ids a step walking round its 30 rows, so every row is touched every 4 steps: never stale at
    stale_steps 3."""
    return ((np.arange(BATCH * FIELDS) + BATCH * FIELDS * step) % WIDE_ROWS).reshape(BATCH, FIELDS).astype(np.int32)


def run(job, steps, deep=deep_ids_at, wide=wide_ids_at):
    rng = np.random.default_rng(0)
    for step in range(steps):
        job(wide(step), deep(step), rng.standard_normal((BATCH, 1)).astype(np.float32))
    flow.sync_default_session()


def reference(ids_of, rows, steps, stale_steps):
    """``{step: (touched, touched_fraction, stale, stale_fraction)}`` worked out from the ids fed."""
    last, out = np.full(rows, -1), {}
    for step in range(steps):
        ids = {int(i) for i in ids_of(step).reshape(-1) if 0 <= i < rows}
        for i in ids:
            last[i] = step
        stale = int((last < step - stale_steps).sum())
        out[step] = (len(ids), (last >= 0).sum() / rows, stale, stale / rows)
    return out


def rows_of(report, layer):
    return tuple(report.table[layer][s] for s in ROW_STATISTICS)


@pytest.mark.parametrize("every, devices, sparse", [(1, 1, True), (2, 1, True), (1, 1, False), (2, 2, False),
                                                    (1, 2, True)])
def test_rows_touched_coverage_and_stale_rows_match_the_ids_fed(every, devices, sparse):
    """Exact counts for both tables, on every report, whether the deep table's update is sparse or dense; with
    ``every=2`` the calls between reports (a plan without the statistics) still mark their rows: the coverage and
    staleness at each report count them. On two devices the joined ids are tracked on the host, with the same
    numbers."""
    reports = []
    steps = 12
    run(wide_and_deep(reports, every=every, devices=devices, sparse=sparse), steps)
    assert [r.step for r in reports] == list(range(0, steps, every))
    deep = reference(deep_ids_at, DEEP_ROWS, steps, 3)
    wide = reference(wide_ids_at, WIDE_ROWS, steps, 3)
    for report in reports:
        assert rows_of(report, "deep") == pytest.approx(deep[report.step]), report.step
        assert rows_of(report, "wide") == pytest.approx(wide[report.step]), report.step
        assert not set(ROW_STATISTICS) & set(report.table["mlp"])            # a dense layer has none
    # spot checks of the reference itself: step 3 touches row 0 only (99 is outside the table); by then rows 0-4
    # were touched; at step 7 rows 0-4 were last touched at steps 0-3 (more than 3 calls before), rows 5-7 at 4-7
    # and rows 8-39 never
    assert deep[3][:2] == (1, 5 / DEEP_ROWS)
    assert deep[7][2] == 5 + 32 and deep[0][2] == 0
    assert wide[11][2] == 0 and wide[3][1] == 1.0            # the wide table is covered every 4 steps: never stale
    # the deep table's ids reach 8 of its 40 rows: it alerts where more than 90% of it is stale, the wide one never
    alerted = {(a.step, a.layer) for r in reports for a in r.alerts if a.kind == "stale_rows"}
    assert alerted == {(r.step, "deep") for r in reports if deep[r.step][3] > 0.9} and (8, "deep") in alerted


def test_two_devices_with_sparse_updates_report_what_one_device_reports():
    """The sparse update's gradient rows and ids are each device's gathered rows, one after another along axis 0:
    joined they are one device's, so on two devices every statistic of every layer (the deep table's
    ``grad_norm`` from its gradient rows, its row counts from its ids, the weights the updates made) equals one
    device's, call after call."""
    tables = {}
    for devices in (1, 2):
        reports = []
        run(wide_and_deep(reports, devices=devices), 6)
        tables[devices] = [r.table for r in reports]
    assert len(tables[2]) == len(tables[1]) == 6
    for step, (one, two) in enumerate(zip(tables[1], tables[2])):
        assert one.keys() == two.keys() and "grad_norm" in one["deep"] and "rows_touched" in one["deep"]
        for layer in one:
            assert one[layer].keys() == two[layer].keys(), (step, layer)
            for name, value in one[layer].items():
                assert two[layer][name] == pytest.approx(value, rel=1e-5, abs=1e-7, nan_ok=True), (step, layer, name)


def test_a_table_gathered_twice_on_two_devices_reports_what_one_device_reports():
    """A sparse table read by two gathers: its update's gradient rows and ids are the two gathers' concatenated, on
    each device its own, which the devices' pieces cannot make; on two devices health joins each gather's and
    concatenates them, so the row counts (against the ids fed), the gradient's norm and its histogram equal one
    device's."""
    def job_on(devices, reports):
        flow.clear_default_session()
        flow.config.gpu_device_num(devices)
        cfg = flow.FunctionConfig()
        cfg.indexed_slices_optimizer_conf(dict(include_op_names=dict(op_name=["deep-embedding"])))

        @flow.global_function(type="train", function_config=cfg)
        def job(user: tp.Numpy.Placeholder((BATCH, 1), dtype=flow.int32),
                items: tp.Numpy.Placeholder((BATCH, 3), dtype=flow.int32)) -> tp.Numpy:
            deep = flow.get_variable("deep-embedding", shape=(DEEP_ROWS, DIM),
                                     initializer=flow.random_uniform_initializer(-1, 1))
            features = flow.concat([flow.reshape(flow.gather(deep, user), (BATCH, DIM)),
                                    flow.reshape(flow.gather(deep, items), (BATCH, 3 * DIM))], axis=1)
            loss = flow.math.square(flow.reshape(flow.layers.dense(features, 1, name="mlp"), (BATCH,)))
            flow.watch_health(reports.append, stale_steps=2, histogram_every=2)
            flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [0.01])).minimize(loss)
            return loss
        return job

    rng = np.random.default_rng(3)
    feeds = [(rng.integers(0, 6, (BATCH, 1)).astype(np.int32), rng.integers(4, 12, (BATCH, 3)).astype(np.int32))
             for _ in range(5)]
    reports = {}
    for devices in (1, 2):
        reports[devices] = []
        job = job_on(devices, reports[devices])
        for user, items in feeds:
            job(user, items)
        flow.sync_default_session()
    expected = reference(lambda step: np.concatenate([f.reshape(-1) for f in feeds[step]]), DEEP_ROWS, 5, 2)
    assert [r.step for r in reports[2]] == [r.step for r in reports[1]] == list(range(5))
    for one, two in zip(reports[1], reports[2]):
        assert rows_of(two, "deep") == pytest.approx(expected[two.step]) == rows_of(one, "deep")
        for name, value in one.table["deep"].items():
            assert two.table["deep"][name] == pytest.approx(value, rel=1e-5, abs=1e-7), (two.step, name)
        assert (one.histograms is None) == (two.histograms is None) == bool(one.step % 2)
        if one.histograms:
            np.testing.assert_allclose(two.histograms["deep"]["gradient"], one.histograms["deep"]["gradient"],
                                       rtol=1e-5, atol=1e-7)


SPARSE_ROWS, SPARSE_DIM, SPARSE_BATCH = 6, 3, 4


def sparse_feeds(seed, more, high):
    """A first call whose ids repeat and reach outside the table (9), then ``more`` calls of ids below ``high``."""
    rng = np.random.default_rng(seed)
    shape = (SPARSE_BATCH, 3, SPARSE_DIM)
    feeds = [(np.array([[0, 0, 2], [0, 2, 5], [9, 0, 2], [1, 1, 1]], np.int32),
              rng.uniform(0.5, 1.5, shape).astype(np.float32))]
    return feeds + [(rng.integers(0, high, (SPARSE_BATCH, 3)).astype(np.int32),
                     rng.standard_normal(shape).astype(np.float32)) for _ in range(more)]


def train_sparse_table(feeds, devices, handler, **watch):
    """``loss = sum(gather(table, ids) * w)`` on a table updated sparsely (``indexed_slices_optimizer_conf``), watched
    by ``watch_health(handler, **watch)``, one call a feed."""
    flow.clear_default_session()
    flow.config.gpu_device_num(devices)
    cfg = flow.FunctionConfig()
    cfg.indexed_slices_optimizer_conf(dict(include_op_names=dict(op_name=["sparse-embedding"])))

    @flow.global_function(type="train", function_config=cfg)
    def job(ids: tp.Numpy.Placeholder((SPARSE_BATCH, 3), dtype=flow.int32),
            w: tp.Numpy.Placeholder((SPARSE_BATCH, 3, SPARSE_DIM))) -> tp.Numpy:
        table = flow.get_variable("sparse-embedding", shape=(SPARSE_ROWS, SPARSE_DIM),
                                  initializer=flow.random_uniform_initializer(-1, 1))
        loss = flow.math.reduce_sum(flow.gather(table, ids) * w)
        flow.watch_health(handler, **watch)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss

    for ids, w in feeds:
        job(ids, w)
    flow.sync_default_session()


def applied_gradient(ids, w):
    """The table's gradient as its sparse update applies it: the gathered rows' ``w`` summed by id (an id outside
    the table adds nothing), and the ids inside the table."""
    dense = np.zeros((SPARSE_ROWS, SPARSE_DIM))
    inside = (ids >= 0) & (ids < SPARSE_ROWS)
    np.add.at(dense, ids[inside], w[inside].astype(np.float64))
    return dense, ids[inside]


@pytest.mark.parametrize("path", ["per call", "blocks", "two devices"])
def test_a_sparse_tables_grad_norm_is_the_norm_of_the_gradient_its_update_applies(path):
    """The loss ``sum(gather(table, ids) * w)`` gives each gathered row the gradient ``w``: the table's gradient, as
    its sparse update applies it, is those rows summed by id (``np.add.at`` on a zero table; an id outside the table
    adds nothing). Ids repeat within a call, so the norm of the rows as they came (each repeat counted apart) is not
    that gradient's: ``grad_norm`` must be the summed one's, per call, in blocks and from the joined pieces of two
    devices."""
    from test_health_blocks import Blocks
    feeds = sparse_feeds(5, more=3, high=3)
    reports, blocks = [], Blocks()
    train_sparse_table(feeds, 2 if path == "two devices" else 1, blocks if path == "blocks" else reports.append)
    if path == "blocks":
        blocks.flush()
        assert blocks.blocks and not blocks.one_by_one                  # the block path ran
        reports = [r for block in blocks.blocks for r in block.reports()]
    assert [r.step for r in reports] == list(range(len(feeds)))
    for report, (ids, w) in zip(reports, feeds):
        dense, _ = applied_gradient(ids, w)
        assert report.table["sparse"]["grad_norm"] == pytest.approx(np.linalg.norm(dense), rel=1e-6), report.step
    # the first call's repeats make the rows' own norm differ from the gradient's by far more than rounding
    ids, w = feeds[0]
    assert abs(np.linalg.norm(w) - reports[0].table["sparse"]["grad_norm"]) > 0.5


@pytest.mark.parametrize("devices", [1, 2])
def test_a_sparse_tables_gradient_histogram_counts_the_rows_its_update_applies(devices):
    """The histogram of a sparsely updated table's gradient (``HealthReport.histograms[layer]["gradient"]``) is of
    the gradient its update applies, as ``grad_norm`` is: the gathered rows summed by id (``loss = sum(gather(table,
    ids) * w)``: each gathered row's gradient is ``w``), one row per distinct id inside the table, not one per
    gathered row; on one device (counted where the rows live, ``ops.stats.SlicesHistogram``) and from the joined
    pieces of two."""
    feeds = sparse_feeds(7, more=2, high=4)
    reports = []
    train_sparse_table(feeds, devices, reports.append, histogram_every=1)
    assert [r.step for r in reports] == list(range(len(feeds)))
    for report, (ids, w) in zip(reports, feeds):
        dense, inside = applied_gradient(ids, w)
        applied = dense[np.unique(inside)]                  # the rows the update changes, each once
        buckets = report.histograms["sparse"]["gradient"]
        assert buckets.shape == (30, 3) and buckets[:, 2].sum() == applied.size, report.step
        lo, hi = applied.min(), applied.max()
        assert (buckets[0, 0], buckets[-1, 1]) == pytest.approx((lo, hi), rel=1e-6), report.step
        want, _ = np.histogram(applied, bins=30, range=(lo, hi))
        np.testing.assert_array_equal(buckets[:, 2], want, err_msg=f"step {report.step}")
    # the first call's repeats and its id outside the table: 12 applied values against 36 gathered ones
    assert reports[0].histograms["sparse"]["gradient"][:, 2].sum() == 12


def test_ids_that_only_reach_a_few_rows_raise_the_stale_rows_alert_once_stale_steps_have_passed():
    """The broken case: every deep id is 0 or 1. Rows 2-39 (95% of the table) never learn; they count as stale once
    they have gone untouched for more than stale_steps (5) calls (from call 5, counting from 0), and from then on
    every report alerts, naming the layer and the numbers; the healthy wide table never alerts."""
    reports = []
    run(wide_and_deep(reports, stale_steps=5), 10, deep=lambda step: np.array([[0, 1]] * BATCH, np.int32))
    alerted = {r.step: [a for a in r.alerts if a.kind == "stale_rows"] for r in reports}
    assert [step for step, alerts in alerted.items() if alerts] == [5, 6, 7, 8, 9]
    for step in range(5, 10):
        (alert,) = alerted[step]
        assert alert.layer == "deep"
        assert "95% of the rows of layer deep's embedding table (38 of 40)" in alert.message
        assert "for more than 5 calls" in alert.message and "5.0% of them ever did, 2 this step" in alert.message
    assert rows_of(reports[-1], "deep") == (2, 2 / DEEP_ROWS, 38, 38 / DEEP_ROWS)
    # a threshold above what is stale keeps it quiet
    quiet = []
    run(wide_and_deep(quiet, stale_steps=5, stale_fraction=0.96), 10,
        deep=lambda step: np.array([[0, 1]] * BATCH, np.int32))
    assert not [a for r in quiet for a in r.alerts if a.kind == "stale_rows"]


def test_row_tracking_kernels_on_their_own():
    """``RowTouches`` counts distinct in-table ids, whatever their repeats and order, and keeps the last call per row;
    ``row_coverage_vector`` counts from that."""
    tracker = RowTracker()
    touched = RowTouches.forward(np, np.array([[3, 3, -1], [7, 10, 3]]), 10, tracker)     # -1 and 10: outside
    assert touched.tolist() == [2.0]
    touched = RowTouches.forward(np, np.array([9, 9, 9, 0]), 10, tracker)
    assert touched.tolist() == [2.0]
    last, calls, _ = tracker.arrays(np, 10)
    assert last[:10].tolist() == [1, -1, -1, 0, -1, -1, -1, 0, -1, 1] and int(calls) == 2
    # stale: untouched for more than stale_after calls; a row never touched counts as touched just before call 0
    assert row_coverage_vector(np, touched, last, calls, 10, 0).tolist() == [2.0, 4.0, 8.0]
    assert row_coverage_vector(np, touched, last, calls, 10, 1).tolist() == [2.0, 4.0, 6.0]
    assert row_coverage_vector(np, touched, last, calls, 10, 2).tolist() == [2.0, 4.0, 0.0]


@pytest.mark.parametrize("bad, message", [(0, "stale_steps must be a positive int, got 0"),
                                          (2.5, "stale_steps must be a positive int, got 2.5")])
def test_stale_steps_must_be_a_positive_int(bad, message):
    job = wide_and_deep([], stale_steps=bad)
    with pytest.raises(ValueError, match=message):
        run(job, 1)


def test_row_statistics_reach_the_log_the_panel_and_the_health_tab(tmp_path):
    """The same numbers flow where every health statistic goes: the log's health records (read back by our reader),
    a ``HealthPanel``'s grid (a statistic it can show, with its meaning) and the dashboard's Health tab."""
    from test_dashboard_health import view_of
    from flowlab.summary import health_log
    from flowlab.summary.tailer import LogdirTailer
    from flowlab.widgets import HealthPanel

    reports = []
    panel = HealthPanel(mode="terminal", file=io.StringIO(), statistic="stale_fraction")

    def both(report):
        reports.append(report)
        panel(report)
    with SummaryWriter(tmp_path / "run") as writer:
        run(wide_and_deep(reports, writer=writer, handler=both, stale_steps=5), 8,
            deep=lambda step: np.array([[0, 1]] * BATCH, np.int32))
    records = [d for d in LogdirTailer(str(tmp_path)).poll() if d.kind == "health" and d.tag == "health"]
    assert [d.step for d in records] == [r.step for r in reports] == list(range(8))
    for datum, report in zip(records, reports):
        record = health_log.decode(datum.value, datum.plugin_content)
        for statistic in ROW_STATISTICS:
            column = record.statistics.index(statistic)
            assert record.matrix[record.layers.index("deep"), column] == report.table["deep"][statistic]
            assert np.isnan(record.matrix[record.layers.index("mlp"), column])
    grid = panel.grid
    assert set(ROW_STATISTICS) <= set(grid.statistics)
    assert grid.trend_columns("deep", "stale_rows")["mean"].tolist() == [r.table["deep"]["stale_rows"] for r in reports]
    assert panel.counts["stale_rows"] == 3                      # steps 5, 6 and 7 (as in the test above)
    _, view = view_of(tmp_path)
    assert set(ROW_STATISTICS) <= set(view.statistic.options)
    view.statistic.value = "stale_fraction"
    assert html.escape(STATISTICS["stale_fraction"]) in view.meaning.text
    alerts = view.sides["A"].alert_source.data
    assert ("stale_rows", "deep") in set(zip(alerts["kind"], alerts["layer"]))
