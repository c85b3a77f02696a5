"""The HParams tab: log axes for log-ranged hparams, ticks at readable values, a colour bar, brushing the parallel
coordinates to filter the table, "Show only these runs" choosing the runs of every tab, and one line of text when
there is nothing to show.

Server-side tests drive the view's Bokeh models (events triggered as the page sends them); the last test drives a
real headless Chromium over eight sessions (lr 0.001…0.1, hidden 64/128), brushes the lr axis with a mouse drag on
the box-select tool, and writes ``artifacts/screenshots/hparams.png``.
"""
import math
import os
from pathlib import Path

import pytest
from bokeh.events import ButtonClick, SelectionGeometry
from bokeh.models import PlainText

from flowlab.dashboard.runs import RunSelection
from flowlab.dashboard.store import Store
from flowlab.dashboard.views.hparams import Axis, HParamsView, in_brush, label_texts
from flowlab.summary import SummaryWriter
from jupyter_page import CHROMIUM

SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"
LRS = [0.001, 0.003, 0.01, 0.03, 0.1, 0.001, 0.03, 0.1]
HIDDEN = [64, 128] * 4
RUNS = [f"lr{lr:g}-h{hidden}" for lr, hidden in zip(LRS, HIDDEN)]
LR, HIDDEN_AXIS = ("hparams", "lr"), ("hparams", "hidden")


def write_sessions(logdir):
    """Eight flowlab sessions, each with a training loss curve, hparams lr and hidden, metrics accuracy and loss."""
    for k, (run, lr, hidden) in enumerate(zip(RUNS, LRS, HIDDEN)):
        with SummaryWriter(logdir / run) as w:
            for step in range(20):
                w.add_scalar("train/loss", 1.0 / (1 + step * lr * 10), step)
            w.add_hparams({"lr": lr, "hidden": hidden}, {"accuracy": 0.5 + 0.05 * k, "loss": 1 / (1 + lr * 100)})
    return logdir


@pytest.fixture
def eight(tmp_path):
    return write_sessions(tmp_path)


def view_of(logdir):
    """An HParams view over ``logdir`` with its own run list (as the app gives it)."""
    store = Store(logdir)
    store.poll()
    runs = RunSelection(store)
    runs.update()
    view = HParamsView(store)
    view.runs = runs
    runs.on_change(view.update)
    view.update()
    return view


def table_runs(view):
    return list(view.table_source.data["run"])


def texts(axis):
    return [text for _, text in axis.ticks]


# ------------------------------------------------------------------------------------------------ axes

def test_a_log_ranged_hparam_gets_a_log_axis_and_a_linear_one_does_not():
    lr = Axis(LRS)
    assert lr.log and texts(lr) == ["0.001", "0.003", "0.01", "0.03", "0.1"]
    assert [p for p, _ in lr.ticks] == pytest.approx([0, math.log10(3) / 2, 0.5, 0.5 + math.log10(3) / 2, 1])
    assert lr.place(0.01) == pytest.approx(0.5)                    # a decade is a decade
    hidden = Axis(HIDDEN)
    assert not hidden.log and hidden.ticks == [(0.0, "64"), (1.0, "128")]
    assert hidden.place(96) == pytest.approx(0.5)
    # many values: round ticks between min and max, compactly written
    accuracy = Axis([0.5, 0.52, 0.61, 0.63, 0.7, 0.74, 0.8, 0.9])
    assert not accuracy.log and texts(accuracy) == ["0.5", "0.6", "0.7", "0.8", "0.9"]
    wide = Axis([1e-6, 2e-6, 5e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0])
    assert wide.log and texts(wide)[:3] == ["1e-6", "1e-5", "0.0001"] and texts(wide)[-1] == "1"
    assert not Axis([-1.0, 0.5, 100.0]).log                        # not all positive: linear
    assert not Axis([1.0, 19.0]).log and Axis([1.0, 21.0]).log
    assert Axis(["sgd", "adam", "sgd"]).ticks == [(0.0, "adam"), (1.0, "sgd")]      # categories keep their labels


def test_the_view_draws_log_axes_ticks_and_a_colour_bar(eight):
    view = view_of(eight)
    assert table_runs(view) == sorted(RUNS)
    labels = label_texts(view.parallel.xaxis[0])
    assert labels == {0: "lr (log)", 1: "hidden", 2: "accuracy", 3: "loss"}
    assert all(isinstance(v, PlainText) for v in view.parallel.xaxis[0].major_label_overrides.values())
    ticks = view.ticks_source.data
    assert [t for x, t in zip(ticks["x"], ticks["text"]) if x == 0] == ["0.001", "0.003", "0.01", "0.03", "0.1"]
    assert [t for x, t in zip(ticks["x"], ticks["text"]) if x == 1] == ["64", "128"]
    lines = view.lines_source.data
    lr_of = dict(zip(lines["run"], (ys[0] for ys in lines["ys"])))
    assert lr_of["lr0.01-h64"] == pytest.approx(0.5) and lr_of["lr0.1-h64"] == pytest.approx(1.0)
    # colour: the chosen metric through one mapper shared by the lines, the points and the colour bar
    accuracy = [0.5 + 0.05 * k for k in range(8)]
    assert view.y_select.value == "accuracy" and view.color_bar.title == "accuracy"
    assert view.color_bar.color_mapper is view.mapper
    assert (view.mapper.low, view.mapper.high) == pytest.approx((min(accuracy), max(accuracy)))
    assert lines["value"] == pytest.approx([accuracy[RUNS.index(r)] for r in lines["run"]])
    assert view.lines_source is view.parallel.renderers[2].data_source
    assert view.parallel.renderers[2].glyph.line_color["transform"] is view.mapper
    assert view.color_bar in view.parallel.right
    # the scatter's x is log10(lr), ticked and labelled at the parallel axis' values
    scatter = view.scatter_source.data
    assert scatter["x"] == pytest.approx([math.log10(LRS[RUNS.index(r)]) for r in scatter["run"]])
    assert list(label_texts(view.scatter.xaxis[0]).values()) == ["0.001", "0.003", "0.01", "0.03", "0.1"]
    assert view.scatter.xaxis[0].axis_label.text == "lr (log scale)"
    assert view.scatter.x_range.start < -3 and view.scatter.x_range.end > -1       # fixed ranges around the points
    view.x_select.value = "hidden"                                  # a linear hparam: plain numbers, auto ticks
    assert view.scatter_source.data["x"] == [float(HIDDEN[RUNS.index(r)]) for r in view.scatter_source.data["run"]]
    assert view.scatter.xaxis[0].axis_label.text == "hidden" and label_texts(view.scatter.xaxis[0]) == {}
    # the table is as tall as its rows, not a fixed block with a gap under it
    assert view.table.height < 300 and not view.table.reorderable


# ------------------------------------------------------------------------------------------------ brushing

def drag(view, x0, x1, y0, y1):
    """A box dragged on the parallel coordinates, as BokehJS' box-select tool reports it to the server."""
    view.parallel._trigger_event(SelectionGeometry(view.parallel, geometry={
        "type": "rect", "sx0": 0, "sx1": 0, "sy0": 0, "sy1": 0, "x0": x0, "x1": x1, "y0": y0, "y1": y1}, final=True))


def test_brushing_axes_filters_the_table_and_clears(eight):
    view = view_of(eight)
    drag(view, -0.2, 0.2, 0.45, 1.1)                                # over the lr axis, from just below 0.01 up
    expected = sorted(r for r, lr in zip(RUNS, LRS) if lr >= 0.01)
    assert table_runs(view) == expected and sorted(view.scatter_source.data["run"]) == expected
    assert view.note.text == "5 of 8 sessions; brushed: lr ≥ 0.007943"
    assert view.brush_source.data["left"] == [-0.1] and view.brush_source.data["top"] == [1.0]
    alpha = dict(zip(view.lines_source.data["run"], view.lines_source.data["alpha"]))
    assert {r for r, a in alpha.items() if a > 0.5} == set(expected)     # the other lines are dimmed, not gone
    drag(view, 0.8, 1.2, 0.9, 1.1)                                  # and hidden = 128 (AND)
    assert table_runs(view) == sorted(r for r, lr, h in zip(RUNS, LRS, HIDDEN) if lr >= 0.01 and h == 128)
    drag(view, 0.7, 0.9, 0.0, 1.0)                                  # between axes, near none: no change
    assert len(view.brushes) == 2
    drag(view, -0.2, 0.2, 0.2, 0.3)                                 # a new box on lr replaces its brush
    assert table_runs(view) == ["lr0.003-h128"]
    assert not view.clear.disabled
    view.clear._trigger_event(ButtonClick(view.clear))
    assert table_runs(view) == sorted(RUNS) and view.brushes == {} and view.clear.disabled
    assert view.brush_source.data["left"] == []
    drag(view, -0.5, 3.5, -0.1, 0.05)                               # one box over every axis: each at its bottom
    assert table_runs(view) == []
    assert view.note.text.startswith("0 of 8 sessions") and view.table.visible


def test_a_brush_keeps_its_values_when_new_sessions_stretch_the_axis(eight):
    view = view_of(eight)
    view.brush({LR: (0.45, 0.55)})                                  # around 0.01
    assert table_runs(view) == ["lr0.01-h64"]
    with SummaryWriter(eight / "late") as w:
        w.add_hparams({"lr": 10.0, "hidden": 64}, {"accuracy": 0.1, "loss": 1.0})
    view.store.poll()
    view.runs.update()
    view.update()
    assert view._axes[LR].place(0.01) == pytest.approx(0.25)        # the axis now spans 0.001...10
    assert table_runs(view) == ["lr0.01-h64"]
    assert in_brush(("in", frozenset({"adam"})), "adam") and not in_brush(("range", 0, 1), None)


# ------------------------------------------------------------------------------------------------ run selection

def test_show_only_these_runs_checks_the_selected_sessions_runs(eight):
    tensorboardX = pytest.importorskip("tensorboardX")
    with tensorboardX.SummaryWriter(str(eight / "tbx")) as w:       # its session: the folder tbx/trial, folded
        w.add_scalar("train/loss", 0.5, 0)
        w.add_hparams({"lr": 0.02, "hidden": 64}, {"hparam/accuracy": 0.9}, name="trial")
    view = view_of(eight)
    runs = view.runs
    assert runs.shown() is None and view.show_only.disabled
    rows = table_runs(view)
    view.table_source.selected.indices = [rows.index("lr0.003-h128"), rows.index("tbx")]   # as in the page
    assert not view.show_only.disabled and view.show_only.label == "Show only these 2 runs"
    view.show_only._trigger_event(ButtonClick(view.show_only))
    assert runs.shown() == {"lr0.003-h128", "tbx"}
    assert runs.summary.text == f"2 of {len(RUNS) + 1} runs shown"
    assert table_runs(view) == ["lr0.003-h128", "tbx"]              # this tab follows the run list too
    assert view.table_source.selected.indices == [] and view.show_only.disabled     # rows changed: selection gone


# ------------------------------------------------------------------------------------------------ empty state

def test_without_hparams_one_line_and_nothing_else(tmp_path):
    with SummaryWriter(tmp_path / "a") as w:
        w.add_scalar("loss", 1.0, 0)
    view = view_of(tmp_path)
    assert view.note.text == "No hparams in this logdir yet." and view.note.visible
    assert not (view.controls.visible or view.table.visible or view.plots.visible)
    write_sessions(tmp_path)
    view.store.poll()
    view.runs.update()
    view.update()
    assert view.controls.visible and view.table.visible and view.plots.visible
    view.runs.check_only(["a"])                                     # no session shown: no empty plots
    assert view.note.text == "0 of 8 sessions" and not view.plots.visible


# ------------------------------------------------------------------------------------------------ in Chromium

# Chromium tests: skipped without Debian's chromium or Playwright.
IDLE_JS = "() => Bokeh.index.roots.every((v) => v.is_idle)"
MODEL_JS = "(name) => Bokeh.documents[0].get_model_by_name(name)"
# Where the parallel coordinates' frame maps (x, y) on the page.
PLACE_JS = """([x, ys]) => { const pv = Bokeh.index.find_one(Bokeh.documents[0].get_model_by_name('hparams-parallel'));
    const r = pv.canvas.el.getBoundingClientRect();
    return ys.map((y) => [r.x + pv.frame.x_scale.compute(x), r.y + pv.frame.y_scale.compute(y)]); }"""
# The colour bar as drawn: its box on the canvas, and the frame's right edge.
COLOR_BAR_JS = """() => { const doc = Bokeh.documents[0], plot = doc.get_model_by_name('hparams-parallel');
    const pv = Bokeh.index.find_one(plot), bar = pv.views.find_one(doc.get_model_by_name('hparams-colorbar'));
    return {title: bar.model.title, bar: [bar.bbox.left, bar.bbox.right, bar.bbox.top, bar.bbox.bottom],
            frame_right: pv.frame.bbox.right}; }"""


def _table_rows(page):
    return sorted(page.locator(".bk-DataTable").nth(1).locator(".slick-row .slick-cell.l0").all_inner_texts())


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Debian's chromium at {CHROMIUM}")
def test_hparams_tab_in_chromium(tmp_path, chromium):
    pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")
    from dashboard_page import DRAWN_JS, as_js, flowlab_serve, open_dashboard
    logdir = write_sessions(tmp_path / "logs")
    with flowlab_serve(logdir, tmp_path / "stderr.txt") as (url, _):
        warnings = []
        page, errors = open_dashboard(chromium, url.rstrip("/") + "/?tab=hparams", warnings=warnings,
                                      viewport={"width": 1400, "height": 900})
        note = f"() => ({MODEL_JS})('hparams-note')?.text"
        page.wait_for_function(f"() => ({note})() === '8 of 8 sessions'", polling=50)
        page.wait_for_function(IDLE_JS, polling=50)
        assert _table_rows(page) == sorted(RUNS)

        # the lr axis is logarithmic: its ticks 0.001 ... 0.1 a decade apart on screen, labelled "(log)"
        ticks = page.evaluate(f"() => {{ const t = ({MODEL_JS})('hparams-ticks').data;"
                              "return t.text.filter((_, i) => t.x[i] === 0).map((s, i) => [s, t.y.filter((_, j) =>"
                              " t.x[j] === 0)[i]]); }")
        assert [s for s, _ in ticks] == ["0.001", "0.003", "0.01", "0.03", "0.1"]
        screen = [y for _, y in page.evaluate(PLACE_JS, [0, [y for _, y in ticks]])]
        assert screen[0] - screen[2] == pytest.approx(screen[2] - screen[4], abs=0.5)      # decades equal
        assert (screen[0] - screen[1]) / (screen[0] - screen[2]) == pytest.approx(math.log10(3), abs=0.01)
        assert page.evaluate(f"() => ({MODEL_JS})('hparams-parallel').below[0].major_label_overrides"
                             ".get(0).text") == "lr (log)"
        # a colour bar titled with the metric, drawn beside the frame
        bar = page.evaluate(COLOR_BAR_JS)
        assert bar["title"] == "accuracy" and bar["bar"][0] >= bar["frame_right"]
        assert bar["bar"][3] - bar["bar"][2] > 150

        # brush the lr axis with the mouse (the box-select tool is the plot's active drag): 0.01 and up
        (x0, y_low), (_, y_top) = page.evaluate(PLACE_JS, [0, [0.45, 1.04]])
        page.mouse.move(x0 - 20, y_low)
        page.mouse.down()
        page.mouse.move(x0, (y_low + y_top) / 2, steps=4)
        page.mouse.move(x0 + 20, y_top, steps=4)
        page.mouse.up()
        brushed = sorted(r for r, lr in zip(RUNS, LRS) if lr >= 0.01)
        page.wait_for_function(f"() => ({note})().startsWith('5 of 8 sessions; brushed: lr ≥')", polling=50)
        page.wait_for_function(f"() => ({MODEL_JS})('hparams-table-source').data.run.length === 5", polling=50)
        page.wait_for_function(IDLE_JS, polling=50)
        assert _table_rows(page) == brushed
        page.evaluate("() => document.activeElement?.blur()")         # no focus ring in the screenshot
        page.wait_for_timeout(300)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "hparams.png"), full_page=True)

        page.locator(".bk-btn", has_text="Clear brushes").click()
        page.wait_for_function(f"() => ({note})() === '8 of 8 sessions'", polling=50)
        page.wait_for_function(IDLE_JS, polling=50)
        assert _table_rows(page) == sorted(RUNS)

        # select two sessions in the table and show only their runs: the Scalars tab then draws those two
        chosen = ["lr0.003-h128", "lr0.1-h64"]
        table = page.locator(".bk-DataTable").nth(1)
        table.locator(".slick-row", has_text=chosen[0]).locator(".slick-cell.l0").click()
        table.locator(".slick-row", has_text=chosen[1]).locator(".slick-cell.l0").click(modifiers=["Control"])
        page.wait_for_function(f"() => ({MODEL_JS})('hparams-show-only').disabled === false", polling=50)
        page.locator(".bk-btn", has_text="Show only these 2 runs").click()
        page.wait_for_function(f"() => ({MODEL_JS})('runs-summary').text === '2 of 8 runs shown'", polling=50)
        page.wait_for_function(IDLE_JS, polling=50)
        assert errors == [] and warnings == [], (errors, warnings)      # all the while on the HParams tab
        page.locator(".bk-tab", has_text="Scalars").first.click()
        every_card = f"[...new Set(({DRAWN_JS})().flat())].sort()"        # the runs any Scalars card draws
        page.wait_for_function(f"() => JSON.stringify({every_card}) === {as_js(sorted(chosen))}", polling=50,
                               timeout=20000)
        assert errors == []
        page.close()


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Debian's chromium at {CHROMIUM}")
def test_hparams_tab_without_hparams_in_chromium_is_one_line(tmp_path, chromium):
    pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")
    from dashboard_page import flowlab_serve, open_dashboard
    with SummaryWriter(tmp_path / "logs" / "a") as w:
        w.add_scalar("loss", 1.0, 0)
    with flowlab_serve(tmp_path / "logs", tmp_path / "stderr.txt") as (url, _):
        warnings = []
        page, errors = open_dashboard(chromium, url.rstrip("/") + "/?tab=hparams", warnings=warnings)
        page.wait_for_function(f"() => ({MODEL_JS})('hparams-note')?.text === 'No hparams in this logdir yet.'",
                               polling=50)
        page.wait_for_function(IDLE_JS, polling=50)
        page.wait_for_timeout(300)
        drawn = page.evaluate("""() => ['hparams-table', 'hparams-parallel', 'hparams-scatter-figure'].map((name) => {
            const view = Bokeh.index.find_one(Bokeh.documents[0].get_model_by_name(name));
            return view != null && view.el.isConnected && view.el.getBoundingClientRect().height > 0; })""")
        assert drawn == [False, False, False]
        assert errors == [] and warnings == [], (errors, warnings)   # (a plot over no data warns)
        page.close()
