"""Dashboard views for histograms, distributions, images, text and anomalies, without a browser: each view is built
over a Store of a logdir written with flowlab's writers, and its ColumnDataSources are checked against NumPy."""
import html.parser
import math

import numpy as np
import pytest
from bokeh.document import Document
from bokeh.document.events import ColumnDataChangedEvent, ColumnsStreamedEvent, ModelChangedEvent
from bokeh.models import Div

from flowlab.dashboard.store import Store
from flowlab.dashboard.views.anomalies import AnomaliesView, heat_cells
from flowlab.dashboard.views.distributions import COLUMNS, MAX_ROWS, DistributionsView
from flowlab.dashboard.views.histograms import HEADROOM, MAX_STEPS, RIDGE_ROWS, Groups, HistogramsView
from flowlab.dashboard.views.images import ImagesView
from flowlab.dashboard.views.text import TextView, render_text
from flowlab.plots.data import NORMAL_HISTOGRAM_BPS, box_stats, compress_histogram, histogram_outline
from flowlab.plots.figures import ALARM, EXPAND_TAG
from flowlab.summary import Projector, SummaryWriter, encode

HOSTILE = ["<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "[click](javascript:alert(1))"]
HOSTILE_RUN = "<img src=x onerror=alert(1)>"            # a legal directory name


def normal(step, n=1000):
    return np.random.default_rng(step).normal(step * 0.1, 1.0 + step * 0.05, n)


def exception_tensor(step):
    t = np.random.default_rng(100 + step).normal(0, 1, (6, 5))
    t[0, 3] = 40.0 + step                               # an outlier
    t[1, 1], t[2, :2], t[4, 4] = np.nan, np.inf, -np.inf
    t[5, step % 5] = np.nan
    return t


@pytest.fixture
def logdir(tmp_path):
    with SummaryWriter(tmp_path / "train") as w:
        for step in range(10):
            w.add_histogram("weights", normal(step), step)
            grad = normal(50 + step, 200)
            if step >= 5:
                grad[:step] = np.nan
                grad[-2:] = np.inf
            w.add_histogram("grad", grad, step)
            w.add_scalar("loss", math.nan if step == 7 else 1.0 / (step + 1), step)
        w.add_histogram("empty", np.array([np.nan, np.nan]), 0)
        w.add_image("digits", image(0), 0, dataformats="HWC")
        w.add_images("digits", np.stack([image(1), image(2), image(3)]), 1, dataformats="NHWC")
        w.add_text("notes", "# Title\n\n**bold** and `code`", 0)
        w.add_text("notes", np.array([["a", "*b*"], ["<script>alert(1)</script>", "d"]]), 1)
        for step in range(4):
            act = np.arange(12.0).reshape(3, 4) + step
            if step == 2:
                act[1, 2] = np.nan
            w.file_writer.add_summary([encode.tensor("activations", act)], step)
        w.file_writer.add_summary([encode.tensor("finite", np.ones(3))], 0)
    projector = Projector(tmp_path / "train").create_exception_projector()
    for step in (3, 8):
        projector.exception_projector(value=exception_tensor(step), tag="bad_batch", step=step,
                                      sample_name="images", sample_type="image",
                                      x=np.zeros((6, 2, 2, 1), np.uint8))
    return tmp_path


def image(seed):
    return np.random.default_rng(seed).integers(0, 256, (5, 7, 3), dtype=np.uint8)


def build(view_class, logdir, **store_args):
    store = Store(logdir, **store_args)
    store.poll()
    view = view_class(store)
    doc = Document()
    doc.add_root(view.layout())
    view.update()
    return store, view, doc


def record(doc):
    """Document change events from now on, as (event, model, attribute or None)."""
    events = []
    doc.on_change(lambda e: events.append(e))
    return events


def data_events(events, source):
    """What happened to ``source``'s data: "stream" (with the streamed columns) or "replace"."""
    out = []
    for e in events:
        if isinstance(e, ColumnsStreamedEvent) and e.model is source:
            out.append(("stream", e.data))
        elif isinstance(e, (ColumnDataChangedEvent, ModelChangedEvent)) and e.model is source and e.attr == "data":
            out.append(("replace", None))
    return out


def card(view, run, tag, kind="histogram"):
    return view._cards[(run, tag, kind)]


# ---------------------------------------------------------------------------------------------- plot-layer functions

def interp_reference(buckets, bps):
    """Percentiles by linear interpolation of the cumulative counts over the bucket edges (NumPy's interp). Of
    several edges with the same cumulative count (empty buckets between) the last one counts, as in TensorBoard."""
    b = np.asarray(buckets)
    cum = np.concatenate([[0.0], np.cumsum(b[:, 2])])
    edges = np.concatenate([b[:1, 0], b[:, 1]])
    keep = np.r_[cum[:-1] != cum[1:], True]
    return np.interp(np.asarray(bps) / 10000 * cum[-1], cum[keep], edges[keep])


KNOWN = {
    "normal": np.random.default_rng(1).normal(3.0, 2.0, 20000),
    "uniform": np.random.default_rng(2).uniform(-1, 1, 5000),
    "bimodal (empty buckets inside)": np.r_[np.random.default_rng(3).normal(-10, 1, 500),
                                            np.random.default_rng(4).normal(10, 1, 1500)],
    "exponential": np.random.default_rng(5).exponential(1.0, 3000),
    "constant": np.full(7, 2.5),
}


@pytest.mark.parametrize("name", list(KNOWN))
def test_compress_histogram_interpolates_within_buckets(name):
    data = KNOWN[name]
    buckets = encode.histogram_buckets(data)
    got = compress_histogram(buckets)
    assert got.shape == (9,) and np.all(np.diff(got) >= 0)
    np.testing.assert_allclose(got, interp_reference(buckets, NORMAL_HISTOGRAM_BPS), rtol=1e-12, atol=1e-12)
    assert got[0] == data.min() and got[-1] == data.max()
    width = buckets[0, 1] - buckets[0, 0]               # interpolation is exact to within one bucket
    np.testing.assert_allclose(got, np.percentile(data, np.array(NORMAL_HISTOGRAM_BPS) / 100), atol=width + 1e-12)
    tb = pytest.importorskip("tensorboard.plugins.distribution.compressor")
    assert got.tolist() == [value for _, value in tb.compress_histogram(buckets)]   # bit for bit


def test_compress_histogram_edge_cases_follow_tensorboard():
    assert compress_histogram(np.zeros((0, 3))).tolist() == [0.0] * 9
    nothing = encode.histogram_buckets(np.array([np.nan]))               # all-zero counts: the right edge
    assert compress_histogram(nothing).tolist() == [0.0] * 9
    gaps = np.array([[0, 1, 0], [1, 2, 4], [2, 3, 0], [3, 4, 4], [4, 5, 0]], float)
    got = compress_histogram(gaps, (0, 2500, 5000, 7500, 10000))
    # TensorBoard's rules: the first non-empty bucket is taken to start at the histogram's left edge (0, not 1), and
    # a basis point exactly between buckets is the start of the next non-empty one (3, not 2).
    assert got.tolist() == [0.0, 1.0, 3.0, 3.5, 5.0]


def test_compress_histogram_matches_tensorboard_on_random_buckets():
    tb = pytest.importorskip("tensorboard.plugins.distribution.compressor")
    rng = np.random.default_rng(7)
    for _ in range(300):
        k = int(rng.integers(1, 12))
        edges = np.cumsum(rng.uniform(0.1, 2.0, k + 1)) - 5
        counts = rng.integers(0, 4, k) * rng.integers(0, 2, k)          # many empty buckets, some all empty
        buckets = np.stack([edges[:-1], edges[1:], counts], 1).astype(float)
        bps = tuple(sorted(rng.choice(10000, 5, replace=False).tolist())) + (10000,)
        assert compress_histogram(buckets, bps).tolist() == [v for _, v in tb.compress_histogram(buckets, bps)]


def test_outline_and_box():
    buckets = np.array([[0, 1, 2], [1, 2, 5], [2, 4, 1]], float)
    x, y = histogram_outline(buckets)
    assert x.tolist() == [0, 0, 1, 1, 2, 2, 4, 4] and y.tolist() == [0, 2, 2, 5, 5, 1, 1, 0]
    values = np.r_[np.random.default_rng(0).normal(0, 1, 200), 30.0, -25.0, np.nan, np.inf]
    stats, outliers = box_stats(values)
    finite = values[np.isfinite(values)]
    q1, q2, q3 = np.percentile(finite, [25, 50, 75])
    assert (stats["q1"], stats["median"], stats["q3"]) == (q1, q2, q3)
    inside = finite[(finite >= q1 - 1.5 * (q3 - q1)) & (finite <= q3 + 1.5 * (q3 - q1))]
    assert stats["lower"] == inside.min() and stats["upper"] == inside.max()
    assert set(outliers.tolist()) == set(finite[(finite < inside.min()) | (finite > inside.max())].tolist())
    assert {-25.0, 30.0} <= set(outliers.tolist())


# ---------------------------------------------------------------------------------------------- histograms

def ridge_reference(items, scale):
    """The rows a card's source must hold for ``(step, buckets)`` items: every bucket of every step, in order."""
    rows = [(step, *bucket) for step, buckets in items for bucket in buckets if bucket[2] or not buckets[:, 2].any()]
    step, left, right, count = (np.array(c, float) for c in zip(*rows))
    return {"step": step, "left": left, "right": right, "count": count, "top": step - count * scale}


def assert_columns(data, expect):
    for name, column in expect.items():
        np.testing.assert_array_equal(np.asarray(data[name], float), column, err_msg=name)


def test_histogram_rows_are_the_buckets_and_new_steps_stream(logdir):
    store, view, doc = build(HistogramsView, logdir)
    c = card(view, "train", "weights")
    items = [(step, encode.histogram_buckets(normal(step))) for step in range(10)]
    peak = max(b[:, 2].max() for _, b in items)
    assert c.peak == peak * HEADROOM and c.scale == RIDGE_ROWS * 1.0 / c.peak     # steps 1 apart
    assert_columns(c.source.data, ridge_reference(items, c.scale))
    assert c.tail is None                                               # every step is in the source: no highlight
    fig = c.layout
    extent, *drawn = fig.renderers      # an undrawn glyph over the rows gives the ranges their extent at once
    assert not extent.visible and extent.data_source is c.source
    glyphs = lambda name: [r for r in fig.renderers[1:] if type(r.glyph).__name__ == name]
    offset = glyphs("Patches")
    # the ridges are outlines the page builds from the rows (see test_outline_js_draws_each_step_from_its_buckets)
    assert [r.data_source for r in offset] == c.drawing.outlines and all(r.visible for r in offset)
    assert [o.name for o in c.drawing.outlines] == ["cards-source:histograms"]
    assert not c.drawing.outlines[0].syncable and c.source.tags[0] == EXPAND_TAG
    assert len(fig.renderers) == 2 and len(fig.left) == 1 and fig.y_range.flipped   # overlay not built until shown
    assert fig.y_range.renderers == [extent] + offset
    view.mode.active = 1
    overlay = glyphs("Segment")
    assert [r.data_source for r in overlay] == [c.source] and len(fig.renderers) == 3
    assert c.layout is fig and all(r.visible for r in overlay) and not any(r.visible for r in offset)
    assert [a.visible for a in fig.left] == [False, True]                # the count axis
    assert fig.extra_y_ranges["count"].renderers == overlay
    view.mode.active = 0
    assert [a.visible for a in fig.left] == [True, False] and len(fig.renderers) == 3    # built once
    assert all(r.visible for r in offset) and not any(r.visible for r in overlay)
    # shared by the view: one colour mapper, and the parts no card keeps state in
    assert {r.glyph.fill_color["transform"] for r in offset} == {view.colors}
    other = card(view, "train", "grad").layout
    assert other.left[0].ticker is fig.left[0].ticker is view.parts.ticker
    assert other.renderers[0].view.filter is offset[0].view.filter is view.parts.all_rows
    assert other.renderers[0].data_source.selection_policy is c.source.selection_policy is view.parts.selection

    events = record(doc)
    with SummaryWriter(logdir / "train") as w:
        for step in (10, 11):
            w.add_histogram("weights", normal(step) * 0.5, step)         # no taller than before: no rescale
    store.poll()
    view.update()
    (kind, streamed), = data_events(events, c.source)
    new = [(step, encode.histogram_buckets(normal(step) * 0.5)) for step in (10, 11)]
    assert kind == "stream"
    assert_columns(streamed, ridge_reference(new, c.scale))
    assert c.tail is None
    view.update()                                                        # nothing new: nothing sent
    assert len(data_events(events, c.source)) == 1

    with SummaryWriter(logdir / "train") as w:
        w.add_histogram("weights", np.zeros(5000), 12)                  # a count past the headroom: redrawn
    store.poll()
    view.update()
    assert data_events(events, c.source)[-1] == ("replace", None)
    assert c.peak == 5000 * HEADROOM
    assert_columns(c.source.data, ridge_reference(items + new + [(12, encode.histogram_buckets(np.zeros(5000)))],
                                                   c.scale))


def test_histogram_groups_keep_the_widest_step_and_the_newest(tmp_path):
    with SummaryWriter(tmp_path) as w:
        for step in range(1003):
            values = normal(step % 7, 50)
            if step == 613:
                values[0] = 1e4                                          # a spike in one step
            w.add_histogram("h", values, step)
    store, view, _ = build(HistogramsView, tmp_path, samples={"histogram": 5000})    # every step reaches the view
    c = card(view, ".", "h")
    steps = np.unique(c.source.data["step"])
    stride = c.groups.stride
    assert MAX_STEPS // 2 <= len(steps) <= MAX_STEPS and stride == 16
    assert np.array_equal(steps // stride, np.arange(len(steps)))      # one step of each group, from the first on
    assert 613 in steps                                                  # the spike's step is never the one left out
    spike = encode.histogram_buckets(np.r_[normal(613 % 7, 50)[1:], 1e4])
    rows = np.asarray(c.source.data["step"]) == 613
    counted = spike[:, 2] > 0
    np.testing.assert_array_equal(np.asarray(c.source.data["right"])[rows], spike[counted, 1])   # drawn exactly
    np.testing.assert_array_equal(np.asarray(c.source.data["count"])[rows], spike[counted, 2])
    assert set(c.tail.data["step"]) == {1002.0}                         # the newest, while its group fills
    drawn = [(r.data_source, r.glyph.line_color) for r in c.layout.renderers[1:]]      # (0: the extent)
    assert drawn == [(c.drawing.outlines[0], "#333333"), (c.drawing.outlines[1], ALARM)]    # in red over the others
    view.mode.active = 1                                                 # the overlay draws it too
    assert [(r.data_source, r.visible) for r in c.layout.renderers][3:] == [(c.source, True), (c.tail, True)]


def test_groups_choose_the_widest_of_each_group():
    groups = Groups(8)
    widths = np.random.default_rng(3).uniform(1, 2, 100)
    for step, width in enumerate(widths):
        groups.offer((step, np.array([[0.0, width, 1.0]])))
    assert groups.stride == 16 and [s for s, _ in groups.items] == [
        16 * g + int(np.argmax(widths[16 * g:16 * g + 16])) for g in range(6)]
    assert groups.open[0] == 96 + int(np.argmax(widths[96:])) and groups.latest[0] == 99


# ---------------------------------------------------------------------------------------------- distributions

def test_distribution_bands_are_the_compressed_histograms(logdir):
    store, view, doc = build(DistributionsView, logdir)
    source = card(view, "train", "weights").source
    data = source.data
    assert list(data["step"]) == list(range(10)) and source.name == "cards-source:distributions"
    for i, step in enumerate(data["step"]):
        buckets = encode.histogram_buckets(normal(int(step)))
        row = [data[c][i] for c in COLUMNS]
        assert row == compress_histogram(buckets).tolist()
        np.testing.assert_allclose(row, interp_reference(buckets, NORMAL_HISTOGRAM_BPS), rtol=1e-12)
    assert np.isnan(data["empty"]).all()
    empty = card(view, "train", "empty").source.data
    assert all(math.isnan(empty[c][0]) for c in COLUMNS)              # nothing finite: a gap, not a band at 0
    assert empty["empty"][0] == 1.0                                   # and a red mark

    events = record(doc)
    with SummaryWriter(logdir / "train") as w:
        w.add_histogram("weights", normal(10), 10)
    store.poll()
    view.update()
    (kind, streamed), = data_events(events, source)
    assert kind == "stream" and list(streamed["step"]) == [10]
    assert [streamed[c][0] for c in COLUMNS] == compress_histogram(encode.histogram_buckets(normal(10))).tolist()


def test_distribution_groups_keep_extremes_and_empty_steps_and_reach_the_latest_step(tmp_path):
    def values(step):
        if step == 333:
            return np.array([np.nan])                                  # nothing finite
        v = normal(step % 5, 100)
        if step == 777:
            v[0] = 500.0                                               # a spike
        return v

    def write(steps):
        with SummaryWriter(tmp_path) as w:
            for step in steps:
                w.add_histogram("h", values(step), step)

    def check(source, last):
        """Every row against the steps of its group, recomputed from the logged values."""
        data, stride = source.data, card(view, ".", "h").bands.stride
        rows = len(data["step"])
        for i in range(rows):
            members = range(i * stride, min((i + 1) * stride, last + 1))
            assert data["step"][i] == (members[-1] if i == rows - 1 else members[0])
            q = np.array([compress_histogram(encode.histogram_buckets(values(s))) for s in members if s != 333])
            assert data["bp0"][i] == q[:, 0].min() and data["bp10000"][i] == q[:, -1].max()
            np.testing.assert_allclose([data[c][i] for c in COLUMNS[1:-1]], q[:, 1:-1].mean(0), rtol=1e-12)
            assert (data["empty"][i] == 1.0) == (333 in members)
        assert data["step"][-1] == last

    write(range(1201))
    store, view, doc = build(DistributionsView, tmp_path, samples={"histogram": 5000})  # every step reaches the view
    source = card(view, ".", "h").source
    assert MAX_ROWS // 2 <= len(source.data["step"]) <= MAX_ROWS
    check(source, 1200)
    assert max(source.data["bp10000"]) == 500.0                       # the spike survives the merging
    events = record(doc)
    write([1201, 1202])
    store.poll()
    view.update()
    check(source, 1202)
    write([1203])                                                     # the filling row moves to 1203
    store.poll()
    view.update()
    check(source, 1203)
    assert {type(e).__name__ for e in events if getattr(e, "model", None) is source} <= \
        {"ColumnsStreamedEvent", "ColumnsPatchedEvent"}              # never the whole source again


# ---------------------------------------------------------------------------------------------- images

def pixels_of(rgba):
    h, w = rgba.shape
    return rgba.view(np.uint8).reshape(h, w, 4)[::-1]                 # drawn bottom row first


def pixels(view_card):
    return pixels_of(view_card.source.data["image"][0])


def test_images_of_a_step_are_a_grid_and_a_tap_enlarges_one(logdir):
    store, view, doc = build(ImagesView, logdir)
    c = card(view, "train", "digits", "image")
    assert c.step.visible and c.step.value == 1 and c.step.title == "step 1"       # follows the latest step
    tiles = c.source.data                                # three images: a 2 x 2 grid, row 0 at the top
    assert [(x > 0, y > 0) for x, y in zip(tiles["x"], tiles["y"])] == [(False, True), (True, True), (False, False)]
    for k in range(3):
        got = pixels_of(tiles["image"][k])
        assert got.dtype == np.uint8 and np.array_equal(got[..., :3], image(k + 1)) and (got[..., 3] == 255).all()
    assert "3 images" in c.caption.text
    assert c.tiles.data["sample"] == [0, 1, 2]
    c.tiles.selected.indices = [2]                       # a tap on the third
    assert len(c.source.data["image"]) == 1 and np.array_equal(pixels(c)[..., :3], image(3))
    assert c.caption.text.startswith("image 3 of 3") and c.tiles.selected.indices == []
    c.tiles.selected.indices = [0]                       # a tap on it: back to the grid
    assert len(c.source.data["image"]) == 3
    c.step.value = 0
    assert np.array_equal(pixels(c)[..., :3], image(0)) and c.caption.text == ""

    events = record(doc)
    with SummaryWriter(logdir / "train") as w:
        w.add_image("digits", image(9), 2, dataformats="HWC")
    store.poll()
    view.update()
    assert c.step.end == 2 and c.step.value == 0                       # the user looks back: the card stays there
    assert data_events(events, c.source) == []
    c.step.value = 2
    assert np.array_equal(pixels(c)[..., :3], image(9))


# ---------------------------------------------------------------------------------------------- text

def test_text_renders_markdown_and_tables(logdir):
    store, view, doc = build(TextView, logdir)
    c = card(view, "train", "notes", "text")
    newest, oldest = [div.text for div in c.entries.children]
    assert "step 0" in oldest and "<h1>Title</h1>" in oldest and "<strong>bold</strong>" in oldest
    assert "<code>code</code>" in oldest
    assert "step 1" in newest and newest.count("<tr>") == 2 and "<em>b</em>" in newest
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in newest and "<script" not in newest
    events = record(doc)
    with SummaryWriter(logdir / "train") as w:
        w.add_text("notes", "third", 2)
    store.poll()
    view.update()
    assert "third" in c.entries.children[0].text and len(c.entries.children) == 3
    assert not [e for e in events if isinstance(e, ModelChangedEvent) and isinstance(e.model, Div)
                and e.attr == "text"]                                 # old entries are not sent again
    cube = render_text(np.full((2, 2, 2), "x"))
    assert "first 2-D slice" in cube and cube.count("<tr>") == 2


# ---------------------------------------------------------------------------------------------- anomalies

def test_anomalies_of_exception_projector_samples(logdir):
    store, view, doc = build(AnomaliesView, logdir)
    c = view._cards[("exception", "train", "bad_batch")]
    assert not view.empty.visible
    box = c.box.data
    assert box["step"] == [3, 8]
    for i, step in enumerate(box["step"]):
        t = exception_tensor(step)
        finite = t[np.isfinite(t)]
        q1, q2, q3 = np.percentile(finite, [25, 50, 75])
        assert (box["q1"][i], box["median"][i], box["q3"][i]) == (q1, q2, q3)
        fence = 1.5 * (q3 - q1)
        inside = finite[(finite >= q1 - fence) & (finite <= q3 + fence)]
        assert (box["lower"][i], box["upper"][i]) == (inside.min(), inside.max())
        outliers = [v for s, v in zip(c.outliers.data["step"], c.outliers.data["value"]) if s == step]
        assert sorted(outliers) == sorted(finite[(finite < inside.min()) | (finite > inside.max())].tolist())
        assert 40.0 + step in outliers
    counts = c.counts.data
    assert counts["step"] == [3, 8] and counts["nan"] == [2, 2] and counts["inf"] == [3, 3]
    assert counts["total"] == [5, 5]

    # the heat map follows the latest step: the exact tensor, NaN and ±Inf kept for the colour mapper
    assert c.select.options == ["3", "8"] and c.select.value == "8"
    heat = c.heat_source.data["image"][0]
    np.testing.assert_array_equal(heat, exception_tensor(8))
    finite = exception_tensor(8)[np.isfinite(exception_tensor(8))]
    assert (c.mapper.low, c.mapper.high) == (finite.min(), finite.max())
    assert len({c.mapper.nan_color, c.mapper.high_color, c.mapper.low_color}) == 3
    c.select.value = "3"
    np.testing.assert_array_equal(c.heat_source.data["image"][0], exception_tensor(3))

    # a new sample rewrites the projector config: only the new step is streamed
    events = record(doc)
    Projector(logdir / "train").exception_projector(value=exception_tensor(12), tag="bad_batch", step=12)
    store.poll()                                    # the store reads the rewritten config
    view.update()
    streams = data_events(events, c.box)
    assert [(kind, d["step"]) for kind, d in streams] == [("stream", [12])]
    assert c.select.options == ["3", "8", "12"] and c.select.value == "3"    # the user's choice is kept


def test_anomalies_of_histograms_scalars_and_tensors(logdir):
    store, view, doc = build(AnomaliesView, logdir)
    keys = set(view._cards)
    assert ("histogram", "train", "grad") in keys and ("scalar", "train", "loss") in keys
    assert ("tensor", "train", "activations") in keys
    assert ("histogram", "train", "weights") not in keys and ("tensor", "train", "finite") not in keys

    grad = view._cards[("histogram", "train", "grad")]
    counts = grad.counts.data
    assert counts["step"] == [5, 6, 7, 8, 9] and counts["nan"] == [5, 6, 7, 8, 9] and counts["inf"] == [2] * 5
    assert grad.box.data["step"] == list(range(10))                     # the whole history, for context
    buckets = encode.histogram_buckets(normal(50, 200))
    q = compress_histogram(buckets, (0, 2500, 5000, 7500, 10000))
    assert [grad.box.data[k][0] for k in ("q1", "median", "q3")] == q[1:4].tolist()
    assert grad.box.data["lower"][0] >= buckets[0, 0] and grad.box.data["upper"][0] <= buckets[-1, 1]

    loss = view._cards[("scalar", "train", "loss")].counts.data
    assert loss["step"] == [7] and loss["nan"] == [1] and loss["inf"] == [0]

    act = view._cards[("tensor", "train", "activations")]
    assert act.box.data["step"] == [0, 1, 2, 3] and act.counts.data["nan"] == [0, 0, 1, 0]
    assert np.isnan(act.heat_source.data["image"][0]).sum() == 0      # latest step (3) is finite
    act.select.value = "2"
    shown = act.heat_source.data["image"][0]
    assert np.isnan(shown[1, 2]) and np.isnan(shown).sum() == 1

    events = record(doc)
    with SummaryWriter(logdir / "train") as w:
        for step in (10, 11):
            w.add_histogram("grad", np.r_[normal(step, 100), np.nan], step)
    store.poll()
    view.update()
    (kind, streamed), = data_events(events, grad.counts)
    assert kind == "stream" and streamed["step"] == [10, 11] and streamed["nan"] == [1, 1]
    (kind, streamed), = data_events(events, grad.box)
    assert kind == "stream" and streamed["step"] == [10, 11]


def test_a_histogram_with_nan_and_no_inf_gets_its_counts_at_once(tmp_path):
    with SummaryWriter(tmp_path / "run") as w:          # inf_count (0) comes before nan_count, which makes the card
        for step in range(3):
            w.add_histogram("w", np.r_[normal(step, 50), [np.nan] * step], step)
    _, view, _ = build(AnomaliesView, tmp_path)
    counts = view._cards[("histogram", "run", "w")].counts.data
    assert counts["step"] == [1, 2] and counts["nan"] == [1, 2] and counts["inf"] == [0, 0]


def test_no_anomalies_found(tmp_path):
    with SummaryWriter(tmp_path) as w:
        w.add_histogram("w", normal(0), 0)
        w.add_scalar("loss", 1.0, 0)
        w.add_scalar("other/nan_count", 0.0, 0)          # counts that stay 0 are no anomaly
    store, view, _ = build(AnomaliesView, tmp_path)
    assert view.empty.visible and "No anomalies found" in view.empty.text and not view._cards


def test_heat_map_reduction_keeps_anomalies():
    m = np.arange(1000.0 * 600).reshape(1000, 600)
    m[10, 10], m[500, 3], m[999, 599] = np.nan, np.inf, -np.inf
    cells = heat_cells(m)
    assert cells.shape == (200, 200)
    assert np.isnan(cells[2, 3]) and cells[100, 1] == np.inf and cells[199, 199] == -np.inf
    assert np.isfinite(cells).sum() == cells.size - 3
    assert cells[0, 0] == m[:5, :3].mean()


# ---------------------------------------------------------------------------------------------- escaping

class _Checker(html.parser.HTMLParser):
    """Collects every element and attribute that could run code or fetch something."""
    SAFE_TAGS = {"b", "span", "div", "p", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "code", "pre", "ul",
                 "ol", "li", "table", "thead", "tbody", "tr", "th", "td", "a", "br", "hr", "blockquote"}

    def __init__(self):
        super().__init__()
        self.problems = []

    def handle_starttag(self, tag, attrs):
        if tag not in self.SAFE_TAGS:
            self.problems.append(tag)
        for name, value in attrs:
            if name.startswith("on") or (name == "href" and not str(value).startswith(("http://", "https://"))):
                self.problems.append(f"{tag} {name}={value}")


def test_nothing_from_a_log_becomes_markup(tmp_path):
    hostile_dir = tmp_path / HOSTILE_RUN
    with SummaryWriter(hostile_dir) as w:
        for tag in HOSTILE:         # a tag has one plugin per run (as in TensorBoard): one tag per kind
            w.add_histogram(tag, np.r_[normal(0, 50), np.nan], 0)
            w.add_image(tag + " (image)", image(0), 0, dataformats="HWC")
            w.add_text(tag + " (text)", "\n\n".join(HOSTILE + ["<a href='javascript:alert(1)'>x</a>", "$$x$$"]), 0)
            w.add_text(tag + " (text)", np.array(HOSTILE), 1)
    Projector(hostile_dir).exception_projector(value=exception_tensor(0), tag=HOSTILE[0], step=0)
    divs = []
    for view_class in (HistogramsView, DistributionsView, ImagesView, TextView, AnomaliesView):
        store, view, doc = build(view_class, tmp_path)
        assert len(view._cards) >= len(HOSTILE)
        divs += [m for m in doc.models if isinstance(m, Div)]
    for div in divs:
        checker = _Checker()
        checker.feed(div.text)
        assert checker.problems == [], div.text
        assert div.disable_math or not div.text
    texts = " ".join(d.text for d in divs)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in texts and "&lt;img src=x onerror=alert(1)&gt;" in texts


def test_views_are_empty_but_alive_without_data(tmp_path):
    for view_class in (HistogramsView, DistributionsView, ImagesView, TextView, AnomaliesView):
        store, view, _ = build(view_class, tmp_path)
        assert view.empty.visible and view.title
        view.update()
