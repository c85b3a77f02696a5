"""The Images tab in a real headless Chromium: a step's images as a grid, and a tap that enlarges one and goes back.
Screenshots go to ``artifacts/screenshots/images-grid.png`` and ``images-enlarged.png``."""
import os
from pathlib import Path

import numpy as np
import pytest

from dashboard_page import flowlab_serve, open_dashboard
from jupyter_page import CHROMIUM

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Debian's chromium at {CHROMIUM}")
pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")

SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"
# How many images the Images card's source holds (the grid's tiles, or 1 when one is enlarged).
TILES_JS = """() => { if (!window.Bokeh || !Bokeh.documents.length) return -1;
    const s = [...Bokeh.documents[0].all_models].find((m) => m.constructor.__name__ === "ColumnDataSource"
                                                         && m.data.image && m.data.x);
    return s ? s.data.image.length : -1; }"""
IDLE_JS = "() => Bokeh.index.roots.every((v) => v.is_idle)"


def digit(k):
    """A 16 x 16 picture of the number k as a bar k pixels high, so tiles differ."""
    a = np.zeros((1, 16, 16))
    a[0, 16 - k:, 4:12] = 1.0
    return a


def test_a_steps_images_are_a_grid_and_a_tap_enlarges_one(tmp_path, chromium):
    from flowlab.summary import SummaryWriter
    with SummaryWriter(tmp_path / "logs" / "run") as w:
        w.add_images("digits", np.stack([digit(k) for k in range(1, 10)]), 0)
    with flowlab_serve(tmp_path / "logs", tmp_path / "stderr.txt") as (url, _):
        page, errors = open_dashboard(chromium, url + "?tab=images", viewport={"width": 1200, "height": 800})
        page.wait_for_function(f"() => ({TILES_JS})() === 9", polling=50, timeout=30000)
        page.wait_for_function(IDLE_JS, polling=50)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "images-grid.png"))
        canvas = page.locator(".bk-Figure").first
        box = canvas.bounding_box()
        page.mouse.click(box["x"] + box["width"] * 0.85, box["y"] + box["height"] * 0.85)   # the last tile: 9
        page.wait_for_function(f"() => ({TILES_JS})() === 1", polling=50, timeout=20000)
        page.wait_for_function(IDLE_JS, polling=50)
        caption = page.evaluate("""() => [...Bokeh.documents[0].all_models].find((m) =>
            m.constructor.__name__ === "Div" && m.text.startsWith("image ")).text""")
        assert caption.startswith("image 9 of 9")
        page.screenshot(path=str(SHOTS / "images-enlarged.png"))
        page.wait_for_function("""() => [...Bokeh.documents[0].all_models].some((m) =>
            m.constructor.__name__ === "ColumnDataSource" && m.data.sample && m.data.sample.length === 1
            && m.selected.indices.length === 0)""", polling=50)      # the server has taken the first tap
        page.wait_for_timeout(200)
        box = canvas.bounding_box()
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.wait_for_function(f"() => ({TILES_JS})() === 9", polling=50, timeout=20000)
        assert errors == []
        page.close()
