"""Histograms compared across runs ("runs" mode), hover on every histogram mode and on the Distributions bands, and
the plot layer the widgets and the dashboard share (``histogram_bars``, ``draw_bands``).

Server-side tests build the views over a ``Store`` and read their sources; the browser tests run one
``flowlab serve`` over three runs × two tags in headless Chromium, move the mouse over a known bucket or step and read
the tooltip's text. Screenshots: ``artifacts/screenshots/histograms-runs.png``, ``histograms-hover.png``,
``distributions-hover.png``.
"""
import os
import re
from pathlib import Path

import numpy as np
import pytest
from bokeh.models import HoverTool, Quad, VArea

from flowlab.dashboard.runs import run_colour
from flowlab.dashboard.store import Store
from flowlab.dashboard.views.distributions import COLUMNS, LABELS, DistributionsView, percentile_row
from flowlab.dashboard.views.histograms import MODES, HistogramsView, nearest, run_columns
from flowlab.plots.figures import histogram_source, histogram_view, trend_figure, trend_source

SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"
RUNS, TAGS, STEPS = ("run0", "run1", "run2"), ("b", "w"), (0, 10, 20, 30, 40)


def values(run, tag, step):
    r = RUNS.index(run)
    return np.random.default_rng([r, TAGS.index(tag), step]).normal(r if tag == "w" else -r, 1 + step / 40, 500)


def write(logdir, runs=RUNS):
    from flowlab.summary import SummaryWriter
    for run in runs:
        with SummaryWriter(logdir / run) as w:
            for step in STEPS:
                for tag in TAGS:
                    w.add_histogram(tag, values(run, tag, step), step)


def buckets(run, tag, step):
    """The buckets as logged (left, right, count), those that counted something."""
    from flowlab.summary import encode
    b = np.asarray(encode.histogram_buckets(values(run, tag, step)), np.float64).reshape(-1, 3)
    return b[b[:, 2] > 0]


class Shown:
    """A run selection showing ``runs``."""

    def __init__(self, runs):
        self.runs = set(runs)

    def shown(self):
        return frozenset(self.runs)

    def shows(self, run):
        return run in self.runs


def short(v):
    """A number as the hovers write it: four significant digits, no trailing zeros."""
    return f"{float(f'{v:.4g}'):g}"


# ------------------------------------------------------------------------------------------------------- server side

def test_nearest_and_run_columns():
    steps = np.array([0, 10, 20, 40])
    assert [nearest(steps, s) for s in (-5, 4, 5, 6, 29, 31, 99)] == [0, 0, 0, 1, 2, 3, 3]
    b = np.array([[0.0, 1.0, 3.0], [1.0, 2.0, 0.0], [2.0, 3.0, 5.0]])
    cols = run_columns([("a", "#111111", 7, b), ("b", "#222222", 9, b[:1])])
    assert cols["run"] == ["a", "a", "b"] and cols["colour"] == ["#111111"] * 2 + ["#222222"]
    assert cols["step"].tolist() == [7, 7, 9] and cols["count"].tolist() == [3, 5, 3]     # the empty bucket: no row
    assert run_columns([])["left"].size == 0


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("compare")
    write(path)
    return path


def runs_view(logdir, shown=RUNS):
    store = Store(str(logdir))
    store.poll()
    view = HistogramsView(store)
    view.runs = Shown(shown)
    view.mode.active = MODES.index("runs")
    view.update()
    return store, view


def test_runs_mode_overlays_every_shown_run_per_tag_in_its_colour(logdir):
    store, view = runs_view(logdir)
    cards = [view._cards[key] for key in view._order]
    assert [card.figure.title.text for card in cards] == list(TAGS)            # one card per tag
    for tag, card in zip(TAGS, cards):
        data = card.source.data
        assert sorted(set(data["run"])) == list(RUNS)
        for run in RUNS:                                                       # each run at its latest step
            rows = [i for i, r in enumerate(data["run"]) if r == run]
            assert {data["colour"][i] for i in rows} == {run_colour(store, run)}
            assert set(data["step"][rows]) == {STEPS[-1]}
            np.testing.assert_array_equal(np.column_stack([data["left"], data["right"], data["count"]])[rows],
                                          buckets(run, tag, STEPS[-1]))
        (renderer,) = card.figure.renderers
        glyph = renderer.glyph
        assert isinstance(glyph, Quad) and glyph.fill_color.field == "colour" and 0 < glyph.fill_alpha < 1
        (hover,) = card.figure.select(HoverTool)
        assert [label for label, _ in hover.tooltips] == ["run", "step", "bucket", "count"]
    assert (view.step.start, view.step.end, view.step.value, view.step.visible) == (0, 40, 40, True)


def test_the_step_slider_picks_each_runs_nearest_step_and_unchecked_runs_leave(logdir):
    store, view = runs_view(logdir)
    view.step.value = 14
    view._step_changed()                       # (the page sets value_throttled when a drag ends)
    card = view._cards[view._order[1]]
    assert set(card.source.data["step"]) == {10} and "nearest 14" in card.subtitle.text
    rows = [i for i, r in enumerate(card.source.data["run"]) if r == "run1"]
    np.testing.assert_array_equal(card.source.data["count"][rows], buckets("run1", "w", 10)[:, 2])
    view.runs = Shown(["run0", "run2"])        # run1 unchecked
    view.update()
    assert sorted(set(card.source.data["run"])) == ["run0", "run2"] and set(card.source.data["step"]) == {10}
    view.mode.active = 0                       # back to one card per run × tag
    view.update()
    assert sorted(view._cards) == [(run, tag, "histogram") for run in ("run0", "run2") for tag in TAGS]
    assert not view.step.visible


def test_histogram_cards_hover_in_both_modes(logdir):
    store = Store(str(logdir))
    store.poll()
    view = HistogramsView(store)
    view.update()
    card = view._cards[view._order[0]]
    view.mode.active = MODES.index("overlay")
    hovers = card.drawing.figure.select(HoverTool)
    assert len(hovers) == 2 and all(h.limit == 1 and h.sort_by == [("@step", "descending")] for h in hovers)
    assert all([label for label, _ in h.tooltips] == ["step", "bucket", "count"] for h in hovers)


def test_distribution_hover_names_every_percentile_at_the_step(logdir):
    store = Store(str(logdir))
    store.poll()
    view = DistributionsView(store)
    view.update()
    fig = view._cards[view._order[0]].layout
    (hover,) = fig.select(HoverTool)
    assert hover.mode == "vline" and [label for label, _ in hover.tooltips] == ["step"] + LABELS[::-1]
    assert hover.tooltips[5] == ("median", "@bp5000{%0.4g}") and hover.formatters["@bp5000"] == "printf"
    assert len([r for r in fig.renderers if isinstance(r.glyph, VArea)]) == 4


def test_widgets_draw_with_the_same_builders():
    """The widget trend and the distribution card are ``draw_bands``; the widget histogram is ``histogram_bars``."""
    fig = trend_figure(trend_source())
    (hover,) = fig.select(HoverTool)
    assert hover.mode == "vline" and hover.limit == 1 and hover.tooltips[0] == ("step", "@step{0,0}")
    assert [type(r.glyph).__name__ for r in fig.renderers] == ["VArea", "VArea", "Line", "Quad"]
    view, _ = histogram_view(histogram_source())
    for fig, top in zip(view.children, ("top", "top_log")):
        (renderer,) = fig.renderers
        assert renderer.glyph.top == top
        (hover,) = fig.select(HoverTool)
        assert [label for label, _ in hover.tooltips] == ["bucket", "count"]


# ------------------------------------------------------------------------------------------------------- the browser

CHROMIUM = "/usr/bin/chromium"
TOOLTIPS_JS = """() => { const out = [];
    const walk = (root) => { for (const el of root.querySelectorAll(".bk-tooltip-content"))
                               if (el.offsetParent !== null || el.getClientRects().length) out.push(el.innerText);
                             for (const el of root.querySelectorAll("*")) if (el.shadowRoot) walk(el.shadowRoot); };
    walk(document); return out; }"""
# The page position of data point (x, y) of the card titled ``tag`` in the tab's grid.
POINT_JS = """([kind, tag, x, y]) => {
    const fig = Bokeh.documents[0].get_model_by_name("cards:" + kind).children.find((f) => f.title.text === tag);
    const view = Bokeh.index.find_one(fig), box = view.canvas_view.el.getBoundingClientRect();
    return [box.left + view.frame.x_scale.compute(x), box.top + view.frame.y_scale.compute(y)]; }"""
RUNS_DRAWN_JS = """(tag) => {
    const grid = Bokeh.documents[0].get_model_by_name("cards:histograms");
    const fig = grid && grid.children.find((f) => f.title.text === tag);
    if (!fig) return null;
    return fig.renderers.map((r) => ({glyph: r.glyph.constructor.__name__, alpha: r.glyph.fill_alpha.value,
        runs: [...new Set(r.data_source.data.run)], colours: [...new Set(r.data_source.data.colour)]})); }"""


def tooltip_blocks(page):
    """The entries of the tooltips shown, as dicts of label → value."""
    blocks = []
    for text in page.evaluate(TOOLTIPS_JS):
        for line in text.splitlines():
            label, _, value = line.partition(":")
            if not blocks or label.strip() in blocks[-1]:
                blocks.append({})
            blocks[-1][label.strip()] = value.strip()
    return blocks


def hover(page, kind, tag, x, y):
    px, py = page.evaluate(POINT_JS, [kind, tag, float(x), float(y)])
    page.mouse.move(px - 30, py - 30)
    page.mouse.move(px, py, steps=3)
    page.wait_for_function(f"() => ({TOOLTIPS_JS})().length > 0", timeout=5000)
    return tooltip_blocks(page)


def wait_filled(page, kind):
    from flowlab.dashboard.views.paging import FILLED_JS
    page.wait_for_function(FILLED_JS, arg=kind, polling=20, timeout=60000)


@pytest.fixture(scope="module")
def served(logdir, tmp_path_factory, chromium):
    pytest.importorskip("playwright.sync_api")
    from dashboard_page import flowlab_serve
    with flowlab_serve(logdir, tmp_path_factory.mktemp("server") / "stderr.txt") as (url, log):
        yield url


@pytest.fixture
def page_at(served, chromium):
    from dashboard_page import open_dashboard
    opened = []

    def open_page(query):
        warnings = []
        page, errors = open_dashboard(chromium, served + query, warnings=warnings,
                                      viewport={"width": 1400, "height": 900})
        opened.append(page)
        return page, errors, warnings
    yield open_page
    for page in opened:
        page.close()


browser = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Debian's chromium at {CHROMIUM}")


@browser
def test_runs_overlay_in_the_browser_hover_and_unchecking(page_at, logdir):
    page, errors, warnings = page_at("?tab=histograms&histmode=2")
    wait_filled(page, "histograms")
    store = Store(str(logdir))
    store.poll()
    colours = dict(zip(page.evaluate("() => Bokeh.documents[0].get_model_by_name('runs-source').data.run"),
                       page.evaluate("() => Bokeh.documents[0].get_model_by_name('runs-source').data.colour")))
    for tag in TAGS:
        (drawn,) = page.evaluate(RUNS_DRAWN_JS, tag)
        assert drawn["glyph"] == "Quad" and 0 < drawn["alpha"] < 1
        assert drawn["runs"] == list(RUNS) and drawn["colours"] == [colours[run] for run in RUNS]
    page.screenshot(path=str(SHOTS / "histograms-runs.png"))
    b = buckets("run2", "w", STEPS[-1])
    k = int(np.argmax(b[:, 2]))                 # run2's tallest bucket, hovered near its top: run2 is drawn last
    left, right, count = b[k]
    blocks = hover(page, "histograms", "w", (left + right) / 2, count * 0.95)
    assert {"run": "run2", "step": str(STEPS[-1]), "bucket": f"{short(left)} … {short(right)}",
            "count": f"{count:,.0f}"} in blocks
    table = page.locator(".bk-DataTable")
    table.locator(".slick-row", has_text="run1").locator("input[type=checkbox]").click()
    page.wait_for_function(f"() => JSON.stringify(({RUNS_DRAWN_JS})('w')[0].runs) === '[\"run0\",\"run2\"]'",
                           timeout=20000)
    table.locator(".slick-row", has_text="run1").locator("input[type=checkbox]").click()
    page.wait_for_function(f"() => ({RUNS_DRAWN_JS})('w')[0].runs.length === 3", timeout=20000)
    assert errors == [] and warnings == []


@browser
def test_offset_ridges_are_filled_and_hover_names_the_front_step(page_at):
    page, errors, warnings = page_at("?tab=histograms")
    wait_filled(page, "histograms")
    fills = page.evaluate("""() => Bokeh.documents[0].get_model_by_name("cards:histograms").children[0].renderers
        .filter((r) => r.visible && r.glyph.constructor.__name__ === "Patches").map((r) => r.glyph.fill_alpha.value)""")
    assert fills and all(a > 0.5 for a in fills)
    # run0's "b" card: the newest ridge, in front, halfway up its tallest bucket
    rows = page.evaluate("""() => { const fig = Bokeh.documents[0].get_model_by_name("cards:histograms").children[0];
        const d = fig.renderers[0].data_source.data; return [fig.above[0].text, fig.title.text,
        Array.from(d.step), Array.from(d.left), Array.from(d.right), Array.from(d.count), Array.from(d.top)]; }""")
    run, tag, steps, lefts, rights, counts, tops = rows
    assert (run, tag) == ("run0", "b")
    last = [i for i, s in enumerate(steps) if s == STEPS[-1]]
    i = max(last, key=lambda j: counts[j])
    blocks = hover(page, "histograms", "b", (lefts[i] + rights[i]) / 2, (steps[i] + tops[i]) / 2)
    b = buckets("run0", "b", STEPS[-1])
    k = int(np.argmax(b[:, 2]))
    assert blocks == [{"step": str(STEPS[-1]), "bucket": f"{short(b[k, 0])} … {short(b[k, 1])}",
                       "count": f"{b[k, 2]:,.0f}"}]
    page.screenshot(path=str(SHOTS / "histograms-hover.png"))
    assert errors == [] and warnings == []


@browser
def test_distribution_hover_shows_the_percentiles_at_the_step(page_at):
    page, errors, warnings = page_at("?tab=distributions")
    wait_filled(page, "distributions")
    expected = percentile_row(np.asarray(
        __import__("flowlab.summary", fromlist=["encode"]).encode.histogram_buckets(values("run0", "b", 20)),
        np.float64).reshape(-1, 3))
    blocks = hover(page, "distributions", "b", 20, expected["bp5000"])
    assert len(blocks) == 1 and blocks[0]["step"] == "20"
    for label, column in zip(LABELS, COLUMNS):
        assert blocks[0][label] == f"{expected[column]:.4g}", label
    page.screenshot(path=str(SHOTS / "distributions-hover.png"))
    assert errors == [] and warnings == []
