"""A page's cost does not grow with the tabs it has visited: only the shown tab's models are in the document (and in
the page's model table); a tab left keeps its view on the server, settings and all, and is brought up to date when
shown again.

Server-side over a bare ``Document``; in headless Chromium over the ``flowlab demo`` logdir, clicking through all ten
tabs twice, the page's model count (``Bokeh.documents[0].all_models``: machine-independent) stays within 1.5x of the
largest single tab's. How long each tab takes to be drawn is printed, not asserted (busy CI machines)."""
import os
import time

import numpy as np
import pytest
from bokeh.document import Document

from dashboard_page import IDLE_JS, flowlab_serve, open_dashboard
from flowlab.dashboard import app
from flowlab.dashboard.store import Store
from flowlab.summary import SummaryWriter
from jupyter_page import CHROMIUM


def tab_index(tabs, name):
    return [panel.name for panel in tabs.tabs].index(name)


def test_a_tab_left_leaves_the_document_and_comes_back_up_to_date(tmp_path):
    with SummaryWriter(tmp_path / "a") as w:
        for step in range(3):
            w.add_scalar("loss", 1.0 / (step + 1), step)
            w.add_histogram("w", np.arange(10.0) + step, step)
    store = Store(tmp_path)
    store.poll()
    doc = Document()
    views = app.build_document(doc, store)
    tabs = doc.select_one({"name": "tabs"})
    scalars_models = len(doc.models)
    assert views["scalars"].cards["loss"].layout.document is doc

    tabs.active = tab_index(tabs, "histograms")
    histograms = views["histograms"]
    histograms.mode.active = 1                                   # overlay: a setting the tab keeps
    card = histograms._cards[("a", "w", "histogram")]
    assert card.layout.document is doc
    assert views["scalars"].cards["loss"].layout.document is None           # released with its tab
    histogram_models = len(doc.models)

    with SummaryWriter(tmp_path / "a") as w:                     # news for both tabs while scalars is not shown
        w.add_scalar("loss", 0.1, 3)
        w.add_histogram("w", np.arange(10.0) + 3, 3)
    store.poll()
    (callback,) = doc.session_callbacks
    callback.callback()
    assert list(card.source.data["step"]).count(3.0) > 0       # the shown tab follows
    loss = views["scalars"].cards["loss"]
    assert 3.0 not in list(loss.flat.data["steps"])              # the hidden one waits

    tabs.active = tab_index(tabs, "scalars")
    assert views["scalars"].cards["loss"] is loss and loss.layout.document is doc     # the same view, back
    assert 3.0 in list(loss.flat.data["steps"])                  # and up to date
    assert card.layout.document is None and len(doc.models) == pytest.approx(scalars_models, abs=2)
    tabs.active = tab_index(tabs, "histograms")
    assert histograms.mode.active == 1 and card.layout.document is doc
    assert len(doc.models) == pytest.approx(histogram_models, abs=2)


# ------------------------------------------------------------------------------------------------------ the browser

TABS = ("scalars", "histograms", "distributions", "images", "text", "anomalies", "health", "hparams", "projector",
        "graph")
COUNT_JS = "() => Bokeh.documents[0].all_models.size"


def single_tab_models(logdir):
    """Each tab's model count in a document that shows it alone (the server's count: the page holds the same)."""
    store = Store(logdir)
    store.poll()
    doc = Document()
    app.build_document(doc, store)
    tabs = doc.select_one({"name": "tabs"})
    counts = {}
    for name in TABS:
        tabs.active = tab_index(tabs, name)
        counts[name] = len(doc.models)
    return counts


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Debian's chromium at {CHROMIUM}")
def test_clicking_through_every_tab_twice_keeps_the_page_at_one_tabs_models(chromium, tmp_path_factory):
    pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")
    from dashboard_page import SHOWN_JS, demo_logdir
    logdir = demo_logdir(tmp_path_factory.mktemp("demo"))
    single = single_tab_models(logdir)
    largest = max(single.values())
    drawn_js = (f"() => {{ const s = ({SHOWN_JS})(); return (s.plots.length > 0 || (s.text.length > 0 && "
                f"!/^No /.test(s.text.trim()))) && Bokeh.index.roots.every((v) => v.is_idle); }}")
    with flowlab_serve(logdir, tmp_path_factory.mktemp("server") / "stderr.txt") as (url, log):
        page, errors = open_dashboard(chromium, url, viewport={"width": 1600, "height": 1000})
        try:
            page.wait_for_function(drawn_js, polling=50, timeout=60000)
            seen = []
            for round_ in range(2):
                for name in TABS[1:] + TABS[:1]:
                    start = time.perf_counter()
                    page.locator(".bk-tab").nth(TABS.index(name)).click()
                    page.wait_for_function(f"() => Bokeh.documents[0].get_model_by_name('tabs').active === "
                                           f"{TABS.index(name)}", polling=20)
                    page.wait_for_function(drawn_js, polling=20, timeout=120000)
                    seconds = time.perf_counter() - start
                    page.wait_for_timeout(500)                   # the tab's later rounds of updates
                    page.wait_for_function(IDLE_JS, polling=50, timeout=60000)
                    count = page.evaluate(COUNT_JS)
                    seen.append((round_, name, seconds, count))
                    print(f"round {round_ + 1} {name:>13}: drawn in {seconds:.2f} s, {count} models "
                          f"(alone: {single[name]})")
                    assert count <= 1.5 * largest, (name, count, largest)
                    assert count <= single[name] * 1.1 + 10, (name, count, single[name])   # that tab's own
            assert errors == [], errors[:5]
            log.seek(0)
            assert "Traceback" not in log.read()
        finally:
            page.close()
