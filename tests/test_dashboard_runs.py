"""The run list in a real headless Chromium: twenty runs written by tensorboardX, each in its own colour, and the
runs checked in the list are the runs every tab shows. A screenshot goes to ``artifacts/screenshots/runs.png``."""
import csv
import os
from pathlib import Path

import numpy as np
import pytest

from dashboard_page import DRAWN_JS, as_js, drawn_is, flowlab_serve, open_dashboard
from jupyter_page import CHROMIUM
from test_dashboard_app import cielab

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Debian's chromium at {CHROMIUM}")
pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")
tensorboardX = pytest.importorskip("tensorboardX")

SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"
RUNS = [f"lr={lr:g},seed={seed}" for lr in (0.1, 0.03, 0.01, 0.003, 0.001) for seed in range(4)]
IDLE_JS = "() => Bokeh.index.roots.every((v) => v.is_idle)"
# The runs of the Histograms tab's cards on the current page (each card is a figure, the run its grey subtitle).
HISTOGRAM_RUNS_JS = """() => { if (!window.Bokeh || !Bokeh.documents.length) return [];
    const grid = Bokeh.documents[0].get_model_by_name("cards:histograms");
    return grid ? grid.children.filter((card) => card.above).map((card) => card.above[0].text) : []; }"""
# The swatch colour of each row of the run list, in the page's rendering.
SWATCHES_JS = """() => { const table = Bokeh.index.find_one(Bokeh.documents[0].get_model_by_name("runs-table"));
    return [...table.shadow_el.querySelectorAll(".slick-row")].map((row) => [
        row.querySelectorAll(".slick-cell")[2].textContent,
        getComputedStyle(row.querySelector(".slick-cell span")).color]); }"""


@pytest.fixture(scope="module")
def twenty_runs(tmp_path_factory, chromium):
    logdir = tmp_path_factory.mktemp("runs20")
    rng = np.random.default_rng(0)
    for k, run in enumerate(RUNS):
        with tensorboardX.SummaryWriter(str(logdir / run)) as w:
            for step in range(100):
                w.add_scalar("train/loss", float(np.exp(-step / (20 + k)) + 0.02 * rng.random()), step)
            for step in range(0, 100, 25):
                w.add_histogram("weights", rng.normal(k / 10, 1, 200), step)
    with flowlab_serve(logdir, tmp_path_factory.mktemp("server") / "stderr.txt") as (url, _):
        page, errors = open_dashboard(chromium, url, viewport={"width": 1600, "height": 1000}, accept_downloads=True)
        page.wait_for_function(f"() => ({DRAWN_JS})().length === 1 && ({DRAWN_JS})()[0].length === {len(RUNS)}",
                               polling=50)
        yield page, errors
        page.close()


def rgb_hex(css):
    r, g, b = (int(v) for v in css[css.index("(") + 1:css.index(")")].split(",")[:3])
    return f"#{r:02x}{g:02x}{b:02x}"


def test_twenty_runs_get_twenty_distinct_colours_in_the_list_and_the_lines(twenty_runs):
    page, errors = twenty_runs
    drawn = page.evaluate("""() => { const s = [...Bokeh.documents[0].all_models].find((m) =>
        m.constructor.__name__ === "ColumnDataSource" && m.data.smooth && m.data.xs);
        return Object.fromEntries(s.data.run.map((r, i) => [r, s.data.colour[i]])); }""")
    assert sorted(drawn) == sorted(RUNS)
    lines = cielab([drawn[run] for run in RUNS])
    distance = np.linalg.norm(lines[:, None] - lines[None], axis=2)
    distance[np.diag_indices(len(RUNS))] = np.inf
    assert distance.min() > 20, "two runs' colours look alike"
    swatches = dict(page.evaluate(SWATCHES_JS))               # the list's swatch of a run is its lines' colour
    assert sorted(swatches) == sorted(RUNS)
    listed = cielab([rgb_hex(swatches[run]) for run in RUNS])
    assert np.linalg.norm(listed - lines, axis=1).max() < 2   # (the page's colour management moves a unit or so)
    assert errors == []


def test_unchecking_and_searching_runs_changes_every_tab(twenty_runs):
    page, errors = twenty_runs
    table = page.locator(".bk-DataTable")
    for run in RUNS[:3]:                                       # uncheck three runs with the mouse
        table.locator(".slick-row", has_text=run).locator("input[type=checkbox]").click()
    shown = sorted(RUNS[3:])
    page.wait_for_function(drawn_is(shown), polling=50, timeout=20000)
    summary = page.evaluate("() => Bokeh.documents[0].get_model_by_name('runs-summary').text")
    assert summary == f"{len(shown)} of {len(RUNS)} runs shown"

    page.locator(".bk-tab", has_text="Histograms").first.click()
    page.wait_for_function(f"() => ({HISTOGRAM_RUNS_JS})().length > 0", polling=50)
    page.wait_for_function(IDLE_JS, polling=50)
    assert sorted(page.evaluate(HISTOGRAM_RUNS_JS)) == shown[:len(page.evaluate(HISTOGRAM_RUNS_JS))]  # a page of them

    search = page.locator(".bk-input[placeholder='filter runs (regex)']")
    search.fill("lr=0.001,")
    search.press("Enter")
    wanted = sorted(run for run in shown if run.startswith("lr=0.001,"))
    page.wait_for_function(f"() => JSON.stringify(({HISTOGRAM_RUNS_JS})().sort()) === {as_js(wanted)}",
                           polling=50, timeout=20000)
    page.locator(".bk-tab", has_text="Scalars").first.click()
    page.wait_for_function(drawn_is(wanted), polling=50, timeout=20000)
    page.wait_for_function(IDLE_JS, polling=50)
    SHOTS.mkdir(parents=True, exist_ok=True)
    search.fill("")
    search.press("Enter")
    page.wait_for_function(f"() => ({DRAWN_JS})()[0].length === {len(shown)}", polling=50, timeout=20000)
    page.wait_for_function(IDLE_JS, polling=50)
    page.wait_for_timeout(300)
    page.screenshot(path=str(SHOTS / "runs.png"))
    assert errors == []


def test_relative_time_ticks_read_as_durations(twenty_runs):
    from flowlab.dashboard.views.scalars import _DURATION_JS
    page, _ = twenty_runs
    hours = [0, 45 / 3600, 0.2125, 2.25, -0.5]
    labels = page.evaluate("([code, ticks]) => ticks.map((t) => new Function('tick', code)(t))", [_DURATION_JS, hours])
    assert labels == ["0s", "45s", "12m 45s", "2h 15m", "-30m"]


# A page (re)loaded, drawn and idle, its Scalars tab built.
LOADED_JS = ("() => window.Bokeh != null && Bokeh.documents.length > 0 && Bokeh.index.roots.length > 0 && "
             "Bokeh.index.roots.every((v) => v.is_idle) && Bokeh.documents[0].get_model_by_name('tag-filter') != null")


def model_values(page):
    return page.evaluate("""() => { const d = Bokeh.documents[0], m = (n) => d.get_model_by_name(n);
        return {tab: m("tabs").tabs[m("tabs").active].name, runs: m("run-search").value, tags: m("tag-filter")?.value,
                x: m("x-axis")?.active, logy: m("log-y")?.active, summary: m("runs-summary").text}; }""")


def test_the_page_state_lives_in_the_url(twenty_runs):
    page, errors = twenty_runs
    base = page.url.split("?")[0]
    page.locator(".bk-tab", has_text="Scalars").first.click()
    for placeholder, text in (("filter runs (regex)", "seed=1"), ("all tags", "train")):
        box = page.locator(f".bk-input[placeholder='{placeholder}']")
        box.fill(text)
        box.press("Enter")
    page.locator(".bk-btn", has_text="Relative").first.click()
    page.locator(".bk-Switch").nth(1).click()                   # log y
    page.wait_for_function("() => ['runs=seed%3D1', 'tags=train', 'x=1', 'logy=1'].every((p) => "
                           "location.search.includes(p))", polling=50, timeout=20000)
    page.reload()
    page.wait_for_function(LOADED_JS, polling=50)
    assert model_values(page) == {"tab": "scalars", "runs": "seed=1", "tags": "train", "x": 1, "logy": True,
                                  "summary": "5 of 20 runs shown"}
    page.wait_for_function(drawn_is([run for run in RUNS if run.endswith("seed=1")]), polling=50, timeout=20000)

    page.goto(base + "?tab=histograms&runs=lr%3D0.001%2C")      # a link to a view
    page.wait_for_function(f"() => ({HISTOGRAM_RUNS_JS})().length === 4", polling=50, timeout=30000)
    assert sorted(page.evaluate(HISTOGRAM_RUNS_JS)) == sorted(run for run in RUNS if run.startswith("lr=0.001,"))
    assert model_values(page)["tab"] == "histograms"

    page.goto(base + "?tab=nope&x=7&smoothing=abc&logy=maybe&runs=(unclosed")   # typed by hand: ignored or refused
    page.wait_for_function(LOADED_JS, polling=50)
    state = model_values(page)
    assert (state["tab"], state["x"], state["logy"]) == ("scalars", 0, False)
    assert "Invalid regex" in state["summary"]
    page.goto(base)
    page.wait_for_function(LOADED_JS, polling=50)
    assert errors == []


def test_download_all_saves_every_shown_series_in_full(twenty_runs, tmp_path):
    page, errors = twenty_runs
    page.wait_for_function(LOADED_JS, polling=50)
    box = page.locator(".bk-input[placeholder='filter runs (regex)']")
    box.fill("seed=0")
    box.press("Enter")
    page.wait_for_function(drawn_is([run for run in RUNS if run.endswith("seed=0")]), polling=50, timeout=20000)
    with page.expect_download() as download:
        page.locator(".bk-btn", has_text="all shown (CSV)").first.click()
    path = tmp_path / "all.csv"
    download.value.save_as(path)
    rows = list(csv.reader(path.read_text().splitlines()))
    assert rows[0] == ["run", "tag", "step", "wall_time", "value"] and len(rows) == 1 + 5 * 100
    assert {(run, tag) for run, tag, *_ in rows[1:]} == {(run, "train/loss") for run in RUNS if run.endswith("seed=0")}
    assert errors == []


def test_run_groups_draw_a_mean_and_a_band_per_group_in_the_page(twenty_runs):
    page, errors = twenty_runs
    base = page.url.split("?")[0]
    page.goto(base + "?groupby=name&group=lr%3D(%5B%5E%2C%5D%2B)")     # lr=([^,]+): five groups of four seeds
    page.wait_for_function(LOADED_JS, polling=50)
    page.wait_for_function("""() => [...Bokeh.documents[0].all_models].some((m) =>
        m.constructor.__name__ === "ColumnDataSource" && m.data.band_ys && m.data.group.length === 5)""",
                           polling=50, timeout=20000)
    bands = page.evaluate("""() => { const s = [...Bokeh.documents[0].all_models].find((m) =>
        m.constructor.__name__ === "ColumnDataSource" && m.data.band_ys);
        return {group: s.data.group, runs: s.data.runs, points: s.data.ys.map((y) => y.length),
                band: s.data.band_ys.map((y) => y.length)}; }""")
    assert sorted(bands["group"]) == ["0.001", "0.003", "0.01", "0.03", "0.1"] and bands["runs"] == [4] * 5
    assert bands["points"] == [100] * 5 and bands["band"] == [200] * 5      # upper, then lower reversed
    page.wait_for_function(drawn_is([]), polling=50, timeout=20000)       # every run is drawn as its group
    page.wait_for_function(IDLE_JS, polling=50)
    page.wait_for_timeout(300)
    page.screenshot(path=str(SHOTS / "run-groups.png"))
    page.goto(base)
    page.wait_for_function(LOADED_JS, polling=50)
    assert errors == []
