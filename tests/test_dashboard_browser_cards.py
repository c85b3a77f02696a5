"""The card views (Histograms, Distributions, Images, Text) in a real headless Chromium, at a real size.

One ``flowlab serve`` over 5 runs × 8 histogram tags × 100 steps (plus 14 image and 14 text series), one page for
the module. A tab is "filled" when its pager says how many cards the page holds, the grid holds that many, every
card's data source (``cards-source:<tab>``) has rows, every card has a view (it is drawn) and BokehJS is idle:
``paging.FILLED_JS``, which the benchmark uses too.
How long a tab takes to fill is printed, not asserted: the 1 s target is measured by ``benchmarks/data_path.py``
(a timed test fails on a busy machine and proves nothing on an idle one).
"""
import os
import re
import time

import numpy as np
import pytest

from dashboard_page import flowlab_serve, open_dashboard
from jupyter_page import CHROMIUM

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"needs Debian's chromium at {CHROMIUM} (.ci/run installs it)")
playwright = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")

from flowlab.dashboard.views.paging import FILLED_JS, PAGE_SIZE  # noqa: E402

RUNS, TAGS, STEPS = 5, 8, 100
PAGES = -(-RUNS * TAGS // PAGE_SIZE)


# What the grid shows: per card its title (the tag), subtitle (the run) and the distinct steps its sources draw (a
# histogram card's second source holds the newest step while its group of steps fills).
CARDS_JS = """(kind) => Bokeh.documents[0].get_model_by_name("cards:" + kind).children.map((fig) => {
    const sources = [...new Set(fig.renderers.map((r) => r.data_source))];
    const steps = [...new Set(sources.flatMap((s) => Array.from(s.data.step)))].sort((a, b) => a - b);
    return {tag: fig.title.text, run: fig.above.find((t) => t !== fig.title).text, steps};
})"""
# Card sources in the document's tree (BokehJS keeps models that left it in ``all_models``: only what the roots
# reach is laid out, drawn and updated).
COUNT_JS = """(kind) => { const reach = new Set();
    for (const root of Bokeh.documents[0].roots()) for (const m of root.references()) reach.add(m);
    return [...reach].filter((m) => m.name === "cards-source:" + kind).length; }"""


def histogram(run, tag, step):
    return np.random.default_rng([run, tag, step]).normal(tag * 0.1, 1 + step / 100, 1000)


def _write(logdir):
    from flowlab.summary import SummaryWriter
    for run in range(RUNS):
        with SummaryWriter(logdir / f"run{run}", max_queue=4096) as w:
            for step in range(STEPS):
                for tag in range(TAGS):
                    w.add_histogram(f"layer{tag}/weights", histogram(run, tag, step), step)
            if run < 2:
                for tag in range(7):
                    w.add_image(f"samples/{tag}", np.full((8, 8, 3), 30 * tag, np.uint8), 0, dataformats="HWC")
                    w.add_text(f"notes/{tag}", f"note <b>{tag}</b>", 0)


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory, chromium):
    logdir = tmp_path_factory.mktemp("cards")
    _write(logdir)
    with flowlab_serve(logdir, tmp_path_factory.mktemp("server") / "stderr.txt") as (url, log):
        page, errors = open_dashboard(chromium, url, viewport={"width": 1400, "height": 900})
        yield dict(page=page, errors=errors, logdir=logdir, log=log)
        page.close()


def open_tab(page, title, kind):
    """Click a tab and wait until its page of cards is filled; returns the seconds it took."""
    start = time.perf_counter()
    page.locator(".bk-tab", has_text=re.compile(rf"^{title}$")).first.click()
    page.wait_for_function(FILLED_JS, arg=kind, polling=10, timeout=60000)
    return time.perf_counter() - start


def expected_keys():
    """Cards in display order: by run, then tag."""
    return [(f"run{run}", f"layer{tag}/weights") for run in range(RUNS) for tag in range(TAGS)]


@pytest.mark.parametrize("title, kind", [("Histograms", "histograms"), ("Distributions", "distributions")])
def test_tab_is_filled_with_one_page_of_cards(dashboard, title, kind):
    page = dashboard["page"]
    seconds = open_tab(page, title, kind)
    print(f"{title} tab filled in {seconds:.2f} s (load {os.getloadavg()[0]:.1f})")
    assert page.evaluate(f"() => Bokeh.documents[0].get_model_by_name('pager:{kind}').tags") == [PAGE_SIZE, 0, PAGES]
    cards = page.evaluate(CARDS_JS, kind)
    assert [(c["run"], c["tag"]) for c in cards] == expected_keys()[:PAGE_SIZE]
    assert all(c["steps"] == list(range(STEPS)) for c in cards)                 # every step, none dropped
    assert page.evaluate(COUNT_JS, kind) == PAGE_SIZE                           # nothing of other pages was built
    assert dashboard["errors"] == []


def outline_reference(buckets):
    """A step's outline as the page draws it: x along the buckets that counted something, and per point the count
    whose top it sits on (0: the baseline), down to the baseline between buckets that do not touch."""
    b = buckets[buckets[:, 2] > 0]
    x, counts = [b[0, 0]], [0.0]
    for i, (left, right, count) in enumerate(b):
        if i and left != b[i - 1, 1]:
            x += [b[i - 1, 1], left]
            counts += [0.0, 0.0]
        x += [left, right]
        counts += [count, count]
    return np.array(x + [b[-1, 1]]), np.array(counts + [0.0])


def test_histogram_outlines_are_the_logged_buckets(dashboard):
    """The page builds each step's ridge from the bucket rows the server sent: its x are the logged bucket edges and
    its heights are the counts, on one scale."""
    from flowlab.summary import encode
    page = dashboard["page"]
    open_tab(page, "Histograms", "histograms")
    got = page.evaluate("""() => { const fig = Bokeh.documents[0].get_model_by_name("cards:histograms").children[3];
        const d = fig.renderers.find((r) => r.data_source.data.xs).data_source.data;   // the drawn outlines
        return {step: Array.from(d.step), xs: d.xs.map((x) => Array.from(x)), ys: d.ys.map((y) => Array.from(y))};
    }""")
    assert got["step"] == list(range(STEPS))                     # run0, layer3: a ridge per step, in order
    scales = []
    for s in (0, 57, 99):
        x, counts = outline_reference(encode.histogram_buckets(histogram(0, 3, s)))
        np.testing.assert_array_equal(got["xs"][s], x)
        y = np.asarray(got["ys"][s])
        np.testing.assert_array_equal(y[counts == 0], s)        # the baseline is the step
        scales += list((s - y[counts > 0]) / counts[counts > 0])
    np.testing.assert_allclose(scales, scales[0], rtol=1e-9)    # one height scale for the card


def go_to_page(page, kind, index):
    """Click "next" or "previous" until page ``index`` is filled; returns the seconds of the last click."""
    seconds = 0.0
    while True:
        current = page.evaluate(f"() => Bokeh.documents[0].get_model_by_name('pager:{kind}').tags[1]")
        if current == index:
            return seconds
        start = time.perf_counter()
        page.locator(".bk-btn:visible", has_text="next" if current < index else "previous").first.click()
        page.wait_for_function(f"""() => Bokeh.documents[0].get_model_by_name('pager:{kind}').tags[1]
                                   === {current + (1 if current < index else -1)}""", polling=10, timeout=10000)
        page.wait_for_function(FILLED_JS, arg=kind, polling=10, timeout=60000)
        seconds = time.perf_counter() - start


def test_paging_shows_the_next_cards_and_drops_the_others(dashboard):
    page = dashboard["page"]
    open_tab(page, "Histograms", "histograms")
    for index in (1, PAGES - 1):
        seconds = go_to_page(page, "histograms", index)
        print(f"page {index + 1} filled in {seconds:.2f} s")
        first = index * PAGE_SIZE
        shown = expected_keys()[first:first + PAGE_SIZE]
        assert page.evaluate("() => Bokeh.documents[0].get_model_by_name('pager:histograms').tags") == \
            [len(shown), index, PAGES]
        assert [(c["run"], c["tag"]) for c in page.evaluate(CARDS_JS, "histograms")] == shown
    assert page.locator(".bk-btn:visible", has_text="next").first.is_disabled()
    # The cards that left are out of the document's tree, in the browser too.
    left = len(expected_keys()) - (PAGES - 1) * PAGE_SIZE
    try:
        page.wait_for_function(f"() => ({COUNT_JS})('histograms') === {left}", timeout=10000)
    except playwright.TimeoutError:
        pytest.fail(f"{page.evaluate(COUNT_JS, 'histograms')} card sources in the page, expected {left}")
    go_to_page(page, "histograms", 0)
    page.wait_for_function(f"() => ({COUNT_JS})('histograms') === {PAGE_SIZE}", timeout=10000)
    assert dashboard["errors"] == []


def test_a_new_step_reaches_the_open_page(dashboard):
    from flowlab.summary import SummaryWriter
    page = dashboard["page"]
    open_tab(page, "Histograms", "histograms")
    go_to_page(page, "histograms", 0)
    with SummaryWriter(dashboard["logdir"] / "run0") as w:
        w.add_histogram("layer0/weights", histogram(0, 0, STEPS), STEPS)
    page.wait_for_function(f"() => ({CARDS_JS})('histograms')[0].steps.includes({STEPS})", timeout=10000)
    assert dashboard["errors"] == []


@pytest.mark.parametrize("title, kind, per_run", [("Images", "images", 7), ("Text", "text", 7)])
def test_images_and_text_are_paged(dashboard, title, kind, per_run):
    page = dashboard["page"]
    page.locator(".bk-tab", has_text=re.compile(rf"^{title}$")).first.click()
    page.wait_for_function(f"""() => {{ const p = Bokeh.documents[0].get_model_by_name("pager:{kind}");
        const g = Bokeh.documents[0].get_model_by_name("cards:{kind}");
        return p && g && p.tags[0] === {PAGE_SIZE} && g.children.length === {PAGE_SIZE}
            && Bokeh.index.roots.every((v) => v.is_idle); }}""", timeout=60000)
    assert page.evaluate(f"() => Bokeh.documents[0].get_model_by_name('pager:{kind}').tags") == \
        [PAGE_SIZE, 0, -(-2 * per_run // PAGE_SIZE)]
    page.locator(".bk-btn:visible", has_text="next").first.click()
    page.wait_for_function(f"""() => Bokeh.documents[0].get_model_by_name("cards:{kind}").children.length
        === {2 * per_run - PAGE_SIZE} && Bokeh.index.roots.every((v) => v.is_idle)""", timeout=60000)
    assert page.evaluate("() => window.__xss") is None
    assert dashboard["errors"] == []
