"""The dashboard's colour scheme in a real headless Chromium: dark when the browser prefers it (Playwright's
``color_scheme="dark"``), light otherwise, ``?theme=dark|light`` overriding the browser, and following a change of
the preference in an open page. Checked where a reader sees it: the page, a plot's painted canvas (background
pixels from a screenshot; the colours BokehJS paints tick labels, titles and grid lines with), the run list, a text
input and a Div's own text colour. Screenshots go to ``artifacts/screenshots/dark-scalars.png`` and
``dark-projector.png``."""
import io
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dashboard_page import flowlab_serve, luminance, open_dashboard
from jupyter_page import CHROMIUM

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Debian's chromium at {CHROMIUM}")
pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")

SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"

# What a reader sees, read in the page: colours as CSS strings, and the scalars card's plot position (page pixels)
# with its frame (canvas pixels).
LOOK_JS = """() => {
  const views = [...Bokeh.index.all_views()], doc = Bokeh.documents[0];
  const kind = (name) => views.find((v) => v.model.constructor.__name__ === name);
  const plot = views.find((v) => v.model.constructor.__name__ === "Figure" && v.model.title.text === "train/loss");
  const inner = (name, selector) => getComputedStyle(Bokeh.index.find_one(doc.get_model_by_name(name))
                                                         .shadow_el.querySelector(selector));
  const box = plot.el.getBoundingClientRect(), frame = plot.frame.bbox;
  return {
    body: getComputedStyle(document.body).backgroundColor,
    status: getComputedStyle(Bokeh.index.find_one(doc.get_model_by_name("status")).el).color,
    input: inner("run-search", "input").backgroundColor,
    input_text: inner("run-search", "input").color,
    row: inner("runs-table", ".slick-row").backgroundColor,
    tick_labels: kind("LinearAxis").visuals.major_label_text.get_text_color(),
    axis_label: kind("LinearAxis").visuals.axis_label_text.get_text_color(),
    title: views.find((v) => v.model === plot.model.title).visuals.text.get_text_color(),
    grid: kind("Grid").visuals.grid_line.get_line_color(),
    plot: [box.left, box.top], frame: [frame.x0, frame.y0, frame.x1, frame.y1],
  };
}"""


def canvas_pixels(page, look):
    """The luminance of the scalars plot's painted background: inside the frame (its top-right corner, where the
    falling loss never goes) and in the border above it (beside the title)."""
    shot = np.asarray(Image.open(io.BytesIO(page.screenshot())).convert("RGB"), np.float64)
    (left, top), (x0, y0, x1, y1) = look["plot"], look["frame"]
    scale = shot.shape[1] / page.viewport_size["width"]

    def at(x, y):
        r, g, b = shot[round((top + y) * scale), round((left + x) * scale)]
        return luminance(f"rgb({r}, {g}, {b})")
    return at(x1 - 6, y0 + 6), at(x1 - 6, max(y0 - 6, 1))


@pytest.fixture(scope="module")
def served(tmp_path_factory, chromium):
    from flowlab.summary import SummaryWriter
    logdir = tmp_path_factory.mktemp("dark")
    rng = np.random.default_rng(0)
    for k, run in enumerate(["lr=0.1", "lr=0.01"]):
        with SummaryWriter(logdir / run) as w:
            for step in range(50):
                w.add_scalar("train/loss", float(np.exp(-step / (10 + 5 * k)) + 0.02 * rng.random()), step)
            if k == 0:
                points = np.concatenate([rng.normal(0, 1, (60, 8)), rng.normal(6, 1, (60, 8))])
                w.add_embedding(points, metadata=["a"] * 60 + ["b"] * 60, tag="features")
    with flowlab_serve(logdir, tmp_path_factory.mktemp("server") / "stderr.txt") as (url, _):
        yield url


def open_page(chromium, url, scheme, warnings):
    page, errors = open_dashboard(chromium, url, warnings=warnings, color_scheme=scheme,
                                  viewport={"width": 1300, "height": 820})
    page.wait_for_function("() => [...Bokeh.index.all_views()].some((v) => v.model.constructor.__name__ === "
                           "'Figure' && v.model.title.text === 'train/loss')", polling=50, timeout=30000)
    page.wait_for_function("() => Bokeh.index.roots.every((v) => v.is_idle)", polling=50)
    return page, errors


def eventually(check, timeout=20.0):
    """Run ``check`` until it passes, for at most ``timeout`` seconds (then its failure is raised)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def assert_dark(page):
    look = page.evaluate(LOOK_JS)
    assert luminance(look["body"]) < 0.02
    for key in ("status", "input_text", "tick_labels", "axis_label", "title"):      # light text
        assert luminance(look[key]) > 0.45, (key, look[key])
    for key in ("input", "row"):                                                    # dark widgets
        assert luminance(look[key]) < 0.05, (key, look[key])
    assert luminance(look["grid"]) < 0.1                                            # faint on the dark canvas
    frame, border = canvas_pixels(page, look)
    assert frame < 0.03 and border < 0.03, (frame, border)


def assert_light(page):
    look = page.evaluate(LOOK_JS)
    assert luminance(look["body"]) > 0.95
    for key in ("status", "input_text", "tick_labels", "title"):
        assert luminance(look[key]) < 0.1, (key, look[key])
    assert luminance(look["input"]) > 0.95 and luminance(look["row"]) > 0.8
    frame, border = canvas_pixels(page, look)
    assert frame > 0.95 and border > 0.95, (frame, border)


def test_the_page_is_dark_when_the_browser_prefers_it_and_light_otherwise(served, chromium):
    warnings = []
    page, errors = open_page(chromium, served, "dark", warnings)
    assert_dark(page)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "dark-scalars.png"))
    page.close()
    page, more = open_page(chromium, served, "light", warnings)
    assert_light(page)
    page.close()
    assert errors == [] and more == [] and warnings == []


def test_the_url_overrides_the_browser_and_an_open_page_follows_a_change(served, chromium):
    warnings = []
    page, errors = open_page(chromium, served + "?theme=light", "dark", warnings)
    assert_light(page)
    page.close()
    page, more = open_page(chromium, served + "?theme=dark", "light", warnings)
    assert_dark(page)
    page.close()
    page, most = open_page(chromium, served, "light", warnings)
    assert_light(page)
    page.emulate_media(color_scheme="dark")          # the system switches to dark: the open page follows
    eventually(lambda: assert_dark(page))            # (the canvases repaint on the next animation frame)
    page.close()
    assert errors == [] and more == [] and most == [] and warnings == []


def test_the_projector_in_the_dark(served, chromium):
    warnings = []
    page, errors = open_dashboard(chromium, served + "?tab=projector", warnings=warnings, color_scheme="dark",
                                  viewport={"width": 1300, "height": 820})
    page.wait_for_function("() => Bokeh.documents[0].get_model_by_name('projector-note').text.startsWith('PCA')",
                           polling=50, timeout=30000)
    legend = page.evaluate("""() => { const v = [...Bokeh.index.all_views()].find((v) =>
        v.model.constructor.__name__ === "Legend");
        return [getComputedStyle(v.el).backgroundColor,
                getComputedStyle(v.shadow_el.querySelector(".bk-label")).color]; }""")
    assert luminance(legend[0]) < 0.03 and luminance(legend[1]) > 0.45, legend
    page.screenshot(path=str(SHOTS / "dark-projector.png"))
    page.close()
    assert errors == [] and warnings == []
