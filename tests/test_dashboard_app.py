"""The dashboard without a browser: session documents built on a bare ``Document`` over a fixture logdir, the
scalars view's data (downsampling, streaming, smoothing, filters, escaping), and ``flowlab serve`` / ``flowlab demo``
run as commands."""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from bokeh.document import Document
from bokeh.models import ColumnDataSource, Div, Tabs

from flowlab.dashboard import app
from flowlab.dashboard.store import Store
from flowlab.dashboard.views import VIEWS
from flowlab.dashboard.views.scalars import LIMIT, X_AXES, ema, smooth
from flowlab.summary.thinning import downsample
from flowlab.summary import SummaryWriter

LONG = 5000          # points of the "loss" tag: more than LIMIT, so it is downsampled


def loss_curve(n, run_offset=0.0):
    i = np.arange(n)
    curve = np.exp(-i / 1500) + 0.05 * np.sin(i * 0.7) + run_offset
    return curve.astype(np.float32).astype(np.float64)           # as event files store scalars


def write_fixture(logdir):
    for k, run in enumerate(("a", "b")):
        with SummaryWriter(logdir / run) as w:
            for i, v in enumerate(loss_curve(LONG, 0.1 * k)):
                w.add_scalar("loss", float(v), i, walltime=1000.0 + i)
            for i in range(20):
                w.add_scalar("acc", i / 20, i * 100, walltime=1000.0 + i * 100)
    return logdir


@pytest.fixture
def logdir(tmp_path):
    return write_fixture(tmp_path)


def session(logdir):
    """A store read once, and one session's document over it."""
    store = Store(logdir)
    store.poll()
    doc = Document()
    views = app.build_document(doc, store)
    return store, doc, views


def refresh(doc):
    """Run the session's periodic callback once, as the server's IOLoop would."""
    (callback,) = doc.session_callbacks
    callback.callback()


def tEMA(values, weight):
    """TensorBoard's smoothing, transcribed: debiased EMA; constant series and non-finite values pass through."""
    out, last, count = [], 0.0, 0
    constant = all(v == values[0] for v in values)
    for v in values:
        if constant or not np.isfinite(v):
            out.append(v)
            continue
        last = last * weight + (1 - weight) * v
        count += 1
        out.append(last / (1 - weight ** count) if weight != 1 else last)
    return np.array(out)


# ----------------------------------------------------------------------------------------------------- document

def test_document_has_status_line_and_a_tab_per_registered_view(logdir):
    store, doc, views = session(logdir)
    tabs = doc.select_one({"type": Tabs})
    assert [p.name for p in tabs.tabs] == [name for name, _ in VIEWS]
    assert set(views) == {"scalars"}                                  # the others are made when first shown
    for index in range(len(VIEWS)):
        tabs.active = index
    assert set(views) == {name for name, _ in VIEWS}
    status = doc.select_one({"name": "status"}).text
    assert "2 runs" in status and "2 files" in status and "0 skipped (bad CRC)" in status
    records = int(re.search(r"([\d,]+) records read", status).group(1).replace(",", ""))
    assert records >= 2 * (LONG + 20)
    scalars = views["scalars"]
    assert sorted(scalars.cards) == ["acc", "loss"]
    assert sorted(scalars.cards["loss"].lines) == ["a", "b"]


def test_a_view_that_fails_to_build_becomes_an_error_tab(logdir):
    class Broken:
        title = "Broken"

        def __init__(self, store):
            raise RuntimeError("<b>boom</b>")

    store = Store(logdir)
    store.poll()
    doc = Document()
    views = app.build_document(doc, store, views=VIEWS + [("broken", Broken)])
    tabs = doc.select_one({"type": Tabs})
    tabs.active = len(VIEWS)
    assert "broken" not in views and "scalars" in views
    text = tabs.tabs[-1].child.children[0].text
    assert "&lt;b&gt;boom&lt;/b&gt;" in text and "<b>boom" not in text


def test_long_series_are_downsampled_keeping_ends_and_extremes(logdir):
    _, _, views = session(logdir)
    line = views["scalars"].cards["loss"].lines["a"]
    data = line.data
    values = loss_curve(LONG)
    assert 100 < len(data["step"]) <= LIMIT
    steps = data["step"].astype(int)
    assert steps[0] == 0 and steps[-1] == LONG - 1 and np.all(np.diff(steps) > 0)
    np.testing.assert_allclose(data["value"], values[steps])
    assert data["value"].max() == values.max() and data["value"].min() == values.min()
    np.testing.assert_allclose(data["wall"], (1000.0 + steps) * 1000)          # datetime axis: milliseconds
    np.testing.assert_allclose(data["rel"], steps / 3600)                      # hours since the first point
    short = views["scalars"].cards["acc"].lines["b"].data                      # short series: every point
    assert list(short["step"]) == [i * 100 for i in range(20)]


def test_downsample_keeps_bucket_extremes():
    rng = np.random.default_rng(0)
    values = rng.normal(size=100_000)
    values[54_321] = 50.0                                         # a spike survives
    values[7] = np.nan
    idx = downsample(np.arange(len(values)), values, 2000)
    assert len(idx) <= 2001 and idx[0] == 0 and idx[-1] == len(values) - 1    # 4 a bucket, and the NaN
    assert 54_321 in idx and 7 in idx and np.all(np.diff(idx) > 0)
    assert list(downsample(np.arange(10), values[:10], 2000)) == list(range(10))
    buckets = np.arange(len(values)) // (len(values) // 500)                    # every pixel bucket keeps its
    for b in (0, 137, 499):                                                     # min and max
        inside = idx[buckets[idx] == b]
        window = values[buckets == b]
        assert np.nanmax(values[inside]) == np.nanmax(window) and np.nanmin(values[inside]) == np.nanmin(window)


def flat_row(card, run):
    """``run``'s shown points as the server sent them: its slice of the card's flat columns."""
    rows = card.rows.data
    i = list(rows["run"]).index(run)
    return {c: np.asarray(v)[rows["start"][i]:rows["stop"][i]] for c, v in card.flat.data.items()}


def test_appending_resends_only_the_card_that_grew(logdir):
    store, doc, views = session(logdir)
    acc, loss = views["scalars"].cards["acc"], views["scalars"].cards["loss"]
    before = len(acc.lines["a"].data["step"])
    acc_data, loss_data = acc.flat.data, loss.flat.data
    with SummaryWriter(logdir / "a") as w:
        for i in range(20, 23):
            w.add_scalar("acc", i / 20, i * 100, walltime=1000.0 + i * 100)
    store.poll()
    refresh(doc)
    assert loss.flat.data is loss_data                                # the other card sends nothing
    assert acc.flat.data is not acc_data
    row = flat_row(acc, "a")
    assert list(row["steps"][-3:]) == [2000.0, 2100.0, 2200.0] and len(row["steps"]) == before + 3
    np.testing.assert_allclose(row["smooth"], tEMA([i / 20 for i in range(23)], 0.6))
    np.testing.assert_allclose(flat_row(acc, "b")["ys"], [i / 20 for i in range(20)])
    sent = acc.flat.data
    refresh(doc)                                                      # nothing new: nothing sent
    assert acc.flat.data is sent


def test_new_runs_and_tags_appear_without_a_new_session(logdir):
    store, doc, views = session(logdir)
    with SummaryWriter(logdir / "c") as w:
        w.add_scalar("loss", 1.0, 0)
        w.add_scalar("grad_norm", 2.0, 0)
    store.poll()
    refresh(doc)
    cards = views["scalars"].cards
    assert "c" in cards["loss"].lines and "grad_norm" in cards
    # the new tag goes last in its group: the cards on screen do not move
    assert [c.name for c in views["scalars"].groups[""].grid.children] == ["card:acc", "card:loss", "card:grad_norm"]
    data = cards["loss"].rows.data
    assert sorted(data["run"]) == ["a", "b", "c"]
    colours = dict(zip(data["run"], data["colour"]))
    assert colours["c"] not in (colours["a"], colours["b"])        # a new run gets its own colour
    other = app.build_document(Document(), store)["scalars"]         # ... and the same in every session
    assert dict(zip(other.cards["loss"].rows.data["run"], other.cards["loss"].rows.data["colour"])) == colours
    dots = cards["grad_norm"].rows.data                              # a one-point series shows as a dot
    assert list(dots["run"]) == ["c"] and dots["dot_y"] == [2.0] and dots["dot_x"] == [float(dots["x0"][0])]
    assert [type(r.glyph).__name__ for r in cards["grad_norm"].figure.renderers][-1] == "Scatter"


def cielab(hex_colours):
    """CIELAB coordinates of ``#rrggbb`` colours (sRGB, D65): distances there are perceived differences (ΔE)."""
    rgb = np.array([[int(c[i:i + 2], 16) for i in (1, 3, 5)] for c in hex_colours]) / 255.0
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = linear @ np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]).T
    f = xyz / [0.95047, 1.0, 1.08883]
    f = np.where(f > (6 / 29) ** 3, np.cbrt(f), f / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[:, 1] - 16, 500 * (f[:, 0] - f[:, 1]), 200 * (f[:, 1] - f[:, 2])], axis=1)


def test_runs_get_colours_that_look_different_from_every_other_run():
    from flowlab.dashboard.runs import palette_colour
    for n, least in ((20, 20.0), (60, 10.0)):          # ΔE 2 is a just-noticeable difference
        lab = cielab([palette_colour(i) for i in range(n)])
        distance = np.linalg.norm(lab[:, None] - lab[None], axis=2)
        distance[np.diag_indices(n)] = np.inf
        assert distance.min() > least, (n, distance.min())


def test_nan_and_inf_points_get_a_red_tick_and_break_the_line(tmp_path):
    values = np.linspace(0, 1, 10_000)
    values[1234], values[8765] = np.nan, np.inf
    with SummaryWriter(tmp_path / "r") as w:
        for i, v in enumerate(values):
            w.add_scalar("x", float(v), i)
    _, _, views = session(tmp_path)
    card = views["scalars"].cards["x"]
    marks = card.marks.data
    assert marks["steps"] == [1234.0, 8765.0] and marks["what"] == ["NaN", "+Inf"] and marks["run"] == ["r", "r"]
    ys = flat_row(card, "r")["ys"]
    assert np.isnan(ys).sum() == 2 and not np.isinf(ys).any()       # both drawn as gaps
    # the ticks are drawn under the lines and see-through: they do not hide another run's line at those steps
    (ticks,) = [r for r in card.figure.renderers if type(r.glyph).__name__ == "VSpan"]
    assert ticks.level == "underlay" and ticks.glyph.line_alpha <= 0.5
    assert [r.level for r in card.renderers] == ["glyph", "glyph"]


def test_zoom_sends_the_exact_points_of_the_visible_range(logdir):
    _, _, views = session(logdir)
    scalars = views["scalars"]
    card = scalars.cards["loss"]

    class Event:
        x0, x1 = 1000.0, 1500.0

    scalars._zoomed(card, Event)
    steps = card.lines["a"].data["step"].astype(int)
    inside = steps[(steps >= 1000) & (steps <= 1500)]
    assert list(inside) == list(range(1000, 1501))                    # every point of the window
    assert steps[0] == 0 and steps[-1] == LONG - 1 and len(steps) <= 2 * LIMIT   # the overview stays around it
    np.testing.assert_allclose(card.lines["a"].data["value"], loss_curve(LONG)[steps])
    np.testing.assert_allclose(flat_row(card, "a")["steps"], steps)          # what the page gets

    class Everything:
        x0, x1 = -10.0, LONG + 10.0

    scalars._zoomed(card, Everything)
    assert len(card.lines["a"].data["step"]) <= LIMIT + 1


# ----------------------------------------------------------------------------------------------------- smoothing

@pytest.mark.parametrize("weight", [0.0, 0.3, 0.6, 0.9, 0.99, 0.999])
def test_ema_is_tensorboards_debiased_ema(weight):
    rng = np.random.default_rng(1)
    values = np.cumsum(rng.normal(size=3000)) + 100
    values[[10, 500]] = np.nan
    values[700] = np.inf
    np.testing.assert_allclose(smooth(values, weight), tEMA(values, weight), rtol=1e-9, atol=1e-9)
    # carried forward in pieces, as streamed points are
    first, state = ema(values[:1234], weight)
    rest, _ = ema(values[1234:], weight, state)
    np.testing.assert_allclose(np.concatenate([first, rest]), tEMA(values, weight), rtol=1e-9, atol=1e-9)


def test_constant_series_is_not_smoothed():
    np.testing.assert_array_equal(smooth(np.full(50, 3.0), 0.9), np.full(50, 3.0))


def test_smoothing_slider_resmooths_every_line(logdir):
    _, _, views = session(logdir)
    scalars = views["scalars"]
    line = scalars.cards["loss"].lines["b"]
    steps = line.data["step"].astype(int)
    np.testing.assert_allclose(line.data["smooth"], tEMA(loss_curve(LONG, 0.1), 0.6)[steps])
    scalars.smoothing.value = 0.95
    scalars._resmooth()                 # what a browser's value_throttled change calls
    np.testing.assert_allclose(line.data["smooth"], tEMA(loss_curve(LONG, 0.1), 0.95)[steps])
    np.testing.assert_allclose(flat_row(scalars.cards["loss"], "b")["smooth"], tEMA(loss_curve(LONG, 0.1), 0.95)[steps])


# ----------------------------------------------------------------------------------------------------- filters

def test_the_run_list_chooses_the_runs_every_tab_shows(tmp_path):
    from bokeh.events import ButtonClick
    for run in ("a", "b", "c"):
        with SummaryWriter(tmp_path / run) as w:
            for i in range(3):
                w.add_scalar("loss", float(i), i)
                w.add_histogram("w", np.arange(10.0) + i, i)
    _, doc, views = session(tmp_path)
    tabs = doc.select_one({"name": "tabs"})
    tabs.active = [panel.name for panel in tabs.tabs].index("histograms")       # opens the tab
    scalars, histograms = views["scalars"], views["histograms"]
    runs = scalars.runs
    assert runs is histograms.runs and list(runs.source.data["run"]) == ["a", "b", "c"]
    assert list(runs.source.data["colour"]) == [scalars.cards["loss"].lines[r].colour for r in "abc"]
    card = scalars.cards["loss"]

    def shown():            # each tab as it is shown (a tab not shown is brought up to date when shown again)
        tabs.active = [panel.name for panel in tabs.tabs].index("scalars")
        kept = card.renderers[0].view.filter.indices
        lines = [card.rows.data["run"][i] for i in (range(3) if kept is None else kept)]
        tabs.active = [panel.name for panel in tabs.tabs].index("histograms")
        cards = sorted(run for run, _, _ in histograms._cards)
        assert lines == cards, (lines, cards)                  # the same runs on both tabs
        return "".join(lines)

    assert shown() == "abc" and runs.summary.text == "3 of 3 runs shown"
    runs.source.selected.indices = [0, 2]                      # b unchecked in the page
    assert shown() == "ac" and runs.summary.text == "2 of 3 runs shown"
    runs.search.value = "^(b|c)$"                              # shown: checked and matching
    assert shown() == "c" and list(runs.view.filter.indices) == [1, 2]
    runs.check_all._trigger_event(ButtonClick(runs.check_all))  # checks the runs the search shows
    assert shown() == "bc" and sorted(runs.source.selected.indices) == [0, 1, 2]
    runs.search.value = "(unclosed"
    assert "Invalid regex" in runs.summary.text and shown() == "bc"      # the last good search stays
    runs.search.value = "c"
    runs.check_none._trigger_event(ButtonClick(runs.check_none))
    assert not histograms._cards                                               # c unchecked: nothing shown
    tabs.active = [panel.name for panel in tabs.tabs].index("scalars")
    assert list(card.renderers[0].view.filter.indices) == []
    tabs.active = [panel.name for panel in tabs.tabs].index("histograms")
    assert "None of the checked runs" in histograms.empty.text and histograms.empty.visible
    runs.search.value = ""
    assert shown() == "ab" and runs.summary.text == "2 of 3 runs shown"
    runs.check_only(["c", "nonesuch"])                         # as another tab asks (HParams sessions)
    assert shown() == "c" and runs.summary.text == "1 of 3 runs shown"


def test_hparams_and_anomalies_follow_the_run_list(tmp_path):
    for run, lr in (("a", 0.1), ("b", 0.01)):
        with SummaryWriter(tmp_path / run) as w:
            w.add_scalar("loss", float("nan"), 0)
            w.add_hparams({"lr": lr}, {"hparams/acc": 0.5})
    _, doc, views = session(tmp_path)
    tabs = doc.select_one({"name": "tabs"})
    for name in ("anomalies", "hparams"):
        tabs.active = [panel.name for panel in tabs.tabs].index(name)
    anomalies, hparams = views["anomalies"], views["hparams"]
    assert sorted(hparams.table_source.data["run"]) == ["a", "b"]
    runs = hparams.runs
    runs.source.selected.indices = [list(runs.source.data["run"]).index("b")]
    assert hparams.table_source.data["run"] == ["b"]
    tabs.active = [panel.name for panel in tabs.tabs].index("anomalies")     # (brought up to date when shown)
    assert {run: card.layout.visible for (_, run, _), card in anomalies._cards.items()} == {"a": False, "b": True}
    runs.source.selected.indices = []
    assert anomalies.empty.visible
    tabs.active = [panel.name for panel in tabs.tabs].index("hparams")
    assert hparams.table_source.data["run"] == []


def test_projector_legend_is_beside_the_points_in_label_order_with_distinct_colours(tmp_path):
    from flowlab.dashboard.views.projector import ProjectorView
    labels = [str(i % 12) for i in range(60)][::-1]              # first seen: 11, 10, 9, ...
    with SummaryWriter(tmp_path / "run") as w:
        w.add_embedding(np.random.default_rng(0).normal(size=(60, 5)), metadata=labels, tag="feat")
    store = Store(tmp_path)
    store.poll()
    view = ProjectorView(store)
    view.update()
    assert view.legend in view.front.right and view.legend not in view.front.center
    items = view.legend.items
    assert [item.label.value for item in items] == [str(i) for i in range(12)]
    colours = [view.source.data["color"][item.index] for item in items]
    assert all(view.source.data["category"][item.index] == item.label.value for item in items)
    lab = cielab(colours)
    distance = np.linalg.norm(lab[:, None] - lab[None], axis=2)
    distance[np.diag_indices(len(colours))] = np.inf
    assert distance.min() > 20


def test_projector_with_nothing_to_show_is_one_line(tmp_path):
    from flowlab.dashboard.views.projector import ProjectorView
    with SummaryWriter(tmp_path / "run") as w:
        w.add_scalar("loss", 1.0, 0)
    store = Store(tmp_path)
    store.poll()
    view = ProjectorView(store)
    view.update()
    assert not view.controls.visible and not view.front.visible and not view.side.visible
    assert view.note.text == "No embeddings in this logdir yet."
    with SummaryWriter(tmp_path / "run") as w:
        w.add_embedding(np.eye(4), metadata=list("abcd"), tag="feat")
    store.poll()                                        # the store reads the new projector config
    view.update()
    assert view.controls.visible and view.front.visible
    view.runs = type("NoRun", (), {"shown": staticmethod(lambda: frozenset()), "shows": staticmethod(lambda r: False)})()
    view.update()
    assert not view.front.visible and view.note.text == "No embeddings of the checked runs."


def test_new_runs_arrive_checked_with_their_own_colour(tmp_path):
    write_fixture(tmp_path)
    store, doc, views = session(tmp_path)
    runs = views["scalars"].runs
    runs.source.selected.indices = [1]                         # only b
    with SummaryWriter(tmp_path / "c") as w:
        w.add_scalar("loss", 1.0, 0)
    store.poll()
    refresh(doc)
    assert list(runs.source.data["run"]) == ["a", "b", "c"] and sorted(runs.source.selected.indices) == [1, 2]
    assert len(set(runs.source.data["colour"])) == 3


def test_tags_are_grouped_by_prefix_in_folding_groups_that_never_reorder(tmp_path):
    from bokeh.events import ButtonClick
    with SummaryWriter(tmp_path / "a") as w:
        for tag in ("train/loss", "test/loss", "loss", "train/acc"):
            w.add_scalar(tag, 1.0, 0)
    store, doc, views = session(tmp_path)
    scalars = views["scalars"]

    def layout():
        return [(group.toggle.label, [card.name.removeprefix("card:") for card in group.grid.children])
                for group in (next(g for g in scalars.groups.values() if g.layout is child)
                              for child in scalars.grid.children)]

    assert layout() == [("▾ top level  (1)", ["loss"]), ("▾ test  (1)", ["test/loss"]),
                        ("▾ train  (2)", ["train/acc", "train/loss"])]
    with SummaryWriter(tmp_path / "a") as w:
        for tag in ("train/lr", "eval/acc", "aaa"):
            w.add_scalar(tag, 1.0, 1)
    store.poll()
    refresh(doc)
    assert layout() == [("▾ top level  (2)", ["loss", "aaa"]), ("▾ test  (1)", ["test/loss"]),
                        ("▾ train  (3)", ["train/acc", "train/loss", "train/lr"]), ("▾ eval  (1)", ["eval/acc"])]
    train = scalars.groups["train"]
    train.toggle._trigger_event(ButtonClick(train.toggle))
    assert not train.grid.visible and train.toggle.label == "▸ train  (3)"
    scalars.tag_filter.value = "^train/"
    assert [g.name for g in scalars.groups.values() if g.layout.visible] == ["train"]


def test_constant_and_single_point_cards_get_a_sane_y_span_and_outliers_can_be_ignored(tmp_path):
    values = 1 + 0.01 * np.sin(np.arange(200.0))
    values[77] = 1e6                                            # one spike
    with SummaryWriter(tmp_path / "a") as w:
        for i, v in enumerate(values):
            w.add_scalar("spiky", float(v), i)
            w.add_scalar("constant", 0.97, i)
        w.add_scalar("once", 0.5, 3)
    _, _, views = session(tmp_path)
    scalars = views["scalars"]
    cards = scalars.cards
    assert cards["constant"].y_range.default_span == pytest.approx(0.194)   # 0.97 ± 10%, not ±1
    assert cards["once"].y_range.default_span == pytest.approx(0.1)
    assert cards["spiky"].y_range.default_span == 2.0                    # BokehJS's own rule where the data spans
    scalars.outliers.active = True
    spiky = cards["spiky"].y_range
    assert type(spiky).__name__ == "Range1d" and 0.95 < spiky.start < 0.99 and 1.01 < spiky.end < 1.05
    assert cards["spiky"].marks.data["steps"] == [] and max(flat_row(cards["spiky"], "a")["ys"]) == 1e6  # still drawn
    scalars.outliers.active = False
    assert type(cards["spiky"].y_range).__name__ == "DataRange1d"
    scalars.log_x.active = True
    assert type(cards["spiky"].layout.children[0].x_scale).__name__ == "LogScale"
    scalars.log_x.active = False
    scalars.x_axis.active = 1
    axis = cards["spiky"].layout.children[0].xaxis[0]
    assert type(axis.formatter).__name__ == "CustomJSTickFormatter" and axis.axis_label.startswith("time since")


def exported_file(scalars):
    """The file the server streams for the export the Scalars tab last registered (its link in ``export``)."""
    from flowlab.dashboard.export_stream import EXPORTS, export_chunks
    token, fmt = scalars.export.data["url"][0].rsplit("/", 1)[1].split(".")
    return "".join(export_chunks(EXPORTS.take(token, scalars.store, fmt).columns, fmt))


def test_download_all_gives_every_shown_series_in_full(logdir):
    from bokeh.events import ButtonClick
    _, _, views = session(logdir)
    scalars = views["scalars"]
    runs = scalars.runs
    runs.check_only(["b"])
    scalars.tag_filter.value = "loss"
    csv_button, json_button = scalars.export_buttons
    csv_button._trigger_event(ButtonClick(csv_button))
    url = scalars.export.data["url"][0]
    assert url.startswith("export/scalars/") and url.endswith(".csv")
    lines = exported_file(scalars).splitlines()
    expected = loss_curve(LONG, 0.1)                          # b's loss: more points than a card shows (LIMIT)
    assert LONG > LIMIT and lines[0] == "run,tag,step,wall_time,value" and len(lines) == 1 + LONG
    assert lines[1].startswith('"b","loss",0,1000.0,') and scalars.export.data["name"] == ["scalars.csv"]
    np.testing.assert_allclose([float(line.rsplit(",", 1)[1]) for line in lines[1:]], expected, rtol=1e-6)
    json_button._trigger_event(ButtonClick(json_button))
    (series,) = json.loads(exported_file(scalars))
    assert (series["run"], series["tag"], len(series["value"])) == ("b", "loss", LONG)
    first = scalars.export.data["n"]
    json_button._trigger_event(ButtonClick(json_button))       # the same file again still reaches the page
    assert scalars.export.data["n"] != first


def test_exported_text_keeps_nan_and_inf():
    from flowlab.dashboard.views.scalars import export_text
    columns = [("r", 't"q', [0, 1, 2], [1.5, 2.5, 3.5], np.array([np.nan, np.inf, -1.0]))]
    assert export_text(columns, "csv").splitlines()[1:] == ['"r","t""q",0,1.5,nan', '"r","t""q",1,2.5,inf',
                                                            '"r","t""q",2,3.5,-1.0']
    assert json.loads(export_text(columns, "json"))[0]["value"] == ["NaN", "Infinity", -1.0]


def test_group_band_is_numpy_over_the_runs_that_logged_each_step():
    from flowlab.plots.data import group_band
    rng = np.random.default_rng(3)
    members = [(np.arange(0, 50), rng.normal(size=50)), (np.arange(10, 60), rng.normal(size=50) + 1e6),
               (np.arange(0, 60, 2), rng.normal(size=30))]
    members[0][1][7] = np.nan                                    # a NaN step of one run: the others still count
    steps, mean, std, low, high, count = group_band(members)
    assert steps.tolist() == list(range(60))
    for k, step in enumerate(steps):
        values = [v[s.tolist().index(step)] for s, v in members if step in s]
        values = np.array([v for v in values if np.isfinite(v)])
        assert count[k] == len(values)
        if not len(values):                                      # step 7: only the NaN
            assert np.isnan([mean[k], std[k], low[k], high[k]]).all()
            continue
        np.testing.assert_allclose([mean[k], std[k], low[k], high[k]],
                                   [values.mean(), values.std(), values.min(), values.max()], rtol=1e-12, atol=1e-9)


def test_run_groups_draw_mean_and_band_and_hide_their_runs(tmp_path):
    rng = np.random.default_rng(0)
    values = {}
    for lr in ("0.1", "0.01"):
        for seed in range(3):
            run = f"lr={lr},seed={seed}"
            values[run] = rng.normal(size=40) + float(lr) * 10
            with SummaryWriter(tmp_path / run) as w:
                for i, v in enumerate(values[run]):
                    w.add_scalar("loss", float(v), i)
    with SummaryWriter(tmp_path / "baseline") as w:
        for i in range(40):
            w.add_scalar("loss", 0.5, i)
    _, _, views = session(tmp_path)
    scalars = views["scalars"]
    scalars.smoothing.value = 0.0
    scalars._resmooth()
    grouping = scalars.runs.grouping                            # chosen beside the run list
    grouping.by.value = "name"
    grouping.pattern.value = "lr=([^,]+)"
    card = scalars.cards["loss"]
    bands = card.bands.data
    assert sorted(bands["group"]) == ["0.01", "0.1"] and bands["runs"] == [3, 3]
    for group, mean, band_ys in zip(bands["group"], bands["ys"], bands["band_ys"]):
        members = np.array([values[f"lr={group},seed={seed}"] for seed in range(3)])
        members = members.astype(np.float32).astype(np.float64)            # as logged: float32
        np.testing.assert_allclose(mean, members.mean(axis=0), rtol=1e-9)
        np.testing.assert_allclose(band_ys[:40], members.mean(axis=0) + members.std(axis=0), rtol=1e-9)
    shown_lines = [card.rows.data["run"][i] for i in card.renderers[0].view.filter.indices]
    assert shown_lines == ["baseline"]                          # grouped runs are drawn as their group
    grouping.band_choice.active = 1                                      # min-max
    group = card.bands.data["group"].index("0.1")
    members = np.array([values[f"lr=0.1,seed={seed}"] for seed in range(3)]).astype(np.float32)
    np.testing.assert_allclose(card.bands.data["band_ys"][group][:40], members.max(axis=0))
    grouping.band_choice.active = 0
    scalars.smoothing.value = 0.9
    scalars._resmooth()                                          # (the slider's value_throttled callback)
    group = card.bands.data["group"].index("0.1")
    np.testing.assert_allclose(card.bands.data["ys"][group], smooth(members.astype(np.float64).mean(axis=0), 0.9),
                               rtol=1e-9)
    scalars.tag_filter.value = "(unclosed"                       # two bad patterns: each said where it was typed
    grouping.pattern.value = "(also"
    assert "Invalid tags regex" in scalars.message.text and "Invalid group regex" in grouping.message.text
    scalars.tag_filter.value = ""
    assert "Invalid tags regex" not in scalars.message.text and "Invalid group regex" in grouping.message.text
    grouping.pattern.value = "lr=([^,]+)"
    scalars.runs.check_only(["lr=0.1,seed=0", "lr=0.1,seed=1", "baseline"])     # a member unchecked
    assert card.bands.data["group"] == ["0.1"] and card.bands.data["runs"] == [2]
    grouping.pattern.value = "(unclosed"
    assert "Invalid group regex" in grouping.message.text and card.bands.data["runs"] == [2]   # the last good one
    grouping.by.value = ""
    assert card.bands.data["group"] == [] and card.renderers[0].view.filter.indices is not None
    assert sorted(card.rows.data["run"][i] for i in card.renderers[0].view.filter.indices) == \
        ["baseline", "lr=0.1,seed=0", "lr=0.1,seed=1"]
    with SummaryWriter(tmp_path / "lr=0.1,seed=0") as w:         # an hparam groups runs as well
        w.add_hparams({"lr": 0.1}, {"loss": 1.0})
    with SummaryWriter(tmp_path / "baseline") as w:
        w.add_hparams({"lr": 0.1}, {"loss": 1.0})
    scalars.store.poll()
    scalars.runs.update()
    grouping.by.value = "hparam:lr"
    assert card.bands.data["group"] == ["lr=0.1"] and card.bands.data["runs"] == [2]   # the two checked with lr
    assert [card.rows.data["run"][i] for i in card.renderers[0].view.filter.indices] == ["lr=0.1,seed=1"]


def test_tag_filter_is_a_regex_and_a_bad_one_says_so(logdir):
    _, doc, views = session(logdir)
    scalars = views["scalars"]
    scalars.tag_filter.value = "acc|nothing"
    assert sorted(scalars.cards) == ["acc"]                      # only the matches are paged and built
    scalars.tag_filter.value = "(unclosed"
    assert "Invalid tags regex" in scalars.message.text
    assert sorted(scalars.cards) == ["acc"]                                       # the last good filter holds
    scalars.tag_filter.value = ""
    assert scalars.message.text == "" and scalars.cards["loss"].layout.visible


def test_x_axis_and_log_y_rebuild_the_figures_over_the_same_sources(logdir):
    _, _, views = session(logdir)
    scalars = views["scalars"]
    card = scalars.cards["loss"]
    source = card.source

    def expanded_axis():                 # the x the page builds from the rows (each row: its place in X_AXES)
        return {X_AXES[int(code)] for code in card.rows.data["axis"]}

    scalars.x_axis.active = 2                                          # wall time
    fig = card.layout.children[0]
    assert type(fig.xaxis[0]).__name__ == "DatetimeAxis" and expanded_axis() == {"wall"}
    assert all(r.data_source is source for r in card.renderers)
    np.testing.assert_allclose(flat_row(card, "a")["walls"], (1000.0 + flat_row(card, "a")["steps"]) * 1000)
    scalars.log_y.active = True
    assert type(card.layout.children[0].y_scale).__name__ == "LogScale"
    scalars.x_axis.active = 1
    assert expanded_axis() == {"relative"} and card.rows.data["first_wall"][list(card.rows.data["run"]).index("a")] == 1e6


# ----------------------------------------------------------------------------------------------------- escaping

def test_markup_from_logs_never_reaches_a_div_unescaped(tmp_path):
    evil = "<script>alert(1)</script>"
    logdir = tmp_path / "<b>logs</b>"
    with SummaryWriter(logdir / "<img src=x onerror=alert(1)>") as w:
        w.add_scalar(evil, 1.0, 0)
        w.add_scalar(evil, 2.0, 1)
    store, doc, views = session(logdir)
    scalars = views["scalars"]
    scalars.runs.search.value = evil + "("                          # an invalid regex quoting markup
    texts = [d.text for d in doc.select({"type": Div})]
    assert any("&lt;script&gt;" in t for t in texts)                 # the filter error, escaped
    assert any("&lt;b&gt;logs&lt;/b&gt;" in t for t in texts)        # the logdir in the status line
    for t in texts:
        assert "<script" not in t and "<img" not in t and "<b>logs" not in t
    assert scalars.cards[evil].layout.children[0].title.text == evil  # a plain-text canvas title


# ----------------------------------------------------------------------------------------------------- status

def test_status_says_when_the_logdir_is_missing_then_data_appears(tmp_path):
    logdir = tmp_path / "later"
    store, doc, views = session(logdir)
    status = doc.select_one({"name": "status"})
    assert "No logdir" in status.text and "waiting" in status.text
    assert "No scalars" in views["scalars"].message.text
    logdir.mkdir()
    store.poll()
    refresh(doc)
    assert "No event files" in status.text
    with SummaryWriter(logdir / "run") as w:
        w.add_scalar("loss", 0.5, 0)
    store.poll()
    refresh(doc)
    assert "1 run" in status.text and "last update" in status.text
    assert "loss" in views["scalars"].cards and views["scalars"].message.text == ""


# ----------------------------------------------------------------------------------------------------- commands

def _get(port, path):
    """A raw GET (http.client sends the path as given: no client-side normalising of ``..``)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    response = conn.getresponse()
    return response.status, response.read()


def _serve(logdir, tmp_path_factory):
    """``flowlab serve`` on a free port over ``logdir`` with symlinks out of it; yields (process, port)."""
    secret = tmp_path_factory.mktemp("outside") / "secret.txt"
    secret.write_text("TOP-SECRET-CONTENTS")
    os.symlink(secret, logdir / "a" / "leak.txt")
    os.symlink(secret.parent, logdir / "linked-dir")
    proc = subprocess.Popen([sys.executable, "-m", "flowlab.cli", "serve", "--logdir", str(logdir), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, (line, proc.stderr.read() if proc.poll() is not None else "")
        yield proc, int(match.group(1))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def served(logdir, tmp_path_factory):
    yield from _serve(logdir, tmp_path_factory)


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    """One server for the read-only request tests."""
    yield from _serve(write_fixture(tmp_path_factory.mktemp("logs")), tmp_path_factory)


def test_serve_prints_its_url_serves_the_page_and_stops_on_sigint(served):
    proc, port = served
    status, body = _get(port, "/")
    assert status == 200 and b"Bokeh" in body
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/static/js/bokeh.min.js", timeout=10) as r:
        assert r.status == 200                                          # Bokeh's own static files are fine
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=15) == 0
    assert "stopped" in proc.stdout.read()


def test_serve_stops_on_sigterm(served):
    proc, _ = served
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0


@pytest.mark.parametrize("path", [
    "/../../../../etc/passwd", "/static/../../../../../etc/passwd", "/static/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    "/static/..%2f..%2f..%2f..%2fetc%2fpasswd", "/static/%252e%252e/%252e%252e/etc/passwd", "/static//etc/passwd",
    "/static/%2Fetc%2Fpasswd", "/static/..%5c..%5c..%5cetc%5cpasswd", "/a/leak.txt", "/static/a/leak.txt",
    "/linked-dir/secret.txt", "/a/", "/events.out.tfevents", "/static/../a/leak.txt",
])
def test_nothing_outside_bokehs_static_files_is_served(shared_server, path):
    _, port = shared_server
    status, body = _get(port, path)
    assert status == 404, (path, status)
    assert b"root:" not in body and b"TOP-SECRET" not in body


def test_serve_reports_a_busy_port(shared_server):
    _, port = shared_server
    result = subprocess.run([sys.executable, "-m", "flowlab.cli", "serve", "--logdir", ".", "--port", str(port)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "cannot listen" in result.stderr


def test_serving_beyond_loopback_is_warned_about():
    from flowlab.dashboard.server import exposure_warning
    assert exposure_warning("127.0.0.1") is None and exposure_warning("localhost") is None
    assert "anyone who can reach" in exposure_warning("0.0.0.0")


def test_show_serves_from_its_own_thread_while_the_caller_blocks(logdir, monkeypatch):
    import IPython.display
    from flowlab import dashboard
    shown = []
    monkeypatch.setattr(IPython.display, "display", shown.append)
    monkeypatch.setattr(dashboard.notebook, "_in_jupyter_kernel", lambda: True)    # as in a notebook
    handle = dashboard.show(logdir)
    try:
        assert shown and handle.url in shown[0].src
        port = int(re.search(r":(\d+)/", handle.url).group(1))
        assert _get(port, "/")[0] == 200                 # answered while this thread waits in the request
        assert handle.server.origins == [f"127.0.0.1:{port}", f"localhost:{port}"]
    finally:
        handle.stop()
    with pytest.raises(OSError):
        _get(port, "/")


def test_demo_trains_and_writes_every_kind_of_summary(tmp_path):
    from flowlab.summary import (read_graphs, read_health, read_histograms, read_hparams, read_images, read_projector,
                                 read_scalars, read_text)
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "flowlab.cli", "demo", "--no-serve", "--epochs", "2",
                             "--logdir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "final test accuracy" in result.stdout and time.perf_counter() - start < 60
    run, broken = sorted(os.listdir(tmp_path))
    assert re.fullmatch(r"\d{8}-\d{6}", run) and broken == run + "-naive-loss"
    scalars = read_scalars(tmp_path)[run]
    assert {"train/loss", "train/lr", "test/accuracy"} <= set(scalars)
    assert len(scalars["test/accuracy"].step) == 2
    histograms = read_histograms(tmp_path)[run]
    assert {"weights/hidden-weight", "gradients/hidden-weight", "weights/output-bias"} <= set(histograms)
    assert "test/digits" in read_images(tmp_path)[run]
    assert "config" in read_text(tmp_path)[run]
    assert "hparams/test_accuracy" in read_hparams(tmp_path)[run]["metrics"]
    assert read_graphs(tmp_path)[run]
    (embedding,) = read_projector(tmp_path / run)          # the hidden layer's features of the test digits
    assert embedding.tensor.shape[1] == 128 and len(embedding.metadata) == len(embedding.tensor)
    losses = np.asarray(read_scalars(tmp_path)[broken]["train/loss"].value)      # the second run's NaN
    assert np.isfinite(losses[0]) and not np.isfinite(losses).all()
    health = read_health(tmp_path)                 # every step's health; the broken run's NaN shows there too
    steps = len(scalars["train/loss"].step)
    assert len(health[run]["health"].step) == steps and health[run]["health"].values[0].layers == ("hidden", "output")
    assert "health/hidden/activation" in histograms
    broken_health = health[broken]["health"].values
    act_nan = [r.matrix[:, r.statistics.index("act_nan")].sum() for r in broken_health]
    assert act_nan[0] == 0 and max(act_nan) > 0
    alerts = read_text(tmp_path)[broken]["health/alerts"].values     # the first op with NaN, at the model's line
    assert any(kind == "nan" and "digits_mlp.py:" in message for rows in alerts for kind, _, message in rows)
    assert "RuntimeWarning" not in result.stderr


def test_demo_serves_its_runs_while_training_and_stops_on_sigint(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "flowlab.cli", "demo", "--epochs", "1", "--port", "0",
                             "--logdir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/", proc.stdout.readline()).group(1))
        assert _get(port, "/")[0] == 200
        for line in proc.stdout:
            if "still serving" in line:
                break
        assert _get(port, "/")[0] == 200                 # still answering after training
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
        with pytest.raises(OSError):                       # the server's own process went with it
            _get(port, "/")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_demo_trains_at_a_watchable_pace_with_its_dashboard_and_at_full_speed_without(tmp_path):
    from flowlab.cli import DEMO_PACE
    from flowlab.examples import digits_mlp
    start = time.perf_counter()
    digits_mlp.main(epochs=2, log=lambda line: None, pace=DEMO_PACE)        # 28 steps
    paced = time.perf_counter() - start
    assert 27 / DEMO_PACE <= paced
    start = time.perf_counter()
    digits_mlp.main(epochs=2, log=lambda line: None)
    assert time.perf_counter() - start < paced / 2


def test_a_server_process_serves_from_its_own_process_and_never_outlives_its_parent(tmp_path):
    from flowlab.dashboard.server import ServerProcess
    server = ServerProcess(tmp_path, port=0)
    try:
        assert server.pid != os.getpid()
        port = int(re.search(r":(\d+)/$", server.url).group(1))
        assert _get(port, "/")[0] == 200
        with pytest.raises(OSError, match="in use"):    # start-up errors are raised in the caller's process
            ServerProcess(tmp_path, port=port)
    finally:
        assert server.stop(timeout=10)
    with pytest.raises(OSError):
        _get(port, "/")
    # a parent killed outright: its server notices within a few seconds and exits
    parent = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "from flowlab.dashboard.server import ServerProcess\n"
                               f"s = ServerProcess({str(tmp_path)!r}, port=0)\n"
                               "print(s.pid, s.url, flush=True)\n"
                               "time.sleep(600)\n"], stdout=subprocess.PIPE, text=True)
    try:
        child, url = parent.stdout.readline().split()
        assert _get(int(url.rstrip("/").rsplit(":", 1)[1]), "/")[0] == 200
    finally:
        parent.kill()
        parent.wait()

    def alive():
        try:
            return open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"   # a zombie has exited
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 20
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive()


def test_views_update_only_when_the_store_moves(tmp_path):
    """Views read only through the store (its series and run assets), so a tick updates them only when its version
    moved: a page left open on an unchanging logdir costs nothing."""
    from bokeh.document import Document
    from bokeh.models import Div

    from flowlab.dashboard.app import build_document
    from flowlab.dashboard.store import Store
    from flowlab.dashboard.views.base import View

    counts = {"store": 0}

    class StoreView(View):
        def layout(self):
            return Div(text="s")

        def update(self):
            counts["store"] += 1

    doc = Document()
    store = Store(tmp_path)
    build_document(doc, store, views=[("store", StoreView)])
    tick = next(iter(doc.session_callbacks)).callback
    before = counts["store"]
    tick()
    tick()
    assert counts["store"] == before
    store.version += 1
    tick()
    assert counts["store"] == before + 1


def test_a_tab_builds_its_view_when_first_shown(tmp_path):
    from bokeh.document import Document
    from bokeh.models import Div

    from flowlab.dashboard.app import build_document
    from flowlab.dashboard.store import Store
    from flowlab.dashboard.views.base import View

    updates = []

    def make(label):
        class Counting(View):
            def layout(self):
                return Div(text=label)

            def update(self):
                updates.append(label)
        return Counting

    doc = Document()
    build_document(doc, Store(tmp_path), views=[("first", make("first")), ("second", make("second"))])
    assert updates == ["first"]                       # only the visible tab's view did any work
    doc.get_model_by_name("tabs").active = 1          # the user opens the second tab
    assert updates == ["first", "second"]


def test_status_line_shows_state_changes_at_once_and_moving_counts_at_most_every_few_seconds(tmp_path):
    from flowlab.dashboard.views.status import StatusLine
    with SummaryWriter(tmp_path / "a") as w:
        w.add_scalar("x", 1.0, 0)
    store = Store(tmp_path)
    store.poll()
    line = StatusLine(store, every=60.0)
    line.update()
    first = line.div.text
    assert "1 run" in first
    with SummaryWriter(tmp_path / "a") as w:                  # a second file: the file count is state
        w.add_scalar("x", 2.0, 1)
    store.poll()
    line.update()
    assert "2 files" in line.div.text
    shown = line.div.text
    from flowlab.summary import proto
    from flowlab.summary.record import frame
    path = sorted((tmp_path / "a").glob("*tfevents*"))[-1]
    with open(path, "ab") as f:                               # the same file grows: only the counts move
        for step in range(2, 50):
            event = proto.Event(wall_time=1.0, step=step)
            event.summary.value.add(tag="x", simple_value=float(step))
            f.write(frame(event.SerializeToString()))
    store.poll()
    line.update()
    assert line.div.text == shown                             # held back: BokehJS would lay the page out again
    line.every = 0.0
    line.update()
    assert line.div.text != shown and f"{store.status()['records_read']:,} records read" in line.div.text


def test_scalars_leave_a_histograms_nan_counts_to_the_anomalies_tab(tmp_path):
    with SummaryWriter(tmp_path / "run") as w:
        for step in range(3):
            w.add_scalar("loss", 1.0 / (step + 1), step)
            w.add_histogram("weights", np.array([0.5, np.nan if step == 2 else 1.0, 2.0]), step)
        w.add_scalar("gauges/nan_count", 4.0, 0)        # a scalar of the user's own with that name: kept
    store, doc, views = session(tmp_path)
    assert ("run", "weights/nan_count", "scalar") in {s.key for s in store.series("scalar")}   # logged, as a twin
    scalars = views["scalars"]
    assert sorted(scalars.cards) == ["gauges/nan_count", "loss"]
    assert "NaN/Inf counts logged with 1 histogram are on the Anomalies tab" in scalars.message.text
    scalars.export_shown("csv")
    exported = exported_file(scalars)
    assert "weights/nan_count" not in exported and "gauges/nan_count" in exported
