"""Plot layer and live widgets, without a browser: data shaping against NumPy, WatchPanel and TrainingProgress fed
by real watches, and what the widgets actually send through a mocked comm (throttled, latest value last)."""
import io
import json
import threading
import time

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.plots import (Trend, histogram_data, histogram_figure, stats_html, stats_table, tensor_summary,
                           trend_figure)
from flowlab.watching import TensorStats
from flowlab.widgets import TrainingProgress, WatchPanel

RNG = np.random.default_rng(0)


# ------------------------------------------------------------------------------------------------- fake comm

class Sent:
    """Every comm message the widgets send (through a comm.BaseComm whose publish_msg records instead of sending)."""

    def __init__(self):
        self.messages = []
        self.lock = threading.Lock()

    def count(self):
        with self.lock:
            return len(self.messages)

    def bokeh_events(self, start=0):
        """Bokeh document events sent after message ``start``, decoded from jupyter_bokeh's PATCH-DOC contents."""
        events = []
        with self.lock:
            messages = self.messages[start:]
        for msg_type, data in messages:
            content = (data or {}).get("content", {}) if msg_type == "comm_msg" else {}
            payload = content.get("payload")
            if isinstance(payload, str) and payload.startswith('{"events"'):
                events += json.loads(payload)["events"]
        return events


@pytest.fixture
def sent(monkeypatch):
    import ipywidgets.comm
    from comm.base_comm import BaseComm
    record = Sent()

    class FakeComm(BaseComm):
        def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
            with record.lock:
                record.messages.append((msg_type, data))

    # ipywidgets 8 opens every widget's comm through ipywidgets.comm.create_comm
    monkeypatch.setattr(ipywidgets.comm, "create_comm", lambda *args, **kwargs: FakeComm(*args, **kwargs))
    return record


def entries(bokeh_map):
    """Bokeh's serialised dict ({"type": "map", "entries": [[k, v], ...]}) as a Python dict."""
    return {k: v for k, v in bokeh_map["entries"]}


# --------------------------------------------------------------------------------------------- data shaping

def test_histogram_matches_numpy_on_finite_values():
    x = RNG.normal(size=(40, 25))
    x[0, :3] = np.nan
    x[1, 0], x[2, 0] = np.inf, -np.inf
    h = histogram_data(x, bins=20)
    finite = x[np.isfinite(x)]
    counts, edges = np.histogram(finite, bins=20)
    assert h["top"].sum() == finite.size == x.size - 5
    np.testing.assert_array_equal(h["top"], counts)
    np.testing.assert_allclose(h["left"], edges[:-1])
    np.testing.assert_allclose(h["right"], edges[1:])
    assert h["left"][0] == finite.min() and h["right"][-1] == finite.max()


def test_histogram_of_constant_integer_and_nonfinite_tensors():
    h = histogram_data(np.full((3, 4), 2.5, np.float32))
    assert h["left"].tolist() == [2.0] and h["right"].tolist() == [3.0] and h["top"].tolist() == [12]
    h = histogram_data(np.array([np.nan, 7.0, np.inf]))
    assert h["top"].tolist() == [1]
    for empty in (np.full(5, np.nan), np.array([np.inf, -np.inf]), np.zeros((0, 3))):
        h = histogram_data(empty)
        assert all(len(v) == 0 for v in h.values())
    h = histogram_data(np.arange(10, dtype=np.int32), bins=5)
    assert h["top"].tolist() == [2, 2, 2, 2, 2]
    with pytest.raises(TypeError, match="real-valued"):
        histogram_data(np.array(["a"]))


def test_tensor_summary_matches_numpy_and_passes_tensor_stats_through():
    x = RNG.normal(size=(8, 6)).astype(np.float32)
    x[0, 0], x[1, 1], x[2, 2] = np.nan, np.inf, np.nan
    s = tensor_summary(x)
    finite = x[np.isfinite(x)].astype(np.float64)
    assert s["shape"] == (8, 6) and s["nan"] == 2 and s["inf"] == 1
    assert s["min"] == finite.min() and s["max"] == finite.max()
    assert s["mean"] == pytest.approx(finite.mean()) and s["std"] == pytest.approx(finite.std())
    s = tensor_summary(np.full(4, np.nan))
    assert np.isnan(s["mean"]) and s["nan"] == 4
    stats = TensorStats((2, 3), -1.0, 2.0, 0.5, 0.25, 1, 0)
    assert tensor_summary(stats) == {"shape": (2, 3), "min": -1.0, "max": 2.0, "mean": 0.5, "std": 0.25,
                                     "nan": 1, "inf": 0}


def test_trend_keeps_at_most_max_points_and_reports_changes():
    t = Trend(max_points=8)
    assert t.take() is None
    t.append(0, 1.0, 0.5)
    t.append(1, 2.0, 0.5)
    assert t.take() == ("stream", {"step": [0, 1], "mean": [1.0, 2.0], "std": [0.5, 0.5], "lower": [0.5, 1.5],
                                   "upper": [1.5, 2.5]})
    for step in range(2, 100):
        t.append(step, float(step), 0.0)
        assert len(t) < 8
    change, columns = t.take()
    assert change == "replace" and columns["step"][0] == 0 and columns["step"][-1] > 80
    assert columns["step"] == sorted(columns["step"])
    with pytest.raises(ValueError):
        Trend(max_points=1)


def test_stats_html_escapes_and_highlights_nonfinite_counts():
    text = stats_html(np.array([1.0, np.nan, np.inf]), title="<script>x</script>")
    assert "<script>" not in text and "&lt;script&gt;" in text
    assert text.count("color:#c00") == 2          # NaN and Inf both non-zero
    assert "color:#c00" not in stats_html(np.ones(3))
    assert stats_table(np.ones(3)).text == stats_html(np.ones(3))


def test_figures_are_small_canvas_plots_without_toolbar():
    for fig in (histogram_figure(title="h"), trend_figure(title="t")):
        assert fig.output_backend == "canvas" and fig.toolbar_location is None
        assert (fig.width, fig.height) == (320, 200)
    assert trend_figure().xaxis[0].axis_label == "step"


# -------------------------------------------------------------------------------------------- the watch panel

def train_job_watched_by(panel, delivered, stats_panel=None):
    @flow.global_function(type="train")
    def train_job(x: tp.Numpy.Placeholder((16, 8)), y: tp.Numpy.Placeholder((16,), dtype=flow.int32)) -> tp.Numpy:
        h = flow.layers.dense(x, 32, activation=flow.nn.relu, name="h")
        logits = flow.layers.dense(h, 4, name="out")
        flow.watch(logits, panel)
        flow.watch_diff(logits, panel)
        flow.watch(h, stats_panel or panel, stats=True)

        def keep_value(v: tp.Numpy):
            delivered["value"].append(v)

        def keep_grad(v: tp.Numpy):
            delivered["gradient"].append(v)

        flow.watch(logits, keep_value)
        flow.watch_diff(logits, keep_grad)
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss
    return train_job


def batch():
    return RNG.normal(size=(16, 8)).astype(np.float32), RNG.integers(0, 4, 16).astype(np.int32)


def test_panel_rows_show_latest_histogram_stats_and_full_trend(sent):
    panel = WatchPanel(mode="notebook", refresh_hz=20, bins=10)
    delivered = {"value": [], "gradient": []}
    job = train_job_watched_by(panel, delivered)
    for _ in range(3):
        job(*batch())
    flow.sync_default_session()
    panel.refresh()

    rows = {(r.lbn, r.kind, r.stats_only): r for r in panel._rows.values()}
    assert set(rows) == {("out_bias_add/out_0", "value", False), ("out_bias_add/out_0", "gradient", False),
                         ("h_activation/out_0", "value", True)}
    assert len(panel.box.children) == 3                   # one row widget each, in order of first report
    titles = [row.children[0].value for row in panel.box.children]
    assert "out_bias_add/out_0" in titles[0] and "value" in titles[0] and "gradient" in titles[1]
    assert "(stats)" in titles[2]
    for kind in ("value", "gradient"):
        row, last = rows[("out_bias_add/out_0", kind, False)], delivered[kind][-1]
        hist = row.hist_source.data
        assert sum(hist["top"]) == last.size == 64
        np.testing.assert_array_equal(hist["top"], histogram_data(last, 10)["top"])
        trend = row.trend_source.data
        assert trend["step"] == [0, 1, 2]
        np.testing.assert_allclose(trend["mean"], [np.mean(v, dtype=np.float64) for v in delivered[kind]])
        np.testing.assert_allclose(trend["std"], [np.std(v, dtype=np.float64) for v in delivered[kind]])
        assert "step 2" in row.table.text
    stats_row = rows[("h_activation/out_0", "value", True)]
    assert stats_row.hist_source is None and len(stats_row.trend_source.data["step"]) == 3
    assert "(16, 32)" in stats_row.table.text
    assert "application/vnd.jupyter.widget-view+json" in panel._repr_mimebundle_()
    panel.close()


def test_panel_table_counts_nan_and_inf():
    panel = WatchPanel(mode="notebook")

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        panel.watch(x)
        return x * 2.0

    job(np.array([[1, np.nan, 2], [np.nan, np.inf, 3]], np.float32))
    flow.sync_default_session()
    panel.refresh()
    (row,) = panel._rows.values()
    text = row.table.text
    assert ">NaN</th><td style=\"color:#c00;font-weight:bold\">2<" in text
    assert ">Inf</th><td style=\"color:#c00;font-weight:bold\">1<" in text
    assert sum(row.hist_source.data["top"]) == 3
    panel.close()


def test_panel_watch_helpers_attach_values_and_gradients():
    panel = WatchPanel(mode="notebook")

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        a = flow.layers.dense(x, 5, name="a")
        b = flow.layers.dense(a, 2, name="b")
        panel.watch_all([a, b], gradients=True)
        panel.watch(b, values=False, gradients=True, stats=True, every=2)
        loss = flow.math.reduce_mean(flow.math.square(b), axis=[1])
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss

    for _ in range(4):
        job(np.ones((4, 3), np.float32))
    flow.sync_default_session()
    panel.refresh()
    counts = {(r.lbn, r.kind, r.stats_only): len(r.trend.columns["step"]) for r in panel._rows.values()}
    assert counts == {("a_bias_add/out_0", "value", False): 4, ("a_bias_add/out_0", "gradient", False): 4,
                      ("b_bias_add/out_0", "value", False): 4, ("b_bias_add/out_0", "gradient", False): 4,
                      ("b_bias_add/out_0", "gradient", True): 2}
    assert len(panel.box.children) == 5
    with pytest.raises(ValueError, match="nothing to watch"):
        panel.watch(None, values=False)
    panel.close()


def test_flood_of_watch_events_is_throttled_and_ends_with_the_latest_values(sent):
    hz = 10
    panel = WatchPanel(mode="notebook", refresh_hz=hz, max_points=2000)
    delivered = {"value": [], "gradient": []}
    job = train_job_watched_by(panel, delivered, stats_panel=lambda s: None)
    job(*batch())                             # compile and show the rows first
    flow.sync_default_session()
    panel.refresh()
    start = sent.count()
    panel.refresh()
    assert sent.count() == start              # nothing pending: nothing sent

    t0 = time.monotonic()
    for _ in range(500):                      # 1000 watch events
        job(*batch())
    flow.sync_default_session()
    elapsed = time.monotonic() - t0
    during = sent.count() - start
    panel.refresh()                            # what the refresh thread had not sent yet
    # a flush of the two rows is 2 x 3 Bokeh events, each a 3-message PATCH-DOC through jupyter_bokeh
    per_flush = 2 * 3 * 3
    assert during <= (hz * elapsed + 2) * per_flush, (during, elapsed)
    assert during < 1000                       # unthrottled, the flood would have sent 9000 messages

    events = sent.bokeh_events(start)
    for kind, row in (("value", panel._rows[("out_bias_add/out_0", "value", False)]),
                      ("gradient", panel._rows[("out_bias_add/out_0", "gradient", False)])):
        last = delivered[kind][-1]
        hists = [e for e in events if e["kind"] == "ColumnDataChanged" and e["model"]["id"] == row.hist_source.id]
        data = entries(hists[-1]["data"])
        expected = histogram_data(last)
        assert data["top"] == expected["top"].tolist() and data["left"] == expected["left"].tolist()
        texts = [e for e in events if e["kind"] == "ModelChanged" and e["model"]["id"] == row.table.id]
        assert "step 500" in texts[-1]["new"]
        streamed = [entries(e["data"]) for e in events
                    if e["kind"] == "ColumnsStreamed" and e["model"]["id"] == row.trend_source.id]
        steps = [s for d in streamed for s in d["step"]]
        assert steps == list(range(1, 501))    # throttling drops intermediate pictures, never trend points
        means = [m for d in streamed for m in d["mean"]]
        np.testing.assert_allclose(means, [np.mean(v, dtype=np.float64) for v in delivered[kind][1:]])
    panel.close()


def test_refresh_thread_flushes_at_most_refresh_hz_times_a_second(sent):
    hz = 5
    panel = WatchPanel(mode="notebook", refresh_hz=hz)

    class Def:
        logical_blob_name, shape, dtype, op_name = "x/out", (100,), np.float32, "x"

    panel.watch_event(np.zeros(100), Def, "value", 0)
    panel.refresh()
    start = sent.count()
    t0 = time.monotonic()
    step = 0
    while time.monotonic() - t0 < 1.0:        # about a second of events, as fast as they come
        step += 1
        panel.watch_event(RNG.normal(size=100), Def, "value", step)
    elapsed = time.monotonic() - t0
    time.sleep(1.5 / hz)                       # let the refresh thread send the last value by itself
    flushes = (sent.count() - start) / 9       # one row: 3 Bokeh events of 3 messages
    assert step > 100
    assert 2 <= flushes <= hz * (elapsed + 1.5 / hz) + 1, (flushes, elapsed)
    row = panel._rows[("x/out", "value", False)]
    assert f"step {step}<" in row.table.text   # the table shows the very latest value
    trend = row.trend_source.data["step"]     # the trend, thinned to max_points, ends within one stride of it
    assert len(trend) < 1000 and step - row.trend.stride < trend[-1] <= step
    panel.close()


def test_watch_event_from_a_thread_while_refresh_runs():
    panel = WatchPanel(mode="notebook", refresh_hz=20, max_points=64)
    errors = []

    class Def:
        logical_blob_name, shape, dtype, op_name = "t/out", (50,), np.float32, "t"

    def feed():
        try:
            for step in range(2000):
                value = RNG.normal(size=50)
                if step % 7 == 0:
                    value[0] = np.nan
                panel.watch_event(value, Def, "value" if step % 2 else "gradient", step)
                panel.watch_event(TensorStats((50,), 0.0, 1.0, 0.5, 0.1, 0, 0), Def, "value", step)
        except Exception as e:       # pragma: no cover - reported below
            errors.append(e)

    thread = threading.Thread(target=feed)
    thread.start()
    while thread.is_alive():
        panel.refresh()
    thread.join()
    panel.close()
    assert not errors
    assert len(panel.box.children) == 3
    for row in panel._rows.values():
        assert 0 < len(row.trend_source.data["step"]) < 64
        assert row.trend_source.data["step"] == row.trend.columns["step"]


def test_panel_in_terminal_mode_prints_a_stats_line_per_row():
    out = io.StringIO()
    panel = WatchPanel(mode="terminal", file=out)
    assert panel.box is None

    class Def:
        logical_blob_name, shape, dtype, op_name = "w/out", (3,), np.float32, "w"

    for step in range(50):
        panel.watch_event(np.array([step, 1.0, np.nan]), Def, "gradient", step)
    panel.close()
    lines = out.getvalue().splitlines()
    assert 1 <= len(lines) <= 3                # the first at once, then at most once a second
    assert lines[-1].startswith("[step 49] w/out gradient:") and "max=49" in lines[-1] and "nan=1" in lines[-1]


def test_bad_arguments():
    with pytest.raises(ValueError, match="refresh_hz"):
        WatchPanel(refresh_hz=50)
    with pytest.raises(ValueError, match="mode"):
        WatchPanel(mode="browser")
    with pytest.raises(ValueError, match="total_steps"):
        TrainingProgress(total_steps=0)
    assert WatchPanel().mode == "terminal"     # no Jupyter kernel under pytest


# ---------------------------------------------------------------------------------------- training progress

def test_progress_in_terminal_rewrites_one_line_at_most_four_times_a_second():
    out = io.StringIO()
    progress = TrainingProgress(total_steps=400, mode="terminal", file=out)
    t0 = time.monotonic()
    for i in range(400):
        progress.update(i + 1, loss=1.0 / (i + 1), acc=0.5)
        time.sleep(0.002)
    elapsed = time.monotonic() - t0
    progress.close()
    text = out.getvalue()
    assert text.endswith("\n") and text.count("\n") == 1
    updates = text.count("\r")
    assert 2 <= updates <= 4 * elapsed + 2, (updates, elapsed)
    final = text.rstrip("\n").split("\r")[-1]
    assert final.startswith("step 400/400 (100%) | loss 0.0025 |") and "steps/s" in final and "acc 0.5" in final


def test_progress_in_notebook_shows_bar_label_and_loss_curve(sent):
    progress = TrainingProgress(total_steps=50, mode="notebook", refresh_hz=20)
    for i in range(50):
        progress.update(i + 1, loss=float(50 - i), lr="<0.1>")
    progress.close()
    bar, label = progress.box.children[0].children
    assert bar.value == 50 and bar.max == 50
    assert "step 50/50" in label.value and "loss 1 " in label.value and "&lt;0.1&gt;" in label.value
    assert progress._loss_source.data["mean"] == [float(50 - i) for i in range(50)]
    sent_values = [data["state"]["value"] for kind, data in sent.messages
                   if kind == "comm_msg" and data.get("method") == "update" and "value" in data.get("state", {})
                   and isinstance(data["state"]["value"], int)]
    assert sent_values[-1] == 50             # the bar's last synced state is the latest step


def test_progress_as_a_watch_handler_reads_the_mean_loss():
    out = io.StringIO()
    progress = TrainingProgress(mode="terminal", file=out)
    losses = []

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((16, 8)), y: tp.Numpy.Placeholder((16,), dtype=flow.int32)) -> tp.Numpy:
        logits = flow.layers.dense(x, 4, name="out")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.watch(loss, progress)
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss

    for _ in range(3):
        losses.append(job(*batch()))
    flow.sync_default_session()
    progress.close()
    final = out.getvalue().rstrip("\n").split("\r")[-1]
    assert final.startswith(f"step 3 | loss {np.mean(losses[-1], dtype=np.float64):.4g}")
