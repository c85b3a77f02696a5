"""The dashboard in a real headless Chromium (Debian's ``chromium`` driven by Playwright; ``.ci/run`` installs it).

One ``flowlab serve`` over a logdir written by flowlab's SummaryWriter and by a second writer (torch's
``torch.utils.tensorboard`` when torch is importable, else tensorboardX), one page for the whole module. Screenshots
of every tab go to ``artifacts/screenshots/<tab>.png``.
"""
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

from dashboard_page import SCALARS_PLACED_JS, flowlab_serve, open_dashboard
from flowlab.plots.static import log_ticks, value_label
from jupyter_page import CHROMIUM

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"needs Debian's chromium at {CHROMIUM} (.ci/run installs it: "
                                       "apt-get install -y chromium)")
playwright = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")

SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"
XSS_RUN = "<img src=x onerror=window.__xss=1>"
LONG = 6000

IDLE_JS = "() => Bokeh.index.roots.every((v) => v.is_idle)"
# The scalars view's lines as the page drew them (rows of each card's expanded source: run, xs, ys, smooth; x is the
# step on the default axis) as {step, value} lists.
SOURCES_JS = """() => [...Bokeh.documents[0].all_models]
    .filter((m) => m.constructor.__name__ === "ColumnDataSource" && "xs" in m.data && "smooth" in m.data)
    .flatMap((m) => m.data.run.map((_, i) => ({step: Array.from(m.data.xs[i]), value: Array.from(m.data.ys[i])})))"""


def _peer_writer(logdir):
    """torch's SummaryWriter when torch is importable, else tensorboardX's: the other writers users have."""
    try:
        from torch.utils.tensorboard import SummaryWriter
        return "torch", SummaryWriter(str(logdir / "torch"))
    except ImportError:
        from tensorboardX import SummaryWriter
        return "tensorboardX", SummaryWriter(str(logdir / "tensorboardX"))


def _write_logs(logdir):
    from flowlab.summary import SummaryWriter
    rng = np.random.default_rng(0)
    ours = SummaryWriter(logdir / "flowlab", flush_secs=0.2)
    peer_name, peer = _peer_writer(logdir)
    for writer in (ours, peer):
        for step in range(300):
            writer.add_scalar("loss", float(np.exp(-step / 80) + 0.05 * rng.random()), step)
            writer.add_scalar("accuracy", float(1 - np.exp(-step / 60)), step)
        for step in range(0, 300, 50):
            writer.add_histogram("weights/dense", rng.normal(0, 1 + step / 300, size=500), step)
        writer.add_image("digits", rng.random((1, 16, 16)), 0)
        writer.add_text("config", "lr = 0.1, hidden = 128", 0)
    for step in range(LONG):                                  # long enough to be downsampled on display
        ours.add_scalar("long", float(np.sin(step / 50)), step)
    ours.add_hparams({"lr": 0.1, "hidden": 128}, {"hparams/accuracy": 0.9})
    peer.add_hparams({"lr": 0.01, "hidden": 64}, {"hparams/accuracy": 0.8})
    peer.close()
    ours.flush()
    with SummaryWriter(logdir / XSS_RUN) as w:                # markup in a run name must stay text
        w.add_scalar("loss", 0.5, 0)
        w.add_scalar("loss", 0.4, 1)
    return ours, peer_name


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory, chromium):
    logdir = tmp_path_factory.mktemp("logs")
    live_writer, peer_name = _write_logs(logdir)
    try:
        with flowlab_serve(logdir, tmp_path_factory.mktemp("server") / "stderr.txt") as (url, log):
            start = time.perf_counter()
            warnings = []
            page, errors = open_dashboard(chromium, url, viewport={"width": 1400, "height": 900},
                                          accept_downloads=True, warnings=warnings)
            # the scalars' lines are expanded in the page once the document is ready: loaded means drawn; the cards
            # join the page one a server turn, so loaded is the whole first page (it was any one line: a race)
            page.wait_for_function(f"() => ({SCALARS_PLACED_JS})() && ({SOURCES_JS})().some((s) => s.step.length > 0)",
                                   polling=20)
            load_s = time.perf_counter() - start
            yield dict(page=page, errors=errors, warnings=warnings, writer=live_writer, peer=peer_name,
                       load_s=load_s, log=log)
            page.close()
    finally:
        live_writer.close()


def server_errors(dashboard):
    log = dashboard["log"]
    log.seek(0)
    return [line for line in log.read().splitlines() if "Traceback" in line or "ERROR" in line]


def test_page_loads_without_console_errors_and_shows_both_writers(dashboard):
    page = dashboard["page"]
    assert dashboard["errors"] == []
    # A run filter's row indices checked before the page expanded the rows warned once per run and line (2,000
    # warnings and most of the drawing time for a thousand runs).
    assert not [w for w in dashboard["warnings"] if "out of bounds" in w], dashboard["warnings"][:5]
    status = page.evaluate("() => Bokeh.documents[0].get_model_by_name('status').text")
    assert "runs" in status and "0 skipped" in status
    sources = page.evaluate(SOURCES_JS)
    full = [s for s in sources if len(s["step"]) == 300]
    assert len(full) == 4, f"loss and accuracy from flowlab and {dashboard['peer']}"
    print(f"first page load {dashboard['load_s']:.2f} s")


def test_each_tab_renders(dashboard):
    page = dashboard["page"]
    SHOTS.mkdir(parents=True, exist_ok=True)
    tabs = page.evaluate("() => Bokeh.documents[0].get_model_by_name('tabs').tabs.map((t) => [t.name, t.title])")
    assert tabs and tabs[0][0] == "scalars"
    for index, (name, title) in enumerate(tabs):
        page.locator(".bk-tab", has_text=re.compile(rf"^{re.escape(title)}$")).first.click()
        page.wait_for_function(f"() => Bokeh.documents[0].get_model_by_name('tabs').active === {index}")
        # the server builds a tab's view when it is first shown: wait for it to replace the blank placeholder
        page.wait_for_function(f"""() => {{ const tab = Bokeh.documents[0].get_model_by_name('tabs').tabs[{index}];
            const first = tab.child.children[0];
            return !(first.constructor.__name__ === "Div" && first.text === ""); }}""", polling=20)
        page.wait_for_function(IDLE_JS, polling=20)
        page.wait_for_timeout(300)
        # (no graph in this logdir: graph.png is the demo's graph, from test_dashboard_graph.py)
        shot = {"graph": "graph-empty", "hparams": "hparams-2-sessions"}.get(name, name)    # (hparams.png: 8 sessions)
        page.screenshot(path=str(SHOTS / f"{shot}.png"), full_page=True)
        assert dashboard["errors"] == [], f"console errors after opening the {title} tab"
    page.locator(".bk-tab").first.click()


def test_graph_tab_without_a_graph_is_one_line(dashboard):
    page, before = dashboard["page"], len(dashboard["warnings"])
    page.locator(".bk-tab", has_text=re.compile(r"^Graph$")).first.click()
    # both models the check below reads: once in CI the note was found and the figure not yet (they join the page
    # in one layout; why one was missing is not known)
    page.wait_for_function("() => ['graph-note', 'graph-figure'].every("
                           "(name) => Bokeh.documents[0].get_model_by_name(name) !== null)", polling=20)
    page.wait_for_function(IDLE_JS, polling=20)
    state = page.evaluate("""() => {
        const doc = Bokeh.documents[0], fig = doc.get_model_by_name("graph-figure");
        const view = Bokeh.index.get_one(fig);
        return {note: doc.get_model_by_name("graph-note").text, figure: fig.visible,
                drawn: view != null && view.el.isConnected && view.el.getBoundingClientRect().height > 0};
    }""")
    assert state == {"note": "No graph in this logdir yet.", "figure": False, "drawn": False}
    assert dashboard["warnings"][before:] == [] and dashboard["errors"] == []
    page.locator(".bk-tab").first.click()


def test_text_cards_are_as_wide_as_their_text(dashboard):
    page = dashboard["page"]
    page.locator(".bk-tab", has_text=re.compile(r"^Text$")).first.click()
    page.wait_for_function("() => (Bokeh.documents[0].get_model_by_name('cards:text') || {tags: []}).tags[1] > 0",
                           polling=20)
    page.wait_for_function(IDLE_JS, polling=20)
    widths = page.evaluate("""() => Bokeh.documents[0].get_model_by_name("cards:text").children
        .map((card) => Bokeh.index.find_one(card).el.getBoundingClientRect().width)""")
    assert widths and all(80 < w < 320 for w in widths), widths      # "lr = 0.1, hidden = 128" is ~150 px
    page.locator(".bk-tab").first.click()


def test_run_names_stay_text_even_in_tooltips(dashboard):
    page = dashboard["page"]
    canvas = page.locator(".bk-Figure").first
    box = canvas.bounding_box()
    for fraction in (0.2, 0.4, 0.6, 0.8):                    # sweep the hover line across a card
        page.mouse.move(box["x"] + box["width"] * fraction, box["y"] + box["height"] / 2)
        page.wait_for_timeout(100)
    assert page.evaluate("() => window.__xss") is None
    assert dashboard["errors"] == []


def test_csv_download_is_built_in_the_page(dashboard, tmp_path):
    page = dashboard["page"]
    with page.expect_download() as download:
        page.locator(".bk-btn", has_text=re.compile(r"^⤓ CSV$")).first.click()       # a card's own download
    path = tmp_path / "scalars.csv"
    download.value.save_as(path)
    lines = path.read_text().splitlines()
    assert lines[0] == "run,step,wall_time,value"
    assert {line.split(",")[0] for line in lines[1:]} >= {'"flowlab"', f'"{dashboard["peer"]}"'}


def test_axis_and_log_toggles_rebuild_every_card(dashboard):
    page = dashboard["page"]

    def every_card(check):
        page.wait_for_function(f"""() => [...Bokeh.documents[0].all_models]
            .filter((m) => m.name && m.name.startsWith("card:"))
            .every((card) => {{ const fig = card.children[0]; return {check}; }})""", timeout=20000)
        page.wait_for_function(IDLE_JS, polling=20)

    lines = 'fig.renderers.find((r) => r.glyph.constructor.__name__ === "MultiLine").data_source.data.xs'
    page.locator(".bk-btn", has_text="Wall").first.click()
    every_card('fig.below[0].constructor.__name__ === "DatetimeAxis" && '
               f'{lines}.every((x) => x.length > 0 && x[0] > 1e12)')          # drawn at wall times (ms)
    log_y = page.locator(".bk-Switch").nth(1)                  # the switches: log x, log y, ignore outliers
    log_y.click()
    every_card('fig.y_scale.constructor.__name__ === "LogScale"')
    page.screenshot(path=str(SHOTS / "scalars-wall-log.png"), full_page=True)
    # the loss falls over a decade and a half: 1-2-5 multiples labelled along all of it, as the static copy's rule
    axis = page.evaluate("""() => {
        const fig = Bokeh.documents[0].get_model_by_name("card:loss").children[0], axis = fig.left[0];
        const {start, end} = fig.y_range, major = axis.ticker.get_ticks(start, end, fig.y_range, NaN).major;
        return {start, end, major, labels: axis.formatter.doFormat(major, {loc: 0})}; }""")
    ticks, _ = log_ticks(axis["start"], axis["end"], 5)
    assert axis["major"] == pytest.approx(list(ticks)) and axis["labels"] == [value_label(t) for t in ticks]
    assert len(ticks) >= 3 and ticks[0] < 3 * axis["start"], axis
    log_y.click()
    every_card('fig.y_scale.constructor.__name__ === "LinearScale"')
    page.locator(".bk-btn", has_text="Step").first.click()
    every_card(f'fig.below[0].constructor.__name__ === "LinearAxis" && {lines}.every((x) => x[0] < 1e6)')
    assert dashboard["errors"] == []


def test_zooming_in_brings_the_exact_points_of_the_visible_range(dashboard):
    from flowlab.dashboard.views.scalars import LIMIT
    page = dashboard["page"]
    # The "long" card's figure: its x range, the steps its sources hold inside it, and where it is on the page.
    state = """() => {
        const fig = Bokeh.documents[0].get_model_by_name("card:long").children[0];
        const {start, end} = fig.x_range;
        const lines = fig.renderers.find((r) => r.glyph.constructor.__name__ === "MultiLine").data_source.data;
        const steps = lines.xs.map((s) => Array.from(s));
        const box = Bokeh.index.get_one(fig).el.getBoundingClientRect();
        return {start, end, inside: steps.map((s) => s.filter((x) => x >= start && x <= end).length),
                lengths: steps.map((s) => s.length), box: [box.x, box.y, box.width, box.height]};
    }"""
    before = page.evaluate(state)
    assert max(before["lengths"]) <= LIMIT < LONG                              # downsampled
    page.evaluate("""() => {
        const fig = Bokeh.documents[0].get_model_by_name("card:long").children[0];
        fig.toolbar.tools.find((t) => t.constructor.__name__ === "BoxZoomTool").active = true;
    }""")
    x, y, width, height = before["box"]
    page.mouse.move(x + width * 0.3, y + 40)                                   # drag a box over a fifth of it
    page.mouse.down()
    page.mouse.move(x + width * 0.5, y + height - 60, steps=10)
    page.mouse.up()
    exact = ("() => { const s = (" + state + ")(); const n = Math.floor(s.end) - Math.ceil(s.start) + 1; "
             "return s.end - s.start < " + str(LONG * 0.5) + " && s.inside.every((k) => k === n); }")
    try:
        page.wait_for_function(exact, timeout=15000, polling=50)                # every step in view, none skipped
    except playwright.TimeoutError:
        pytest.fail(f"no exact points after zooming: {before} -> {page.evaluate(state)}")
    after = page.evaluate(state)
    assert max(after["lengths"]) <= 2 * LIMIT
    page.evaluate("""() => {
        const fig = Bokeh.documents[0].get_model_by_name("card:long").children[0];
        fig.toolbar.tools.find((t) => t.constructor.__name__ === "BoxZoomTool").active = false;
    }""")
    assert dashboard["errors"] == []


def test_appended_scalar_appears_in_the_open_page_without_a_reload(dashboard):
    """The page receives the new point by itself. How fast (target: p95 <= 0.5 s) is measured by
    benchmarks/data_path.py; the bound here only tells a live page from one that never updates."""
    page, writer = dashboard["page"], dashboard["writer"]
    writer.add_scalar("loss", 123.0, 10_000)
    writer.flush()
    start = time.perf_counter()
    try:
        page.wait_for_function(f"() => ({SOURCES_JS})().some((s) => s.step.includes(10000) && s.value.includes(123))",
                               timeout=10000, polling=20)
    except playwright.TimeoutError:
        dashboard["log"].seek(0)
        pytest.fail(f"the new point did not arrive within 10 s; server log:\n{dashboard['log'].read()[-3000:]}")
    print(f"live delta latency {time.perf_counter() - start:.2f} s")
    assert dashboard["errors"] == [] and server_errors(dashboard) == []


def test_a_new_tag_gets_a_drawn_card_in_the_open_page(dashboard):
    """A card built in a live page reaches it inside a patch with its data, which fires no change in the page: the
    server's nudge makes the page expand it (without it the card stays empty)."""
    page, writer = dashboard["page"], dashboard["writer"]
    for step, value in enumerate((7.25, 7.5, 7.75)):
        writer.add_scalar("fresh/tag", value, step)
    writer.flush()
    try:
        page.wait_for_function("""() => { const card = Bokeh.documents[0].get_model_by_name("card:fresh/tag");
            if (!card) return false;
            const source = card.children[0].renderers[0].data_source;
            return source.data.ys.some((ys) => Array.from(ys).join() === "7.25,7.5,7.75"); }""",
                               timeout=15000, polling=50)
    except playwright.TimeoutError:
        pytest.fail("the new tag's card was not drawn with its points")
    assert dashboard["errors"] == [] and server_errors(dashboard) == []


def test_the_scalars_toolbar_is_one_line_in_a_1280_px_window(dashboard):
    """Every Scalars control, from the tag search to the "all shown" downloads, on one line beside the run list in
    a 1280-px-wide window (it wrapped the downloads onto a second line)."""
    page = dashboard["page"]
    page.set_viewport_size({"width": 1280, "height": 900})
    try:
        page.wait_for_function(IDLE_JS, polling=50)
        boxes = page.evaluate("""() => Object.fromEntries(["tag-filter", "smoothing", "card-size", "export-csv",
                "export-json"].map((name) => {
            const view = Bokeh.index.find_one(Bokeh.documents[0].get_model_by_name(name));
            const box = view.el.getBoundingClientRect();
            return [name, {top: box.top, bottom: box.bottom, right: box.right}];
        }))""")
        first, last = boxes["tag-filter"], boxes["export-json"]
        assert last["right"] <= 1280 and last["top"] < first["bottom"], boxes      # not below the first line
        assert all(box["top"] < first["bottom"] for box in boxes.values()), boxes
    finally:
        page.set_viewport_size({"width": 1400, "height": 900})
        page.wait_for_function(IDLE_JS, polling=50)
