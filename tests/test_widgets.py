"""Plot layer and live widgets without a browser: statistics and trends against NumPy, the watch-summary protocol
through real jobs, and what the widgets send through a recording comm, applied by a reference page that follows
live.js's rules (snapshot, then numbered updates; a gap waits for a keyframe). tests/test_widgets_browser.py draws the
same widgets in real JupyterLab and Notebook 7 pages."""
import gzip
import io
import json
import math
import pathlib
import re
import sys
import threading
import time
import warnings

import numpy as np
import pytest
from bokeh.document import Document

import flowlab as flow
import flowlab.typing as tp
from flowlab.ops.stats import histogram_vector, stats_rows, stats_vector
from flowlab.plots import (STATS_ROWS, Trend, heading, histogram_columns, histogram_data, histogram_source,
                           histogram_view, is_spiky, stats_columns, stats_view, tensor_summary, trend_columns,
                           trend_figure, trend_source)
from flowlab.plots.figures import ALARM
from flowlab.runtime import backend, jit
from flowlab.watching import StatsFeed, TensorHistogram, TensorStats
from flowlab.widgets import LiveDocument, TrainingProgress, WatchPanel
from flowlab.widgets import live as live_module

RNG = np.random.default_rng(0)


# -------------------------------------------------------------------------------------- recording comm, page

class Sent:
    """Every comm message the widgets send (a comm.BaseComm whose publish_msg records instead of sending)."""

    def __init__(self):
        self.messages = []
        self.lock = threading.Lock()

    def of(self, widget, start=0):
        """``[(method, content, buffers)]`` sent by one widget's comm."""
        with self.lock:
            messages = self.messages[start:]
        return [(data.get("method"), data, buffers) for comm_id, msg_type, data, buffers in messages
                if comm_id == widget.comm.comm_id and msg_type == "comm_msg"]

    def count(self, widget):
        return len(self.of(widget))


@pytest.fixture
def sent(monkeypatch):
    import ipywidgets.comm
    from comm.base_comm import BaseComm
    record = Sent()

    class RecordingComm(BaseComm):
        def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
            with record.lock:
                record.messages.append((self.comm_id, msg_type, data or {}, list(buffers or [])))

    # ipywidgets 8 opens every widget's comm through ipywidgets.comm.create_comm
    monkeypatch.setattr(ipywidgets.comm, "create_comm", lambda *args, **kwargs: RecordingComm(*args, **kwargs))
    # No keyframe unless a test asks for one: a push more than KEYFRAME_EARLY (0.5 s) after a snapshot sends every
    # touched column whole, and a test asserting a delta failed on a loaded machine where its steps took that long
    # (test_live_document_sends_numbered_deltas_and_keyframes sets them itself).
    monkeypatch.setattr(live_module, "KEYFRAME_EARLY", float("inf"))
    monkeypatch.setattr(live_module, "KEYFRAME_PERIOD", float("inf"))
    return record


class Page:
    """What a browser shows of one LiveDocument, following live.js: the snapshot (``_snapshot`` state, as sent on
    comm open and on updates), then custom messages in sequence; a message after a gap is ignored unless it is a
    keyframe. ``drop`` names message numbers to lose (a page still loading its module)."""

    def __init__(self, widget, sent, drop=()):
        self.widget, self.sent, self.drop = widget, sent, set(drop)
        self.doc, self.seq, self.applied = None, -1, []
        self._build(json.loads(widget._snapshot))
        self._seen = 0

    def _build(self, snapshot):
        self.doc = Document.from_json(snapshot["doc"])
        self.seq = snapshot["seq"]

    def update(self):
        messages = self.sent.of(self.widget)
        for method, data, buffers in messages[self._seen:]:
            if method == "update" and "_snapshot" in data.get("state", {}):
                snapshot = json.loads(data["state"]["_snapshot"])
                if snapshot["seq"] > self.seq:
                    self._build(snapshot)
            elif method == "custom":
                self._apply(data["content"], buffers)
        self._seen = len(messages)
        return self

    def _apply(self, msg, buffers):
        if msg["seq"] in self.drop or msg["seq"] <= self.seq:
            return
        if not msg["key"] and msg["seq"] != self.seq + 1:
            return
        for model_id, props in msg["props"]:
            model = self.doc.get_model_by_id(model_id)
            for attr, value in props.items():
                setattr(model, attr, value)
        for model_id, at, columns in msg["data"]:
            source = self.doc.get_model_by_id(model_id)
            if source is None:                      # not in the document (live.js skips it too)
                continue
            data = {}
            for name, spec in columns.items():
                if isinstance(spec, dict):          # numbers: a float64 buffer
                    added = np.frombuffer(buffers[spec["buffer"]], np.float64)
                    data[name] = np.concatenate([np.asarray(source.data[name], np.float64)[:at], added])
                else:                               # text: a JSON list
                    data[name] = list(source.data[name])[:at] + spec
            source.data = data
        self.seq = msg["seq"]
        self.applied.append(msg["seq"])

    def model(self, python_model):
        """This page's copy of a model of the widget's document."""
        return self.doc.get_model_by_id(python_model.id)


class Def:
    """A BlobDef stand-in for calling watch_event directly."""

    def __init__(self, lbn, shape=(100,)):
        self.logical_blob_name, self.shape, self.dtype, self.op_name = lbn, shape, np.float32, lbn.split("/")[0]


def stats_of(array):
    return TensorStats.from_vector(np.shape(array), stats_vector(np, np.asarray(array)))


# ------------------------------------------------------------------------------------------ statistics, trend

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.uint8, np.bool_])
def test_stats_vector_matches_numpy_on_finite_elements(dtype):
    x = (RNG.normal(size=(37, 11)) * 30).astype(dtype)
    if np.dtype(dtype).kind == "f":
        x.flat[[3, 50, 99]] = [np.nan, np.inf, -np.inf]
    finite = x[np.isfinite(x)].astype(np.float64)
    v = stats_vector(np, x)
    np.testing.assert_allclose(v[:4], [finite.min(), finite.max(), finite.mean(), finite.std()], rtol=2e-6)
    expected_bad = [1, 2] if np.dtype(dtype).kind == "f" else [0, 0]
    assert v.dtype == np.float64 and v[4:].tolist() == expected_bad


def test_stats_vector_edge_cases():
    assert np.isnan(stats_vector(np, np.zeros(0))[:4]).all()
    nothing = stats_vector(np, np.array([np.nan, np.inf, np.nan]))
    assert np.isnan(nothing[:4]).all() and nothing[4:].tolist() == [2, 1]
    huge = np.full(1000, 3e38, np.float32)          # a float32 sum overflows: the exact path still gets it right
    np.testing.assert_allclose(stats_vector(np, huge), [3e38, 3e38, 3e38, 0, 0, 0], rtol=1e-6)
    spike = np.zeros(100)
    spike[0] = 1e307                                  # float64 squares overflow: the spread is still right
    np.testing.assert_allclose(stats_vector(np, spike)[2:4], [1e305, 1e307 * np.sqrt(99) / 100], rtol=1e-9)
    spike[1] = np.nan                                 # ...and with a NaN beside it (the masked path), no overflow
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = stats_vector(np, spike)
    finite = np.delete(spike, 1) / 1e307
    np.testing.assert_allclose(got[2:], [finite.mean() * 1e307, finite.std() * 1e307, 1, 0], rtol=1e-9)
    offset = np.float32(1e4) + RNG.normal(size=4096).astype(np.float32) * 1e-2   # std small next to the mean
    np.testing.assert_allclose(stats_vector(np, offset)[3], offset.astype(np.float64).std(), rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stats_rows_is_stats_vector_of_each_row(dtype):
    rows = (RNG.normal(size=(9, 700)) * 3 + 1).astype(dtype)
    rows[1, 5] = np.nan                                   # non-finite rows, a constant, an overflow risk and a
    rows[2, :3] = [np.inf, -np.inf, np.nan]               # spread tiny next to the mean: each its own rule
    rows[3] = np.nan
    rows[4] = 2.5
    rows[5, 7] = 3e38 if dtype == np.float32 else 1e307
    rows[6] = dtype(1e4) + RNG.normal(size=700).astype(dtype) * dtype(1e-2)
    got = stats_rows(rows)
    assert got.shape == (9, 6) and got.dtype == np.float64
    for row, vector in zip(rows, got):
        finite = row[np.isfinite(row)].astype(np.float64)
        scale = np.abs(finite).max() if finite.size else 1.0     # NumPy's own std overflows at 1e307
        expected = [finite.min(), finite.max(), finite.mean(), (finite / scale).std() * scale] if finite.size \
            else [np.nan] * 4
        np.testing.assert_allclose(vector[:4], expected, rtol=1e-5)
        assert vector[4:].tolist() == [np.isnan(row).sum(), np.isinf(row).sum()]


def test_histogram_vector_matches_numpy_histogram():
    x = RNG.normal(size=5000).astype(np.float32)
    x[:7] = [np.nan, np.inf, -np.inf, np.nan, 1.0, 2.0, 3.0]
    finite = x[np.isfinite(x)]
    v = histogram_vector(np, x, 25)
    counts, edges = np.histogram(finite, bins=25)
    assert v[0] == finite.min() and v[1] == finite.max()
    np.testing.assert_array_equal(v[2:], counts)      # the maximum falls in the last, closed bin
    assert histogram_vector(np, np.full(4, 2.5), 3).tolist() == [2.5, 2.5, 4, 0, 0]
    empty = histogram_vector(np, np.array([np.nan]), 3)
    assert np.isnan(empty[:2]).all() and empty[2:].tolist() == [0, 0, 0]


def test_histogram_data_from_an_array_or_a_device_histogram_is_the_same():
    x = RNG.normal(size=(20, 30)).astype(np.float32)
    from_array = histogram_data(x, 12)
    from_device = histogram_data(TensorHistogram.from_vector(x.shape, histogram_vector(np, x, 12)))
    for key in ("left", "right", "top"):
        np.testing.assert_allclose(from_array[key], from_device[key])
    assert from_array["top"].sum() == x.size
    assert histogram_data(np.full(5, 7.0))["left"].tolist() == [6.5]       # a constant: one bar around it
    assert histogram_data(np.array([np.nan]))["top"].size == 0
    with pytest.raises(TypeError, match="real-valued"):
        histogram_data(np.array(["a"]))


def test_trend_buckets_pool_steps_and_keep_extremes_and_nans():
    steps = [RNG.normal(loc=i / 10, scale=1 + i / 50, size=64) for i in range(50)]
    steps[17] = steps[17].copy()
    steps[17][5] = 1e6                                  # a spike in one element of one step
    steps[33] = np.full(64, np.nan)                      # a step with no finite value
    trend = Trend(max_points=8)
    for i, values in enumerate(steps):
        trend.add(i, stats_of(values))
    assert len(trend) <= 8 and trend.stride == 8
    cols = trend.columns()
    assert cols["step"][0] == 0 and cols["end"][-1] == 50
    for b, (first, end) in enumerate(zip(cols["step"].astype(int), cols["end"].astype(int))):
        values = np.concatenate(steps[first:end])
        finite = values[np.isfinite(values)]
        np.testing.assert_allclose([cols["mean"][b], cols["min"][b], cols["max"][b]],
                                   [finite.mean(), finite.min(), finite.max()], rtol=1e-6)
        np.testing.assert_allclose(cols["upper"][b] - cols["mean"][b], finite.std(), rtol=1e-5)
        assert cols["nonfinite"][b] == np.sum(~np.isfinite(values))
    assert cols["max"].max() == 1e6                      # the spike survived two rounds of merging
    assert cols["nonfinite"].sum() == 64


def test_trend_extend_from_stats_vectors_is_add_step_by_step():
    steps = [RNG.normal(loc=i / 10, size=40) for i in range(30)]
    steps[11] = np.full(40, np.inf)
    one_by_one, in_bulk = Trend(max_points=6), Trend(max_points=6)
    for i, values in enumerate(steps):
        one_by_one.add(i, stats_of(values))
    in_bulk.extend(range(0, 17), np.array([stats_vector(np, v) for v in steps[:17]]))
    in_bulk.extend(range(17, 30), np.array([stats_vector(np, v) for v in steps[17:]]))
    for name, column in one_by_one.columns().items():
        np.testing.assert_allclose(in_bulk.columns()[name], column, rtol=1e-12, err_msg=name)
    assert in_bulk.columns()["nonfinite"].sum() == 40


@pytest.mark.skipif(not jit.available(), reason="needs numba (the compiled fold)")
def test_trend_compiled_fold_is_the_numpy_fold():
    """``Trend.extend``'s compiled pass against its NumPy twin: chunks of every size (a whole bucket, none, more than
    all the buckets hold), steps with gaps, rows with no finite element or with Inf counted, takes between them."""
    rng = np.random.default_rng(11)
    for trial in range(200):
        max_points = int(rng.integers(2, 30))
        compiled, numpy = Trend(max_points), Trend(max_points)
        step = 0
        for _ in range(int(rng.integers(1, 10))):
            rows = int(rng.integers(0, 150))
            v = rng.normal(size=(rows, 6))
            v[:, 1] = v[:, 0] + rng.random(rows)
            v[:, 3], v[:, 4:] = np.abs(v[:, 3]), 0.0
            empty, inf = rng.random(rows) < 0.1, rng.random(rows) < 0.05
            v[empty, :4], v[empty, 4] = np.nan, 7.0
            v[inf, 5] = 2.0
            steps = step + np.cumsum(rng.integers(1, 3, rows))
            step = int(steps[-1]) if rows else step
            with jit.using(True):
                compiled.extend(steps, v)
            with jit.using(False):
                numpy.extend(steps, v)
            if rng.random() < 0.5:
                got, want = compiled.take(), numpy.take()
                assert (got is None) == (want is None) and (got is None or got[0] == want[0]), trial
                for name in (want[1] if want else ()):
                    np.testing.assert_allclose(got[1][name], want[1][name], rtol=1e-12, err_msg=name)
        a, b = compiled.buckets, numpy.buckets
        assert (a.count, a.stride, a._changed) == (b.count, b.stride, b._changed), trial
        for name in ("first", "last", "n"):
            np.testing.assert_array_equal(getattr(a, name)[:a.count], getattr(b, name)[:b.count], err_msg=name)
        for name, values in b.fields.items():          # the empty slots too: a later fold starts from them
            np.testing.assert_allclose(a.fields[name], values, rtol=1e-12, err_msg=name)


def test_stats_feed_gives_what_was_put_in_order_and_calls_on_full_at_its_limit():
    woken, full = [], []
    feed = StatsFeed(lambda: woken.append(1), lambda: full.append(feed.take()), limit=3)
    assert feed.take() == ([], None)
    feed.put(4, np.arange(6.0))
    feed.put(5, lambda: np.arange(6.0) + 1)              # a CuPy copy still under way: taken by waiting for it
    steps, vectors = feed.take()
    assert steps == [4, 5] and vectors.dtype == np.float64
    np.testing.assert_array_equal(vectors, [np.arange(6.0), np.arange(6.0) + 1])
    for step in range(6, 9):
        feed.put(step, np.full(6, float(step)))
    assert len(woken) == 2 and [s for s, _ in full] == [[6, 7, 8]] and len(feed) == 0   # woken once a take
    feed.limit = 100
    for step, value in ((8, 0.0), (9, 1.0), (9, 2.0), (10, 3.0)):     # 8 was given by the last take
        feed.put(step, np.full(6, value))
    steps, vectors = feed.take()
    assert steps == [9, 10] and vectors[:, 0].tolist() == [2.0, 3.0]        # one row a step: its last put


def test_stats_feed_counts_the_rows_of_its_blocks_and_gives_them_in_order_one_a_step():
    with jit.using(False):     # blocks of copies (compiled kernels summarise each tensor at once: test_stats_jit)
        _count_rows_of_blocks()


def _count_rows_of_blocks():
    full = []
    feed = StatsFeed(lambda: None, lambda: full.append(feed.take()), limit=40)
    rng = np.random.default_rng(3)
    size = StatsFeed.BLOCK_BYTES // (4 * StatsFeed.MIN_ROWS)      # blocks of the fewest rows: several fill up
    tensors = rng.standard_normal((70, size)).astype(np.float32)
    tensors[33, 7] = np.nan                              # a NaN inside a block: its row still counts it
    for step in range(30):
        feed.put_tensor(step, tensors[step])
    assert len(feed) == 30                               # every row, whether summarised into a block or not
    for step in range(30, 70):
        feed.put_tensor(step, tensors[step])
    assert full, "the limit counts a block's rows, not its entries"
    assert len(feed) < 40 + len(feed._block)
    feed.put(69, np.full(6, -1.0))                       # a step repeated by a single put: the last put counts
    feed.put(70, np.full(6, 70.0))
    steps, vectors = feed.take()
    assert len(feed) == 0 and feed._chunk_rows == 0
    got_steps = [s for taken, _ in full for s in taken] + steps
    got = np.concatenate([v for _, v in full] + [vectors])
    assert got_steps == list(range(71))
    want = np.array([stats_vector(np, t) for t in tensors[:69]] + [np.full(6, -1.0), np.full(6, 70.0)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert got[33, 4] == 1                               # the NaN counted
    feed.put(70, np.zeros(6))                            # the step the last take gave: not given again
    assert feed.take() == ([], None)


def test_stats_feed_put_value_gives_a_number_a_step_as_a_stats_vector_in_order_with_other_puts():
    woken, full = [], []
    feed = StatsFeed(lambda: woken.append(1), lambda: full.append(feed.take()), limit=1000)
    with jit.using(False):                               # put_tensor keeps a block of copies open between puts
        feed.put_value(0, 1.5)
        feed.put_value(1, math.nan)
        feed.put_value(2, -math.inf)
        feed.put(3, np.full(6, 3.0))                     # a single put after the pairs: they go first
        feed.put_value(4, 4.0)
        feed.put_tensor(5, np.array([1.0, 2.0, np.nan], np.float32))     # a block after the pairs
        feed.put_value(6, 6.0)                           # pairs after the block: the block goes first
        feed.put_value(6, 7.0)                           # the same step again: its last value counts
        assert len(feed) == 8 and len(woken) == 1
        steps, vectors = feed.take()
    assert steps == [0, 1, 2, 3, 4, 5, 6] and vectors.dtype == np.float64
    nan = math.nan
    want = [[1.5, 1.5, 1.5, 0, 0, 0], [nan, nan, nan, nan, 1, 0], [nan, nan, nan, nan, 0, 1], np.full(6, 3.0),
            [4.0, 4.0, 4.0, 0, 0, 0], stats_vector(np, np.array([1.0, 2.0, np.nan])), [7.0, 7.0, 7.0, 0, 0, 0]]
    np.testing.assert_array_equal(vectors, want)
    assert len(feed) == 0 and feed._chunk_rows == 0 and not full
    feed.limit = 5
    for step in range(7, 17):                            # full at 5 waiting: on_full takes them
        feed.put_value(step, float(step))
    assert [s for s, _ in full] == [[7, 8, 9, 10, 11], [12, 13, 14, 15, 16]]
    assert np.concatenate([v for _, v in full])[:, 2].tolist() == list(map(float, range(7, 17)))
    feed.put_value(16, 0.0)                              # the step the last take gave: not given again
    assert feed.take() == ([], None)
    for step, value in ((16, 0.0), (17, 1.0), (17, 2.0), (18, 3.0)):
        feed.put_value(step, value)
    steps, vectors = feed.take(arrays=True)              # the steps as an array, the same rows
    assert steps.dtype == np.int64 and steps.tolist() == [17, 18] and vectors[:, 0].tolist() == [2.0, 3.0]
    steps, vectors = feed.take(arrays=True)
    assert steps.dtype == np.int64 and steps.size == 0 and vectors is None


@pytest.mark.parametrize("put", ["put", "put_tensor", "put_value"])
def test_stats_feed_never_strands_a_vector_without_waking_its_consumer(put):
    steps, wake, taken = 100_000, threading.Event(), []
    feed = StatsFeed(wake.set, lambda: None, limit=10**9)

    def consume():                       # as the refresh thread does: clear the wake-up, then take
        while len(taken) < steps and wake.wait(timeout=2.0):
            wake.clear()
            taken.extend(feed.take()[0])

    consumer = threading.Thread(target=consume)
    warm = StatsFeed(lambda: None, lambda: None)         # compiled kernels load before the consumer's 2 s wait starts
    warm.put_tensor(0, np.zeros(3, np.float32))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)          # the two threads interleave at almost every bytecode
    try:
        consumer.start()
        put, value = {"put": (feed.put, np.zeros(6)), "put_tensor": (feed.put_tensor, np.zeros(3, np.float32)),
                      "put_value": (feed.put_value, 0.0)}[put]
        for step in range(steps):
            put(step, value)
        consumer.join(timeout=10)        # woken by the puts alone
    finally:
        sys.setswitchinterval(interval)
    assert taken == list(range(steps)), f"{steps - len(taken)} vectors left untaken with no wake-up"


def test_trend_take_reports_the_rows_that_changed():
    trend = Trend(max_points=4)
    one = stats_of(np.ones(3))
    assert trend.take() is None
    for i in range(3):
        trend.add(i, one)
    at, cols = trend.take()
    assert at == 0 and cols["step"].tolist() == [0, 1, 2]
    trend.add(3, one)
    at, cols = trend.take()
    assert at == 3 and cols["step"].tolist() == [3]
    trend.add(4, one)                                    # full: merge to 2 buckets of 2, then a third starts
    at, cols = trend.take()
    assert at == 0 and cols["step"].tolist() == [0, 2, 4] and cols["end"].tolist() == [2, 4, 5]
    trend.add(5, one)                                    # fills the last bucket: only it changes
    assert trend.take()[0] == 2
    with pytest.raises(ValueError, match="max_points"):
        Trend(max_points=1)


def test_spiky_histograms_and_figures():
    relu = np.maximum(RNG.normal(size=10000), 0)        # half the values exactly 0
    assert is_spiky(histogram_data(relu, 30)["top"])
    assert not is_spiky(histogram_data(RNG.normal(size=10000), 30)["top"])
    source = histogram_source()
    view, toggle = histogram_view(source, log=True)
    linear, logarithmic = view.children
    assert (linear.visible, logarithmic.visible, toggle.active) == (False, True, True)
    assert logarithmic.y_scale.__class__.__name__ == "LogScale" and linear.x_range is logarithmic.x_range
    assert "cb_obj.active" in toggle.js_property_callbacks["change:active"][0].code
    for fig in (linear, trend_figure(trend_source())):
        assert fig.sizing_mode == "stretch_width" and fig.output_backend == "canvas" and fig.toolbar_location is None
    columns = histogram_columns(histogram_data(relu, 30))
    assert np.isnan(columns["top_log"][columns["top"] == 0]).all()
    marks = trend_columns({"nonfinite": np.array([0.0, 3.0])})["mark"]
    assert np.isnan(marks[0]) and marks[1] == 1.0


def shown(columns):
    """``{label: (value, colour)}`` of a stats table's columns."""
    return {label: (value, color) for label, value, color in zip(columns["label"], columns["value"],
                                                                 columns["color"])}


def test_stats_table_formats_numbers_and_highlights_nonfinite_counts():
    table = shown(stats_columns(tensor_summary(np.array([1.0, np.nan, np.inf, 2.5])), step=7))
    assert list(table) == list(STATS_ROWS)
    assert table["step"][0] == "7" and table["shape"][0] == "(4,)" and table["max"][0] == "2.5"
    assert table["NaN"] == ("1", ALARM) and table["Inf"] == ("1", ALARM) and table["min"][1] != ALARM
    assert shown(stats_columns(TensorStats((2,), math.nan, math.nan, math.nan, math.nan, 2, 0)))["mean"][0] == "—"
    view = stats_view(stats_source_for_test())
    assert view.width == 190 and view.toolbar_location is None and not view.below and not view.left
    assert heading("<b>ok</b>").sizing_mode == "stretch_width"


def stats_source_for_test():
    from flowlab.plots import stats_source
    return stats_source()


# ------------------------------------------------------------------------------------ the watch-summary protocol

class Recorder:
    """A watch handler using the summary protocol: a histogram only when ``want`` says so."""

    def __init__(self, bins=6):
        self.bins, self.want, self.events = bins, True, []

    def watch_summary(self, blob_def, kind):
        return self.bins, lambda: self.want

    def watch_event(self, value, blob_def, kind, step):
        self.events.append((type(value).__name__, kind, step, value))


def test_summary_handlers_get_device_stats_every_call_and_histograms_on_demand():
    handler, values = Recorder(), []

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((8, 5))) -> tp.Numpy:
        h = flow.layers.dense(x, 6, activation=flow.nn.relu, name="h")
        flow.watch(h, handler)
        flow.watch(h, lambda v: values.append(v))        # the whole tensor, to check against
        loss = flow.math.reduce_mean(flow.math.square(h), axis=[1])
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss

    for step in range(4):
        handler.want = step in (0, 2)
        job(RNG.normal(size=(8, 5)).astype(np.float32))
    flow.sync_default_session()
    kinds = sorted((step, name) for name, _, step, _ in handler.events)
    assert kinds == [(0, "TensorHistogram"), (0, "TensorStats"), (1, "TensorStats"), (2, "TensorHistogram"),
                     (2, "TensorStats"), (3, "TensorStats")]
    for name, _, step, value in handler.events:
        whole = values[step]
        if name == "TensorStats":
            np.testing.assert_allclose(value[1:5], stats_vector(np, whole)[:4], rtol=1e-6)
        else:
            assert value.shape == (8, 6) and value.lo == whole.min() and value.hi == whole.max()
            np.testing.assert_array_equal(value.counts, np.histogram(whole, bins=6)[0])
    plan = job.plan().source
    assert "TensorStats" in plan and "w1()" in plan   # the histogram line is guarded by the handler's demand


def test_summary_handler_with_no_bins_gets_statistics_only_and_bad_plans_are_rejected():
    stats_only = Recorder(bins=0)

    class Bad(Recorder):
        def watch_summary(self, blob_def, kind):
            return "30", None

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        flow.watch(x, stats_only)
        return x + 1.0

    job(np.ones(3, np.float32))
    flow.sync_default_session()
    assert [name for name, *_ in stats_only.events] == ["TensorStats"]
    expected = r"Bad.watch_summary must return \(bins: int >= 0, wanted: callable\[, feed: StatsFeed\]\), got"
    with pytest.raises(TypeError, match=expected + r" \('30', None\)"):
        @flow.global_function()
        def bad(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
            flow.watch(x, Bad())
            return x + 1.0
        bad(np.ones(3, np.float32))


# ------------------------------------------------------------------------------------------ the live document

def test_bokeh_runtime_is_one_model_with_bokehs_own_bundles(sent):
    one, two = live_module.bokeh_runtime(), live_module.bokeh_runtime()
    assert one is two
    js = pathlib.Path(live_module.bokeh.__file__).parent / "server" / "static" / "js"
    assert [gzip.decompress(b) for b in one.bundles] == [(js / "bokeh.min.js").read_bytes(),
                                                         (js / "bokeh-widgets.min.js").read_bytes()]
    assert one.probes == ["Plot", "Div"] and one.version == live_module.bokeh.__version__
    assert sum(map(len, one.bundles)) < 600_000          # gzipped: what the page loads once


def test_live_document_sends_numbered_deltas_and_keyframes(sent, monkeypatch):
    source, div = trend_source(), heading("start")
    from bokeh.layouts import column
    live = LiveDocument(column(div, trend_figure(source)))
    page, lossy = Page(live, sent), Page(live, sent, drop={2})
    assert page.model(div).text == "start" and page.seq == 0

    assert live.push() is False                           # nothing changed: nothing sent
    live.set(div, text="one")
    live.splice(source, 0, trend_columns(Trend(4).columns()))
    first = {name: np.arange(3.0) + k for k, name in enumerate(source.data)}
    live.splice(source, 0, first)
    assert live.push() is True
    live.splice(source, 2, {name: np.array([10.0, 11.0]) for name in source.data})
    live.set(div, text="two")
    live.push()
    for p in (page, lossy):
        p.update()
    assert page.model(div).text == "two" and page.applied == [1, 2]
    np.testing.assert_array_equal(page.model(source).data["step"], [0, 1, 10, 11])
    method, data, buffers = sent.of(live)[-1]
    assert data["content"]["data"][0][1] == 2 and len(buffers[0]) == 2 * 8   # only the two new rows, as float64
    assert lossy.applied == [1] and lossy.model(div).text == "one"            # message 2 was lost: it waits

    monkeypatch.setattr(live_module, "KEYFRAME_EARLY", 0.0)
    live.set(div, text="three")
    live.push()                                           # a keyframe: every touched model, whole
    assert sent.of(live)[-1][1]["content"]["key"] is True
    lossy.update()
    assert lossy.model(div).text == "three"
    np.testing.assert_array_equal(lossy.model(source).data["step"], [0, 1, 10, 11])
    with pytest.raises(ValueError, match="columns must be"):
        live.splice(source, 0, {"step": [1.0]})


def test_live_document_publish_sends_the_whole_document_for_new_views(sent):
    from bokeh.layouts import column
    root = column(heading("first"))
    live = LiveDocument(root)
    root.children = [heading("a new row"), heading("and another")]
    live.publish()
    page = Page(live, sent).update()
    assert [m.text for m in page.doc.roots[0].children] == ["a new row", "and another"]
    assert json.loads(live._snapshot)["seq"] == 1


# ------------------------------------------------------------------------------------------------ WatchPanel

def watched_job(panel, values, stats_panel=None):
    @flow.global_function(type="train")
    def train_job(x: tp.Numpy.Placeholder((16, 8)), y: tp.Numpy.Placeholder((16,), dtype=flow.int32)) -> tp.Numpy:
        h = flow.layers.dense(x, 32, activation=flow.nn.relu, name="h")
        logits = flow.layers.dense(h, 4, name="out")
        flow.watch(logits, panel)
        flow.watch_diff(logits, panel)
        flow.watch(h, stats_panel or panel, stats=True)
        flow.watch(logits, lambda v: values["value"].append(v))
        flow.watch_diff(logits, lambda v: values["gradient"].append(v))
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss
    return train_job


def batch():
    return RNG.normal(size=(16, 8)).astype(np.float32), RNG.integers(0, 4, 16).astype(np.int32)


def test_panel_shows_latest_histogram_every_steps_statistics_and_a_stats_only_row(sent):
    panel = WatchPanel(mode="notebook", bins=10, log_counts=False)
    panel._refresher.stop()                               # only the refresh() calls below flush (and ask anew)
    values = {"value": [], "gradient": []}
    job = watched_job(panel, values)
    job(*batch())                                         # step 0 ships histograms (wanted from the start)
    flow.sync_default_session()
    panel.refresh()                                       # shown: the screen wants new ones
    for _ in range(3):
        job(*batch())                                     # only step 1 ships histograms
    flow.sync_default_session()
    panel.refresh()
    page = Page(panel.widget, sent).update()

    rows = {(r.lbn, r.kind): r for r in panel._rows.values()}
    value, gradient, stats = ("out_bias_add/out_0", "value"), ("out_bias_add/out_0", "gradient"), \
        ("h_activation/out_0", "value")
    # rows come in order of first report. On NumPy the calling thread hands the panel its summaries while the plan
    # runs, before the dispatcher delivers h's statistics (a plain stats=True watch) after the call; on CuPy every
    # copy is asynchronous, so all three come from the dispatcher, in the plan's order (h before the logits)
    assert list(rows) == ([stats, value, gradient] if backend.current().is_gpu else [value, gradient, stats])
    assert len(page.doc.roots[0].children) == 3           # one row each, in order of first report
    for kind in ("value", "gradient"):
        row = rows[("out_bias_add/out_0", kind)]
        hist = page.model(row.hist_source).data
        np.testing.assert_array_equal(hist["top"], histogram_data(values[kind][1], 10)["top"])
        for figure in row.layout.children[1].children[0].children:      # linear and log
            assert page.model(figure.xaxis[0]).axis_label == kind
        trend = page.model(row.trend_source).data
        assert trend["step"].tolist() == [0, 1, 2, 3]
        np.testing.assert_allclose(trend["mean"], [v.astype(np.float64).mean() for v in values[kind]], atol=1e-7)
        np.testing.assert_allclose(trend["max"], [v.max() for v in values[kind]], rtol=1e-6)
        table = shown(page.model(row.stats_source).data)
        assert table["step"][0] == "3" and table["shape"][0] == "(16, 4)"
        assert table["hist"][0] == "1"                                  # the histogram shown is step 1's
    stats_row = rows[("h_activation/out_0", "value")]
    assert stats_row.hist_source is None and "(stats" in stats_row.header_html()
    assert page.model(stats_row.trend_source).data["step"].tolist() == [0, 1, 2, 3]
    panel.close()


def test_panel_ends_a_run_with_the_last_steps_histogram(sent):
    # during the run a histogram is asked for only after the last one was drawn, so the one shown trails; the end of
    # the cell (or close) draws the last step's from the copy the feed keeps of tensors copied whole
    panel = WatchPanel(mode="notebook", bins=10, log_counts=False)
    panel._refresher.stop()
    values = {"value": [], "gradient": []}
    job = watched_job(panel, values)
    for _ in range(5):
        job(*batch())                                     # step 0 ships histograms; none is wanted after it
    flow.sync_default_session()
    panel.refresh()
    page = Page(panel.widget, sent).update()
    rows = {(r.lbn, r.kind): r for r in panel._rows.values()}
    for kind in ("value", "gradient"):
        assert shown(page.model(rows[("out_bias_add/out_0", kind)].stats_source).data)["hist"][0] == "0"
    panel.close()
    page.update()
    for kind in ("value", "gradient"):
        row = rows[("out_bias_add/out_0", kind)]
        table = shown(page.model(row.stats_source).data)
        assert table["step"][0] == "4" and table["hist"][0] == "4"
        hist = page.model(row.hist_source).data
        np.testing.assert_array_equal(hist["top"], histogram_data(values[kind][4], 10)["top"])
        np.testing.assert_allclose(hist["left"], histogram_data(values[kind][4], 10)["left"])
    # the snapshot a reloaded page (and the saved notebook) gets holds it too
    snapshot = Page(panel.widget, sent)
    snapshot.update()
    assert shown(snapshot.model(rows[("out_bias_add/out_0", "value")].stats_source).data)["hist"][0] == "4"


def test_panel_updates_change_no_axis_and_no_div_so_the_page_only_repaints(sent):
    """BokehJS lays a plot out again whenever one of its axes changes, and the whole document when a Div's text
    does; a refresh of the panel (and of a progress widget beside it) sends data only."""
    from bokeh.models import Axis, Div
    panel = WatchPanel(mode="notebook", bins=10)
    progress = TrainingProgress(mode="notebook", total_steps=100)
    for view in (panel, progress):
        view._refresher.stop()
    job = watched_job(panel, {"value": [], "gradient": []})
    for _ in range(4):
        loss = job(*batch())
        flow.sync_default_session()
        progress.update(loss=float(loss.mean()))
        panel.refresh()
        progress.refresh()
    for view in (panel, progress):
        relaid = {m.id for m in view.widget._document.models if isinstance(m, (Axis, Div))}
        updates = [data["content"] for method, data, _ in sent.of(view.widget) if method == "custom"]
        assert len(updates) >= 3 and all(update["data"] for update in updates)
        assert not [model for update in updates for model, _ in update["props"] if model in relaid]
    page = Page(panel.widget, sent).update()
    for row in panel._rows.values():                    # which step the histogram is: canvas text in the table
        assert shown(page.model(row.stats_source).data)["hist"][0] == (str(row.hist_step) if row.histograms else "")
    panel.close()
    progress.close()


def test_panel_counts_nan_and_inf_in_table_and_trend(sent):
    panel = WatchPanel(mode="notebook")

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        panel.watch(x)
        return x * 2.0

    job(np.array([[1, np.nan, 2], [np.nan, np.inf, 3]], np.float32))
    flow.sync_default_session()
    panel.refresh()
    page = Page(panel.widget, sent).update()
    (row,) = panel._rows.values()
    table = shown(page.model(row.stats_source).data)
    assert table["NaN"] == ("2", ALARM) and table["Inf"] == ("1", ALARM)
    job(np.ones((2, 3), np.float32))
    flow.sync_default_session()
    panel.refresh()
    page.update()
    assert shown(page.model(row.stats_source).data)["NaN"][0] == "0"      # the table: the last step only
    trend = page.model(row.trend_source).data                             # the trend: every step
    assert trend["nonfinite"].tolist() == [3, 0] and trend["mark"][0] == 1 and np.isnan(trend["mark"][1])
    np.testing.assert_array_equal(trend["max"], [3, 1])
    job(np.full((2, 3), np.nan, np.float32))                              # a step with no finite value at all
    flow.sync_default_session()
    panel.refresh()
    page.update()
    table = shown(page.model(row.stats_source).data)
    assert table["NaN"] == ("6", ALARM) and table["hist"][0] == "2: no finite"    # no bars, and the table says so
    assert len(page.model(row.hist_source).data["top"]) == 0
    panel.close()


def test_panel_chooses_a_log_count_axis_for_a_spiky_first_histogram(sent):
    panel = WatchPanel(mode="notebook")
    panel.watch_event(np.maximum(RNG.normal(size=5000), 0), Def("relu/out"), "value", 0)
    panel.watch_event(RNG.normal(size=5000), Def("dense/out"), "value", 0)
    panel.refresh()
    page = Page(panel.widget, sent).update()
    toggles = {lbn: page.model(row.toggle).active for (lbn, _), row in panel._rows.items()}
    assert toggles == {"relu/out": True, "dense/out": False}
    panel.close()


def test_flood_of_watch_events_is_throttled_and_keeps_every_step_in_the_trend(sent):
    hz = 10
    panel = WatchPanel(mode="notebook", refresh_hz=hz, max_points=2000)
    values = {"value": [], "gradient": []}
    job = watched_job(panel, values, stats_panel=lambda s: None)
    job(*batch())
    flow.sync_default_session()
    panel.refresh()
    start = sent.count(panel.widget)
    t0 = time.monotonic()
    for _ in range(400):
        job(*batch())
    flow.sync_default_session()
    elapsed = time.monotonic() - t0
    during = sent.count(panel.widget) - start
    panel.refresh()
    assert during <= hz * elapsed + 2, (during, elapsed)       # one message per refresh, at most hz a second
    page = Page(panel.widget, sent).update()
    for kind in ("value", "gradient"):
        row = panel._rows[("out_bias_add/out_0", kind)]
        trend = page.model(row.trend_source).data
        assert trend["step"].tolist() == list(range(401))      # pictures are dropped, trend points never
        np.testing.assert_allclose(trend["mean"], [v.astype(np.float64).mean() for v in values[kind]], atol=1e-7)
        assert shown(page.model(row.stats_source).data)["step"][0] == "400"
    panel.close()


@pytest.mark.parametrize("width, path", [(32, "copied whole"), (4096, "summarised in place")])
def test_panel_statistics_are_each_calls_whether_copied_whole_or_summarised_in_place(width, path):
    panel = WatchPanel(mode="terminal", file=io.StringIO())
    seen = []

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((16, 8))) -> tp.Numpy:
        h = flow.layers.dense(x, width, activation=flow.nn.relu, name="h")
        flow.watch(h, panel)
        flow.watch(h, lambda v: seen.append(v.copy()))
        loss = flow.math.reduce_mean(flow.math.square(h))
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss

    inputs = [RNG.normal(size=(16, 8)).astype(np.float32) for _ in range(23)]
    inputs[-1][3, :] = np.nan                             # the last call's value holds NaN: its row is redone exactly
    for x in inputs:
        job(x)
    flow.sync_default_session()
    panel.close()
    # (a small tensor is copied whole on the host only: on CuPy every watched tensor is summarised in place; with
    # compiled kernels the feed summarises any float32 tensor itself, at once: no statistics op)
    op = backend.current().is_gpu or (path == "summarised in place" and not jit.enabled())
    assert ("TensorStats" in job.plan().source) == op
    trend = next(iter(panel._rows.values())).trend.columns()
    assert trend["step"].tolist() == list(range(23))
    for step, value in enumerate(seen):
        finite = value[np.isfinite(value)]
        assert (trend["min"][step], trend["max"][step]) == (finite.min(), finite.max())
        assert trend["mean"][step] == pytest.approx(finite.mean(dtype=np.float64), rel=1e-5)
        assert trend["nonfinite"][step] == np.sum(~np.isfinite(value))
    assert trend["nonfinite"][22] == width and not trend["nonfinite"][:22].any()


def test_a_closed_panel_still_fed_keeps_every_step_in_bounded_memory(sent):
    panel = WatchPanel(mode="notebook", max_points=1000)
    values = {"value": [], "gradient": []}
    job = watched_job(panel, values, stats_panel=lambda s: None)
    job(*batch())
    panel.close()                                        # no refresh thread from here on; training goes on
    feeds = [feed for _, feed in panel._feeds.values()]
    for feed in feeds:
        feed.limit = 8
    waiting = []
    for _ in range(50):
        job(*batch())
        waiting.append(max(len(feed) for feed in feeds))
    flow.sync_default_session()
    blocks = max(0 if feed._block is None else len(feed._block) for feed in feeds)   # tensors copied, not summarised
    assert max(waiting) < 8 + blocks                     # folded into the rows on the job's thread when full
    panel.refresh()
    for kind in ("value", "gradient"):
        trend = panel._rows[("out_bias_add/out_0", kind)].trend.columns()
        assert trend["step"].tolist() == list(range(51))
        np.testing.assert_allclose(trend["max"], [v.max() for v in values[kind]], rtol=1e-6)


def test_a_tensor_watched_twice_by_a_panel_counts_each_step_once(sent):
    panel = WatchPanel(mode="notebook")

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        flow.watch(x, panel)
        flow.watch(x, panel)
        return x * 2.0

    for step in range(3):
        job(np.full(4, float(step), np.float32))
    panel.close()
    (row,) = panel._rows.values()
    trend = row.trend.columns()
    assert trend["step"].tolist() == [0, 1, 2] and trend["mean"].tolist() == [0.0, 1.0, 2.0]


def test_refresh_thread_sends_at_most_refresh_hz_a_second_and_the_latest_last(sent):
    hz = 5
    panel = WatchPanel(mode="notebook", refresh_hz=hz)
    panel.watch_event(np.zeros(100), Def("x/out"), "value", 0)
    panel.refresh()
    start = sent.count(panel.widget)
    t0, step = time.monotonic(), 0
    while time.monotonic() - t0 < 1.0:
        step += 1
        panel.watch_event(TensorStats((100,), -1.0, float(step), 0.0, 1.0, 0, 0), Def("x/out"), "value", step)
    elapsed = time.monotonic() - t0
    time.sleep(2.0 / hz)                                       # the refresh thread sends the last one by itself
    flushes = sent.count(panel.widget) - start
    assert step > 100 and 2 <= flushes <= hz * (elapsed + 2.0 / hz) + 1, (flushes, elapsed)
    page = Page(panel.widget, sent).update()
    row = panel._rows[("x/out", "value")]
    assert shown(page.model(row.stats_source).data)["step"][0] == str(step)
    assert page.model(row.trend_source).data["max"].max() == step
    panel.close()


def test_watch_event_from_a_thread_while_refresh_runs(sent):
    panel = WatchPanel(mode="notebook", refresh_hz=20, max_points=64)
    errors = []

    def feed():
        try:
            for step in range(2000):
                value = RNG.normal(size=50)
                value[0] = np.nan if step % 7 == 0 else value[0]
                panel.watch_event(value, Def("t/out"), "value" if step % 2 else "gradient", step)
                panel.watch_event(TensorHistogram((50,), 0.0, 1.0, np.ones(30)), Def("u/out"), "value", step)
        except Exception as e:       # pragma: no cover - reported below
            errors.append(e)

    thread = threading.Thread(target=feed)
    thread.start()
    while thread.is_alive():
        panel.refresh()
    thread.join()
    panel.close()
    assert not errors
    page = Page(panel.widget, sent).update()
    assert len(page.doc.roots[0].children) == 3
    for row in panel._rows.values():
        np.testing.assert_array_equal(page.model(row.trend_source).data["step"], row.trend.columns()["step"])


def test_panel_in_terminal_mode_prints_a_stats_line_per_row():
    out = io.StringIO()
    panel = WatchPanel(mode="terminal", file=out)
    assert panel.widget is None
    for step in range(50):
        panel.watch_event(np.array([step, 1.0, np.nan]), Def("w/out", (3,)), "gradient", step)
    panel.close()
    lines = out.getvalue().splitlines()
    assert 1 <= len(lines) <= 3                # the first at once, then at most once a second
    assert lines[-1].startswith("[step 49] w/out gradient:") and "max=49" in lines[-1] and "nan=1" in lines[-1]


def test_bad_arguments():
    with pytest.raises(ValueError, match="refresh_hz"):
        WatchPanel(refresh_hz=50)
    with pytest.raises(ValueError, match="mode"):
        WatchPanel(mode="browser")
    with pytest.raises(ValueError, match="bins"):
        WatchPanel(bins=0)
    with pytest.raises(ValueError, match="log_counts"):
        WatchPanel(log_counts="yes")
    with pytest.raises(ValueError, match="max_points"):
        WatchPanel(max_points=1)
    with pytest.raises(ValueError, match="total_steps"):
        TrainingProgress(total_steps=0)
    for step in (-1, True, 2.0, "3"):
        with pytest.raises(ValueError, match="step must be"):
            TrainingProgress(mode="terminal").update(step)
    TrainingProgress(mode="terminal").update(np.int64(3))     # a NumPy integer is a step
    assert WatchPanel().mode == "terminal"     # no Jupyter kernel under pytest
    with pytest.raises(ValueError, match="nothing to watch"):
        WatchPanel().watch(None, values=False)


# ---------------------------------------------------------------------------------------- training progress

def test_progress_in_terminal_rewrites_one_line_at_most_four_times_a_second():
    out = io.StringIO()
    progress = TrainingProgress(total_steps=400, mode="terminal", file=out)
    t0 = time.monotonic()
    for i in range(400):
        progress.update(i, loss=1.0 / (i + 1), acc=0.5)
        time.sleep(0.002)
    elapsed = time.monotonic() - t0
    progress.close()
    text = out.getvalue()
    assert text.endswith("\n") and text.count("\n") == 1
    updates = text.count("\r")      # the first at once, then on the refresh grid (4 a second), the last at close
    assert 2 <= updates <= 4 * elapsed + 3, (updates, elapsed)
    final = text.rstrip("\n").split("\r")[-1]
    assert final.startswith("step 399 · 400/400 (100%) | loss 0.0025 |") and "steps/s" in final
    assert "acc 0.5" in final


def test_progress_updates_are_taken_in_bulk_one_loss_a_step():
    progress = TrainingProgress(mode="terminal", file=io.StringIO())
    progress._refresher.stop()                           # only close() takes what update() put
    progress.update(loss=1.0)                            # no train job: steps count from 0
    progress.update(loss=2.0)
    progress.update()                                    # a step without a loss: no point on the curve
    progress.update(loss=float("nan"), acc=0.5)
    progress.update(4, loss=3.0)
    progress.update(4, loss=np.float32(5.0))             # the same step again: its last loss counts
    with pytest.raises(TypeError, match=r"loss must be a number, a TensorStats or None, got str 'low'"):
        progress.update(5, loss="low")
    progress.close()
    curve = progress._losses.columns()
    assert curve["step"].tolist() == [0, 1, 3, 4]
    np.testing.assert_array_equal(curve["mean"], [1.0, 2.0, np.nan, 5.0])
    assert curve["nonfinite"].tolist() == [0, 0, 1, 0]
    assert repr(progress).startswith("TrainingProgress(step 4 | loss 5 |") and "acc 0.5" in repr(progress)


def test_progress_in_notebook_shows_bar_status_and_the_whole_loss_curve(sent):
    progress = TrainingProgress(total_steps=50, mode="notebook", refresh_hz=20, max_points=16)
    for i in range(50):
        progress.update(i, loss=float(50 - i) if i != 20 else math.nan, lr="<0.1>")
    progress.close()
    page = Page(progress.widget, sent).update()
    status = page.model(progress._text_source).data["text"][0]
    assert "step 49 · 50/50 (100%)" in status and "loss 1 " in status and "lr <0.1>" in status
    assert page.model(progress._done_source).data["right"][0] == 1.0
    curve = page.model(progress._loss_source).data
    assert curve["step"][0] == 0 and curve["end"][-1] == 50 and len(curve["step"]) <= 16
    assert curve["max"][0] == 50 and curve["min"][-1] == 1 and curve["nonfinite"].sum() == 1


def test_progress_in_notebook_without_a_total_sends_no_bar(sent):
    progress = TrainingProgress(mode="notebook", refresh_hz=20)
    progress._refresher.stop()                           # only the refreshes below send
    for i in range(3):
        progress.update(i, loss=float(i))
        progress.refresh()
    ids = [{source for source, _, _ in data["content"]["data"]} for method, data, _ in sent.of(progress.widget)
           if method == "custom"]
    assert len(ids) == 3 and all(progress._text_source.id in s and progress._loss_source.id in s for s in ids)
    assert not any(progress._done_source.id in s for s in ids)    # the bar's source never changes without a total
    progress.close()


def small_train_job(watch):
    """A 16x8 -> 4 softmax regression trained with SGD; ``watch(logits, loss)`` attaches watches inside the job."""
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((16, 8)), y: tp.Numpy.Placeholder((16,), dtype=flow.int32)) -> tp.Numpy:
        logits = flow.layers.dense(x, 4, name="out")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        watch(logits, loss)
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss
    return job


def test_progress_and_panel_show_the_same_step(sent):
    panel, progress = WatchPanel(mode="notebook"), TrainingProgress(mode="notebook")
    job = small_train_job(lambda logits, loss: flow.watch(logits, panel))
    for _ in range(3):
        loss = job(*batch())
        progress.update(loss=float(loss.mean()))              # no step given: the train job's
    flow.sync_default_session()
    panel.close()
    progress.close()
    row = next(iter(panel._rows.values()))
    assert shown(Page(panel.widget, sent).update().model(row.stats_source).data)["step"][0] == "2"
    assert Page(progress.widget, sent).update().model(progress._text_source).data["text"][0].startswith("step 2 ")


def test_progress_as_a_watch_handler_uses_device_statistics():
    out = io.StringIO()
    progress = TrainingProgress(mode="terminal", file=out)
    losses = []
    job = small_train_job(lambda logits, loss: flow.watch(loss, progress))
    for _ in range(3):
        losses.append(job(*batch()))
    flow.sync_default_session()
    progress.close()
    source = job.plan().source
    if backend.current().is_gpu:                        # summarised on the GPU; the six numbers come to the feed
        assert re.search(r"p\d+\(step, deliver\(t\d+\)\)", source) and "TensorStats" in source
    else:                                               # the small loss goes to the feed whole, uncopied
        assert re.search(r"p\d+\(step, t\d+\)", source) and "deliver(" not in source and "TensorStats" not in source
    final = out.getvalue().rstrip("\n").split("\r")[-1]
    assert final.startswith(f"step 2 | loss {np.mean(losses[-1], dtype=np.float64):.4g}")
    curve = progress._losses.columns()
    np.testing.assert_allclose(curve["max"], [loss.max() for loss in losses], rtol=1e-6)


def test_an_error_in_a_summary_handler_reaches_the_user_at_the_call():
    class Broken(Recorder):
        def watch_event(self, value, blob_def, kind, step):
            raise RuntimeError("the panel broke")

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        flow.watch(x, Broken())
        return x + 1.0

    from flowlab.errors import WatchCallbackError
    with pytest.raises(WatchCallbackError, match=r"flow.watch handler \S*Broken for the value of Input_\d+/out_0 "
                                                 r"\(call 0 of job job\) raised RuntimeError: the panel broke"):
        job(np.ones(3, np.float32))


# ------------------------------------------------------------------------------------------------------------ on GPU

@pytest.mark.gpu
def test_device_statistics_and_histograms_match_the_host_ones():
    import cupy
    x = (RNG.normal(size=(64, 50)) * 3).astype(np.float32)
    x.flat[[1, 7, 9]] = [np.nan, np.inf, -np.inf]
    for array in (x, np.full(20, 2.5, np.float32), np.array([np.nan], np.float32)):
        np.testing.assert_allclose(cupy.asnumpy(stats_vector(cupy, cupy.asarray(array))), stats_vector(np, array),
                                   rtol=1e-5, equal_nan=True)
        np.testing.assert_allclose(cupy.asnumpy(histogram_vector(cupy, cupy.asarray(array), 12)),
                                   histogram_vector(np, array, 12), rtol=1e-6, equal_nan=True)


@pytest.mark.gpu
def test_a_panel_fed_by_a_gpu_job_gets_summaries_through_the_dispatcher(sent):
    backend.use("gpu")
    try:
        panel, values = WatchPanel(mode="notebook", bins=10), {"value": [], "gradient": []}
        job = watched_job(panel, values)
        for _ in range(3):
            job(*batch())
        flow.sync_default_session()
        panel.refresh()
        row = panel._rows[("out_bias_add/out_0", "value")]
        page = Page(panel.widget, sent).update()
        np.testing.assert_allclose(page.model(row.trend_source).data["max"], [v.max() for v in values["value"]],
                                   rtol=1e-5)
        np.testing.assert_array_equal(page.model(row.hist_source).data["top"],
                                      histogram_data(values["value"][row.hist_step], 10)["top"])
        panel.close()
    finally:
        backend.use("cpu")


# ------------------------------------------------------------------------------------------ ranges set by Python

def test_sticky_range_holds_the_data_and_moves_only_when_it_must():
    from flowlab.plots import sticky_range
    first = sticky_range(None, 0.0, 10.0)
    assert first == pytest.approx((-0.5, 10.5))                 # 5 % of the span each side, as DataRange1d pads
    assert sticky_range(first, 1.0, 9.0) is first                # inside and more than half full: kept
    assert sticky_range(first, 4.0, 5.0) != first                # under half full: fitted again
    grown = sticky_range(first, 0.0, 20.0)                       # outgrown: headroom on the growing side
    assert grown == pytest.approx((-0.5, 26.0))                 # the start stays; the end 5 % + 25 % past the data
    assert sticky_range(grown, 0.0, 22.0) is grown               # ... so the next steps fit without a change
    assert sticky_range(None, 0.0, 80.0, start=0.0) == pytest.approx((0.0, 84.0))    # a count axis from 0
    assert sticky_range(None, 3.0, 3.0) == pytest.approx((2.835, 3.165))              # a constant: a range round it
    assert sticky_range(None, 0.0, 0.0) == pytest.approx((-0.55, 0.55))
    # a non-negative series (a gradient norm) that spiked to 72k and fell to 0: its lower end takes the pad below
    # 0, not headroom (it was drawn from -20k); the mirror for a non-positive one
    shown = None
    for lo, hi in ((10.0, 10.0), (10.0, 100.0), (10.0, 72_000.0), (0.0, 72_000.0)):
        shown = sticky_range(shown, lo, hi)
    assert shown == pytest.approx((-3_600.0, shown[1])) and shown[1] >= 72_000.0
    assert sticky_range((-93_000.0, -9.0), -72_000.0, 0.0) == pytest.approx((-93_000.0, 3_600.0))
    assert sticky_range((-1.0, 1.0), -5.0, 0.5)[0] == pytest.approx(-6.65)     # data on both sides: headroom stays


def test_panel_ranges_are_set_with_the_data_hold_every_value_and_a_spike_and_rarely_change(sent):
    """Histograms and trends have explicit ranges sent in the same update as their data (BokehJS's auto ranges change
    inside a paint and ask for another, re-laying the plot out), holding every bucket, every count and every finite
    value of the trend (a spike included; a NaN step is a red band on a range of its own), and changing on few
    updates."""
    from bokeh.models import DataRange1d, Range1d
    panel = WatchPanel(mode="notebook", bins=10)
    panel._refresher.stop()
    range_updates, updates = 0, 0
    for step in range(40):
        values = RNG.normal(size=1000) * (1 + 0.01 * step)
        if step == 25:
            values[3] = 5e4                                     # one spike
        if step == 30:
            values[:] = np.nan                                  # a step with nothing finite
        panel.watch_event(values, Def("dense/out", (1000,)), "value", step)
        panel.refresh()
        page = Page(panel.widget, sent).update()
        (row,) = panel._rows.values()
        linear, logarithmic = (page.model(f) for f in row.hist_figures)
        trend_fig = page.model(row.trend_fig)
        for fig in (linear, logarithmic, trend_fig):
            assert type(fig.x_range) is Range1d and type(fig.y_range) is Range1d
        assert not [m for m in page.doc.models if isinstance(m, DataRange1d)]
        hist = page.model(row.hist_source).data
        if len(hist["top"]):
            assert linear.x_range.start < min(hist["left"]) and max(hist["right"]) < linear.x_range.end
            assert linear.y_range.start == 0 and max(hist["top"]) < linear.y_range.end
            assert logarithmic.y_range.start == 0.5 and max(hist["top"]) < logarithmic.y_range.end
        trend = page.model(row.trend_source).data
        assert trend_fig.x_range.start <= trend["step"][0] and trend["end"][-1] <= trend_fig.x_range.end
        finite = np.concatenate([np.asarray(trend[c]) for c in ("min", "max", "lower", "upper", "mean")])
        finite = finite[np.isfinite(finite)]
        assert trend_fig.y_range.start <= finite.min() and finite.max() <= trend_fig.y_range.end
        if step >= 25:
            assert trend_fig.y_range.end >= 5e4                  # the spike stays in view
        last = sent.of(panel.widget)[-1][1]
        if last.get("method") == "custom":
            updates += 1
            ids = {r.id for f in (row.hist_figures[0], row.trend_fig) for r in (f.x_range, f.y_range)}
            range_updates += any(model in ids for model, _ in last["content"]["props"])
    assert updates >= 35 and range_updates <= updates // 3, (range_updates, updates)
    panel.close()


def test_a_cell_end_fits_the_ranges_tight_and_a_page_in_sync_keeps_its_drawing(sent):
    """While a run goes on a trend's step axis keeps room to grow (up to a third of it empty); the end of the cell
    fits every range tight, with every step still in the trend as block statistics and the spike and the NaN step
    in view. The end-of-cell snapshot carries the number of the update it follows, so a page that applied it keeps
    its document (rebuilding it was a long browser task) and a page opened later builds the same state."""
    panel = WatchPanel(mode="notebook", bins=10, max_points=50)
    panel._refresher.stop()
    page = Page(panel.widget, sent)
    steps = 350
    for step in range(steps):
        values = RNG.normal(size=200)
        if step == 100:
            values[7] = 1e3                                     # a spike
        if step == 200:
            values[:] = np.nan                                  # a step with nothing finite
        panel.watch_event(values, Def("dense/out", (200,)), "value", step)
        if step % 10 == 9:
            panel.refresh()
    page.update()
    (row,) = panel._rows.values()
    x_range = page.model(row.trend_fig).x_range
    assert x_range.end - steps > 0.15 * steps                   # room left to grow while it runs
    doc = page.doc
    panel.widget.settle()                                       # what the end of a cell runs
    page.update()
    assert page.doc is doc and page.seq == json.loads(panel.widget._snapshot)["seq"]     # no rebuild
    trend = page.model(row.trend_source).data
    assert trend["step"][0] == 0 and trend["end"][-1] == steps                # every step, as block statistics
    assert np.all(np.asarray(trend["step"])[1:] == np.asarray(trend["end"])[:-1])
    assert trend["max"].max() == 1e3 and trend["nonfinite"].sum() == 200 and np.nansum(trend["mark"]) == 1
    for fig, extent in ((row.trend_fig, (0.0, float(steps))),):
        x = page.model(fig).x_range
        assert x.start <= extent[0] and extent[1] <= x.end
        assert (x.end - x.start) <= 1.1 * (extent[1] - extent[0]) + 1e-9       # tight: the pad each side only
    y = page.model(row.trend_fig).y_range
    finite = np.concatenate([np.asarray(trend[c]) for c in ("min", "max", "lower", "upper", "mean")])
    finite = finite[np.isfinite(finite)]
    assert y.start <= finite.min() and finite.max() <= y.end <= finite.max() + 0.06 * np.ptp(finite)
    linear = page.model(row.hist_figures[0])
    hist = page.model(row.hist_source).data
    span = max(hist["right"]) - min(hist["left"])
    assert linear.x_range.start < min(hist["left"]) and max(hist["right"]) < linear.x_range.end
    assert linear.x_range.end - linear.x_range.start <= 1.1 * span + 1e-9
    # a page opened now builds the same state from the snapshot
    later = Page(panel.widget, sent)
    assert later.seq == page.seq
    for model in (row.trend_fig.x_range, row.trend_fig.y_range, linear.x_range):
        mine = later.doc.get_model_by_id(model.id)
        theirs = page.doc.get_model_by_id(model.id)
        assert (mine.start, mine.end) == (theirs.start, theirs.end)
    # a page that missed an update builds the document again from the snapshot
    panel.watch_event(RNG.normal(size=200), Def("dense/out", (200,)), "value", steps)
    panel.refresh()
    missed = json.loads(panel.widget._snapshot)["seq"] + 1
    behind = Page(panel.widget, sent, drop={missed})
    behind.update()
    panel.widget.settle()
    behind.update()
    assert behind.seq == json.loads(panel.widget._snapshot)["seq"] > missed    # rebuilt from it
    assert behind.model(row.trend_source).data["end"][-1] == steps + 1
    # the next run in the same panel goes on from the tight ranges, sticky again
    panel.close()


def test_a_cell_end_fits_the_loss_curve_tight(sent):
    progress = TrainingProgress(mode="notebook")
    progress._refresher.stop()
    for step in range(300):
        progress.update(step, loss=1.0 / (step + 1))
        if step % 10 == 9:
            progress.refresh()
    page = Page(progress.widget, sent).update()
    assert page.model(progress._loss_figure).x_range.end > 1.2 * 300
    progress.widget.settle()
    page.update()
    x = page.model(progress._loss_figure).x_range
    assert x.start <= 0 and 300 <= x.end <= 300 * 1.051
    losses = page.model(progress._loss_source).data
    assert losses["end"][-1] == 300 and losses["max"].max() == 1.0
    progress.close()
