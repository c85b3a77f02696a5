"""The Graph tab coloured by network health: a net trained with ``flow.watch_health(writer=...)`` whose ReLU layer
``hidden`` is dead (bias -100) beside a healthy ``first``. Its boxes are drawn in their layer's state (the dead layer in
the alert colour, the others green, read from the page's data and from the pixels drawn), the menu recolours them by
a statistic, hover names the layer, new reports recolour them live (only the health columns are sent), tapping an op
of ``hidden`` opens the Health tab's URL, markup in layer names stays text, and a run without reports is drawn as
before. Screenshots: ``artifacts/screenshots/graph-health.png`` and ``graph-health-statistic.png``."""
import copy
import io
import os
import re
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest
from bokeh.document import Document
from bokeh.document.events import ColumnDataChangedEvent, ColumnsPatchedEvent, ColumnsStreamedEvent

import flowlab as flow
import flowlab.typing as tp
from flowlab.dashboard.store import Store
from flowlab.dashboard.views import graph as graph_view
from flowlab.dashboard.views.graph import (CATEGORY_COLORS, CATEGORY_TINTS, HEALTH_COLORS, HEALTH_TINTS,
                                           GraphView, LayerHealth, graph_data, health_columns, layer_states, layers_of,
                                           nodes_from_graph_def)
from flowlab.health import STATISTICS, HealthAlert, HealthReport
from flowlab.summary import SummaryWriter, proto
from test_health import data

SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"
BATCH, FEATURES, CLASSES, STEPS = 32, 20, 5, 12
HEALTH_RUN, PLAIN_RUN, MARKUP_RUN = "a-health", "b-plain", "c-markup"
XSS = "<img src=x onerror=window.__xss=1>"


def train(logdir, watch=True, steps=STEPS):
    """Train a net of a healthy ReLU layer ``first`` and a dead one ``hidden`` (bias -100) side by side, then
    ``output``, logging its graph and (``watch``) its health; returns the reports."""
    flow.clear_default_session()
    reports = []
    with SummaryWriter(logdir) as writer:
        @flow.global_function(type="train")
        def job(x: tp.Numpy.Placeholder((BATCH, FEATURES)),
                y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
            first = flow.layers.dense(x, 32, activation=flow.nn.relu, name="first")
            hidden = flow.layers.dense(x, 32, activation=flow.nn.relu, name="hidden",
                                       bias_initializer=flow.constant_initializer(-100.0))
            logits = flow.layers.dense(first + hidden, CLASSES, name="output")
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
            if watch:
                flow.watch_health(reports.append, writer=writer)
            flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
            return loss

        writer.add_graph(job)
        for x, y in data(steps, 0, BATCH, FEATURES, CLASSES):
            job(x, y)
        flow.sync_default_session()
    return reports


def write_markup_run(logdir):
    """A run whose graph and health name a layer in markup, with an alert whose message is markup too."""
    graph = proto.GraphDef()
    graph.node.add(name="x", op="Input")
    graph.node.add(name=f"{XSS}/weight", op="Variable")
    graph.node.add(name=f"{XSS}_matmul", op="MatMul", input=["x", f"{XSS}/weight"])
    with SummaryWriter(logdir) as writer:
        writer.file_writer.add_graph_def(graph.SerializeToString())
        writer.add_health(HealthReport(0, {XSS: {s: 0.0 for s in STATISTICS}},
                                       alerts=[HealthAlert("dead_relu", XSS, 0, XSS)]))


def report_with_nan(report, layer, step):
    """``report`` again at ``step``, with NaNs in ``layer``'s output and no alerts."""
    table = copy.deepcopy(report.table)
    table[layer]["act_nan"] = 3.0
    return HealthReport(step, table)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("logs")
    reports = train(logdir / HEALTH_RUN)
    train(logdir / PLAIN_RUN, watch=False)
    write_markup_run(logdir / MARKUP_RUN)
    return logdir, reports


def view_of(logdir, run):
    store = Store(logdir)
    store.poll()
    view = GraphView(store)
    view.update()
    value = next(v for v, label in view.select.options if label == run)
    view.select.value = value
    return store, view


def rows(view, *names):
    data = view.nodes_source.data
    return [data["name"].index(name) for name in names]


# ------------------------------------------------------------------------------------------------ without a browser

def test_a_node_belongs_to_the_longest_layer_its_name_starts_with():
    layers = ["hidden", "hidden_2", "mlp-out", "Dense_6"]
    names = ["hidden_matmul", "hidden/weight", "hidden-bias", "hidden", "hidden_2_matmul", "hidden_2/weight",
             "hiddenx_matmul", "mlp/out/weight", "mlp/out_bias_add", "mlp-out_activation", "mlp", "Dense_6_matmul",
             "System/AutoGrad/hidden_matmul_grad", "Input_0"]
    assert layers_of(names, layers) == ["hidden", "hidden", "hidden", "hidden", "hidden_2", "hidden_2", "", "mlp-out",
                                        "mlp-out", "mlp-out", "", "Dense_6", "", ""]


def test_a_layer_is_red_for_nan_or_inf_amber_for_another_alert_green_else():
    statistics = ("act_mean_abs", "act_nan", "grad_inf")
    matrix = np.array([[1.0, 0.0, 0.0], [1.0, 0.0, 2.0], [1.0, np.nan, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    health = LayerHealth(5, ("ok", "inf", "missing", "nan_alert", "dead"), statistics, matrix,
                         {"nan_alert": ("nan",), "dead": ("dead_relu",)})
    assert layer_states(health) == {"ok": "healthy", "inf": "NaN/Inf", "missing": "healthy", "nan_alert": "NaN/Inf",
                                    "dead": "alert"}
    columns = health_columns(["ok_matmul", "dead_activation", "other"], health)
    assert columns["h_line"][:2] == [HEALTH_COLORS["healthy"], HEALTH_COLORS["alert"]]
    assert list(columns["h_line_alpha"]) == [1.0, 1.0, 0.0] and columns["layer"] == ["ok", "dead", ""]
    assert columns["h_status"][1] == "alert (dead_relu) at step 5"
    assert columns["h_activation"][0] == "mean_abs 1 · nan 0" and columns["h_gradient"][0] == "inf 0"
    by_norm = health_columns(["ok_matmul", "dead_activation", "other"], health, "act_mean_abs")
    assert np.isnan(by_norm["h_value"][1]) and by_norm["h_value"][0] == 1.0      # log scale: zero has no colour
    assert np.isnan(by_norm["h_value"][2])
    # a batch norm's statistics get their own row, empty for the layers that have none
    bn_statistics = ("act_mean_abs", "moving_var_min", "batch_var_ratio")
    bn_matrix = np.array([[1.0, np.nan, np.nan], [0.5, 0.25, 1.0]])
    bn_health = LayerHealth(1, ("conv", "conv_bn"), bn_statistics, bn_matrix, {})
    bn = health_columns(["conv", "conv_bn"], bn_health)
    assert bn["h_activation"] == ["mean_abs 1", "mean_abs 0.5"]
    assert bn["h_batch_norm"] == ["", "var_min 0.25 · batch_var_ratio 1"]


def test_without_health_records_the_graph_is_drawn_as_before(logdir):
    logdir, _ = logdir
    _, view = view_of(logdir, PLAIN_RUN)
    data = view.nodes_source.data
    shown = [view.health_boxes, view.health_legend, view.color_by, view.health_note, *view.color_bars.values()]
    assert not any(model.visible for model in shown)
    assert data["color"] == [CATEGORY_COLORS[c] for c in data["category"]]
    assert data["tint"] == [CATEGORY_TINTS[c] for c in data["category"]]
    assert set(data["layer"]) == {""} and not any(data["h_line_alpha"])
    plain = graph_data(nodes_from_graph_def(view._graph_defs[PLAIN_RUN]), expanded=view.expanded)
    assert view.expanded == {"first", "hidden", "output"}             # a small graph opens whole
    assert {k: data[k] for k in plain.nodes} == plain.nodes


def test_new_reports_send_only_the_health_columns(logdir, tmp_path):
    logdir, reports = logdir
    (tmp_path / HEALTH_RUN).mkdir()
    for f in (logdir / HEALTH_RUN).iterdir():                   # a copy to append to
        (tmp_path / HEALTH_RUN / f.name).write_bytes(f.read_bytes())
    store, view = view_of(tmp_path, HEALTH_RUN)
    first = rows(view, "first_matmul")[0]
    assert view.nodes_source.data["h_line"][first] == HEALTH_COLORS["healthy"]
    doc = Document()
    doc.add_root(view.layout())
    events = []
    doc.on_change(events.append)
    store.poll()
    view.update()                                               # nothing new: nothing sent
    assert events == []
    with SummaryWriter(tmp_path / HEALTH_RUN) as writer:
        writer.add_health(report_with_nan(reports[-1], "first", STEPS))
    store.poll()
    view.update()
    assert view.nodes_source.data["h_line"][first] == HEALTH_COLORS["NaN/Inf"]
    data_events = [e for e in events if isinstance(e, (ColumnDataChangedEvent, ColumnsPatchedEvent,
                                                       ColumnsStreamedEvent))]
    assert data_events
    for e in data_events:               # columns named (None: the whole data), all of them health columns
        assert isinstance(e, ColumnDataChangedEvent) and e.model is view.nodes_source and e.cols is not None
        assert set(e.cols) <= set(graph_view.HEALTH_COLUMNS)


# ------------------------------------------------------------------------------------------------ in Chromium

# The health overlay as the page holds it: its visibility, how it is coloured, and each box's columns and place.
OVERLAY_JS = """() => {
    const doc = Bokeh.documents[0];
    const fig = doc.get_model_by_name("graph-figure"), r = doc.get_model_by_name("graph-health");
    const d = r.data_source.data, fill = r.glyph.fill_color;
    const {x_scale, y_scale} = Bokeh.index.get_one(fig).frame;
    const page = Bokeh.index.get_one(fig).el.getBoundingClientRect();
    const boxes = Object.fromEntries(Array.from(d.name, (name, i) => [name, {
        layer: d.layer[i], line: d.h_line[i], fill: d.h_fill[i], alpha: d.h_fill_alpha[i], value: d.h_value[i],
        left: page.x + x_scale.compute(d.x[i] - d.w[i] / 2), right: page.x + x_scale.compute(d.x[i] + d.w[i] / 2),
        top: page.y + y_scale.compute(d.y[i] + d.h[i] / 2), bottom: page.y + y_scale.compute(d.y[i] - d.h[i] / 2)}]));
    return {visible: r.visible, field: fill.field || null,
            mapper: fill.transform ? fill.transform.constructor.__name__ : null,
            legend: doc.get_model_by_name("graph-health-legend").visible,
            bar: ["linear", "log"].some((scale) => doc.get_model_by_name(`graph-color-bar-${scale}`).visible),
            menu: doc.get_model_by_name("graph-color-by").visible, boxes};
}"""
IDLE_JS = "() => Bokeh.index.roots.every((v) => v.is_idle)"


def hover(page, box):
    """The rows of the tooltip shown over ``box``, as ``{label: value}`` (the text the page shows)."""
    page.mouse.move((box["left"] + box["right"]) / 2, (box["top"] + box["bottom"]) / 2)
    tooltip = page.locator(".bk-Tooltip:visible")
    tooltip.locator(".bk-tooltip-row-value").first.wait_for()
    assert tooltip.count() == 1
    labels = tooltip.locator(".bk-tooltip-row-label").all_inner_texts()
    values = tooltip.locator(".bk-tooltip-row-value").all_inner_texts()
    page.mouse.move(1, 1)
    tooltip.wait_for(state="detached")
    return {label.strip().rstrip(":"): value for label, value in zip(labels, values)}


def hex_rgb(colour):
    return np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)], float)


def fill_pixel(page, box):
    """The colour drawn just inside ``box``'s left edge, past its 3 px outline and before its label."""
    from PIL import Image
    x, y = round(box["left"]) + 6, round((box["top"] + box["bottom"]) / 2)
    shot = Image.open(io.BytesIO(page.screenshot(clip={"x": x - 1, "y": y - 1, "width": 3, "height": 3})))
    return np.array(shot.convert("RGB").getpixel((1, 1)), float)


def wait_for(page, condition):
    page.wait_for_function(f"() => {{ const s = ({OVERLAY_JS})(); return ({condition}) && ({IDLE_JS})(); }}",
                           polling=50)
    page.wait_for_timeout(200)
    return page.evaluate(OVERLAY_JS)


def choose_run(page, run):
    page.evaluate("""(run) => { const select = [...Bokeh.documents[0].all_models].find((m) =>
        m.constructor.__name__ === "Select" && m.title === "Graph");
        select.value = select.options.find(([value, label]) => label === run)[0]; }""", run)


@pytest.fixture(scope="module")
def health_page(logdir, tmp_path_factory, request):
    from jupyter_page import CHROMIUM
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"needs Debian's chromium at {CHROMIUM} (.ci/run installs it: apt-get install -y chromium)")
    pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")
    from dashboard_page import flowlab_serve, open_dashboard
    chromium = request.getfixturevalue("chromium")
    logdir, reports = logdir
    with flowlab_serve(logdir, tmp_path_factory.mktemp("server") / "stderr.txt") as (url, log):
        warnings = []
        page, errors = open_dashboard(chromium, f"{url}?tab=graph&theme=light",
                                      viewport={"width": 1400, "height": 900}, warnings=warnings)
        wait_for(page, "s.visible && s.boxes.hidden_matmul")
        yield dict(page=page, errors=errors, warnings=warnings, logdir=logdir, reports=reports)
        page.close()


def test_the_dead_layer_is_drawn_in_the_alert_colour_and_the_others_green(health_page):
    page = health_page["page"]
    state = page.evaluate(OVERLAY_JS)
    assert state["visible"] and state["legend"] and state["menu"] and not state["bar"] and state["field"] == "h_fill"
    boxes = state["boxes"]
    dead = [name for name, b in boxes.items() if b["layer"] == "hidden"]
    healthy = [name for name, b in boxes.items() if b["layer"] in ("first", "output")]
    assert {"hidden_matmul", "hidden_bias_add", "hidden_activation"} <= set(dead)
    assert {"first_matmul", "first_activation", "output_matmul"} <= set(healthy)
    assert {boxes[name]["line"] for name in dead} == {HEALTH_COLORS["alert"]}
    assert {boxes[name]["line"] for name in healthy} == {HEALTH_COLORS["healthy"]}
    assert boxes["Add_4"]["layer"] == "" and boxes["Add_4"]["alpha"] == 0
    # ... and the page draws them so.
    for name, state_name in (("hidden_matmul", "alert"), ("first_matmul", "healthy")):
        assert np.abs(fill_pixel(page, boxes[name]) - hex_rgb(HEALTH_TINTS[state_name])).max() <= 3, name
    text = page.evaluate('() => Bokeh.documents[0].get_model_by_name("graph-health-note").text')
    assert "step 11 (1 alert, 2 healthy)" in text
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "graph-health.png"), full_page=True)
    assert health_page["errors"] == [] and health_page["warnings"] == []


def test_the_statistic_menu_recolours_the_layers(health_page):
    page = health_page["page"]
    before = page.evaluate(OVERLAY_JS)["boxes"]
    page.locator(".bk-input-group", has_text="Colour layers by").locator("select").select_option(
        "act_zero_fraction")
    state = wait_for(page, 's.mapper === "LinearColorMapper"')
    assert state["bar"] and not state["legend"] and state["field"] == "h_value"
    boxes = state["boxes"]
    assert boxes["hidden_matmul"]["value"] == 1.0 and boxes["first_matmul"]["value"] < 1.0      # all zeros: dead
    dead, healthy = fill_pixel(page, boxes["hidden_matmul"]), fill_pixel(page, boxes["first_matmul"])
    assert np.abs(dead - fill_pixel(page, before["hidden_matmul"])).max() > 20 or \
        np.abs(dead - hex_rgb(HEALTH_TINTS["alert"])).max() > 20
    assert np.abs(dead - healthy).max() > 40                    # Viridis' ends differ
    page.screenshot(path=str(SHOTS / "graph-health-statistic.png"), full_page=True)
    page.locator(".bk-input-group", has_text="Colour layers by").locator("select").select_option("weight_norm")
    assert wait_for(page, 's.mapper === "LogColorMapper"')["bar"]                  # norms: a log scale
    page.locator(".bk-input-group", has_text="Colour layers by").locator("select").select_option(
        label="health (alerts, NaN/Inf)")
    state = wait_for(page, 's.field === "h_fill"')
    assert state["legend"] and not state["bar"]
    assert state["boxes"]["hidden_matmul"]["line"] == HEALTH_COLORS["alert"]
    assert health_page["errors"] == [] and health_page["warnings"] == []


def test_hover_names_the_layer_and_its_latest_statistics(health_page):
    page = health_page["page"]
    boxes = page.evaluate(OVERLAY_JS)["boxes"]
    assert hover(page, boxes["Add_4"]) == {"name": "Add_4", "op": "Add", "outputs": "(32, 32) float", "source": ""}
    rows = hover(page, boxes["hidden_matmul"])
    assert rows["name"] == "hidden_matmul" and rows["layer"] == "hidden"
    assert rows["health"].startswith("alert (dead_relu") and rows["health"].endswith("at step 11")
    assert "dead_fraction 1" in rows["activation"] and "zero_fraction 1" in rows["activation"]
    assert rows["gradient"].startswith("norm 0") and "update_ratio" in rows["weights"]
    assert health_page["errors"] == [] and health_page["warnings"] == []


def test_new_reports_recolour_the_page(health_page):
    page = health_page["page"]
    with SummaryWriter(health_page["logdir"] / HEALTH_RUN) as writer:
        writer.add_health(report_with_nan(health_page["reports"][-1], "first", STEPS))
    state = wait_for(page, f's.boxes.first_matmul.line === "{HEALTH_COLORS["NaN/Inf"]}"')
    assert state["boxes"]["hidden_matmul"]["line"] == HEALTH_COLORS["healthy"]      # no alerts at the new step
    assert np.abs(fill_pixel(page, state["boxes"]["first_matmul"]) - hex_rgb(HEALTH_TINTS["NaN/Inf"])).max() <= 3
    assert health_page["errors"] == [] and health_page["warnings"] == []


def test_markup_in_layer_names_stays_text(health_page):
    page = health_page["page"]
    choose_run(page, MARKUP_RUN)
    state = wait_for(page, f's.boxes[{XSS + "_matmul"!r}] && s.visible')
    box = state["boxes"][XSS + "_matmul"]
    assert box["layer"] == XSS and box["line"] == HEALTH_COLORS["alert"]
    rows = hover(page, box)
    assert rows["layer"] == XSS and rows["name"] == XSS + "_matmul"
    assert page.evaluate("() => window.__xss") is None
    choose_run(page, PLAIN_RUN)                                  # a run without reports: as before
    state = wait_for(page, "!s.visible && s.boxes.hidden_matmul && s.boxes.hidden_matmul.layer === ''")
    assert not (state["legend"] or state["bar"] or state["menu"])
    choose_run(page, HEALTH_RUN)
    wait_for(page, "s.visible && s.boxes.hidden_matmul && s.boxes.hidden_matmul.layer === 'hidden'")
    assert health_page["errors"] == [] and health_page["warnings"] == []


def test_tapping_an_op_of_a_layer_opens_the_health_tab_on_it(health_page):
    page = health_page["page"]
    box = page.evaluate(OVERLAY_JS)["boxes"]["hidden_matmul"]
    page.mouse.click((box["left"] + box["right"]) / 2, (box["top"] + box["bottom"]) / 2)
    page.wait_for_url(re.compile(r".*[?&]tab=health(&|$).*"))
    query = parse_qs(urlparse(page.url).query)
    assert query["tab"] == ["health"] and query["run"] == [HEALTH_RUN] and query["layer"] == ["hidden"]
    assert query["theme"] == ["light"]                          # the rest of the page's URL is kept
    # and the Health tab opens on that run and layer, with the layer's trend drawn
    page.wait_for_function("""() => { if (!window.Bokeh || !Bokeh.documents.length) return false;
        const m = (n) => Bokeh.documents[0].get_model_by_name(n);
        return m('health-run-a') && m('health-run-a').value === %r && m('health-layer').value === 'hidden'
            && m('health-trend:A') && m('health-trend:A').data.step.length > 0; }""" % HEALTH_RUN,
                           polling=100, timeout=30000)
    page.wait_for_function(IDLE_JS, polling=50)
    assert health_page["errors"] == [] and health_page["warnings"] == []
