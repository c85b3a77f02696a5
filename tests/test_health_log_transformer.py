"""A transformer's health (``HealthReport.attention``, ``.residual``) written by ``SummaryWriter.add_health`` as the
``<tag>/attention`` and ``<tag>/residual`` records, read back with TensorBoard's own reader, ``read_health`` and our
tailer, the same numbers as the reports."""
import numpy as np
import pytest
from tensorboard.util import tensor_util

from flowlab.health import HealthReport
from flowlab.summary import SummaryWriter, health_log, read_health
from flowlab.summary.tailer import LogdirTailer
from test_health_log import accumulate
from test_health_transformer import watched_bert


def test_attention_and_residual_reach_the_event_file_and_read_back(tmp_path):
    with SummaryWriter(tmp_path / "run") as writer:
        reports, _ = watched_bert(3, writer=writer)
    assert reports and all(r.attention and r.residual for r in reports)
    acc = accumulate(tmp_path / "run")
    assert {"health", "health/attention", "health/residual"} <= set(acc.Tags()["tensors"])
    for tag, back in (("health/attention", health_log.attention_of), ("health/residual", health_log.residual_of)):
        meta = acc.SummaryMetadata(tag).plugin_data
        assert meta.plugin_name == "flowlab_health"
        events = acc.Tensors(tag)
        assert [e.step for e in events] == [r.step for r in reports]
        for event, report in zip(events, reports):
            record = health_log.decode(tensor_util.make_ndarray(event.tensor_proto), meta.content)
            expected = report.attention if tag.endswith("attention") else report.residual
            assert back(record) == expected           # float64 written: exactly the report's numbers
    first = health_log.decode(tensor_util.make_ndarray(acc.Tensors("health/attention")[0].tensor_proto),
                              acc.SummaryMetadata("health/attention").plugin_data.content)
    assert first.layers == tuple(f"bert-encoder-layer_{i}-attention-self/head_{h}" for i in range(2) for h in range(2))
    assert first.statistics == ("attention_entropy",)

    health = read_health(str(tmp_path))["run"]
    residual = health["health/residual"]
    assert list(residual.step) == [r.step for r in reports]
    assert residual.values[-1].statistics == health_log.RESIDUAL_STATISTICS
    assert health_log.residual_of(residual.values[-1]) == reports[-1].residual
    assert health_log.attention_of(health["health/attention"].values[-1]) == reports[-1].attention
    polled = {d.tag for d in LogdirTailer(str(tmp_path)).poll() if d.kind == "health"}
    assert polled == {"health", "health/attention", "health/residual"}


def transformer_report(step, blocks=("a",), heads=2, sums=("s",)):
    return HealthReport(step, {"dense": {"grad_norm": 1.0}}, loss=1.0,
                        attention={b: [0.5 + 0.1 * h for h in range(heads)] for b in blocks},
                        residual={s: {"stream_norm": 4.0, "growth": 1.0 + step, "branch_ratio": 0.5} for s in sums})


def test_a_plain_network_writes_no_transformer_records(tmp_path):
    with SummaryWriter(tmp_path / "run") as writer:
        writer.add_health(HealthReport(0, {"dense": {"grad_norm": 1.0}}, loss=1.0))
    assert "health/attention" not in accumulate(tmp_path / "run").Tags()["tensors"]


def test_a_report_of_other_blocks_is_refused_whole(tmp_path):
    writer = SummaryWriter(tmp_path / "run")
    writer.add_health(transformer_report(0))
    with pytest.raises(ValueError, match=r"tag 'health/attention' already holds reports of layers \['a/head_0'"):
        writer.add_health(transformer_report(1, blocks=("b",)))
    with pytest.raises(ValueError, match=r"tag 'health/residual'"):
        writer.add_health(transformer_report(1, sums=("t",)))
    writer.add_health(transformer_report(2))
    writer.close()
    acc = accumulate(tmp_path / "run")
    assert [e.step for e in acc.Tensors("health/residual")] == [0, 2]
    assert [e.step for e in acc.Tensors("health")] == [0, 2]     # nothing of a refused report was written
    # the metadata went with the first record only, and the second decodes by it
    record = health_log.decode(tensor_util.make_ndarray(acc.Tensors("health/residual")[1].tensor_proto),
                               acc.SummaryMetadata("health/residual").plugin_data.content)
    assert health_log.residual_of(record)["s"]["growth"] == 3.0
    np.testing.assert_array_equal(record.matrix, [[4.0, 3.0, 0.5]])
