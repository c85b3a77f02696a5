"""The run list's choice reaches every mark of a Scalars card: the lines, the one-point runs' dots (the ``hparam/*``
metrics of twenty tensorboardX runs showed twenty dots with no run checked), the red NaN/Inf ticks, the groups'
bands, the readout (the legend) and the card's own downloads.

Server-side: the views over a bare ``Document``; in the browser: ``flowlab serve`` over tensorboardX runs in headless
Chromium, runs unchecked with the mouse, and what the page draws and downloads read back."""
import csv
import io
import math
import os
import re

import numpy as np
import pytest
from bokeh.document import Document

from dashboard_page import DRAWN_JS, IDLE_JS, as_js, flowlab_serve, open_dashboard
from flowlab.dashboard import app
from flowlab.dashboard.store import Store
from jupyter_page import CHROMIUM

tensorboardX = pytest.importorskip("tensorboardX")

RUNS = ["a", "b", "c", "d"]


def write(logdir):
    """Four runs: ``loss`` over 20 steps with a NaN at step 5 + the run's index and a +Inf in run c, and one
    ``hparam/acc`` point each (a dot)."""
    for k, run in enumerate(RUNS):
        with tensorboardX.SummaryWriter(str(logdir / run)) as w:
            for step in range(20):
                value = math.nan if step == 5 + k else math.inf if (run == "c" and step == 15) else 1.0 / (step + 1)
                w.add_scalar("loss", value, step)
            w.add_scalar("hparam/acc", 0.5 + k / 10, 0)
    return logdir


@pytest.fixture
def views(tmp_path):
    store = Store(write(tmp_path))
    store.poll()
    return app.build_document(Document(), store)


def dots_of(card):
    """The one-point runs drawn as dots: rows with a dot that the card's filter (the runs shown) lets through."""
    rows, kept = card.rows.data, card.filter.indices
    return [(run, y) for i, (run, x, y) in enumerate(zip(rows["run"], rows["dot_x"], rows["dot_y"]))
            if not math.isnan(x) and (kept is None or i in kept)]


def download_runs(card):
    """The runs the card's download button takes (None: all of them)."""
    shown = card.download.args["shown"]
    return None if shown is None else list(shown)


def marks_of(card):
    return sorted(set(card.marks.data["run"])), sorted(run for run, _ in dots_of(card))


def test_dots_ticks_and_downloads_follow_the_run_list(views):
    scalars = views["scalars"]
    runs = scalars.runs
    loss, acc = scalars.cards["loss"], scalars.cards["hparam/acc"]
    assert marks_of(loss) == (RUNS, []) and marks_of(acc) == ([], RUNS)
    assert sorted(loss.marks.data["what"]) == ["+Inf"] + ["NaN"] * 4
    assert [download_runs(card) for card in (loss, acc)] == [None] * 2       # every run

    runs.check_only(["b", "c"])
    assert marks_of(loss) == (["b", "c"], []) and marks_of(acc) == ([], ["b", "c"])
    assert list(zip(loss.marks.data["run"], loss.marks.data["what"], loss.marks.data["steps"])) == [
        ("b", "NaN", 6.0), ("c", "NaN", 7.0), ("c", "+Inf", 15.0)]
    assert [y for _, y in dots_of(acc)] == pytest.approx([0.6, 0.7])            # (float32 in the log)
    assert [download_runs(card) for card in (loss, acc)] == [["b", "c"]] * 2

    runs.check_only([])                                     # nothing checked: nothing drawn, not even a dot
    assert marks_of(loss) == ([], []) and marks_of(acc) == ([], [])
    assert list(loss.filter.indices) == [] and list(acc.filter.indices) == []
    assert download_runs(loss) == []

    runs.check_only(RUNS)
    assert marks_of(loss) == (RUNS, []) and marks_of(acc) == ([], RUNS)
    assert download_runs(loss) is None


def test_a_new_run_brings_its_marks_only_when_shown(tmp_path):
    store = Store(write(tmp_path))
    store.poll()
    doc = Document()
    scalars = app.build_document(doc, store)["scalars"]
    scalars.runs.check_only(["a"])
    acc = scalars.cards["hparam/acc"]
    with tensorboardX.SummaryWriter(str(tmp_path / "b")) as w:     # more points for a hidden run
        w.add_scalar("loss", math.nan, 30)
    with tensorboardX.SummaryWriter(str(tmp_path / "e")) as w:     # a new run arrives checked
        w.add_scalar("hparam/acc", 0.9, 0)
    store.poll()
    (callback,) = doc.session_callbacks
    callback.callback()
    assert marks_of(scalars.cards["loss"]) == (["a"], [])
    assert marks_of(acc) == ([], ["a", "e"]) and download_runs(acc) == ["a", "e"]


def test_grouped_runs_keep_their_ticks_and_leave_their_dots_to_the_group(views):
    scalars = views["scalars"]
    grouping = scalars.runs.grouping
    grouping.by.value, grouping.pattern.value = "name", "^(a|b)$"
    acc, loss = scalars.cards["hparam/acc"], scalars.cards["loss"]
    assert acc.grouped == {"a", "b"} and marks_of(acc) == ([], ["c", "d"])
    assert marks_of(loss) == (RUNS, [])                      # a member's NaN still shows on its group's card
    scalars.runs.check_only(["c"])
    assert marks_of(acc) == ([], ["c"]) and marks_of(loss) == (["c"], [])


# ------------------------------------------------------------------------------------------------------ the browser

needs_chromium = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Debian's chromium at {CHROMIUM}")

# Per Scalars card (by title): the runs of its dots, of its NaN/Inf ticks, and the names its readout lists at rest.
MARKS_JS = """() => { const out = {};
    for (const m of Bokeh.documents[0].all_models) {
      if (m.constructor.__name__ !== "Figure" || !m.title || !m.renderers) continue;
      const ticks = m.renderers.find((r) => r.data_source.data.what), ones = m.renderers.find(
        (r) => r.data_source.data.dot_x), dots = [];
      if (ones) {                       // rows with a dot that the card's filter (the runs shown) lets through
        const d = ones.data_source.data, kept = ones.view.filter.indices;
        for (let i = 0; i < d.run.length; i++)
          if (!Number.isNaN(d.dot_x[i]) && (kept == null || kept.includes(i))) dots.push(d.run[i]);
      }
      out[m.title.text] = {dots: dots.sort(), ticks: ticks ? [...new Set(ticks.data_source.data.run)].sort() : []};
    }
    for (const m of Bokeh.documents[0].all_models)
      if (m.name && m.name.startsWith("card:")) {
        const readout = Bokeh.index.find_one(m.children[1]);
        const names = readout ? [...readout.shadow_el.querySelectorAll(".name")].map((e) => e.textContent) : [];
        if (out[m.name.slice(5)]) out[m.name.slice(5)].readout = names.sort();
      }
    return out; }"""


def uncheck(page, runs):
    table = page.locator(".bk-DataTable")
    for run in runs:
        table.locator(".slick-row", has_text=re.compile(rf"^\W*{run}$")).locator("input[type=checkbox]").click()   # (■ name)


@needs_chromium
def test_unchecked_runs_leave_every_mark_and_the_download_in_the_page(chromium, tmp_path):
    pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")
    logdir = write(tmp_path / "logs")
    with flowlab_serve(logdir, tmp_path / "stderr.txt") as (url, _):
        page, errors = open_dashboard(chromium, url, viewport={"width": 1400, "height": 900}, accept_downloads=True)
        try:
            every = {"loss": {"dots": [], "ticks": RUNS, "readout": RUNS},
                     "hparam/acc": {"dots": RUNS, "ticks": [], "readout": RUNS}}
            page.wait_for_function(f"() => JSON.stringify(({MARKS_JS})()) === {as_js(every)}", polling=100,
                                   timeout=60000)
            uncheck(page, ["a", "d"])
            shown = ["b", "c"]
            some = {"loss": {"dots": [], "ticks": shown, "readout": shown},
                    "hparam/acc": {"dots": shown, "ticks": [], "readout": shown}}
            page.wait_for_function(f"() => JSON.stringify(({MARKS_JS})()) === {as_js(some)}", polling=100,
                                   timeout=20000)
            page.wait_for_function(IDLE_JS, polling=50)
            with page.expect_download() as download:
                page.locator(".bk-btn", has_text=re.compile(r"^⤓ CSV$")).first.click()
            path = tmp_path / "card.csv"
            download.value.save_as(path)
            rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"), newline="")))
            assert rows[0] == ["run", "step", "wall_time", "value"]
            assert {row[0] for row in rows[1:]} <= set(shown) and len({row[0] for row in rows[1:]}) == 2
            uncheck(page, shown)                                   # none checked: not a dot, not a tick
            nothing = {"loss": {"dots": [], "ticks": [], "readout": []},
                       "hparam/acc": {"dots": [], "ticks": [], "readout": []}}
            page.wait_for_function(f"() => JSON.stringify(({MARKS_JS})()) === {as_js(nothing)}", polling=100,
                                   timeout=20000)
            assert page.evaluate(DRAWN_JS) == [[], []]
            assert errors == []
        finally:
            page.close()
