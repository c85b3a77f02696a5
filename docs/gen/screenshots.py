"""Regenerate the docs' and README's pictures from the current code: ``python docs/gen/screenshots.py``.

- ``docs/images/dashboard.png``: ``flowlab demo``'s two runs (its training, at full speed, with fixed run names)
  served by ``flowlab.dashboard.server.ServerThread`` and opened in headless Chromium, the Scalars tab once every
  card is drawn. The logdir is ``<tmp>/digits/runs`` (made for the run, removed after), so the status line reads
  like a user's project folder rather than a random temporary path.
- ``docs/images/watch-panel.png``: the getting-started page's cell (the digits MLP under a ``WatchPanel`` and a
  ``TrainingProgress``, taken from ``docs/getting-started.md`` itself, with more epochs: a curve worth looking at)
  run in a real JupyterLab page; the picture is the cell's outputs.
- ``docs/images/health-panel.png``: ``notebooks/09_network_health.ipynb``'s diverging case (learning rate 10) in
  the same way; the picture is its ``HealthPanel``.

Needs what the browser tests need (``pip install -e '.[test]'``: playwright, jupyterlab, anywidget, nbformat) and
Debian's chromium at ``/usr/bin/chromium``; it reuses ``tests/jupyter_page.py`` and ``tests/dashboard_page.py``.
Training is seeded (variables are initialised from their names), so what changes from one run to the next is only
what depends on the machine's pace: the clock in the dashboard's status line, the progress line's steps/s and which
step the watch panel's histogram is from (its stats table's "hist" row). ``--only NAME`` (repeatable) makes some
of them; ``--out DIR`` writes elsewhere. Each PNG is optimised with Pillow and kept under ``MAX_BYTES``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "docs" / "images"
MAX_BYTES = 250_000
SHOTS = ("dashboard", "watch-panel", "health-panel")

# The demo names its runs by the time it starts (``flowlab.cli._demo``); a fixed name keeps the picture the same.
DEMO_RUN = "20260301-093000"
# The dashboard at a common laptop size, with small cards so that three of them fill a line beside the run list.
DASHBOARD_VIEWPORT = {"width": 1280, "height": 800}
DASHBOARD_QUERY = "?size=0"                       # the card size control's "S" (see dashboard.url_state)
# JupyterLab with its file browser open: a 1280-pixel window leaves the cell's outputs about 900 pixels wide. Tall,
# so that a whole output area is on screen (a clipped screenshot only sees what the window shows).
NOTEBOOK_VIEWPORT = (1280, 1800)
WATCH_EPOCHS = 30                                 # the getting-started cell trains 5 (70 steps); 30 are 420
TIMEOUT_S = 300


def _import_test_helpers():
    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


# ------------------------------------------------------------------------------------------------------ dashboard

# The Scalars tab is complete when it has placed as many cards as its page holds ("scalar-groups"' tags are
# [page, cards built], see ScalarsView._place) and every card's lines have their rows.
_CARDS_DRAWN_JS = """() => {
    const doc = Bokeh.documents[0], grid = doc && doc.get_model_by_name("scalar-groups");
    if (!grid || grid.tags.length !== 2 || !(grid.tags[1] > 0)) return false;
    const cards = [...doc.all_models].filter((m) => m.name && m.name.startsWith("card:"));
    return cards.length === grid.tags[1] && cards.every((card) => {
        const fig = card.children[0];
        return fig.renderers && fig.renderers.some((r) => r.data_source && r.data_source.data.run
                                                         && r.data_source.data.run.length > 0);
    });
}"""


def _fresh_logdir():
    """``<tmp>/digits/runs``, empty. The folder is marked as this script's so that a second run may replace it and
    nothing else of that name is ever removed."""
    project = Path(tempfile.gettempdir()) / "digits"
    marker = project / ".flowlab-screenshots"
    if project.exists():
        if not marker.exists():
            raise SystemExit(f"screenshots: {project} exists and is not this script's; move it away first")
        shutil.rmtree(project)
    (project / "runs").mkdir(parents=True)
    marker.touch()
    return project


def write_demo_runs(logdir):
    """What ``flowlab demo`` trains and logs (``flowlab.cli._demo``), at full speed, into ``logdir``."""
    import numpy as np

    import flowlab as flow
    from flowlab.cli import DEMO_EPOCHS
    from flowlab.examples import digits_mlp

    quiet = lambda line: None       # noqa: E731
    flow.clear_default_session()
    digits_mlp.main(epochs=DEMO_EPOCHS, logdir=str(logdir / DEMO_RUN), log=quiet)
    flow.clear_default_session()
    with np.errstate(all="ignore"):                  # the naive loss's NaN are its point
        digits_mlp.main(epochs=1, logdir=str(logdir / f"{DEMO_RUN}-naive-loss"), lr=3.0, naive_loss=True, log=quiet)
    flow.clear_default_session()


def shoot_dashboard(browser, path):
    from dashboard_page import IDLE_JS, open_dashboard

    from flowlab.dashboard.server import ServerThread
    project = _fresh_logdir()
    try:
        write_demo_runs(project / "runs")
        server = ServerThread(str(project / "runs"))
        try:
            page, errors = open_dashboard(browser, server.url + DASHBOARD_QUERY, timeout_ms=TIMEOUT_S * 1000,
                                          viewport=DASHBOARD_VIEWPORT)
            page.wait_for_function(_CARDS_DRAWN_JS, polling=100, timeout=TIMEOUT_S * 1000)
            page.wait_for_function(IDLE_JS, polling=50, timeout=TIMEOUT_S * 1000)
            page.wait_for_timeout(500)                  # the last canvases painted
            if errors:
                raise RuntimeError(f"the dashboard logged errors: {errors}")
            page.screenshot(path=str(path))
            page.close()
        finally:
            server.stop()
    finally:
        shutil.rmtree(project, ignore_errors=True)


# ------------------------------------------------------------------------------------------------------ notebooks

def watch_cell():
    """The getting-started page's notebook cell (its first Python block that displays a ``WatchPanel``), trained
    for ``WATCH_EPOCHS`` epochs."""
    text = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "display(panel, progress)" in b]
    if not blocks:
        raise SystemExit("screenshots: no cell displaying `panel, progress` in docs/getting-started.md")
    cell, n = re.subn(r"for epoch in range\(\d+\):", f"for epoch in range({WATCH_EPOCHS}):", blocks[0])
    if n != 1:
        raise SystemExit("screenshots: the getting-started cell has no `for epoch in range(N):` loop to lengthen")
    return cell


def health_cells():
    """Notebook 09's set-up cell (data and the ``train`` helper) and its diverging case."""
    notebook = json.loads((ROOT / "notebooks" / "09_network_health.ipynb").read_text(encoding="utf-8"))
    code = ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]
    diverging = [c for c in code if "lr=10.0" in c and "HealthPanel(" in c]
    if not code or "def train(" not in code[0] or len(diverging) != 1:
        raise SystemExit("screenshots: notebooks/09_network_health.ipynb no longer has its set-up cell first and "
                         "one diverging case (lr=10.0)")
    return [code[0], diverging[0]]


# A cell's outputs that are widgets (not its printed text), as (x, y, width, height) in the page: the union of them.
_WIDGETS_BOX_JS = """(cell) => {
    const outputs = [...cell.querySelectorAll(".jp-OutputArea-output")]
        .filter((o) => !(o.dataset.mimeType || "").startsWith("application/vnd.jupyter.std"));
    if (!outputs.length) return null;
    const boxes = outputs.map((o) => o.getBoundingClientRect());
    const left = Math.min(...boxes.map((b) => b.left)), top = Math.min(...boxes.map((b) => b.top));
    const right = Math.max(...boxes.map((b) => b.right)), bottom = Math.max(...boxes.map((b) => b.bottom));
    return [left, top, right - left, bottom - top];
}"""


def shoot_cell(nb, index, path):
    """Screenshot cell ``index``'s widget outputs, once the kernel is idle and every Bokeh view has drawn."""
    from dashboard_page import IDLE_JS
    nb.wait_idle(timeout=TIMEOUT_S)
    errors = nb.errors() + nb.output_errors()
    if errors:
        raise RuntimeError(f"{nb.path}: {errors}")
    nb.page.wait_for_function(IDLE_JS, polling=50, timeout=TIMEOUT_S * 1000)
    nb.page.wait_for_timeout(1500)                   # the widgets' last refresh after the cell ended, painted
    nb.page.wait_for_function(IDLE_JS, polling=50, timeout=TIMEOUT_S * 1000)
    cell = nb.cell(index)
    cell.scroll_into_view_if_needed()
    nb.page.mouse.move(0, 0)                          # no hover tooltip on a plot
    box = cell.evaluate(_WIDGETS_BOX_JS)
    if box is None:
        raise RuntimeError(f"{nb.path}: cell {index} shows no widget")
    x, y, width, height = box
    viewport = nb.page.viewport_size
    if y + height > viewport["height"]:
        raise RuntimeError(f"{nb.path}: the outputs ({height:.0f} px from {y:.0f}) do not fit the window "
                           f"({viewport['height']} px): make NOTEBOOK_VIEWPORT taller")
    nb.page.screenshot(path=str(path), clip={"x": x, "y": y, "width": width, "height": height})


def shoot_notebooks(browser, shots, out):
    from jupyter_page import JupyterServer, NotebookPage, write_notebook

    # the kernels import flowlab from this checkout, whatever is installed
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    notebooks = {"watch-panel": [watch_cell()], "health-panel": health_cells()}
    with tempfile.TemporaryDirectory(prefix="flowlab-screenshots-") as root, JupyterServer(root) as server:
        for name in shots:
            write_notebook(Path(root) / f"{name}.ipynb", notebooks[name])
            with NotebookPage(browser, server, f"{name}.ipynb", viewport=NOTEBOOK_VIEWPORT, timeout=TIMEOUT_S) as nb:
                nb.run_all()
                shoot_cell(nb, len(notebooks[name]) - 1, out / f"{name}.png")


# ---------------------------------------------------------------------------------------------------------- PNGs

def optimise(path):
    """Rewrite ``path`` as an optimised PNG; in 256 colours when that is what keeps it under ``MAX_BYTES``."""
    from PIL import Image
    with Image.open(path) as image:
        image = image.convert("RGB")
    image.save(path, optimize=True)
    if path.stat().st_size > MAX_BYTES:
        image.quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)
    if path.stat().st_size > MAX_BYTES:
        raise RuntimeError(f"{path} is {path.stat().st_size:,} bytes, over {MAX_BYTES:,}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=SHOTS, help="make only this picture (repeatable)")
    parser.add_argument("--out", type=Path, default=IMAGES, help=f"where the PNGs go (default {IMAGES})")
    args = parser.parse_args(argv)
    shots = args.only or list(SHOTS)
    args.out.mkdir(parents=True, exist_ok=True)
    _import_test_helpers()
    from playwright.sync_api import sync_playwright

    from jupyter_page import CHROMIUM, launch_chromium
    if not os.path.exists(CHROMIUM):
        raise SystemExit(f"screenshots: needs Debian's chromium at {CHROMIUM} (apt-get install -y chromium)")
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            if "dashboard" in shots:
                shoot_dashboard(browser, args.out / "dashboard.png")
            notebook_shots = [name for name in shots if name != "dashboard"]
            if notebook_shots:
                shoot_notebooks(browser, notebook_shots, args.out)
        finally:
            browser.close()
    for name in shots:
        path = args.out / f"{name}.png"
        optimise(path)
        print(f"{path}: {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
