"""No request holds the dashboard's event loop for long, whatever the logdir holds (issue 29, "memory and time bombs
in logs"): a run with thousands of scalar tags builds one page of Scalars cards, a page at a time, while other
clients are answered, and its tag search pages through every tag; the "all shown" export of hundreds of thousands of
points is formatted in a worker thread and streamed, and the loop keeps answering meanwhile.

The loop's longest stall is measured in the server's own process: a task on its loop that sleeps a few milliseconds
and records how late it wakes (``loop_probe.LoopProbe``).
"""
import csv
import io
import json
import os
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from dashboard_page import IDLE_JS, open_dashboard
from flowlab.dashboard.server import ServerThread
from flowlab.summary import SummaryWriter
from jupyter_page import CHROMIUM
from loop_probe import LoopProbe

pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")
pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"needs Debian's chromium at {CHROMIUM}")

# The loop's budget per request is ~100 ms; this shared 2-core machine adds scheduling noise on top.
STALL_BOUND_S = 0.25


def plain_get_seconds(url):
    """Seconds for a cheap request (an unknown export link: a 404 made on the loop) to be answered."""
    t0 = time.perf_counter()
    try:
        urllib.request.urlopen(url + "export/scalars/" + "x" * 32 + ".csv", timeout=60).read()
    except urllib.error.HTTPError as e:
        assert e.code == 404
    return time.perf_counter() - t0


STEPS = 100_000
RUNS = ("a", "b", "c")


@pytest.fixture(scope="module")
def big_logdir(tmp_path_factory):
    """Three runs of 100,000 points each (300k points in all)."""
    logdir = tmp_path_factory.mktemp("big")
    for i, run in enumerate(RUNS):
        with SummaryWriter(logdir / run) as w:
            for step in range(STEPS):
                w.add_scalar("loss", step * 0.25 + i, step, walltime=1000.0 + step)
    return logdir


def test_export_of_300k_points_is_streamed_off_the_loop(big_logdir, chromium, tmp_path):
    server = ServerThread(big_logdir)
    try:
        page, errors = open_dashboard(chromium, server.url, accept_downloads=True)
        page.wait_for_function(IDLE_JS, polling=50, timeout=60000)
        probe = LoopProbe(server)
        answered = []
        stop = threading.Event()

        def ask():                       # another client, asking again and again while the export runs
            while not stop.is_set():
                answered.append(plain_get_seconds(server.url))
                time.sleep(0.02)

        asker = threading.Thread(target=ask)
        with page.expect_download(timeout=60000) as download:
            asker.start()
            page.locator(".bk-btn", has_text="all shown (CSV)").click()
        path = tmp_path / "scalars.csv"
        download.value.save_as(path)
        stop.set()
        asker.join()
        stall = probe.stop()
        print(f"longest loop stall during the export: {stall * 1000:.0f} ms; slowest other request: "
              f"{max(answered) * 1000:.0f} ms")
        assert download.value.suggested_filename == "scalars.csv"
        rows = list(csv.reader(io.StringIO(path.read_text(), newline="")))
        assert rows[0] == ["run", "tag", "step", "wall_time", "value"] and len(rows) == 1 + len(RUNS) * STEPS
        got = np.array([[float(r[2]), float(r[3]), float(r[4])] for r in rows[1:]]).reshape(len(RUNS), STEPS, 3)
        assert [r[0] for r in rows[1::STEPS]] == list(RUNS) and {r[1] for r in rows[1:]} == {"loss"}
        for i in range(len(RUNS)):
            np.testing.assert_array_equal(got[i, :, 0], np.arange(STEPS))
            np.testing.assert_array_equal(got[i, :, 1], 1000.0 + np.arange(STEPS))
            np.testing.assert_allclose(got[i, :, 2], np.arange(STEPS) * 0.25 + i, rtol=1e-6)   # float32 on disk
        assert answered and max(answered) < STALL_BOUND_S + 0.1, answered
        assert stall < STALL_BOUND_S, f"the event loop stalled {stall * 1000:.0f} ms during the export"
        assert errors == []
        page.close()
    finally:
        server.stop()


def test_a_used_or_unknown_export_link_is_refused(big_logdir):
    from flowlab.dashboard.export_stream import EXPORTS
    server = ServerThread(big_logdir)
    try:
        token = EXPORTS.add(server.server.store, [("r", "=t", np.arange(3), np.ones(3), np.array([1.0, np.nan,
                                                                                                   np.inf]))], "json")
        with pytest.raises(urllib.error.HTTPError) as wrong_format:
            urllib.request.urlopen(f"{server.url}export/scalars/{token}.csv", timeout=30)
        assert wrong_format.value.code == 404
        with urllib.request.urlopen(f"{server.url}export/scalars/{token}.json", timeout=30) as response:
            assert response.headers["Content-Type"] == "application/json"
            assert 'attachment; filename="scalars.json"' == response.headers["Content-Disposition"]
            assert json.loads(response.read()) == [{"run": "r", "tag": "=t", "step": [0, 1, 2],
                                                    "wall_time": [1.0, 1.0, 1.0], "value": [1.0, "NaN", "Infinity"]}]
        with pytest.raises(urllib.error.HTTPError) as again:                # one download per click
            urllib.request.urlopen(f"{server.url}export/scalars/{token}.json", timeout=30)
        assert again.value.code == 404 and b"already used" in again.value.read()
    finally:
        server.stop()


TAGS = 2000
# The Scalars page in the browser: [the cards in its layout, the grid's tags, the pager's tags].
SCALARS_PAGE_JS = """() => {
    const doc = Bokeh.documents[0];
    const cards = (m) => m.name && m.name.startsWith("card:") ? [m.name] : (m.children || []).flatMap(cards);
    const grid = doc.get_model_by_name("scalar-groups");
    return [cards(grid).sort(), grid.tags,
            doc.get_model_by_name("pager:scalars").tags];
}"""


@pytest.fixture(scope="module")
def many_tags(tmp_path_factory):
    """One run with 2,000 scalar tags in 20 groups of 100, three steps each."""
    logdir = tmp_path_factory.mktemp("tags")
    with SummaryWriter(logdir / "run") as w:
        for step in range(3):
            for i in range(TAGS):
                w.add_scalar(f"layer{i // 100:02}/w{i:04}", i + step * 0.5, step)
    return logdir


def test_thousands_of_tags_build_one_page_and_the_search_pages_through_all(many_tags, chromium):
    from flowlab.dashboard.views.scalars import PAGE_SIZE
    server = ServerThread(many_tags)
    try:
        deadline = time.monotonic() + 30
        while server.server.store.status()["series"] < TAGS and time.monotonic() < deadline:
            time.sleep(0.05)                    # the store's first read (its own thread) is not what is measured
        probe = LoopProbe(server)
        page = chromium.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(server.url, wait_until="commit")
        # a second client while the first session builds its page: answered at once
        first_get = plain_get_seconds(server.url)
        t0 = time.perf_counter()
        urllib.request.urlopen(server.url, timeout=60).read()       # a whole second session's page
        second_session = time.perf_counter() - t0
        page.wait_for_function(f"""() => {{ if (!window.Bokeh || !Bokeh.documents.length) return false;
            const [cards, grid, pager] = ({SCALARS_PAGE_JS})();
            return grid[1] === {PAGE_SIZE} && cards.length === {PAGE_SIZE}; }}""", polling=50, timeout=60000)
        page.wait_for_function(IDLE_JS, polling=50, timeout=60000)
        cards, grid, pager = page.evaluate(SCALARS_PAGE_JS)
        stall = probe.stop()
        print(f"{TAGS} tags: longest loop stall {stall * 1000:.0f} ms ({probe.longest_cpu * 1000:.0f} ms of CPU); a "
              f"cheap request while the first session built: {first_get * 1000:.0f} ms; a second session's page: "
              f"{second_session * 1000:.0f} ms; gaps (when, wall, CPU): {probe.gaps}")
        assert cards == sorted(f"card:layer00/w{i:04}" for i in range(PAGE_SIZE))     # the first page only
        assert grid == [0, PAGE_SIZE] and pager == [PAGE_SIZE, 0, TAGS // PAGE_SIZE]
        # (wall times: a second client waited minutes before; 0.45 s was seen here at load 5, while Chromium drew)
        assert first_get < 1.0 and second_session < 3.0
        # A card is built in one loop turn and joins the page in the next, once the page has pulled the document (the
        # pull serialises all of it in one turn): one card's work is the bound (before: every card of every tag in one
        # turn, minutes for 20,000 tags). The bound is on the loop thread's own CPU time; its wall time also counts
        # Chromium drawing the page and whatever else shares the machine's two cores (a 40 ms turn took 300-400 ms
        # of wall time at load 6), so it only has to stay far from the minutes this was. A card turn's own cost,
        # models and bytes are also bounded in test_dashboard_paging (a served document's turns, run one by one).
        held = f"(gaps (when, wall, CPU): {probe.gaps}; collections: {probe.collections})"
        # (one callback: a card's build or its joining is 25-50 ms of CPU here, 40-100 ms at load 3; the page's pull
        # ~30)
        assert probe.longest_cpu < 0.15, f"one callback held the event loop's thread {probe.longest_cpu * 1000:.0f} ms " \
            f"of CPU {held}"
        assert stall < 2.0, f"the event loop stalled {stall * 1000:.0f} ms {held}"

        box = page.locator(".bk-input[placeholder='all tags']")            # a tag on the last page
        box.fill("w1999$")
        box.press("Enter")
        page.wait_for_function(f"""() => JSON.stringify(({SCALARS_PAGE_JS})()[0])
                               === '["card:layer19/w1999"]'""", polling=50, timeout=20000)
        page.wait_for_function(IDLE_JS, polling=50, timeout=20000)
        cards, grid, pager = page.evaluate(SCALARS_PAGE_JS)
        assert grid == [0, 1] and pager == [1, 0, 1]
        box.fill("^layer07/")                                                # 100 matches: paged
        box.press("Enter")
        page.wait_for_function(f"() => ({SCALARS_PAGE_JS})()[1][1] === {PAGE_SIZE}", polling=50, timeout=20000)
        cards, grid, pager = page.evaluate(SCALARS_PAGE_JS)
        assert cards == sorted(f"card:layer07/w{i:04}" for i in range(700, 700 + PAGE_SIZE))
        assert pager == [PAGE_SIZE, 0, -(-100 // PAGE_SIZE)]
        assert errors == []
        page.close()
    finally:
        server.stop()
