"""Every tab of the dashboard in a real headless Chromium, as a new user meets it, on two logdirs: the one
``flowlab demo`` writes (every summary kind, a run that turns NaN, an embedding, the train job's graph) and twenty
runs written by tensorboardX (another writer's logs, more runs than a 10-colour cycle). Each tab draws what its logdir
holds, without a console warning or error, and leaves a screenshot in ``artifacts/screenshots/tour-<logdir>-<tab>.png``
to be looked at."""
import os
from pathlib import Path

import pytest

from dashboard_page import IDLE_JS, SHOWN_JS, TABS, demo_logdir, flowlab_serve, open_dashboard, \
    tensorboardx_logdir
from jupyter_page import CHROMIUM

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Debian's chromium at {CHROMIUM}")
pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")

SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"

# tab -> does it draw something in this logdir (False: its one-line empty message is right)
EXPECTED = {
    "demo": dict.fromkeys(TABS, True),
    "tbx20": {**dict.fromkeys(TABS, True), "anomalies": False, "health": False, "graph": False},
}


@pytest.fixture(scope="module", params=["demo", "tbx20"])
def served(request, tmp_path_factory, chromium):
    root = tmp_path_factory.mktemp(request.param)
    logdir = demo_logdir(root) if request.param == "demo" else tensorboardx_logdir(root)
    with flowlab_serve(logdir, tmp_path_factory.mktemp("server") / "stderr.txt") as (url, log):
        yield request.param, url, log


@pytest.mark.parametrize("tab", TABS)
def test_every_tab_draws_its_logdir_without_a_warning(served, tab, chromium):
    name, url, log = served
    warnings = []
    page, errors = open_dashboard(chromium, f"{url}?tab={tab}", warnings=warnings,
                                  viewport={"width": 1600, "height": 1000})
    try:
        expected = EXPECTED[name][tab]
        if expected:        # a tab fills on the IOLoop's next turns: wait for its first plot or text card
            page.wait_for_function(f"() => {{ const s = ({SHOWN_JS})(); return s.plots.length > 0 || "
                                   f"(s.text.length > 0 && !/^No /.test(s.text.trim())); }}",
                                   polling=100, timeout=30000)
        page.wait_for_timeout(1500)                                 # the rest of the first rounds of updates
        page.wait_for_function(IDLE_JS, polling=50, timeout=30000)
        shown = page.evaluate(SHOWN_JS)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"tour-{name}-{tab}.png"), full_page=True)
        if expected:
            assert shown["plots"] or tab == "text", f"{tab} drew no plot: {shown['text'][:300]}"
        else:
            assert not shown["plots"], f"{tab} drew {shown['plots']} for a logdir without such data"
            assert "No " in shown["text"], shown["text"][:300]
        status = page.evaluate("() => Bokeh.documents[0].get_model_by_name('status').text")
        assert " runs · " in status and " 0 skipped" in status, status      # every record of these logs reads
        assert warnings == [], warnings[:5]
        assert errors == [], errors[:5]
        log.seek(0)
        assert "Traceback" not in log.read()
    finally:
        page.close()


@pytest.mark.parametrize("tab", TABS)
def test_every_tab_of_the_demo_in_the_dark_scheme(served, tab, chromium):
    name, url, log = served
    if name != "demo":
        pytest.skip("the dark scheme is toured on the demo's logdir")
    warnings = []
    page, errors = open_dashboard(chromium, f"{url}?tab={tab}", warnings=warnings, color_scheme="dark",
                                  viewport={"width": 1600, "height": 1000})
    try:
        page.wait_for_function(f"() => ({SHOWN_JS})().plots.length > 0 || {str(tab == 'text').lower()}", polling=100,
                               timeout=30000)
        page.wait_for_timeout(1500)
        page.wait_for_function(IDLE_JS, polling=50, timeout=30000)
        page.screenshot(path=str(SHOTS / f"tour-{name}-{tab}-dark.png"), full_page=True)
        background = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
        assert sum(int(c) for c in background[background.index("(") + 1:-1].split(",")[:3]) < 3 * 60, background
        assert warnings == [] and errors == [], (warnings + errors)[:5]
    finally:
        page.close()
