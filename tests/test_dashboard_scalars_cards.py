"""The Scalars tab's cards in a real headless Chromium: groups side by side, the size control, enlarging one card to
the tab's width, x zoom linked across cards and the hover readout under each card.

One ``flowlab serve`` over three runs written by tensorboardX (``train/loss``, ``train/acc``, ``eval/loss``, and a
``long`` tag of more points than a card shows), one page for the module, opened with no smoothing so that the
readout's smoothed values are the logged ones. Screenshots: ``artifacts/screenshots/scalars-cards.png`` (a card
enlarged) and ``scalars-hover.png``.
"""
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest

from dashboard_page import flowlab_serve, open_dashboard
from jupyter_page import CHROMIUM

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Debian's chromium at {CHROMIUM}")
playwright = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")
tensorboardX = pytest.importorskip("tensorboardX")

from flowlab.dashboard.views.scalars import ENLARGED_HEIGHT, LIMIT, SIZES  # noqa: E402

SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"
RUNS = ("a", "b", "c")
STEPS = 200
LONG = 3 * LIMIT
TAGS = ["long", "eval/loss", "train/acc", "train/loss"]     # in the page's order: top level first, then groups
IDLE_JS = "() => Bokeh.index.roots.every((v) => v.is_idle)"


def loss(k, step):
    return float(np.float32(math.exp(-step / (30 + 10 * k)) + 0.01 * k))    # as event files store it


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory, chromium):
    logdir = tmp_path_factory.mktemp("cards")
    for k, run in enumerate(RUNS):
        with tensorboardX.SummaryWriter(str(logdir / run)) as w:
            for step in range(STEPS):
                w.add_scalar("train/loss", loss(k, step), step)
                w.add_scalar("train/acc", 1 - loss(k, step), step)
                w.add_scalar("eval/loss", loss(k, step) + 0.05, 2 * step)
            if run == "a":
                for step in range(LONG):
                    w.add_scalar("long", math.sin(step / 50), step)
    with flowlab_serve(logdir, tmp_path_factory.mktemp("server") / "stderr.txt") as (url, log):
        warnings = []
        page, errors = open_dashboard(chromium, url + "?smoothing=0", viewport={"width": 1400, "height": 900},
                                      warnings=warnings)
        # (the cards are built after the page is first idle: until the last one is, it has no model to read)
        page.wait_for_function(f"""() => {{ const card = Bokeh.documents[0].get_model_by_name("card:{TAGS[-1]}");
            return card != null && card.children[0].renderers[0].data_source.data.run.length === 3; }}""",
                               polling=50, timeout=30000)
        yield dict(page=page, errors=errors, warnings=warnings, url=url, log=log)
        page.close()


def fig_js(tag):
    return f'Bokeh.documents[0].get_model_by_name("card:{tag}").children[0]'


def rect(page, js):
    """Where the view of the model ``js`` evaluates to is in the window: ``[x, y, width, height]``."""
    return page.evaluate(f"() => {{ const r = Bokeh.index.find_one({js}).el.getBoundingClientRect(); "
                         "return [r.x, r.y, r.width, r.height]; }")


def scroll_to(page, js):
    """Scroll the view of the model ``js`` evaluates to into the middle of the window (the mouse reaches it)."""
    page.evaluate(f"() => Bokeh.index.find_one({js}).el.scrollIntoView({{block: 'center'}})")


def sizes(page):
    """Each card's figure as the page lays it out: ``{tag: [width, height]}``."""
    return {tag: [round(v) for v in rect(page, fig_js(tag))[2:]] for tag in TAGS}


def click_model(page, name):
    """Click the middle of the widget named ``name``, as a user would."""
    scroll_to(page, f'Bokeh.documents[0].get_model_by_name("{name}")')
    x, y, width, height = rect(page, f'Bokeh.documents[0].get_model_by_name("{name}")')
    page.mouse.click(x + width / 2, y + height / 2)


def x_ranges(page):
    """Each card's x range as its plot draws it: ``{tag: [start, end, range id]}``."""
    return page.evaluate(f"""() => Object.fromEntries({TAGS}.map((tag) => {{
        const fig = Bokeh.documents[0].get_model_by_name("card:" + tag).children[0];
        const r = Bokeh.index.find_one(fig).frame.x_range;
        return [tag, [r.start, r.end, r.id]]; }}))""")


def settled(page):
    page.wait_for_function(IDLE_JS, polling=50)
    page.wait_for_timeout(200)


def assert_clean(dashboard):
    assert dashboard["errors"] == []
    assert dashboard["warnings"] == []                      # e.g. BokehJS's "could not set initial ranges"


def test_the_size_control_resizes_every_card_and_keeps_its_zoom(dashboard):
    page = dashboard["page"]
    assert sizes(page) == {tag: list(SIZES["M"]) for tag in TAGS}
    page.evaluate(f"() => {{ const r = {fig_js('train/acc')}.x_range; r.start = 20; r.end = 80; }}")   # zoomed in
    for label, index in (("S", 0), ("L", 2)):
        page.locator(".bk-btn", has_text=re.compile(f"^{label}$")).first.click()
        page.wait_for_function(f"() => location.search.includes('size={index}')", polling=50, timeout=10000)
        page.wait_for_function(f"""() => {{ const r = Bokeh.index.find_one({fig_js('train/loss')}).el
            .getBoundingClientRect(); return Math.round(r.width) === {SIZES[label][0]}; }}""", polling=50)
        settled(page)
        assert sizes(page) == {tag: list(SIZES[label]) for tag in TAGS}
        assert x_ranges(page)["train/acc"][:2] == [20, 80]    # the same figure, its zoom kept
        readout = rect(page, 'Bokeh.documents[0].get_model_by_name("card:train/acc").children[1]')
        assert readout[2] == SIZES[label][0] - 10              # the readout is as wide as the card ...
        page.wait_for_function(f"() => ({readout_text_js('train/acc')})().includes('step {STEPS - 1}')", polling=50,
                               timeout=5000)                   # ... and lists the last values again
    page.locator(".bk-btn", has_text=re.compile("^M$")).first.click()
    page.wait_for_function("() => !location.search.includes('size=')", polling=50, timeout=10000)
    page.evaluate(f"() => Bokeh.index.find_one({fig_js('train/acc')}).reset()")
    settled(page)
    assert sizes(page) == {tag: list(SIZES["M"]) for tag in TAGS}
    assert_clean(dashboard)


def test_groups_flow_side_by_side_and_wrap_their_own_cards(dashboard):
    """A group of one card does not keep its line to itself: "long" (top level) and eval/loss share the first line;
    train's two cards do not fit beside them, so that group starts the next line, its cards side by side."""
    page = dashboard["page"]
    settled(page)
    tab = rect(page, 'Bokeh.documents[0].get_model_by_name("scalar-groups")')
    where = {tag: rect(page, fig_js(tag)) for tag in TAGS}
    assert where["eval/loss"][1] == where["long"][1] and where["eval/loss"][0] > where["long"][0] + SIZES["M"][0]
    assert where["train/acc"][1] > where["long"][1] + SIZES["M"][1]
    assert where["train/loss"][1] == where["train/acc"][1] and where["train/loss"][0] > where["train/acc"][0]
    assert all(x + width <= tab[0] + tab[2] for x, _, width, _ in where.values())      # all inside the tab
    assert_clean(dashboard)


def test_one_card_at_a_time_is_enlarged_to_the_tab_width_and_back(dashboard):
    page = dashboard["page"]
    tab = rect(page, 'Bokeh.documents[0].get_model_by_name("scalar-groups")')
    enlarge = page.locator(".bk-btn", has_text="⤢")
    assert enlarge.count() == len(TAGS)
    enlarge.nth(TAGS.index("train/acc")).click()
    page.wait_for_function(f"() => Bokeh.index.find_one({fig_js('train/acc')}).el.getBoundingClientRect().height "
                           f"=== {ENLARGED_HEIGHT}", polling=50, timeout=10000)
    settled(page)
    got = sizes(page)
    assert got["train/acc"][1] == ENLARGED_HEIGHT and got["train/acc"][0] > tab[2] - 40     # the tab's width
    assert all(got[tag] == list(SIZES["M"]) for tag in TAGS if tag != "train/acc")
    figure = rect(page, fig_js("train/acc"))
    assert figure[0] - tab[0] < 40                           # a line of its own, from the left
    for width, height in ((1200, 900), (1400, 1800), (1400, 900)):    # and it follows the window
        page.set_viewport_size({"width": width, "height": height})
        settled(page)
        now = rect(page, 'Bokeh.documents[0].get_model_by_name("scalar-groups")')
        assert now[2] - 40 < sizes(page)["train/acc"][0] <= now[2], (width, height)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "scalars-cards.png"), full_page=True)

    enlarge.nth(TAGS.index("train/loss") - 1).click()      # another one (train/acc's shows ⤡): the first goes back
    page.wait_for_function(f"() => Bokeh.index.find_one({fig_js('train/loss')}).el.getBoundingClientRect().height "
                           f"=== {ENLARGED_HEIGHT}", polling=50, timeout=10000)
    settled(page)
    got = sizes(page)
    assert got["train/acc"] == list(SIZES["M"]) and got["train/loss"][0] > tab[2] - 40
    page.locator(".bk-btn", has_text="⤡").click()             # and back
    page.wait_for_function(f"() => Bokeh.index.find_one({fig_js('train/loss')}).el.getBoundingClientRect().height "
                           f"=== {SIZES['M'][1]}", polling=50, timeout=10000)
    settled(page)
    assert sizes(page) == {tag: list(SIZES["M"]) for tag in TAGS}
    assert page.locator(".bk-btn", has_text="⤡").count() == 0
    assert_clean(dashboard)


def wheel_zoom(page, tag, notches):
    """Zoom into the middle of card ``tag`` with the mouse wheel."""
    page.evaluate(f"""() => {fig_js(tag)}.toolbar.tools.find((t) =>
        t.constructor.__name__ === "WheelZoomTool").active = true""")
    scroll_to(page, fig_js(tag))
    x, y, width, height = rect(page, fig_js(tag))
    page.mouse.move(x + width * 0.4, y + height * 0.4)
    for _ in range(notches):
        page.mouse.wheel(0, -200)
        page.wait_for_timeout(30)


def exact_points_js(tag):
    """Whether card ``tag`` holds every step inside its x range (what the server sends for a zoomed window)."""
    return f"""() => {{ const fig = {fig_js(tag)}, {{start, end}} = fig.x_range;
        const xs = Array.from(fig.renderers[0].data_source.data.xs[0]).filter((x) => x >= start && x <= end);
        return end - start < {LIMIT} && xs.length === Math.floor(end) - Math.max(0, Math.ceil(start)) + 1; }}"""


def test_link_x_zooms_every_card_together_and_reset_restores_them(dashboard):
    page = dashboard["page"]
    before = x_ranges(page)
    assert len({r[2] for r in before.values()}) == len(TAGS)         # each card its own x range
    wheel_zoom(page, "train/loss", 3)                                # not linked: the others stay
    page.wait_for_function(f"() => {fig_js('train/loss')}.x_range.end < {before['train/loss'][1]}", polling=50)
    assert x_ranges(page)["train/acc"][:2] == before["train/acc"][:2]

    click_model(page, "link-x")
    page.wait_for_function("() => location.search.includes('linkx=1')", polling=50, timeout=10000)
    page.wait_for_function(f"""() => new Set({TAGS}.map((tag) =>
        Bokeh.documents[0].get_model_by_name("card:" + tag).children[0].x_range.id)).size === 1""", polling=50)
    settled(page)
    linked = x_ranges(page)
    auto = linked["long"]
    assert all(r == auto for r in linked.values())
    assert auto[0] < 0 and auto[1] > LONG - 1                        # every card's points, padded: the "long" tag's

    wheel_zoom(page, "train/loss", 12)                               # zoom one card ...
    page.wait_for_function(f"() => {fig_js('train/loss')}.x_range.end - {fig_js('train/loss')}.x_range.start "
                           f"< {LIMIT}", polling=50, timeout=10000)
    settled(page)
    zoomed = x_ranges(page)
    assert all(r[:2] == zoomed["train/loss"][:2] for r in zoomed.values())     # ... and every card follows
    try:      # the server re-reads the exact points of the window for a card that was not touched
        page.wait_for_function(exact_points_js("long"), polling=50, timeout=15000)
    except playwright.TimeoutError:
        pytest.fail(f"the long card did not get the exact points of the linked window {zoomed['long']}")

    page.locator(".bk-Figure").nth(TAGS.index("eval/loss")).locator(".bk-tool-icon-reset").click()  # another card
    page.wait_for_function(f"() => {fig_js('train/acc')}.x_range.start === {auto[0]}", polling=50, timeout=10000)
    settled(page)
    assert all(r == auto for r in x_ranges(page).values())           # the auto range again, on every card

    click_model(page, "link-x")                                      # unlinked: own ranges again
    page.wait_for_function(f"""() => new Set({TAGS}.map((tag) =>
        Bokeh.documents[0].get_model_by_name("card:" + tag).children[0].x_range.id)).size === {len(TAGS)}""",
                           polling=50, timeout=10000)
    page.wait_for_function("() => !location.search.includes('linkx')", polling=50, timeout=10000)
    settled(page)
    assert_clean(dashboard)


def readout_text_js(tag):
    """A JS function giving card ``tag``'s readout text."""
    return f"""() => Bokeh.index.find_one(Bokeh.documents[0].get_model_by_name("card:{tag}").children[1])
        .shadow_el.querySelector(".readout").textContent"""


def readout(page, tag):
    """The lines of card ``tag``'s readout as ``(name, step, value text)``."""
    return [tuple(line) for line in page.evaluate(f"""() => {{
        const box = Bokeh.index.find_one(Bokeh.documents[0].get_model_by_name("card:{tag}").children[1])
            .shadow_el.querySelector(".readout");
        return [...box.querySelectorAll(".line")].map((line) =>
            [...line.querySelectorAll(".name, .step, .value")].map((el) => el.textContent)); }}""")]


def test_hover_reads_each_runs_value_at_the_step_under_the_pointer_below_the_plot(dashboard):
    page = dashboard["page"]
    tag, step = "train/loss", 57
    # at rest: each run's last point, top curve first
    assert readout(page, tag) == [(run, f"step {STEPS - 1}", f"{loss(k, STEPS - 1):.5g}")
                                  for k, run in reversed(list(enumerate(RUNS)))]
    fig = fig_js(tag)
    scroll_to(page, fig)
    # the pointer on run a's curve at the step (a tooltip used to cover the curves there)
    sx, sy = page.evaluate(f"""() => {{ const view = Bokeh.index.find_one({fig}), frame = view.frame;
        const box = view.canvas_view.el.getBoundingClientRect();
        return [box.x + frame.x_scale.compute({step}), box.y + frame.y_scale.compute({loss(0, step)})]; }}""")
    page.mouse.move(sx, sy)
    page.wait_for_function(f"() => ({readout_text_js(tag)})().includes('step {step}')", polling=50, timeout=5000)
    lines = readout(page, tag)
    assert lines == [(run, f"step {step}", f"{loss(k, step):.5g}") for k, run in reversed(list(enumerate(RUNS)))]
    # the readout is under the plot, and no tooltip box covers the curves
    below = rect(page, f'Bokeh.documents[0].get_model_by_name("card:{tag}").children[1]')
    plot = rect(page, fig)
    assert below[1] >= plot[1] + plot[3] - 1
    assert page.locator(".bk-Tooltip:visible").count() == 0
    settled(page)
    card = rect(page, f'Bokeh.documents[0].get_model_by_name("card:{tag}")')
    page.screenshot(path=str(SHOTS / "scalars-hover.png"),
                    clip={"x": card[0] - 10, "y": card[1] - 10, "width": card[2] + 20, "height": card[3] + 20})
    page.mouse.move(5, 5)                                              # away: the last values again
    page.wait_for_function(f"() => ({readout_text_js(tag)})().includes('step {STEPS - 1}')", polling=50, timeout=5000)
    assert_clean(dashboard)


def test_a_card_that_arrives_later_takes_the_size_and_the_shared_x_range(tmp_path):
    """Without a browser: the view's state applies to cards built after it was set."""
    from bokeh.document import Document

    from flowlab.dashboard import app
    from flowlab.dashboard.store import Store
    from flowlab.summary import SummaryWriter
    with SummaryWriter(tmp_path / "a") as w:
        w.add_scalar("loss", 1.0, 0)
        w.add_scalar("loss", 0.5, 1)
    store = Store(tmp_path)
    store.poll()
    scalars = app.build_document(Document(), store)["scalars"]
    scalars.card_size.active, scalars.link_x.active = 2, True
    loss = scalars.cards["loss"]
    scalars._toggle_enlarged(loss)
    with SummaryWriter(tmp_path / "a") as w:
        w.add_scalar("acc", 0.25, 0)
    store.poll()
    scalars.update()
    acc = scalars.cards["acc"]
    assert (acc.figure.width, acc.figure.height) == SIZES["L"] and acc.figure.sizing_mode == "fixed"
    assert acc.figure.x_range is loss.figure.x_range                  # linked with the cards already there
    assert loss.figure.sizing_mode == "stretch_width" and loss.figure.height == ENLARGED_HEIGHT
    scalars._toggle_enlarged(acc)                                      # one at a time
    assert loss.figure.height == SIZES["L"][1] and acc.figure.height == ENLARGED_HEIGHT
    scalars.link_x.active = False
    assert acc.figure.x_range is not loss.figure.x_range
    assert acc.figure.height == ENLARGED_HEIGHT                        # (a rebuilt figure stays enlarged)


def test_size_and_link_x_come_back_from_the_url(dashboard):
    page = dashboard["page"]
    page.goto(dashboard["url"] + "?size=0&linkx=1")
    page.wait_for_function(f"() => window.Bokeh && Bokeh.documents.length > 0 && "
                           f"Bokeh.documents[0].get_model_by_name('card:{TAGS[-1]}') != null", polling=50,
                           timeout=30000)
    page.wait_for_function(f"() => {fig_js(TAGS[-1])}.renderers[0].data_source.data.run.length === 3", polling=50)
    settled(page)
    assert sizes(page) == {tag: list(SIZES["S"]) for tag in TAGS}
    assert len({r[2] for r in x_ranges(page).values()}) == 1
    assert page.evaluate("() => window.__xss") is None
    assert_clean(dashboard)


def test_every_line_and_readout_swatch_has_its_runs_colour(dashboard):
    """A card's rows name each run's colour by its place in the runs' palette, and the x axis by its place in
    ``X_AXES`` (numbers: bytes on the wire, where 100,000 runs' strings were ~17 ms of a card's joining the page):
    the lines the page expands, their one-point dots' rows and the readout's swatches have the run list's colour of
    each run, and the lines are drawn on the step axis."""
    page = dashboard["page"]
    settled(page)
    listed = page.evaluate("""() => { const d = Bokeh.documents[0].get_model_by_name("runs-source").data;
        return Object.fromEntries(Array.from(d.run, (run, i) => [run, d.colour[i]])); }""")
    assert sorted(listed) == list(RUNS) and len(set(listed.values())) == len(RUNS)
    for tag in TAGS:
        drawn = page.evaluate(f"""() => {{ const fig = {fig_js(tag)}, d = fig.renderers[0].data_source.data;
            const r = fig.renderers[2].data_source.data;                 // (the rows: the extent's source)
            return {{lines: Array.from(d.run, (run, i) => [run, d.colour[i]]), first_x: d.xs.map((x) => x[0]),
                     dots: [Array.from(d.dot_x), Array.from(r.dot_x)], axis: Array.from(r.axis),
                     typed: ArrayBuffer.isView(r.colour) && ArrayBuffer.isView(r.axis)}}; }}""")
        runs = list(RUNS) if tag != "long" else ["a"]
        assert drawn["lines"] == [[run, listed[run]] for run in runs], tag
        assert drawn["first_x"] == [0] * len(runs) and drawn["axis"] == [0] * len(runs), tag   # the step axis
        assert drawn["typed"], tag                                   # (arrays of numbers, not lists of strings)
        np.testing.assert_array_equal(*drawn["dots"], err_msg=tag)     # (every run here has many points: none)
    scroll_to(page, fig_js("train/loss"))
    swatches = page.evaluate("""() => [...Bokeh.index.find_one(Bokeh.documents[0].get_model_by_name("card:train/loss")
        .children[1]).shadow_el.querySelectorAll(".line")].map((line) =>
            [line.querySelector(".name").textContent, line.querySelector(".swatch").getAttribute("style")])""")
    assert sorted(swatches) == [[run, f"background:{listed[run]}"] for run in RUNS]


def test_a_run_of_one_point_is_drawn_as_a_dot_of_its_colour(tmp_path_factory, chromium):
    """A run that logged one point has no line to draw: the card draws it as a dot, from the rows the page expands
    (its colour a name there), in the run's colour, and the page logs no warning (e.g. "could not set initial
    ranges")."""
    from flowlab.summary import SummaryWriter
    logdir = tmp_path_factory.mktemp("dots")
    with SummaryWriter(logdir / "one") as w:
        w.add_scalar("loss", 0.75, 7)
    with SummaryWriter(logdir / "two") as w:
        for step in range(20):
            w.add_scalar("loss", 1.0 / (1 + step), step)
    with flowlab_serve(logdir, tmp_path_factory.mktemp("server") / "stderr.txt") as (url, log):
        warnings = []
        page, errors = open_dashboard(chromium, url, viewport={"width": 1400, "height": 900}, warnings=warnings)
        try:
            page.wait_for_function("""() => { const card = Bokeh.documents[0].get_model_by_name("card:loss");
                return card != null && card.children[0].renderers.some((r) => r.glyph.type === "Scatter")
                    && card.children[0].renderers[0].data_source.data.run.length === 2; }""",
                                   polling=50, timeout=30000)
            page.wait_for_function(IDLE_JS, polling=50)
            dots = page.evaluate("""() => { const fig = Bokeh.documents[0].get_model_by_name("card:loss").children[0];
                const dots = fig.renderers.find((r) => r.glyph.type === "Scatter"), d = dots.data_source.data;
                const keep = dots.view.filter.indices;            // (the rows it draws: the run list's filter)
                const rows = keep == null ? Array.from(d.run, (_, i) => i) : Array.from(keep);
                const listed = Bokeh.documents[0].get_model_by_name("runs-source").data;
                return {viewed: Bokeh.index.find_one(dots) != null,
                        drawn: rows.filter((i) => Number.isFinite(d.dot_x[i]))
                            .map((i) => [d.run[i], d.dot_x[i], d.dot_y[i], d.colour[i]]),
                        colour: listed.colour[Array.from(listed.run).indexOf("one")]}; }""")
            assert dots["viewed"] and dots["drawn"] == [["one", 7, 0.75, dots["colour"]]]
            assert errors == [] and warnings == []
        finally:
            page.close()
