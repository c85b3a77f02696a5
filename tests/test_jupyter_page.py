"""Smoke test of tests/jupyter_page.py: a real JupyterLab 4 and Notebook 7 in headless Chromium (Debian's
``chromium`` driven by Playwright; ``.ci/run`` installs it).

One ``jupyter lab`` server for the module serves both UIs; per UI, one page shows an ipywidgets IntSlider that a
busy kernel moves from Python. Screenshots go to ``artifacts/screenshots/harness_<ui>.png``.
"""
import os
from pathlib import Path

import pytest

from jupyter_page import CHROMIUM, UIS, NotebookPage, write_notebook

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"needs Debian's chromium at {CHROMIUM} (.ci/run installs it: "
                                       "apt-get install -y chromium)")
for _module in ("playwright.sync_api", "jupyterlab", "notebook", "ipywidgets", "anywidget", "nbformat"):
    pytest.importorskip(_module, reason=f"needs {_module} (pip install -e '.[test]')")

SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"
STEPS = 15                                      # slider updates, 0.2 s apart: the kernel is busy for ~3 s
# An anywidget drawing into a canvas inside an open shadow root, with a blank canvas and a label beside it.
SHADOW_ESM = """
export default { render({ model, el }) {
    const root = el.attachShadow({mode: "open"});
    const drawn = document.createElement("canvas"); drawn.width = 40; drawn.height = 20;
    const ctx = drawn.getContext("2d"); ctx.fillStyle = "#c00"; ctx.fillRect(5, 5, 10, 10);
    const blank = document.createElement("canvas"); blank.width = 10; blank.height = 10;
    const label = document.createElement("span"); label.textContent = `inside the shadow ${model.get("n")}`;
    root.append(drawn, blank, label);
} };
"""
CELLS = [
    "import ipywidgets as w\ns = w.IntSlider(max=100)\ndisplay(s)",
    f"import time\nfor i in range(1, {STEPS + 1}):\n    s.value = i\n    time.sleep(0.2)",
    "import anywidget, traitlets\n"
    f"class Shadow(anywidget.AnyWidget):\n    _esm = {SHADOW_ESM!r}\n    n = traitlets.Int(7).tag(sync=True)\n"
    "Shadow()",
    "print(','.join(map(str, range(15000))))",   # one printed line of 73,889 characters
]


@pytest.fixture(scope="module", params=UIS)
def nb(request, jupyter_server, chromium):
    ui = request.param
    write_notebook(jupyter_server.root_dir / f"harness_{ui}.ipynb", CELLS)     # one file per UI: one kernel per page
    with NotebookPage(chromium, jupyter_server, f"harness_{ui}.ipynb", ui) as page:
        yield page


def run_slider_loop(nb):
    """Run all cells; watch the slider's readout while the loop runs. Returns (texts seen, comm_msgs sent)."""
    nb.page.evaluate("() => document.querySelectorAll('.widget-readout').forEach((e) => { e.dataset.stale = 1; })")
    nb.run_all()
    readout = nb.output_area(0).locator(".widget-readout:not([data-stale])")   # the new view, not the last run's
    readout.wait_for()
    nb.watch_text(readout, "slider")
    start = nb.flush()
    assert nb.is_cell_running(1), "the loop should still be running: it takes ~3 s"
    nb.wait_idle()
    end = nb.flush()
    texts = [text for _t, text in nb.watched("slider")]
    return texts, nb.sent_messages("comm_msg", since=start, until=end)


def test_slider_follows_a_busy_kernel(nb):
    texts, comm_msgs = run_slider_loop(nb)
    assert len(texts) - 1 >= 3, f"the readout changed {len(texts) - 1} times while the kernel was busy: {texts}"
    assert texts[-1] == str(STEPS)
    # Updates from the kernel are not echoed: the page sent nothing on the widget comm while the loop ran.
    assert comm_msgs == []
    assert nb.kernel_status() == "idle" and not nb.is_running()
    shot = nb.screenshot(SHOTS / f"harness_{nb.ui}.png")         # before the error checks: it loads more fonts
    assert shot.stat().st_size > 0
    assert nb.output_errors() == []
    assert nb.errors() == []
    print(f"{nb.ui}: page ready in {nb.load_s:.1f} s; readout texts {texts}")


def test_canvas_and_text_helpers_see_into_shadow_dom(nb):
    nb.run_cell(2)
    nb.wait_idle()
    out = nb.output_area(2)
    nb.page.wait_for_function("(el) => [...el.querySelectorAll('*')].some((e) => e.shadowRoot)",
                              arg=out.element_handle(), polling=50)
    canvases = nb.canvases(out)
    assert [(c["width"], c["height"], c["drawn"], c["differsFromFirstPixel"]) for c in canvases] == \
        [(40, 20, True, True), (10, 10, False, False)]
    assert "inside the shadow 7" in nb.text(out)
    assert "inside the shadow" not in out.inner_text()           # what innerText alone would miss
    assert nb.errors() == [] and nb.output_errors() == []


# The text nodes under an element that hold part of the printed line; with ``split``, the longest is first cut into
# pieces of 65,536 characters, as Chromium's HTML parser cut it up to version 155 (156 no longer does).
_LINE_NODES_JS = """(el, split) => {
    const nodes = () => { const w = document.createTreeWalker(el, NodeFilter.SHOW_TEXT), found = [];
                          while (w.nextNode()) if (w.currentNode.textContent.includes(",")) found.push(w.currentNode);
                          return found; };
    if (split) {
        let node = nodes().reduce((a, b) => (b.length > a.length ? b : a));
        while (node.length > 65536) node = node.splitText(65536);
    }
    return nodes().length;
}"""


def test_text_helper_reads_a_line_longer_than_the_parsers_text_nodes_whole(nb):
    """A page may hold one printed line as several sibling text nodes (Chromium's HTML parser cut a text over 65,536
    characters so up to version 155); ``text`` joins them again without a space (a printed JSON of that size used to
    come back broken at character 65,536). The line is cut here when the parser left it whole."""
    nb.run_cell(3)
    nb.wait_idle()
    out = nb.output_area(3)
    out.wait_for()
    if out.evaluate(_LINE_NODES_JS, False) < 2:
        assert out.evaluate(_LINE_NODES_JS, True) >= 2, "the printed line should now be several text nodes"
    assert nb.text(out) == ",".join(map(str, range(15000)))


def test_restart_kernel_then_rerun(nb):
    executes_before = len(nb.sent_messages("execute_request"))
    nb.restart_kernel()
    assert nb.kernel_status() == "idle"
    assert nb.page.evaluate("() => jupyterapp.shell.currentWidget === window.__flPanel")
    texts, comm_msgs = run_slider_loop(nb)
    assert texts[-1] == str(STEPS) and comm_msgs == []
    assert len(nb.sent_messages("execute_request")) - executes_before == len(CELLS)
    assert [nb.execution_count(i) for i in range(len(CELLS))] == list(range(1, len(CELLS) + 1))  # a fresh kernel
    assert nb.output_errors() == []
    assert nb.errors() == []
