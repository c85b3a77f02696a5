"""The Health tab: two runs trained with a real ``flow.watch_health(writer=SummaryWriter(...))`` (a healthy MLP and
one whose first ReLU layer is dead from a bias of -100), served by ``flowlab serve`` and read in a real headless
Chromium: both runs' heatmaps, their divergence, the alerts, a tapped layer's trends and histograms of both runs, the
``?tab=health&run=&layer=`` link, and reports appended while the page is open. Screenshots go to
``artifacts/screenshots/health-tab.png`` (and ``health-tab-dark.png``). The store keeps a million steps of reports
in a bounded grid without losing a NaN step or a one-step spike."""
import os
from pathlib import Path

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.dashboard.runs import RunSelection
from flowlab.dashboard.store import HEALTH_BUCKETS, Store
from flowlab.dashboard.views.health import HealthView
from flowlab.dashboard.views.status import status_html
from flowlab.health import BATCH_NORM_STATISTICS, ROW_STATISTICS, STATISTICS
from flowlab.summary import SummaryWriter, health_log
from flowlab.summary.tailer import Datum
from jupyter_page import CHROMIUM
from test_health import data

SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"
BATCH, FEATURES, CLASSES = 32, 20, 5
LAYERS = ["hidden_0", "hidden_1", "output"]
STEPS = 40
IDLE_JS = "() => Bokeh.index.roots.every((v) => v.is_idle)"


def train(logdir, run, bias, steps=STEPS, reports=None):
    """``steps`` training steps of a two-ReLU-layer MLP whose health reports go to ``logdir/run``."""
    flow.clear_default_session()
    with SummaryWriter(logdir / run) as writer:
        @flow.global_function(type="train")
        def job(x: tp.Numpy.Placeholder((BATCH, FEATURES)),
                y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
            h = flow.layers.dense(x, 32, activation=flow.nn.relu, name="hidden_0",
                                  bias_initializer=flow.constant_initializer(bias))
            h = flow.layers.dense(h, 32, activation=flow.nn.relu, name="hidden_1")
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, flow.layers.dense(h, CLASSES, name="output"))
            flow.watch_health(None if reports is None else reports.append, writer=writer, histogram_every=10)
            flow.optimizer.SGD(0.05, momentum=0).minimize(loss)
            return loss
        for x, y in data(steps, 0, BATCH, FEATURES, CLASSES):
            job(x, y)
        flow.sync_default_session()


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("health")
    reports = []
    train(root, "healthy", 0.0, reports=reports)
    train(root, "dead_relu", -100.0)
    flow.clear_default_session()
    return root, reports


def view_of(root, samples=None):
    store = Store(root, samples=samples)
    store.poll()
    runs = RunSelection(store)
    runs.update()
    view = HealthView(store)
    view.runs = runs
    view.update()
    return store, view


# ------------------------------------------------------------------------------------------------ server side

def test_with_no_health_reports_the_tab_says_how_to_log_them(tmp_path):
    with SummaryWriter(tmp_path / "plain") as w:
        w.add_scalar("loss", 1.0, 0)
    _, view = view_of(tmp_path)
    assert view.message.visible and not view.body.visible
    assert "flow.watch_health(writer=" in view.message.text


def test_the_divergence_of_a_dead_layer_is_high_and_its_alerts_name_it(logdir):
    store, view = view_of(logdir[0])
    view.run_a.value, view.run_b.value = "healthy", "dead_relu"
    # every statistic the log holds (a network without batch norms or embeddings has no moving or row statistics)
    assert list(view.statistic.options) == [s for s in STATISTICS if s not in BATCH_NORM_STATISTICS + ROW_STATISTICS]
    for stat in ("dead_fraction", "act_zero_fraction"):
        view.statistic.value = stat
        data = view.divergence.source.data
        layer, hi = np.array(LAYERS)[np.asarray(data["bottom"], int)], np.array(data["hi"])
        assert view.divergence.layers == tuple(LAYERS)
        assert np.nanmin(hi[layer == "hidden_0"]) >= 0.45, stat      # dead from the first step to the last
    alerts = view.sides["B"].alert_source.data
    assert ("dead_relu", "hidden_0") in set(zip(alerts["kind"], alerts["layer"]))
    assert alerts["step"] == sorted(alerts["step"], reverse=True)                 # newest first
    assert "dead_relu ×" in view.sides["B"].counts.text and view.sides["A"].counts.text.endswith("no alerts.")
    assert view.sides["B"].table.visible and not view.sides["A"].table.visible
    assert "sample" not in view.sides["B"].counts.text                          # every alert step kept


def test_alert_counts_say_when_they_are_of_a_sample(logdir):
    """A long run's alert steps are kept as an even sample: the counts say they are of a sample, and of how many."""
    store, view = view_of(logdir[0], samples={"text": 8})
    view.run_a.value = "dead_relu"
    (text,) = [s for s in store.series("text") if s.run == "dead_relu"]
    assert len(text) < text.offered
    counts = view.sides["A"].counts.text
    assert f"in the {len(text):,} of {text.offered:,} steps with alerts kept: an even sample" in counts


def test_a_million_steps_keep_the_nan_step_and_the_spike_in_bounded_memory():
    layers, statistics = ("a", "b"), ("grad_norm", "act_nan")
    content = health_log.content(layers, statistics)
    n, nan_step, spike_step = 1_000_000, 123_457, 876_543

    class Provider:                     # what LogdirProvider yields for such a log, a poll's batch at a time
        def __init__(self):
            self.at, self.more, self.logdir = 0, False, "fake"

        def poll(self, **kwargs):
            batch = []
            for step in range(self.at, min(n, self.at + 50_000)):
                m = np.array([[1.0, 0.0], [1.0, 0.0]])     # grad_norm 1, no NaN
                if step == nan_step:
                    m[1] = [np.nan, 3.0]          # a NaN gradient norm and three NaNs in layer b
                if step == spike_step:
                    m[0, 0] = 1e6
                batch.append(Datum("run", "health", "health", step, 0.0, m, "flowlab_health", content))
            self.at += len(batch)
            self.more = self.at < n
            if self.at == 50_000:                 # a damaged record: counted, not fatal
                batch.append(Datum("run", "health", "health", 0, 0.0, np.ones(3), "flowlab_health", content))
            return batch

        def stats(self):
            return {"runs": 1, "files": 1, "records_read": n, "records_skipped": 0, "errors": {}}

        def exists(self):
            return True

        def projector_signatures(self):
            return {}

        structure_signatures = projector_signatures

    store = Store("/nonexistent-logdir")
    store._provider = Provider()
    store.poll()
    (series,) = store.series("health")
    grid = series.grid
    assert store.status()["health_skipped"] == 1
    assert "1 health reports skipped" in status_html(dict(store.status(), logdir="L", last_update=None))  # said
    assert len(series) <= 2 * store.samples["health"] and len(grid) <= HEALTH_BUCKETS  # bounded
    cells = grid.cells("grad_norm")
    assert cells["first"][0] == 0 and cells["last"][-1] == n - 1                  # the whole run
    spike = int(np.nanargmax(cells["hi"][0]))
    assert cells["hi"][0, spike] == 1e6 and cells["first"][spike] <= spike_step <= cells["last"][spike]
    bad = np.flatnonzero(cells["nonfinite"][1])
    assert len(bad) == 1 and cells["nonfinite"][1, bad[0]] == 3.0
    assert cells["first"][bad[0]] <= nan_step <= cells["last"][bad[0]]
    assert np.nanmax(cells["hi"][1]) == 1.0                                        # the NaN is not a value


def test_a_restart_purge_rebuilds_the_grid_from_the_reports_before_it(tmp_path):
    from flowlab.health import HealthReport
    from flowlab.summary import proto
    from flowlab.summary.record import frame

    def report(step, value):
        return HealthReport(step, {"a": {"grad_norm": value}}, None, None, [], {})

    with SummaryWriter(tmp_path / "r") as w:
        for step in range(10):
            w.add_health(report(step, 1.0))
    store = Store(tmp_path)
    store.poll()
    (series,) = store.series("health")
    epoch = series.epoch
    (path,) = (tmp_path / "r").glob("*tfevents*")
    with open(path, "ab") as f:         # the run restarts from step 5, at another value (a START after the first)
        for step in (0, 5):
            f.write(frame(proto.Event(wall_time=2.0, step=step, session_log=proto.SessionLog(status=1))
                          .SerializeToString()))
    with SummaryWriter(tmp_path / "r") as w:
        for step in range(5, 8):
            w.add_health(report(step, 2.0))
    store.poll()
    cells = series.grid.cells("grad_norm")
    assert series.epoch != epoch and series.grid.last_step == 7
    assert cells["first"].tolist() == list(range(8)) and cells["hi"][0].tolist() == [1.0] * 5 + [2.0] * 3


# ------------------------------------------------------------------------------------------------ in the browser

@pytest.fixture(scope="module")
def served(logdir, tmp_path_factory, chromium):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"needs Debian's chromium at {CHROMIUM}")
    pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")
    from dashboard_page import flowlab_serve
    with flowlab_serve(logdir[0], tmp_path_factory.mktemp("server") / "stderr.txt") as (url, log):
        yield url, log


def model(name):
    return f"Bokeh.documents[0].get_model_by_name({name!r})"


# A heatmap's cells name their layer by row (``bottom``); the names are its y axis formatter's.
CELL_LAYERS_JS = """(source) => { const d = Bokeh.documents[0], s = d.get_model_by_name(source);
    if (!s) return null;
    const figure = d.get_model_by_name(source.replace("health-heatmap:", "health-heatmap-figure:")
                                             .replace("health-divergence", "health-divergence-figure"));
    const args = figure.left[0].formatter.args, names = args instanceof Map ? args.get("names") : args.names;
    return Array.from(s.data.bottom, (r) => names[r]); }"""


def layers_of(page, source):
    cells = page.evaluate(CELL_LAYERS_JS, source)
    return None if cells is None else list(dict.fromkeys(cells))


def open_health(chromium, url, query, warnings, **options):
    from dashboard_page import open_dashboard
    page, errors = open_dashboard(chromium, f"{url}?tab=health{query}", warnings=warnings,
                                  viewport={"width": 1600, "height": 1100}, **options)
    page.wait_for_function(f"() => {model('health-heatmap:A')} != null && {model('health-heatmap:A')}.data.bottom"
                           f".length > 0", polling=100, timeout=30000)
    return page, errors


def click_row(page, figure, row):
    """A real mouse click on the middle of ``row`` (0: the top layer) of a heatmap figure."""
    x, y = page.evaluate(f"""() => {{ const v = Bokeh.index.find_one({model(figure)}), f = v.frame;
        const r = v.el.getBoundingClientRect();
        return [r.left + f.bbox.left + f.bbox.width / 2, r.top + f.y_scale.compute({row} + 0.5)]; }}""")
    page.mouse.click(x, y)


def divergence_of(page, layer):
    """The divergence heatmap's cell values of ``layer``, as the page holds them."""
    names, hi = page.evaluate(CELL_LAYERS_JS, "health-divergence"), page.evaluate(
        f"() => Array.from({model('health-divergence')}.data.hi)")
    return [v for name, v in zip(names, hi) if name == layer]


def test_two_runs_side_by_side_in_the_page(served, chromium):
    url, log = served
    warnings = []
    page, errors = open_health(chromium, url, "&run=healthy&runb=dead_relu&stat=dead_fraction", warnings)
    try:
        page.wait_for_function(f"() => {model('health-divergence')} != null", polling=100, timeout=30000)
        assert layers_of(page, "health-heatmap:A") == LAYERS and layers_of(page, "health-heatmap:B") == LAYERS
        ticks = page.evaluate(f"() => {model('health-heatmap-figure:A')}.left[0].ticker.ticks")
        assert ticks == [0.5, 1.5, 2.5]                                        # one labelled row per layer
        divergence = divergence_of(page, "hidden_0")
        assert len(divergence) > 0 and min(divergence) >= 0.9
        alerts = page.evaluate(f"() => {{ const d = {model('health-alerts:B')}.data; "
                               f"return d.kind.map((k, i) => [k, d.layer[i]]); }}")
        assert ["dead_relu", "hidden_0"] in alerts
        counts = page.evaluate(f"() => {model('health-alert-counts:B')}.text")
        assert "dead_relu ×" in counts
        # every alert group is in view without scrolling the table, and a three-layer heatmap leaves its colour
        # bar the height of several labels
        page.wait_for_function(f"""() => {{ const v = Bokeh.index.find_one({model('health-alert-table:B')});
            const port = v && v.el.shadowRoot.querySelector('.slick-viewport');
            return port && port.clientHeight > 0 && port.scrollHeight <= port.clientHeight + 1; }}""",
                               polling=100, timeout=20000)
        assert page.evaluate(f"() => Bokeh.index.find_one({model('health-heatmap-figure:A')}).frame.bbox.height") >= 90
        # the statistic chosen in the page: act_zero_fraction's divergence is high for the dead layer too
        page.evaluate(f"() => {{ {model('health-statistic')}.value = 'act_zero_fraction'; }}")
        page.wait_for_function(f"() => {model('health-divergence-figure')}.title.text.includes('act_zero_fraction')",
                               polling=100, timeout=20000)
        zeros = divergence_of(page, "hidden_0")
        assert min(zeros) >= 0.45
        assert "stat=act_zero_fraction" in page.url
        assert warnings == [] and errors == [], (warnings + errors)[:5]
        log.seek(0)
        assert "Traceback" not in log.read()
    finally:
        page.close()


TREND_JS = f"""() => ["A", "B"].map((n) => {{ const s = Bokeh.documents[0].get_model_by_name("health-trend:" + n);
    return [s.data.run[0] || null, s.data.step.length]; }})"""
HIST_JS = """() => ["activation", "weight", "gradient"].map((w) => ["A", "B"].map((n) =>
    Bokeh.documents[0].get_model_by_name(`health-hist:${w}:${n}`).data.left.length))"""
SHOWN_FIGURES_JS = """() => { const names = [];
    for (const v of Bokeh.index.all_views()) if (v.model.name && v.el.isConnected) names.push(v.model.name);
    return names; }"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_tapping_a_layer_draws_both_trends_and_histograms(served, chromium, scheme):
    url, _ = served
    warnings = []
    page, errors = open_health(chromium, url, "&run=healthy&runb=dead_relu" + ("&theme=dark" * (scheme == "dark")),
                               warnings)
    try:
        page.wait_for_function(IDLE_JS, polling=100, timeout=30000)
        click_row(page, "health-heatmap-figure:B", 1)                     # the broken run's hidden_1
        page.wait_for_function(f"() => {model('health-layer')}.value === 'hidden_1'", polling=100, timeout=20000)
        page.wait_for_function(f"() => {model('health-detail')}.text.includes('hidden_1')", polling=100,
                               timeout=20000)
        assert page.evaluate(TREND_JS) == [["healthy", STEPS], ["dead_relu", STEPS]]
        shown = page.evaluate(SHOWN_FIGURES_JS)
        assert "health-trend" in shown
        counts = page.evaluate(HIST_JS)
        assert all(a > 0 and b > 0 for a, b in counts), counts                # both runs' bars, each kind
        assert {"health-hist-figure:activation", "health-hist-figure:weight",
                "health-hist-figure:gradient"} <= set(shown)
        assert page.evaluate(f"() => {model('health-step')}.value") == 30   # the newest step both logged
        assert "layer=hidden_1" in page.url
        # the colour bars' labels, painted by an axis no CSS reaches, are light on the dark plot and dark enough
        # on the white one (the light page here is the browser's choice: the grey that reads on both)
        from dashboard_page import luminance
        inks = page.evaluate("""() => [...Bokeh.index.all_views()].filter((v) => v.model.constructor.__name__ ===
            "ColorBar" && v.model.visible).map((v) => v._axis_view.visuals.major_label_text.get_text_color())""")
        assert len(inks) >= 3 and all((luminance(c) > 0.45) if scheme == "dark" else (luminance(c) < 0.25)
                                      for c in inks), inks
        page.mouse.move(5, 1000)                                              # (no hover in the picture)
        page.wait_for_function(IDLE_JS, polling=100, timeout=30000)
        page.wait_for_timeout(500)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"health-tab{'-dark' * (scheme == 'dark')}.png"), full_page=True)
        assert warnings == [] and errors == [], (warnings + errors)[:5]
    finally:
        page.close()


def test_a_link_opens_a_run_and_a_layer_and_unknown_values_are_ignored(served, chromium):
    url, _ = served
    warnings = []
    page, errors = open_health(chromium, url, "&run=dead_relu&layer=hidden_1", warnings)
    try:
        page.wait_for_function(f"() => {model('health-trend:A')}.data.step.length > 0", polling=100, timeout=20000)
        state = page.evaluate(f"() => [{model('health-run-a')}.value, {model('health-layer')}.value, "
                              f"{model('health-trend:A')}.data.run[0]]")
        assert state == ["dead_relu", "hidden_1", "dead_relu"]
        assert "health-trend" in page.evaluate(SHOWN_FIGURES_JS)
        page.close()
        page, errors = open_health(chromium, url, "&run=%3Cb%3Enope&layer=nope&stat=nope", warnings)
        page.wait_for_function(f"() => {model('health-trend:A')}.data.step.length > 0", polling=100, timeout=20000)
        state = page.evaluate(f"() => [{model('health-run-a')}.value, {model('health-layer')}.value, "
                              f"{model('health-statistic')}.value]")
        assert state == ["dead_relu", "hidden_0", "grad_norm"]                # the defaults
        assert warnings == [] and errors == [], (warnings + errors)[:5]
    finally:
        page.close()


def test_the_tab_reaches_the_page_whole_with_its_data_in_one_message(served, chromium):
    """Opened from another tab, the Health tab is filled before it joins the page (``View.fill_before_shown``): its
    heatmaps, their data and the divergence arrive in one message, which the page lays out once (a patch per change
    made the page lay out three heatmaps over and over: 3 s on a 24-layer, 100k-step log, benchmarks/data_path.py)."""
    from dashboard_page import open_dashboard
    url, _ = served
    frames = []
    page, errors = open_dashboard(chromium, url, viewport={"width": 1600, "height": 1100})
    try:
        tabs_js = """() => { const tabs = [...Bokeh.documents[0].all_models].find((m) => m.name === "tabs");
            tabs.active = tabs.tabs.findIndex((p) => p.title === "Health"); }"""
        cdp = page.context.new_cdp_session(page)        # the frames of the socket the page already has open
        cdp.send("Network.enable")
        cdp.on("Network.webSocketFrameReceived", lambda e: frames.append(e["response"]["payloadData"]))
        page.evaluate(tabs_js)
        page.wait_for_function(f"() => {model('health-divergence')} != null && "
                               f"{model('health-divergence')}.data.bottom.length > 0 && "
                               "Bokeh.index.roots.every((v) => v.is_idle)", polling=50, timeout=30000)
        names = ("health-heatmap:A", "health-heatmap:B", "health-divergence", "health-trend")
        carrying = [i for i, f in enumerate(frames) if any(f'"{n}"' in f for n in names)]
        assert carrying, "no message carried the tab's models"
        assert all(f'"{n}"' in frames[carrying[0]] for n in names), [frames[i][:200] for i in carrying]
        assert errors == [], errors[:5]
    finally:
        page.close()


def test_reports_appended_while_the_page_is_open_grow_the_heatmap(served, logdir, chromium):
    url, _ = served
    root, reports = logdir
    warnings = []
    page, errors = open_health(chromium, url, "&run=healthy&runb=none", warnings)
    last_js = f"() => Math.max(...{model('health-heatmap:A')}.data.last)"
    try:
        page.wait_for_function(IDLE_JS, polling=100, timeout=30000)
        assert page.evaluate(last_js) == STEPS - 1
        with SummaryWriter(root / "healthy") as writer:                   # the run goes on: 20 more reports
            for i, report in enumerate(reports[:20]):
                writer.add_health(report, global_step=STEPS + i)
        page.wait_for_function(f"() => ({last_js})() === {STEPS + 19}", polling=100, timeout=20000)
        assert layers_of(page, "health-heatmap:A") == LAYERS
        assert page.evaluate(f"() => {model('health-divergence')}") is None      # no run B: no divergence
        assert warnings == [] and errors == [], (warnings + errors)[:5]
    finally:
        page.close()
