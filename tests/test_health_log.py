"""flow.watch_health(writer=...) and SummaryWriter.add_health: reports as TensorBoard event records, read back with
TensorBoard's own reader and with ours, and refused whole when they do not fit."""
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from flowlab.health import HealthAlert, HealthReport
from flowlab.summary import SummaryWriter, health_log
from flowlab.summary.tailer import LogdirTailer
from test_health import Recorder, mlp, train


def accumulate(path):
    acc = event_accumulator.EventAccumulator(str(path), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    return acc


def test_reports_written_by_watch_health_read_back_in_tensorboard(tmp_path):
    reports, values, grads = [], Recorder(), Recorder()
    with SummaryWriter(tmp_path / "run") as writer:
        train(mlp(reports, bias=-100.0, every=2, writer=writer, histogram_every=3, scope=values, diff_scope=grads), 12)
    acc = accumulate(tmp_path / "run")
    records = acc.Tensors("health")
    assert [r.step for r in records] == [r.step for r in reports] == list(range(0, 12, 2))
    meta = acc.SummaryMetadata("health").plugin_data
    assert meta.plugin_name == "flowlab_health"
    for record, report in zip(records, reports):
        decoded = health_log.decode(tensor_util.make_ndarray(record.tensor_proto), meta.content)
        assert decoded.layers == tuple(report.table) == ("hidden_0", "output")
        for i, layer in enumerate(decoded.layers):
            for j, statistic in enumerate(decoded.statistics):
                expected = report.table[layer].get(statistic, np.nan)
                np.testing.assert_equal(decoded.matrix[i, j], expected)
    losses = {e.step: float(tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors("health/loss")}
    assert losses == pytest.approx({r.step: r.loss for r in reports}, rel=1e-6)
    # the dead layer's alert, as a table row per alert, at every step that had one
    alerted = {r.step: r.alerts for r in reports if r.alerts}
    assert alerted and {e.step for e in acc.Tensors("health/alerts")} == set(alerted)
    rows = tensor_util.make_ndarray(acc.Tensors("health/alerts")[0].tensor_proto)
    assert [row[0].decode() for row in rows] == [a.kind for a in alerted[min(alerted)]]
    assert any(row[0] == b"dead_relu" and row[1] == b"hidden_0" for row in rows)
    # histograms on every third report, of the tensors themselves (NumPy's 30 equal buckets over min..max)
    with_histograms = [r for r in reports if r.histograms]
    assert [r.step for r in with_histograms] == [0, 6]
    for tag, what, name, diff in [("health/output/activation", "activation", "output_bias_add/out_0", False),
                                  ("health/hidden_0/weight", "weight", "hidden_0-weight/out", False),
                                  ("health/hidden_0/gradient", "gradient", "hidden_0-weight/out", True)]:
        events = acc.Tensors(tag)
        assert [e.step for e in events] == [0, 6]
        for event, report in zip(events, with_histograms):
            buckets = tensor_util.make_ndarray(event.tensor_proto)
            np.testing.assert_array_equal(buckets, report.histograms[tag.split("/")[1]][what])
            tensor = (grads if diff else values).values[name][report.step]
            assert buckets[:, 2].sum() == tensor.size
            if tensor.min() == tensor.max():                      # (the dead layer's zero gradient) as TensorBoard
                assert (buckets[:, :2] == tensor.min()).all() and buckets[-1, 2] == tensor.size
                continue
            counts, edges = np.histogram(tensor, bins=30)
            np.testing.assert_allclose(buckets[:, 0], edges[:-1], rtol=1e-6, atol=1e-12)
            assert np.abs(buckets[:, 2] - counts).sum() <= 2      # a value on an edge may fall on either side


def test_our_tailer_reads_the_records(tmp_path):
    reports = []
    with SummaryWriter(tmp_path / "run") as writer:
        train(mlp(reports, every=1, writer=writer, histogram_every=0), 4)
    data = [d for d in LogdirTailer(str(tmp_path)).poll() if d.kind == "health"]
    assert [d.step for d in data] == [0, 1, 2, 3]
    record = health_log.decode(data[-1].value, data[-1].plugin_content)
    assert record.matrix[1, record.statistics.index("grad_norm")] == pytest.approx(
        reports[-1].table["output"]["grad_norm"])
    assert not [d for d in LogdirTailer(str(tmp_path)).poll() if d.kind == "histogram"]    # histogram_every=0


def test_a_writer_alone_takes_the_reports(tmp_path):
    with SummaryWriter(tmp_path / "run") as writer:
        train(mlp(None, writer=writer), 2)
    assert len(accumulate(tmp_path / "run").Tensors("health")) == 2


def report(step, layers, alerts=()):
    return HealthReport(step, {layer: {"grad_norm": 1.0 + step, "dead_fraction": 0.0} for layer in layers},
                        loss=0.5, alerts=list(alerts))


def test_add_health_refuses_what_does_not_fit_and_keeps_what_came_before(tmp_path):
    writer = SummaryWriter(tmp_path / "run")
    writer.add_health(report(0, ["a", "b"], [HealthAlert("dead_relu", "a", 0, "a <b>dead</b>")]))
    with pytest.raises(TypeError, match="add_health: report must be a flowlab.HealthReport .* got dict"):
        writer.add_health({"a": {}})
    with pytest.raises(ValueError, match=r"tag 'health' already holds reports of layers \['a', 'b'\], this report "
                                         r"has \['a'\]; write another job's reports under another tag"):
        writer.add_health(report(1, ["a"]))
    writer.add_health(report(1, ["a"]), tag="eval_health")     # another job's reports: another tag
    writer.add_health(report(2, ["a", "b"]))
    writer.close()
    acc = accumulate(tmp_path / "run")
    assert [e.step for e in acc.Tensors("health")] == [0, 2]
    assert [e.step for e in acc.Tensors("eval_health")] == [1]
    assert tensor_util.make_ndarray(acc.Tensors("health/alerts")[0].tensor_proto)[0, 2].decode() == "a <b>dead</b>"


@pytest.mark.parametrize("content, array, match", [
    (b"not json", np.zeros((1, 1)), "metadata content is not a flowlab_health layout"),
    (b'{"layers": ["a"]}', np.zeros((1, 1)), "metadata content is not a flowlab_health layout"),
    (health_log.content(["a", "b"], ["x"]), np.zeros((1, 1)), r"a matrix of shape \(1, 1\) for 2 layers and 1 "),
])
def test_damaged_records_are_refused_by_decode(content, array, match):
    with pytest.raises(ValueError, match=match):
        health_log.decode(array, content)
