"""Drive ``flowlab serve`` and its page in headless Chromium from a pytest test (a test-support module, like
``jupyter_page``; the ``chromium`` fixture of tests/conftest.py gives the browser)::

    from dashboard_page import flowlab_serve, open_dashboard

    with flowlab_serve(logdir, tmp_path / "stderr.txt") as (url, log):
        page, errors = open_dashboard(chromium, url)
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from contextlib import contextmanager

import numpy as np


def resnet_logdir(tmp_path_factory, request, **run_options):
    """``(logdir, chromium)``: a fresh logdir holding ``flowlab.examples.resnet.write_run``'s ResNet-50 run
    ``resnet50`` (3 steps, ``run_options`` passed on) and the ``chromium`` fixture's browser; skips without Debian's
    chromium or playwright."""
    import os

    import pytest

    from jupyter_page import CHROMIUM
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"needs Debian's chromium at {CHROMIUM} (.ci/run installs it: apt-get install -y chromium)")
    pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")
    chromium = request.getfixturevalue("chromium")
    import flowlab as flow
    from flowlab.examples import resnet
    flow.clear_default_session()
    logdir = tmp_path_factory.mktemp("logs")
    resnet.write_run(logdir / "resnet50", steps=3, **run_options)
    flow.clear_default_session()
    return logdir, chromium


IDLE_JS = ("() => window.Bokeh && Bokeh.documents.length > 0 && Bokeh.index.roots.length > 0 && "
           "Bokeh.index.roots.every((v) => v.is_idle)")


@contextmanager
def flowlab_serve(logdir, log_path):
    """``flowlab serve --logdir LOGDIR --port 0`` in a subprocess, its stderr in ``log_path`` (a file: a pipe could
    fill up); yields ``(url, log file)``. On exit: SIGINT, as a user's Ctrl-C, killed if it lingers past 15 s."""
    log = open(log_path, "w+")
    server = subprocess.Popen([sys.executable, "-m", "flowlab.cli", "serve", "--logdir", str(logdir), "--port", "0"],
                              stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        yield re.search(r"http://\S+", server.stdout.readline()).group(0), log
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def open_dashboard(browser, url, timeout_ms=60000, warnings=None, **page_options):
    """A new page of ``browser`` at ``url``, once every Bokeh root is drawn and idle; returns ``(page, errors)``,
    ``errors`` collecting console errors and uncaught page errors from then on (and ``warnings``, a list, the
    console's warnings, when given)."""
    page = browser.new_page(**page_options)
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    if warnings is not None:
        page.on("console", lambda m: warnings.append(m.text) if m.type == "warning" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_function(IDLE_JS, polling=20, timeout=timeout_ms)
    return page, errors


# The runs each scalars card draws, as the page filters its rows (the raw and smoothed lines share the filter; its
# indices arrive as a typed array).
DRAWN_JS = """() => { const drawn = new Map();
    for (const m of Bokeh.documents[0].all_models)
      if (m.constructor.__name__ === "GlyphRenderer" && m.glyph.constructor.__name__ === "MultiLine"
          && m.data_source.data.smooth) {
        const runs = m.data_source.data.run, keep = m.view.filter.indices;
        drawn.set(m.data_source.id, (keep == null ? [...runs] : Array.from(keep, (i) => runs[i])).sort());
      }
    return [...drawn.values()]; }"""


def drawn_is(runs):
    """A page condition: the (one) Scalars card draws exactly ``runs``."""
    return f"() => JSON.stringify(({DRAWN_JS})()) === {as_js([sorted(runs)])}"


def as_js(value):
    """A JavaScript string literal of ``JSON.stringify(value)``."""
    return json.dumps(json.dumps(value, separators=(",", ":")))


def luminance(css):
    """Relative luminance (0 black … 1 white) of a CSS colour: ``#rrggbb`` or ``rgb(a)(r, g, b[, a])``."""
    if css.startswith("#"):
        rgb = [int(css[i:i + 2], 16) for i in (1, 3, 5)]
    else:
        rgb = [float(v) for v in re.findall(r"[\d.]+", css)[:3]]
    linear = [(c / 255) / 12.92 if c / 255 <= 0.04045 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


# The Scalars tab's current page is whole: every card of it has joined the page (a served session's cards join one an
# IOLoop turn once the page has connected; the grid's tags say ``[page index, cards placed]``, the pager's
# ``[cards on the page, page index, pages]``) and BokehJS is idle.
SCALARS_PLACED_JS = """() => {
    if (!window.Bokeh || !Bokeh.documents.length) return false;
    const doc = Bokeh.documents[0];
    const grid = doc.get_model_by_name("scalar-groups"), pager = doc.get_model_by_name("pager:scalars");
    return grid != null && pager != null && pager.tags[0] > 0 && grid.tags[0] === pager.tags[1]
        && grid.tags[1] === pager.tags[0] && Bokeh.index.roots.every((v) => v.is_idle);
}"""

# ------------------------------------------------------------------ the tab tour's logdirs (tests and benchmarks)

TABS = ("scalars", "histograms", "distributions", "images", "text", "anomalies", "health", "hparams", "projector",
        "graph")
TBX_RUNS = [f"lr={lr:g},seed={seed}" for lr in (0.1, 0.03, 0.01, 0.003, 0.001) for seed in range(4)]

# What the open tab shows: its plots that are drawn (visible, with rows to draw) and the text of its visible Divs.
SHOWN_JS = """() => {
  const tabs = Bokeh.documents[0].get_model_by_name("tabs"), seen = new Set(), plots = [], texts = [];
  const visit = (m) => {
    if (m == null || typeof m !== "object" || seen.has(m)) return;
    seen.add(m);
    if (Array.isArray(m)) { m.forEach(visit); return; }
    if (!m.constructor || m.visible === false) return;
    const kind = m.constructor.__name__;
    if (kind === "Plot" || kind === "Figure") {
      const rows = m.renderers.map((r) => r.data_source ? r.data_source.get_length() || 0 : 0)
                              .reduce((a, b) => a + b, 0);
      if (rows > 0) plots.push(m.title ? m.title.text : "");
      return;
    }
    if (kind === "Div" && m.text) texts.push(m.text);
    for (const key of ["children", "child", "tabs"]) if (key in m) visit(m[key]);
  };
  visit(tabs.tabs[tabs.active].child);
  return {plots, text: texts.join(" ")};
}"""


def demo_logdir(root):
    """``flowlab demo``'s logdir (2 epochs: every summary kind, a run that turns NaN, an embedding, the graph)."""
    subprocess.run([sys.executable, "-m", "flowlab.cli", "demo", "--no-serve", "--epochs", "2", "--logdir",
                    str(root)], check=True, capture_output=True, timeout=600)
    return root


def tensorboardx_logdir(root):
    """Twenty runs written by tensorboardX (another writer's logs, more runs than a 10-colour cycle): scalars,
    histograms, images, text, an embedding and hparams."""
    import tensorboardX
    from tensorboardX.summary import hparams
    rng = np.random.default_rng(0)
    for k, run in enumerate(TBX_RUNS):
        with tensorboardX.SummaryWriter(str(root / run)) as w:
            for step in range(200):
                loss = float(np.exp(-step / (30 + 3 * k)) + 0.03 * rng.random())
                w.add_scalar("train/loss", loss, step)
                w.add_scalar("train/accuracy", 1 - loss / 2, step)
                if step % 20 == 0:
                    w.add_scalar("eval/loss", loss * 1.1, step)
            for step in range(0, 200, 40):
                w.add_histogram("layer1/weights", rng.normal(k / 20, 1 + step / 400, 500), step)
            if k < 4:
                w.add_image("samples", rng.random((3, 16, 16)), 0)
                w.add_text("notes", f"run **{run}**: lr and seed from its name", 0)
            if k == 0:
                w.add_embedding(rng.normal(size=(60, 8)) + np.repeat(np.eye(3, 8) * 4, 20, axis=0),
                                metadata=[f"class {i // 20}" for i in range(60)], global_step=0)
            # what add_hparams writes, into the run itself (add_hparams opens a second writer in a subfolder)
            for summary in hparams({"lr": float(run.split(",")[0][3:]), "seed": k % 4}, {"hparam/loss": loss}):
                w.file_writer.add_summary(summary)
            w.add_scalar("hparam/loss", loss, 199)
    return root
