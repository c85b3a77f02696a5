"""``flowlab.widgets.HealthPanel``: reports of deliberately broken nets reach its grid and alert list, what it sends a
page (through a recording comm, applied as live.js applies it), its terminal lines and bad input; then in real
JupyterLab in headless Chromium: a cell trains a net with a dead ReLU layer under ``flow.watch_health(panel)`` and
the test reads what the page draws, switches the statistic and clicks a layer's row."""
import html
import io
import json
import math
import os
import re
import time
from collections import Counter

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.health import HealthAlert, HealthReport
from flowlab.plots.health import AlertGroups, heatmap_svg
from flowlab.widgets import HealthPanel
from test_health import data
from test_widgets import Page, sent  # noqa: F401 - sent is a fixture

BATCH, FEATURES, CLASSES = 32, 12, 4


def batches(steps, seed=0):
    return data(steps, seed, BATCH, FEATURES, CLASSES)


def health_job(handler, depth=2, bias=0.0, lr=0.1, activation=flow.nn.relu):
    """A train job of ``depth`` dense layers ``hidden_<i>`` (the first with bias ``bias``) and ``output``."""
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((BATCH, FEATURES)),
            y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        h = x
        for i in range(depth):
            h = flow.layers.dense(h, 16, activation=activation, name=f"hidden_{i}",
                                  bias_initializer=flow.constant_initializer(bias) if i == 0 else None)
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, flow.layers.dense(h, CLASSES, name="output"))
        flow.watch_health(handler)
        flow.optimizer.SGD(lr, momentum=0).minimize(loss)
        return loss
    return job


def train(job, steps):
    for x, y in batches(steps):
        job(x, y)
    flow.sync_default_session()


class Both:
    """A handler giving each report to the panel and keeping it."""

    def __init__(self, panel):
        self.panel, self.reports = panel, []

    def __call__(self, report):
        self.reports.append(report)
        self.panel(report)


# ------------------------------------------------------------------------------------------------ data side

def test_a_dead_relu_nets_reports_reach_the_grid_and_the_alert_list():
    panel = HealthPanel(mode="terminal", file=io.StringIO())
    handler = Both(panel)
    train(health_job(handler, bias=-100.0), 6)
    reports = handler.reports
    grid = panel.grid
    assert grid.layers == ("hidden_0", "hidden_1", "output")
    assert panel.statistic == "grad_norm" and "dead_fraction" in grid.statistics and panel.step == 5
    # the trend columns are the reports' numbers, one step a column in a short run
    for layer in grid.layers:
        for stat in ("dead_fraction", "grad_norm", "weight_norm", "act_mean_abs"):
            trend = grid.trend_columns(layer, stat)
            assert trend["step"].tolist() == list(range(6))
            np.testing.assert_array_equal(trend["mean"], [r.table[layer][stat] for r in reports])
            np.testing.assert_array_equal(trend["max"], trend["mean"])
    assert grid.trend_columns("hidden_0", "dead_fraction")["mean"].tolist() == [1.0] * 6
    # every alert of every report is kept and counted; hidden_0 is the default layer (first with an alert)
    alerts = [a for r in reports for a in r.alerts]
    assert list(panel.alerts) == alerts and ("dead_relu", "hidden_0") in {(a.kind, a.layer) for a in alerts}
    assert panel.counts["dead_relu"] == sum(a.kind == "dead_relu" for a in alerts) >= 6
    assert panel.default_layer() == "hidden_0"
    # the list: one row a kind on a layer (its steps, how often), not one an alert
    groups = panel.alert_groups.columns()
    assert sorted(zip(groups["kind"], groups["layer"])) == sorted({(a.kind, a.layer or "") for a in alerts})
    dead = list(zip(groups["kind"], groups["layer"])).index(("dead_relu", "hidden_0"))
    assert groups["steps"][dead] == "0 … 5" and groups["count"][dead] == 6
    page_html = HealthPanel._alerts_html(groups, panel.counts)
    assert re.search(r"dead_relu <b>\d+</b>", page_html)
    # grouped by kind: a heading a kind, then a row a layer with its latest message in full
    assert page_html.count('<tr class="flowlab-alert-kind"') == len(set(groups["kind"]))
    assert page_html.count('<tr class="flowlab-alert"') == len(groups["kind"])
    assert all(html.escape(m) in page_html for m in groups["message"])


def test_a_healthy_net_has_no_alert_and_the_first_layer_is_the_default():
    panel = HealthPanel(mode="terminal", file=io.StringIO())
    train(health_job(panel), 5)
    assert not panel.alerts and not panel.counts and panel.default_layer() == "hidden_0"
    assert "No alerts" in HealthPanel._alerts_html(panel.alert_groups.columns(), panel.counts)


def report(step, table, alerts=()):
    return HealthReport(step, table, 1.0, None, list(alerts))


def test_the_default_layer_is_the_first_in_forward_order_with_an_alert():
    panel = HealthPanel(mode="terminal", file=io.StringIO())
    table = {"a": {"grad_norm": 1.0}, "b": {"grad_norm": 1.0}, "c": {"grad_norm": 1.0}}
    panel(report(0, table))
    assert panel.default_layer() == "a"
    panel(report(1, table, [HealthAlert("update_ratio", "c", 1, "c"), HealthAlert("loss_spike", None, 1, "all")]))
    assert panel.default_layer() == "c"
    panel(report(2, table, [HealthAlert("dead_relu", "b", 2, "b")]))
    assert panel.default_layer() == "b"


def test_alert_list_is_escaped_newest_first_with_a_count_per_kind():
    evil = "<img src=x onerror=alert(1)>"
    alerts = [HealthAlert("nan", "a", 1, f"first {evil}"), HealthAlert("dead_relu", evil, 3, "second"),
              HealthAlert("nan", None, 2, "third")]
    text = HealthPanel._alerts_html(AlertGroups(alerts).columns(), {"nan": 2, "dead_relu": 1})
    assert evil not in text and "&lt;img src=x onerror=alert(1)&gt;" in text
    assert text.index("second") < text.index("third") < text.index("first")
    assert "3 alerts" in text and "dead_relu <b>1</b>" in text and "nan <b>2</b>" in text


def test_alert_list_shows_every_kind_with_full_messages_and_names_the_layers_beyond_the_first_few():
    from flowlab.widgets.health import ALERT_LAYERS_SHOWN
    long = "the update of layer {} is 2.55 of its weights' norm (healthy is around 1e-3; threshold 0.5): " \
        "the weights are being overwritten. Usually a learning rate far too high. " + "x" * 300 + " END"
    alerts = [HealthAlert("update_ratio", f"layer_{i}", s, long.format(f"layer_{i}")) for i in range(7)
              for s in range(3)] + [HealthAlert(kind, None, 5, f"{kind} message END")
                                    for kind in ("loss_spike", "exploding_gradient", "nan")] + \
        [HealthAlert("dead_relu", "layer_1", 4, "dead END")]
    groups = AlertGroups(alerts)
    counts = Counter(a.kind for a in alerts)
    text = HealthPanel._alerts_html(groups.columns(), counts)
    kinds = re.findall(r'<tr class="flowlab-alert-kind" data-kind="([^"]+)"', text)
    assert sorted(kinds) == sorted(counts) and len(kinds) == 5
    assert kinds.index("dead_relu") < kinds.index("update_ratio")           # the kind seen last first
    assert "update_ratio</b> <span style=\"color:#777\">· 21 alerts on 7 layers · steps 0 … 2" in text
    assert "loss_spike</b> <span style=\"color:#777\">· 1 alert on the network · step 5" in text
    assert text.count("END</td>") == ALERT_LAYERS_SHOWN + 4                 # messages whole, never cut
    shown = re.findall(r"layer_(\d) is 2.55", text)
    assert len(shown) == ALERT_LAYERS_SHOWN
    rest = sorted(set(map(str, range(7))) - set(shown))
    assert f"… and {len(rest)} more layers (times): " + ", ".join(f"layer_{i} (3)" for i in rest) in text


def test_alert_groups_keep_a_row_a_kind_on_a_layer_however_the_alerts_arrive():
    alerts = [HealthAlert("dead_relu", "h", s, f"dead at {s}") for s in (3, 1, 7, 5)] + \
        [HealthAlert("loss_spike", None, 6, "spike"), HealthAlert("dead_relu", "out", 2, "out dead")]
    groups = AlertGroups()
    started = [first for a in alerts for first in groups.add([a])]   # one at a time, as reports come, out of order
    assert started == [alerts[0], alerts[4], alerts[5]]       # each group's first alert, once
    assert groups.columns() == AlertGroups(alerts).columns() == {
        "first": [1, 6, 2], "step": [7, 6, 2], "steps": ["1 … 7", "6", "2"], "count": [4, 1, 1],
        "kind": ["dead_relu", "loss_spike", "dead_relu"], "layer": ["h", "", "out"],
        "message": ["dead at 7", "spike", "out dead"]}
    assert len(groups) == 3 and groups.layers() == {"h", "", "out"}
    assert groups.kind_counts() == {"dead_relu": 5, "loss_spike": 1}
    groups.add([HealthAlert("dead_relu", "h", 10_000, "later")])
    assert groups.columns()["steps"][0] == "1 … 10,000" and groups.columns()["message"][0] == "later"


def test_terminal_prints_each_new_alert_once_and_a_per_layer_line():
    out = io.StringIO()
    panel = HealthPanel(mode="terminal", file=out)
    table = {"h": {"grad_norm": 0.5, "dead_fraction": 1.0}, "out": {"grad_norm": 2.0, "dead_fraction": 0.0}}
    for step in range(30):
        panel(report(step, table, [HealthAlert("dead_relu", "h", step, "dead units in h")]))
    panel.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "[step 0] dead_relu h: dead units in h"           # once, not once a step
    assert sum("dead_relu h:" in line for line in lines) == 1
    assert lines[-1] == "[step 29] grad_norm: h 0.5  out 2 | alerts so far: dead_relu 30"
    assert 2 <= len(lines) <= 4                       # the table at most every few seconds, and at the close


def test_bad_input_is_named():
    panel = HealthPanel(mode="terminal", file=io.StringIO())
    with pytest.raises(TypeError, match=r"HealthPanel: expected a flowlab.HealthReport .* got dict"):
        panel({"h": {"grad_norm": 1.0}})
    with pytest.raises(TypeError, match="got int"):
        panel(3)
    panel(report(0, {"h": {"grad_norm": 1.0}}))
    with pytest.raises(ValueError, match=r"layers \['h'\]; a report of layers \['other'\]"):
        panel(report(1, {"other": {"grad_norm": 1.0}}))
    for kwargs, match in [(dict(refresh_hz=0), "refresh_hz"), (dict(refresh_hz=50), "refresh_hz"),
                          (dict(refresh_hz=True), "refresh_hz"), (dict(max_steps=1), "max_steps"),
                          (dict(max_steps=2.5), "max_steps"), (dict(mode="browser"), "mode"),
                          (dict(statistic="grad"), "unknown statistic 'grad'")]:
        with pytest.raises(ValueError, match=match):
            HealthPanel(**kwargs)
    assert HealthPanel().mode == "terminal"           # no Jupyter kernel under pytest


def test_a_handler_error_from_the_panel_reaches_the_next_call():
    panel = HealthPanel(mode="terminal", file=io.StringIO())
    panel(report(0, {"elsewhere": {"grad_norm": 1.0}}))   # the panel now shows another job's layers
    job = health_job(panel)
    x, y = next(batches(1))
    with pytest.raises(flow.errors.WatchCallbackError, match=r"handler HealthPanel.* a report of layers \['hidden_0'"):
        job(x, y)      # a job that returns a value has run its callbacks
        job(x, y)


def test_notebook_mode_sends_every_statistic_and_only_new_buckets(sent):    # noqa: F811
    panel = HealthPanel(mode="notebook", statistic="dead_fraction")
    panel._refresher.stop()                           # only the refresh() calls below flush
    train(health_job(panel, bias=-100.0), 4)
    panel.refresh()
    page = Page(panel.widget, sent).update()
    cells = page.model(panel._cells).data
    layers, stats = panel.grid.layers, panel.grid.statistics
    assert len(cells["row"]) == 4 * len(layers)       # a row per step and layer, bucket by bucket
    for i, layer in enumerate(layers):
        rows = np.flatnonzero(np.asarray(cells["row"]) == i)
        for stat in stats:
            np.testing.assert_array_equal(cells[f"mean|{stat}"][rows], panel.grid.trend_columns(layer, stat)["mean"])
    # the snapshot draws the panel's own choice before the page's script runs
    assert page.model(panel.select).value == "dead_fraction"
    heat = page.model(panel.heatmap.source).data
    assert sorted(set(heat["bottom"])) == list(range(len(layers))) and len(heat["bottom"]) == 4 * len(layers)
    assert panel.heatmap.layer_at(len(layers) - 1) == layers[-1]        # a cell's row names its layer
    assert page.model(panel._trend_source).data["mean"].tolist() == [1.0] * 4        # hidden_0 is dead
    assert "dead_relu" in page.model(panel._alerts_div).text
    before = len(sent.of(panel.widget))
    panel.refresh()                                   # nothing new: nothing sent
    assert len(sent.of(panel.widget)) == before
    panel(report(4, {layer: {s: 0.5 for s in stats} for layer in layers}))
    panel.refresh()
    (method, data, buffers), = sent.of(panel.widget)[before:]
    (_, at, columns), = [d for d in data["content"]["data"] if d[0] == panel._cells.id]
    # the new step, and the bucket before it (its right edge moved to where the new one starts)
    assert at == 3 * len(layers) and len(buffers[columns["row"]["buffer"]]) == 8 * 2 * len(layers)
    page.update()
    assert page.model(panel._cells).data["row"].shape == (5 * len(layers),)
    assert page.model(panel._cells).data["mean|dead_fraction"][-1] == 0.5
    # the saved notebook's copy: the heatmap as SVG, the trend, the alerts
    static = panel.widget.static_html()
    assert static.count("<svg") >= 2 and "dead_relu" in static and "<script" not in static
    panel.close()


def test_a_burst_of_reports_sends_a_bounded_number_of_updates_and_every_step_reaches_the_grid(sent):  # noqa: F811
    hz, steps, spike, bad = 10, 3000, 1234, 2345
    panel = HealthPanel(mode="notebook", refresh_hz=hz, max_steps=100)

    def table(step):
        norm = 1e6 if step == spike else math.nan if step == bad else 1.0 + step % 7 / 10
        return {layer: {"grad_norm": norm, "grad_nan": float(step == bad)} for layer in ("a", "b")}

    panel(report(0, table(0)))
    panel.refresh()
    start, t0 = sent.count(panel.widget), time.monotonic()
    for step in range(1, steps):
        panel(report(step, table(step)))
    elapsed = time.monotonic() - t0
    during = sent.count(panel.widget) - start
    panel.refresh()
    assert during <= hz * elapsed + 2, (during, elapsed)        # at most refresh_hz updates a second, however fast
    page = Page(panel.widget, sent).update()
    cells = page.model(panel._cells).data
    for layer in (0, 1):
        rows = np.asarray(cells["row"]) == layer
        first, last = np.asarray(cells["first"])[rows], np.asarray(cells["last"])[rows]
        # the buckets tile every step, in at most max_steps columns
        assert len(first) <= 100 and first[0] == 0 and last[-1] == steps - 1 and (first[1:] == last[:-1] + 1).all()
        holding = {s: int(np.flatnonzero((first <= s) & (s <= last))[0]) for s in (spike, bad)}
        hi, nonfinite = np.asarray(cells["hi|grad_norm"])[rows], np.asarray(cells["nonfinite"])[rows]
        assert hi[holding[spike]] == 1e6                              # the spike's bucket keeps it
        assert np.nanmax(np.delete(hi, holding[spike])) == pytest.approx(1.6)
        assert nonfinite[holding[bad]] == 1 and nonfinite.sum() == 1  # the NaN step is counted, in its own bucket
    panel.close()


def test_static_heatmap_escapes_names_and_marks_missing_and_nonfinite_cells():
    from flowlab.summary.thinning import HealthGrid
    grid = HealthGrid(["<b>x</b>", "y"], ["grad_norm", "grad_nan"], 10)
    grid.extend([0, 1, 2], [[[1.0, 0], [math.nan, 0]], [[10.0, 0], [1.0, 0]], [[100.0, 3], [1.0, 0]]])
    svg = heatmap_svg(grid, "grad_norm")
    assert "<b>x</b>" not in svg and "&lt;b&gt;x&lt;/b&gt;" in svg
    assert 'fill="#d9d9d9"' in svg                     # y at step 0: no value
    assert svg.count('stroke="') == 1                  # x held NaN/Inf at step 2
    assert "log scale" in svg and "linear scale" in heatmap_svg(grid, "grad_nan")
    assert "pink" not in svg and 'fill="#e377c2"' not in svg
    # a zero norm (a dead layer's gradient) is a value: pink, as the live heatmap draws it, not grey
    grid.extend([3], [[[10.0, 0], [0.0, 0]]])
    svg = heatmap_svg(grid, "grad_norm")
    assert svg.count('fill="#e377c2"') == 1 and "pink: 0" in svg and svg.count('fill="#d9d9d9"') == 1
    assert 'fill="#e377c2"' not in heatmap_svg(grid, "grad_nan")      # on a linear scale 0 is the darkest colour


def test_static_heatmap_of_sparse_reports_has_no_gaps_and_labels_its_scale_and_steps():
    """Reports every 50 steps: each cell reaches the next bucket's first step (white stripes between them before);
    the colour bar and the step axis are labelled by plots.static's rules, as the live figure's BokehJS code is."""
    import re
    from flowlab.summary.thinning import HealthGrid
    grid = HealthGrid(["a", "b"], ["grad_norm", "dead_fraction"], 100)
    steps = list(range(0, 20_000, 50))
    grid.extend(steps, [[[10.0 ** (1 + 2 * (s % 7 == 0)), 0.0], [1.0, 1.0]] for s in steps])
    svg = heatmap_svg(grid, "grad_norm")
    texts = re.findall(r">([^<>]+)</text>", svg)
    rects = [tuple(float(v) for v in m) for m in re.findall(
        r'<rect x="([\d.]+)" y="([\d.]+)" height="([\d.]+)" width="([\d.]+)" fill="#[0-9A-Fa-f]{6}" '
        r'shape-rendering', svg)]
    row = sorted((x, w) for x, y, _, w in rects if y == min(r[1] for r in rects))
    assert len(row) > 10 and row[0][0] == 100.0
    for (x, w), (next_x, _) in zip(row, row[1:]):
        assert x + w >= next_x, (x, w, next_x)             # no gap between a cell and the next
    assert abs(row[-1][0] + row[-1][1] - (900 - 56)) <= 1   # the last one ends at the plot's right edge
    assert {"10", "100", "1000"} <= set(texts) and {"0", "2k", "10k", "18k"} <= set(texts)
    assert "log scale; grey: no value" in texts
    linear = re.findall(r">([^<>]+)</text>", heatmap_svg(grid, "dead_fraction"))
    assert {"0", "0.2", "0.4", "0.6", "0.8", "1"} <= set(linear) and "linear scale; grey: no value" in linear


# ------------------------------------------------------------------------------------------------ in JupyterLab

NOTEBOOK = ["""\
import json, time
import numpy as np
import flowlab as flow
import flowlab.typing as tp
from flowlab.widgets import HealthPanel

panel = HealthPanel()
display(panel)
rng = np.random.default_rng(0)
centres = rng.normal(size=(4, 12)) * 2

@flow.global_function(type="train")
def job(x: tp.Numpy.Placeholder((32, 12)), y: tp.Numpy.Placeholder((32,), dtype=flow.int32)) -> tp.Numpy:
    h = flow.layers.dense(x, 16, activation=flow.nn.relu, name="hidden_0",
                          bias_initializer=flow.constant_initializer(-100.0))     # dead from the start
    h = flow.layers.dense(h, 16, activation=flow.nn.relu, name="hidden_1")
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, flow.layers.dense(h, 4, name="output"))
    flow.watch_health(panel)
    flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
    return loss

def train(steps):
    for _ in range(steps):
        y = rng.integers(0, 4, 32).astype(np.int32)
        job((centres[y] + rng.normal(size=(32, 12))).astype(np.float32), y)
        time.sleep(0.03)          # a few refreshes reach the page while the cell runs

train(40)
""", """\
def trends():
    print(json.dumps({s: {layer: {k: v.tolist() for k, v in panel.grid.trend_columns(layer, s).items()}
                          for layer in panel.grid.layers} for s in panel.grid.statistics}))
trends()
""", """\
train(3)
trends()
"""]

# What the page's HealthPanel holds, read from its Bokeh models (None before it is drawn).
STATE_JS = """() => {
    // the document on screen (a re-rendered output leaves its old document behind, detached)
    const doc = (window.Bokeh ? Bokeh.documents : []).find((d) => d.get_model_by_name("health-cells") &&
        Bokeh.index.find_one(d.get_model_by_name("health-heatmap"))?.el.isConnected);
    if (!doc) return null;
    const m = (name) => doc.get_model_by_name(name), heat = m("health-heat").data, trend = m("health-trend").data;
    const view = Bokeh.index.find_one(m("health-heatmap"));
    const box = view.el.getBoundingClientRect(), frame = view.frame;
    const row = (i) => ({x: box.left + frame.bbox.left + frame.bbox.width / 2,
                         y: box.top + frame.y_scale.compute(i + 0.5)});
    const names = view.model.left[0].formatter.args, rowNames = names instanceof Map ? names.get("names") : names.names;
    return {rows: [...new Set(Array.from(heat.bottom ?? []))].sort(), cells: heat.bottom.length,
            layers: [...new Set(Array.from(heat.bottom, (r) => rowNames[r]))], value: Array.from(heat.linear_value),
            title: m("health-heatmap").title.text,
            trendTitle: m("health-trend-figure").title.text, statistic: m("health-statistic").value,
            trend: {step: Array.from(trend.step), mean: Array.from(trend.mean), max: Array.from(trend.max)},
            cellsRows: m("health-cells").data.row.length, alerts: m("health-alerts").text,
            rowAt: [row(0), row(1), row(2)], idle: Bokeh.index.roots.every((v) => v.is_idle)};
}"""


def printed_trends(nb, cell):
    return json.loads(nb.text(nb.output_area(cell)).split("]:", 1)[-1].strip())


def same(page_values, kernel_values):
    return np.testing.assert_array_equal(np.asarray(page_values, np.float64), np.asarray(kernel_values, np.float64))


@pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"), reason="needs Debian's chromium at /usr/bin/chromium")
def test_health_panel_in_jupyterlab_draws_switches_statistic_and_shows_a_tapped_layers_trend(jupyter_server,
                                                                                                 chromium):
    for module in ("playwright.sync_api", "jupyterlab", "anywidget", "nbformat"):
        pytest.importorskip(module)
    from jupyter_page import NotebookPage, write_notebook
    from test_widgets_browser import SHOTS
    write_notebook(jupyter_server.root_dir / "health.ipynb", NOTEBOOK)
    with NotebookPage(chromium, jupyter_server, "health.ipynb", "lab") as nb:
        warnings = []
        nb.page.on("console", lambda m: warnings.append(m.text) if m.type == "warning" else None)
        for cell in (0, 1):
            nb.run_cell(cell)
            nb.wait_idle()
        nb.page.wait_for_function(f"() => {{ const s = ({STATE_JS})(); return s && s.idle && s.cellsRows === 120; }}",
                                  polling=100)
        kernel = printed_trends(nb, 1)
        state = nb.page.evaluate(STATE_JS)
        # one row per layer, a cell per step and layer, the panel's default statistic
        assert state["rows"] == [0, 1, 2] and state["cells"] == 3 * 40
        assert state["layers"] == ["hidden_0", "hidden_1", "output"]
        assert state["statistic"] == "grad_norm" and state["title"].startswith("grad_norm: norm of the layer")
        assert "dead_relu" in state["alerts"] and "hidden_0" in state["alerts"]
        text = nb.text(nb.output_area(0))
        assert re.search(r"dead_relu \d+", text) and "100% of the units of layer hidden_0" in text
        # before any click: the first layer with an alert, hidden_0, whose gradient is zero (dead)
        assert state["trendTitle"].startswith("layer hidden_0: grad_norm")
        same(state["trend"]["mean"], kernel["grad_norm"]["hidden_0"]["mean"])
        canvases = [c for c in nb.canvases(nb.output_area(0)) if c["drawn"] and c["visible"]]
        assert len(canvases) >= 2
        before = {c["fingerprint"] for c in canvases}

        # switching the statistic redraws the heatmap with that statistic's numbers
        nb.page.locator(".flowlab-live select").first.select_option("dead_fraction")
        nb.page.wait_for_function(f"() => ({STATE_JS})().title.startsWith('dead_fraction')", polling=50)
        state = nb.page.evaluate(STATE_JS)
        dead = [kernel["dead_fraction"][layer]["max"] for layer in ("hidden_0", "hidden_1", "output")]
        same(state["value"], np.array(dead).T.reshape(-1))          # bucket by bucket, a cell per layer
        same(state["trend"]["mean"], kernel["dead_fraction"]["hidden_0"]["mean"])
        nb.page.wait_for_function(IDLE, polling=50)
        after = {c["fingerprint"] for c in nb.canvases(nb.output_area(0)) if c["drawn"] and c["visible"]}
        assert after != before, "switching the statistic did not redraw"

        # clicking the output layer's row shows its trend
        click = state["rowAt"][2]
        nb.page.mouse.click(click["x"], click["y"])
        nb.page.wait_for_function(f"() => ({STATE_JS})().trendTitle.startsWith('layer output')", polling=50)
        state = nb.page.evaluate(STATE_JS)
        assert state["trendTitle"] == "layer output: dead_fraction"
        same(state["trend"]["step"], kernel["dead_fraction"]["output"]["step"])
        same(state["trend"]["max"], kernel["dead_fraction"]["output"]["max"])
        nb.page.locator(".flowlab-live select").first.select_option("weight_norm")
        nb.page.wait_for_function(f"() => ({STATE_JS})().trendTitle === 'layer output: weight_norm'", polling=50)
        same(nb.page.evaluate(STATE_JS)["trend"]["mean"], kernel["weight_norm"]["output"]["mean"])
        nb.page.mouse.move(5, 5)                      # no tooltip over the picture
        nb.page.evaluate("() => document.activeElement?.blur()")
        nb.page.wait_for_function(IDLE, polling=50)
        nb.screenshot(SHOTS / "health-panel.png", nb.output_area(0))

        # a cell that trains on: the document is rebuilt at its end, the choice made in the page stays
        nb.run_cell(2)
        nb.wait_idle()
        nb.page.wait_for_function(f"() => {{ const s = ({STATE_JS})(); return s && s.idle && s.cellsRows === 129; }}",
                                  polling=100)
        state = nb.page.evaluate(STATE_JS)
        assert state["statistic"] == "weight_norm" and state["trendTitle"] == "layer output: weight_norm"
        same(state["trend"]["mean"], printed_trends(nb, 2)["weight_norm"]["output"]["mean"])
        assert nb.output_errors() == [] and nb.errors() == []
        assert [w for w in warnings if "bokeh" in w.lower()] == [], warnings


IDLE = "() => Bokeh.index.roots.every((v) => v.is_idle)"


def test_a_colour_scale_over_equal_counts_or_fractions_starts_at_zero():
    """All-zero NaN counts are the darkest colour (not the middle of a scale around 0), all-dead layers the
    brightest; a log scale and mixed values keep their fitted range."""
    from flowlab.plots.health import value_range
    assert value_range([0.0, 0.0, np.nan], linear=True) == (0.0, 1.0)
    assert value_range([1.0, 1.0], linear=True) == (0.0, 1.0)
    assert value_range([3.0, 3.0], linear=True) == (0.0, 3.0)
    assert value_range([0.2, 0.7], linear=True) == (0.2, 0.7)
    assert value_range([-1.0, -1.0], linear=True) == (-1.5, -0.5)
    assert value_range([2.0, 2.0], linear=False) == (1.0, 4.0)


DIVERGING = ["""\
import json
import numpy as np
import flowlab as flow
import flowlab.typing as tp
from flowlab.widgets import HealthPanel

panel = HealthPanel()
display(panel)
rng = np.random.default_rng(0)
centres = rng.normal(size=(4, 12)) * 2

@flow.global_function(type="train")
def job(x: tp.Numpy.Placeholder((32, 12)), y: tp.Numpy.Placeholder((32,), dtype=flow.int32)) -> tp.Numpy:
    h = flow.layers.dense(x, 16, activation=flow.nn.relu, name="hidden_0")
    h = flow.layers.dense(h, 16, activation=flow.nn.relu, name="hidden_1")
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, flow.layers.dense(h, 4, name="output"))
    flow.watch_health(panel)
    flow.optimizer.SGD(5.0, momentum=0).minimize(loss)      # far too high: the run diverges
    return loss

with np.errstate(all="ignore"):
    for _ in range(40):
        y = rng.integers(0, 4, 32).astype(np.int32)
        job((centres[y] + rng.normal(size=(32, 12))).astype(np.float32), y)
""", """\
flow.sync_default_session()
panel.refresh()
print(json.dumps(panel.alert_groups.columns()))
"""]

# Each alert kind's heading and each message of the page's alert list: its text, and whether it is on screen whole
# once scrolled to (the topmost element at its corners is itself, and its text does not overflow its cell).
DEBUG_JS = """() => { const out = [];
 for (const d of Bokeh.documents) { const m = d.get_model_by_name("health-alerts"); if (!m) continue;
   const v = Bokeh.index.find_one(m); out.push([v?.constructor.name, v?.el.isConnected, !!v?.shadow_el,
   (v?.shadow_el ?? v?.el.shadowRoot)?.innerHTML.slice(0, 300), m.text.slice(0, 100)]); }
 return JSON.stringify(out); }"""
ALERTS_JS = """() => {
    const doc = (window.Bokeh ? Bokeh.documents : []).find((d) => d.get_model_by_name("health-alerts") &&
        Bokeh.index.find_one(d.get_model_by_name("health-alerts"))?.el.isConnected);
    if (!doc) return null;
    const view = Bokeh.index.find_one(doc.get_model_by_name("health-alerts"));
    const root = view.shadow_el ?? view.el.shadowRoot;
    const seen = (el) => {
        el.scrollIntoView({block: "center"});
        const r = el.getBoundingClientRect();
        const corners = [[r.left + 2, r.top + 2], [r.right - 2, r.bottom - 2]];
        return r.width > 0 && corners.every(([x, y]) => { const hit = root.elementFromPoint(x, y);
                                                         return hit !== null && el.contains(hit); }) &&
            el.scrollWidth <= el.clientWidth + 1 && el.scrollHeight <= el.clientHeight + 1;
    };
    return {kinds: [...root.querySelectorAll("tr.flowlab-alert-kind")].map((tr) => ({kind: tr.dataset.kind,
                                                                                   seen: seen(tr)})),
            messages: [...root.querySelectorAll("td.flowlab-alert-message")].map((td) => ({text: td.textContent,
                                                                                       seen: seen(td)}))};
}"""


@pytest.mark.skipif(not os.path.exists("/usr/bin/chromium"), reason="needs Debian's chromium at /usr/bin/chromium")
def test_health_panel_in_jupyterlab_shows_every_alert_kind_of_a_diverging_run_with_whole_messages(jupyter_server,
                                                                                                   chromium):
    for module in ("playwright.sync_api", "jupyterlab", "anywidget", "nbformat"):
        pytest.importorskip(module)
    from jupyter_page import NotebookPage, write_notebook
    from test_widgets_browser import SHOTS
    write_notebook(jupyter_server.root_dir / "diverging.ipynb", DIVERGING)
    with NotebookPage(chromium, jupyter_server, "diverging.ipynb", "lab") as nb:
        for cell in (0, 1):
            nb.run_cell(cell)
            nb.wait_idle()
        groups = json.loads(nb.text(nb.output_area(1)).split("]:", 1)[-1].strip())
        kinds = set(groups["kind"])
        assert len(kinds) >= 5, f"the run was meant to raise five kinds of alert, raised {sorted(kinds)}"
        deadline = time.monotonic() + 60
        while (state := nb.page.evaluate(ALERTS_JS)) is None or len(state["kinds"]) < len(kinds):
            assert time.monotonic() < deadline, f"the page's alert list: {state} " + nb.page.evaluate(DEBUG_JS)
            time.sleep(0.2)
        nb.page.wait_for_function(IDLE, polling=50)
        state = nb.page.evaluate(ALERTS_JS)
        assert {k["kind"] for k in state["kinds"]} == kinds
        assert all(k["seen"] for k in state["kinds"]), state["kinds"]
        # each kind's first layers' latest messages, whole and readable
        from flowlab.widgets.health import ALERT_LAYERS_SHOWN
        expected = [m for kind in dict.fromkeys(groups["kind"])
                    for m in [m for k, m in zip(groups["kind"], groups["message"]) if k == kind][:ALERT_LAYERS_SHOWN]]
        assert sorted(m["text"] for m in state["messages"]) == sorted(expected)
        assert all(m["seen"] for m in state["messages"]), [m for m in state["messages"] if not m["seen"]]
        # the heatmap and the trend put a step at the same pixel; the colour bar's labels have one style (a scale
        # reaching 1e+16 read "10k, 100M, 1T, 1e+16")
        drawn = nb.page.evaluate(STEPS_JS)
        heat, trend = drawn["health-heatmap"], drawn["health-trend-figure"]
        assert heat["steps"] == trend["steps"] and heat["pixels"] == pytest.approx(trend["pixels"], abs=0.5), drawn
        labels = drawn["bar"]
        styles = {bool(re.fullmatch(r"-?[\d.]+e[+-]\d+", label)) for label in labels if label != "0"}
        assert len(labels) >= 3 and len(styles) == 1, labels
        nb.page.mouse.move(5, 5)
        nb.screenshot(SHOTS / "health-panel-diverging.png", nb.output_area(0))
        assert nb.output_errors() == [] and nb.errors() == []


# Where the heatmap and the trend draw their first and last step (their shared x range), and the labels of the
# colour bar shown.
STEPS_JS = """() => {
  const out = {}, views = [...Bokeh.index.all_views()];
  for (const name of ["health-heatmap", "health-trend-figure"]) {
    // the document shown: the newest (the page rebuilds it from each snapshot)
    const fig = Bokeh.documents.map((d) => d.get_model_by_name(name)).filter((m) => m).pop();
    const view = views.find((v) => v.model === fig);
    const {start, end} = fig.x_range;
    out[name] = {steps: [start, end], pixels: [view.frame.x_scale.compute(start), view.frame.x_scale.compute(end)]};
    if (name === "health-heatmap") {
      const bar = fig.right.find((r) => r.visible && r.color_mapper);
      const ticks = bar.ticker.get_ticks(bar.color_mapper.low, bar.color_mapper.high, null, NaN).major;
      out.bar = bar.formatter.doFormat(ticks, {loc: 0});
    }
  }
  return out;
}"""


def test_a_transformers_panel_adds_a_compact_attention_heatmap(sent):    # noqa: F811
    from test_health_transformer import watched_bert
    panel = HealthPanel(mode="notebook")
    panel._refresher.stop()
    reports, _ = watched_bert(4, before_health=None)          # the reports, then the panel takes them as they came
    for r in reports:
        panel(r)
    panel.refresh()
    page = Page(panel.widget, sent).update()
    grid = panel.attention_grid
    heads = [f"bert-encoder-layer_{i}-attention-self/head_{h}" for i in range(2) for h in range(2)]
    assert grid.layers == tuple(heads) and grid.statistics == ("attention_entropy",)
    for layer in heads:
        block, h = layer.rsplit("/head_", 1)
        np.testing.assert_array_equal(grid.trend_columns(layer, "attention_entropy")["mean"],
                                      [r.attention[block][int(h)] for r in reports])
    heat = page.model(panel.attention_map.source).data
    assert len(heat["bottom"]) == 4 * len(heads)                          # a cell a head and step, in the page
    np.testing.assert_array_equal(heat["linear_value"][np.asarray(heat["bottom"]) == 0],
                                  [r.attention["bert-encoder-layer_0-attention-self"][0] for r in reports])
    assert page.model(panel.attention_map.linear).high == 1.0 and page.model(panel.attention_map.linear).low == 0.0
    # its steps, the main heatmap's and the trend's are one x range drawn between the same borders
    figures = (panel.heatmap.figure, panel.attention_map.figure, panel.trend)
    assert all(f.x_range is panel.heatmap.figure.x_range for f in figures)
    assert len({(f.min_border_left, f.min_border_right) for f in figures}) == 1
    # a new report reaches the page's attention heatmap too
    later = HealthReport(10, reports[-1].table, attention={b: [0.01] * 2 for b in reports[-1].attention})
    panel(later)
    panel.refresh()
    page.update()
    heat = page.model(panel.attention_map.source).data
    assert len(heat["bottom"]) == 5 * len(heads) and heat["hi"][-1] == 0.01
    assert panel.widget.static_html().count("<svg") >= 3                 # its static copy has it too
    with pytest.raises(ValueError, match=r"HealthPanel: this panel shows the attention blocks of"):
        panel(HealthReport(11, reports[-1].table, attention={"other": [0.5]}))
    panel.close()


def test_many_heads_are_drawn_a_row_per_block_by_its_lowest_head():
    panel = HealthPanel(mode="terminal", file=io.StringIO())
    attention = {f"layer_{i}": [0.9 - 0.01 * h for h in range(12)] for i in range(12)}     # 144 heads
    panel(HealthReport(0, {"dense": {"grad_norm": 1.0}}, attention=attention))
    grid = panel.attention_grid
    assert grid.layers == tuple(f"layer_{i} (lowest head)" for i in range(12))
    assert grid.trend_columns("layer_3 (lowest head)", "attention_entropy")["mean"].tolist() == [pytest.approx(0.79)]
    panel.close()
    plain = HealthPanel(mode="terminal", file=io.StringIO())
    plain(HealthReport(0, {"dense": {"grad_norm": 1.0}}))
    assert plain.attention_grid is None
    plain.close()


def test_the_trends_value_range_is_set_with_its_data_in_the_snapshot_and_the_static_copy(sent):    # noqa: F811
    """The trend's value range is a ``Range1d`` set with its data (an auto range makes the page lay the plot out
    again): the page's script sets it for the layer and statistic shown there, Python for the snapshot (the
    default layer) and for the saved notebook's static copy, which drew the trend on 0…1 before."""
    from bokeh.models import DataRange1d, Range1d
    panel = HealthPanel(mode="notebook", statistic="grad_norm")
    panel._refresher.stop()
    train(health_job(panel), 6)
    panel.refresh()
    panel.widget.settle()
    page = Page(panel.widget, sent).update()
    trend = panel.grid.trend_columns(panel.default_layer("grad_norm"), "grad_norm")
    values = np.concatenate([trend["min"], trend["max"], trend["mean"]])
    values = values[np.isfinite(values)]
    y = page.model(panel.trend).y_range
    assert type(y) is Range1d and not isinstance(y, DataRange1d)
    assert y.start <= values.min() and values.max() <= y.end
    assert y.end - y.start <= 1.1 * np.ptp(values) + 1e-12             # fitted to it, not to 0…1
    assert "trend_figure.y_range" in panel.select.js_property_callbacks["change:value"][0].code
    layout = panel._static_layout()
    (static_trend,) = [child for child in layout.children if getattr(child, "y_range", None) is not None]
    assert static_trend.x_range.start <= 0 and 6 <= static_trend.x_range.end <= 6.5
    assert static_trend.y_range.start <= values.min() and values.max() <= static_trend.y_range.end
    assert static_trend.y_range.end - static_trend.y_range.start <= 1.1 * np.ptp(values) + 1e-12
    panel.close()


def test_the_page_scripts_sticky_range_is_plots_sticky_range():
    """The page's script moves the trend's value range by the rule Python uses for the other panels' ranges
    (``plots.data.sticky_range``): its ``sticky`` function, run by Node, against Python's on a run of extents."""
    import shutil
    import subprocess
    from flowlab.plots import sticky_range
    from flowlab.widgets.health import _PAGE_JS
    node = shutil.which("node")
    if node is None:
        pytest.skip("needs Node.js to run the page script's function")
    rng = np.random.default_rng(3)
    cases, current = [], None
    for i in range(200):                 # a trend that grows, shrinks, jumps (a spike) and goes flat
        lo = float(rng.normal(0, 1 + i / 20)) if i % 37 else 5.0
        hi = lo + (float(rng.exponential(1 + i / 10)) if i % 29 else 0.0)
        if i == 120:
            hi = 1e6
        cases.append([current, lo, hi])
        current = list(sticky_range(None if current is None else tuple(current), lo, hi))
    cases += [[None, 0.0, 0.0], [None, -3.0, -3.0], [[0.0, 1.0], 0.25, 0.75], [[0.0, 1.0], 0.4, 0.5],
              [[9.0, 93_000.0], 0.0, 72_000.0], [[9.0, 93_000.0], 5.0, 72_000.0], [[-93_000.0, -9.0], -72_000.0, 0.0]]
    script = _PAGE_JS[_PAGE_JS.index("function sticky("):] + \
        f"\nconsole.log(JSON.stringify({json.dumps(cases)}.map(([c, lo, hi]) => sticky(c, lo, hi))));"
    got = json.loads(subprocess.run([node, "-e", script], capture_output=True, text=True, check=True,
                                    timeout=60).stdout)
    assert len(got) == len(cases)
    for (current, lo, hi), js in zip(cases, got):
        assert js == pytest.approx(list(sticky_range(None if current is None else tuple(current), lo, hi)),
                                   rel=1e-12, abs=1e-12), (current, lo, hi)
