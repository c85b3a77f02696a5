#!/usr/bin/env python
"""The summary data path, event file to browser: every row of issue 9's "Targets" table, TensorBoard beside it.

Each row runs the real servers in subprocesses, one server at a time (``flowlab serve --logdir D --port 0`` and
``tensorboard --logdir D --port 0 --host 127.0.0.1``, which here uses its Rust data server), pages in one headless
Chromium (a fresh browser context per page load, so nothing is cached), and logdirs written once per run into a
temp dir (records framed directly: ``flowlab.summary.record.frame`` around hand-encoded ``Event`` bytes).

    first_page  1,000 runs x 100 scalars. Per round, each side in turn: start the server, wait until it holds the
                data (flowlab: URL printed; TensorBoard: its HTTP API lists every run and the last step), then
                goto -> first page. flowlab: Bokeh document rendered (all root views idle) and a Scalars source
                non-empty. TensorBoard: its scalar card's chart sized and the scalar data it asked for delivered.
                Target <= 2 s (median page load).
    ten_thousand  10,000 runs x 100 scalars (issue 28, "Scale"; the logdir is cached under /tmp by its sizes). Per
                round, each side: start the server (TensorBoard: until its API holds every run), then goto -> a
                usable page (flowlab: as first_page, its cards' lines drawn too; TensorBoard: its scalar card drawn;
                both: the run list drawn with rows), -> every run listed, then a pattern typed into the run list's
                search box -> the list shows exactly the ten runs it matches (the last ten); the server's peak RSS
                (sampled from its start) and its RSS settled with the page open. Target <= 5 s page, RSS <= TB's.
    histograms  5 runs x 8 tags x 100 histogram steps. flowlab: page rendered, then select the Histograms tab ->
                its first page of cards filled (every card built, holding its data and drawn: paging.FILLED_JS)
                and every root view idle. Target <= 1 s. Beside it: TensorBoard's page (no tabs: goto -> its
                histogram cards filled).
    million     1 run x 1,000,000 scalar points with a spike (1000.0 at one step) and a NaN at another. goto -> first
                page holding the run's last step; then, at full zoom-out, does the page's data hold the spike value
                and the NaN (a NaN value, or a marker source naming the NaN step)? Target <= 2 s and yes.
                TensorBoard: its page load, and whether the data its page receives holds them.
    memory      server RSS (process and children) on 2,000 128x128 images (20 tags x 100 steps) and on 20 tags x
                5,000 histogram steps, with one page open on that kind, once the RSS has settled. Target <= TB's.
    training    a training subprocess (flowlab's digits MLP job; scalars every step, weight histograms every 50) into
                the logdir the flowlab server watches; blocks with no page, a page on Scalars, a page on
                Histograms, order rotating per round; ratio to the no-page block of the same round, medians.
                Target >= 0.9x. (No TensorBoard peer: the target is relative to no page.)
    demo        ``flowlab demo`` itself (its dashboard and its training in one command, ``--pace 0``): blocks with no
                page, a page on Scalars and a page on Health, order rotating per round, each block a fresh demo;
                steps/s from its own epoch lines during the block; ratio to the no-page block of the same round,
                medians. Target >= 0.9x (issue 28).
    latency     write -> visible for scalar, histogram, image and text with flowlab's SummaryWriter (add_* then
                flush()), one page per kind on its tab; kinds interleaved, random 0-0.5 s pauses. Target p95 <= 0.5 s
                for every kind. TensorBoard: anchors only (5 s server reload, >= 30 s browser refresh).
    sigint      server started, a page opened the Histograms tab (TensorBoard: its page open), SIGINT -> exit, and
                what the server wrote to stderr after the signal. Target <= 1 s, no warnings.
    health      2 runs x 24 layers x 100,000 watch_health reports (the statistics matrix of every layer, the loss,
                alerts every 1,000 steps), the second run with a gradient-norm spike at one step and NaN at another.
                flowlab: page rendered, then select the Health tab -> both runs' heatmaps and their divergence
                filled and every root view idle; at full zoom-out, do run B's cells hold the spike value and mark
                the NaN step? Then another statistic chosen -> the three heatmaps redrawn with it. Target <= 1 s
                each and yes. No TensorBoard peer: it has no view of per-layer health.
    graph       1 run: flowlab.examples.resnet's ResNet-50 train job (32x32 images, batch 2: ResNet-50's ~1,000 ops with its
                gradients, momentum updates and watch_health statistics), 3 steps, then
                flow.summary.Graph(run).write_structure_graph() (structure_graph.json and a GraphDef event).
                flowlab: page rendered, then select the Graph tab -> its boxes drawn and every root view idle
                (residual blocks collapsed); then a tap on block res3_0 -> its ops drawn. Target <= 2 s and <= 1 s.
                TensorBoard: goto #graphs -> its graph's node groups drawn (SVG ``g.node`` elements in its
                shadow DOM), a full page load (TensorBoard has no tab switch without one).
    reader      8 MiB of random bytes as a *tfevents* file; 100k scalar records with every 100th damaged (one byte
                flipped). flowlab's dashboard store (``Store(logdir).poll()``: the tailer's columnar polls, as ``flowlab serve``
                reads) vs TensorBoard's ``EventAccumulator.Reload()``,
                each in a fresh subprocess (imports excluded), with the records each recovered. Target <= 0.5 s each.
    tabs        ``flowlab demo``'s logdir and 20 runs written by tensorboardX (the browser tests' tab tour's logdirs,
                tests/dashboard_page.py): each tab alone in a fresh page (its Bokeh models), then one page clicked
                through all ten tabs twice: click -> the tab drawn (a plot with data, or its text; idle) and the
                page's models. Target each tab <= 1.5 s and models <= 1.5x the largest single tab's (issue 28). No
                TensorBoard peer: its plugins share no "drawn" condition.

Every wait has a deadline, so the script always ends with the table (TIMEOUT marks a wait that ran out; a side that
timed out is not retried in later rounds). Rounds interleave the sides (the order alternates) and the table gives
medians.

    python benchmarks/data_path.py                     # full sizes, 3 rounds (see README for the run time)
    python benchmarks/data_path.py --quick             # small sizes, 1 round: checks the script works (~5 min)
    python benchmarks/data_path.py --only first_page,reader --rounds 5
    python benchmarks/data_path.py --only ten_thousand    # 10,000 runs (~3 min a round, TensorBoard's page ~1.5)
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np

from flowlab.dashboard.views.paging import FILLED_JS

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))   # the tab tour's logdirs and JS
from dashboard_page import SHOWN_JS, TABS, demo_logdir, tensorboardx_logdir  # noqa: E402
from machine import cpu_model

# ------------------------------------------------------------------------------------------- page detection (JS)
# The dashboard's views are being reworked: everything the script knows about the pages is in these snippets.
#
# flowlab (Bokeh): read through Bokeh.documents[0]. A "scalar source" is a ColumnDataSource holding a flat series: a
# step column ("step" or "steps") and a value column ("value" or "ys") of numbers. That is one line per source in the
# first Scalars view and one card's runs concatenated ("flat") since the thousand-run rework; per-row columns (a
# MultiLine's xs/ys, lists of arrays) are the drawn copy of the same points and are skipped. A tab's sources are the
# ColumnDataSources its TabPanel references (found by the panel's title, e.g. "Histograms").
STEP_COLUMNS, VALUE_COLUMNS = '["step", "steps"]', '["value", "ys"]'
SCALAR_SOURCES = f"""(() => [...Bokeh.documents[0].all_models]
    .filter((m) => m.constructor.__name__ === "ColumnDataSource").map((m) => {{
        const d = m.data, s = {STEP_COLUMNS}.find((n) => n in d), v = {VALUE_COLUMNS}.find((n) => n in d);
        if (!s || !v || (d[v].length && typeof d[v][0] !== "number")) return null;
        return {{model: m, steps: d[s], values: d[v]}};
    }}).filter(Boolean))()"""

# The Bokeh document is in the page and every root view has finished rendering.
RENDERED_JS = """() => window.Bokeh !== undefined && Bokeh.documents.length > 0 && Bokeh.index.roots.length > 0
    && Bokeh.index.roots.every((v) => v.is_idle)"""

# Scalar sources: how many, how many non-empty, the largest step any holds (-1: none).
SCALARS_JS = """() => {
    if (!window.Bokeh || Bokeh.documents.length === 0) return {sources: 0, nonempty: 0, last: -1};
    const src = SCALAR_SOURCES;
    let nonempty = 0, last = -1;
    for (const s of src) {
        if (s.steps.length) nonempty++;
        for (let i = 0; i < s.steps.length; i++) if (s.steps[i] > last) last = s.steps[i];
    }
    return {sources: src.length, nonempty, last};
}""".replace("SCALAR_SOURCES", SCALAR_SOURCES)

# The ColumnDataSources a tab references: {found, sources, nonempty}. Its views are idle when RENDERED_JS holds.
TAB_JS = """(title) => {
    if (!window.Bokeh || Bokeh.documents.length === 0) return {found: false, sources: 0, nonempty: 0};
    const tabs = [...Bokeh.documents[0].all_models].find((m) => m.constructor.__name__ === "Tabs");
    const panel = tabs && tabs.tabs.find((p) => p.title === title);
    if (!panel) return {found: false, sources: 0, nonempty: 0};
    const src = [...panel.child.references()].filter((m) => m.constructor.__name__ === "ColumnDataSource");
    const size = (s) => Math.max(0, ...Object.values(s.data).map((c) => c.length || 0));
    return {found: true, sources: src.length, nonempty: src.filter((s) => size(s) > 0).length};
}"""

# Select a tab by title, as a click on its header does (the Tabs model's `active` syncs to the server).
SELECT_TAB_JS = """(title) => {
    const tabs = [...Bokeh.documents[0].all_models].find((m) => m.constructor.__name__ === "Tabs");
    const i = tabs.tabs.findIndex((p) => p.title === title);
    if (i < 0) return false;
    tabs.active = i;
    return true;
}"""

# At full zoom-out, does the page's data hold the spike value and the NaN? The NaN counts as shown when a scalar
# source holds a NaN value, or another source (a marker) has the NaN's step in a step column or an "x" column.
SPIKE_NAN_JS = """({spike, nan_step}) => {
    const scalar = SCALAR_SOURCES;
    const mine = new Set(scalar.map((s) => s.model));
    let has_spike = false, has_nan = false, points = 0;
    for (const s of scalar) {
        points += s.values.length;
        for (let i = 0; i < s.values.length; i++) {
            if (s.values[i] === spike) has_spike = true;
            if (Number.isNaN(s.values[i])) has_nan = true;
        }
    }
    for (const m of Bokeh.documents[0].all_models) {
        if (m.constructor.__name__ !== "ColumnDataSource" || mine.has(m)) continue;
        for (const c of [...STEP_COLUMNS, "x"])
            if (c in m.data && m.data[c].length && typeof m.data[c][0] === "number"
                && Array.from(m.data[c]).includes(nan_step)) has_nan = true;
    }
    return {spike: has_spike, nan: has_nan, points};
}""".replace("SCALAR_SOURCES", SCALAR_SOURCES).replace("STEP_COLUMNS", STEP_COLUMNS)

# Is a just-written item visible in the tab `title`? scalar/histogram: a source of the tab has `step` in a step
# column; image: a source holds an image whose first pixel is `pixel` (packed RGBA uint32, the solid colour
# written); text: a model of the tab has `marker` in its text.
VISIBLE_JS = """({title, kind, step, pixel, marker}) => {
    const tabs = [...Bokeh.documents[0].all_models].find((m) => m.constructor.__name__ === "Tabs");
    const panel = tabs && tabs.tabs.find((p) => p.title === title);
    if (!panel) return false;
    for (const m of panel.child.references()) {
        if (kind === "text") {
            if (typeof m.text === "string" && m.text.includes(marker)) return true;
            continue;
        }
        if (m.constructor.__name__ !== "ColumnDataSource") continue;
        for (const [name, col] of Object.entries(m.data)) {
            if (kind === "image") {
                for (const item of col) if (item && item.length && item[0] === pixel) return true;
            } else if (STEP_COLUMNS.includes(name) && Array.from(col).includes(step)) {
                return true;
            }
        }
    }
    return false;
}""".replace("STEP_COLUMNS", STEP_COLUMNS)

# TensorBoard (Angular; charts drawn by a worker on an OffscreenCanvas, so pixels cannot be read). An init script
# counts the time-series data requests the page makes per plugin and how many are still in flight; a kind's cards
# count as rendered when `<kind>-card` elements exist, their data requests have all answered, no card shows a
# spinner, a scalar card's canvas has been sized (300x150 is the unsized default), and two animation frames passed.
TB_INIT_JS = """(() => {
    const state = window.__bench = {done: {}, pending: 0};
    const plugins = (url, body) => {
        if (!String(url).includes("/timeSeries")) return null;
        let text = "";
        try { text = typeof body === "string" ? body : body instanceof FormData ? String(body.get("requests")) : ""; }
        catch (e) {}
        state.pending++;
        return [...text.matchAll(/"plugin":"(\\w+)"/g)].map((m) => m[1]);
    };
    const finish = (names) => { state.pending--; for (const p of names) state.done[p] = (state.done[p] || 0) + 1; };
    const open = XMLHttpRequest.prototype.open, send = XMLHttpRequest.prototype.send;
    XMLHttpRequest.prototype.open = function (method, url, ...rest) { this.__url = url; return open.call(this, method, url, ...rest); };
    XMLHttpRequest.prototype.send = function (body) {
        const names = plugins(this.__url, body);
        if (names) this.addEventListener("loadend", () => finish(names));
        return send.call(this, body);
    };
    const fetch0 = window.fetch;
    window.fetch = function (input, init) {
        const names = plugins(typeof input === "string" ? input : input.url, init && init.body);
        const out = fetch0.apply(this, arguments);
        if (names) out.finally(() => finish(names));
        return out;
    };
})();"""

TB_CARDS_JS = """(kind) => {
    const b = window.__bench;
    const cards = document.querySelectorAll(kind + "-card");
    if (!b || cards.length === 0 || b.pending > 0 || !b.done[kind + "s"]) return false;
    if (document.querySelector(kind + "-card mat-spinner, " + kind + "-card mat-progress-spinner")) return false;
    if (kind === "scalar") {
        const canvas = document.querySelector("scalar-card line-chart canvas");
        if (!canvas || (canvas.width === 300 && canvas.height === 150)) return false;
    }
    return cards.length;
}"""

TWO_FRAMES_JS = "() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(() => r(true))))"

# The run list as drawn. flowlab: the "runs-table" DataTable (SlickGrid draws only its visible rows; a row's third
# cell is the run's name) and how many runs its source holds. TensorBoard: its runs table's content rows (every
# row of the filtered list, in the DOM), the name in each row's run column. {total, names}; null before it exists.
FL_RUNLIST_JS = """() => {
    if (!window.Bokeh || Bokeh.documents.length === 0) return null;
    const model = Bokeh.documents[0].get_model_by_name("runs-table"), view = model && Bokeh.index.find_one(model);
    if (!view || !view.shadow_el) return null;
    const names = [...view.shadow_el.querySelectorAll(".slick-row")].map((row) => {
        const cells = row.querySelectorAll(".slick-cell");
        return cells.length ? cells[cells.length - 1].textContent.trim() : "";
    });
    return {total: model.source.get_length(), names};
}"""
TB_RUNLIST_JS = """() => {
    const rows = document.querySelectorAll("runs-data-table tb-data-table-content-row");
    if (!document.querySelector("runs-data-table")) return null;
    const names = [...rows].map((row) => (row.querySelector(".table-column-run") || row).textContent.trim());
    return {total: rows.length, names};
}"""
# flowlab's Scalars cards drawn: each card's per-run rows (a source with run, start, stop) expanded by the page into
# its drawn lines (a source with run, xs, smooth), as many of them, and every root view idle (painted).
FL_LINES_DRAWN_JS = """() => {
    if (!window.Bokeh || Bokeh.documents.length === 0) return false;
    let rows = 0, drawn = 0, cards = 0;
    for (const m of Bokeh.documents[0].all_models) {
        if (m.constructor.__name__ !== "ColumnDataSource") continue;
        const d = m.data;
        if ("start" in d && "stop" in d && "run" in d) { rows += d.run.length; cards++; }
        else if ("xs" in d && "smooth" in d && "run" in d) drawn += d.run.length;
    }
    return cards > 0 && rows > 0 && drawn === rows && Bokeh.index.roots.every((v) => v.is_idle);
}"""
FL_SEARCH_BOX = ".bk-input[placeholder='filter runs (regex)']"
TB_SEARCH_BOX = "runs-data-table input[placeholder='Filter runs (regex)']"

# ------------------------------------------------------------------------------------------------------ settings

CHROMIUM = "/usr/bin/chromium"
BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
ROWS = ("first_page", "ten_thousand", "histograms", "million", "health", "graph", "memory", "training", "demo",
        "latency", "sigint", "reader", "tabs")
FULL = dict(runs=1000, many_runs=10_000, run_scalars=100, hist_runs=5, hist_tags=8, hist_steps=100,
            million=1_000_000, img_tags=20, img_steps=100, mem_hist_tags=20, mem_hist_steps=5000, block_s=10.0,
            latency_samples=20, garbage_mib=8, damaged=100_000, health_layers=24, health_steps=100_000, wait_s=120.0,
            many_wait_s=300.0, rounds=3)
QUICK = dict(runs=50, many_runs=500, run_scalars=100, hist_runs=5, hist_tags=8, hist_steps=20, million=100_000,
             img_tags=4, img_steps=25, mem_hist_tags=4, mem_hist_steps=200, block_s=3.0, latency_samples=4,
             garbage_mib=1, damaged=10_000, health_layers=6, health_steps=5_000, wait_s=45.0, many_wait_s=120.0,
             rounds=1)
SPIKE = 1000.0
HIST_EVERY = 50            # the training loop logs weight histograms every this many steps
PY = sys.executable
TENSORBOARD = shutil.which("tensorboard", path=os.path.dirname(PY)) or shutil.which("tensorboard")


class Timeout(Exception):
    """A wait ran past its deadline."""


def loadavg():
    try:
        return " / ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def median(values):
    return statistics.median(values) if values else None


def p95(values):
    return float(np.percentile(np.asarray(values, np.float64), 95)) if values else None


def fmt_s(x):
    return "-" if x is None else "inf" if x == float("inf") else f"{x:.2f} s" if x >= 0.1 else f"{x * 1000:.0f} ms"


def fmt_list(xs):
    return ", ".join("TIMEOUT" if x is None else f"{x:.2f}" for x in xs)


# ---------------------------------------------------------------------------------------------- writing logdirs
# Hand-encoded Event bytes (TensorBoard's event.proto field numbers) are ~10x faster than building protos, which
# matters for 1M points. Scalars use `simple_value` (as tensorboardX writes them); histograms, images and text are
# tensors with their plugin's metadata on a tag's first record in each file, as flowlab's writer sends them.

def _varint(n):
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number, payload):           # a length-delimited field
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def event_bytes(step, wall, summary=b"", file_version=None):
    out = b"\x09" + struct.pack("<d", wall)
    if file_version is not None:
        return out + _field(3, file_version.encode())
    return out + b"\x10" + _varint(step) + _field(5, summary)


def scalar_summary(tag, value):
    return _field(1, _field(1, tag.encode()) + b"\x15" + struct.pack("<f", value))


class EventFile:
    """One event file of a run, written record by record (``frame`` from flowlab's record module)."""

    def __init__(self, run_dir, suffix="bench"):
        from flowlab.summary.record import frame
        self.frame = frame
        run_dir.mkdir(parents=True, exist_ok=True)
        self.f = open(run_dir / f"events.out.tfevents.{int(time.time())}.{suffix}", "wb")
        self.f.write(frame(event_bytes(0, time.time(), file_version="brain.Event:2")))
        self.tagged = set()

    def raw(self, step, wall, summary):
        self.f.write(self.frame(event_bytes(step, wall, summary)))

    def value(self, step, wall, make_value, tag):
        """``make_value(metadata: bool)`` builds the Summary.Value proto; metadata only on the tag's first record."""
        v = make_value(tag not in self.tagged)
        self.tagged.add(tag)
        from flowlab.summary import proto
        self.raw(step, wall, proto.Summary(value=[v]).SerializeToString())

    def close(self):
        self.f.close()


def _plugin_value(tag, plugin, metadata):
    from flowlab.summary import proto
    v = proto.Summary.Value(tag=tag)
    if metadata:
        v.metadata.plugin_data.plugin_name = plugin
    return v


def histogram_value(tag, buckets, metadata):
    """A [k, 3] float64 array of (left, right, count) as TensorBoard's histogram tensor."""
    from flowlab.summary import proto
    v = _plugin_value(tag, "histograms", metadata)
    v.tensor.dtype = proto.enum_value("tensorboard.DataType", "DT_DOUBLE")
    v.tensor.tensor_shape.dim.add(size=buckets.shape[0])
    v.tensor.tensor_shape.dim.add(size=3)
    v.tensor.tensor_content = np.ascontiguousarray(buckets, "<f8").tobytes()
    return v


def image_value(tag, png, width, height, metadata):
    from flowlab.summary import proto
    v = _plugin_value(tag, "images", metadata)
    v.tensor.dtype = proto.enum_value("tensorboard.DataType", "DT_STRING")
    v.tensor.tensor_shape.dim.add(size=3)
    v.tensor.string_val.extend([str(width).encode(), str(height).encode(), png])
    return v


def png_bytes(hwc):
    import io
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(hwc).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def buckets_of(rng, spread):
    counts, edges = np.histogram(rng.normal(0, spread, 1000), bins=30)
    return np.stack([edges[:-1], edges[1:], counts], axis=1).astype(np.float64)


def write_scalar_runs(logdir, runs, steps):
    rng = np.random.default_rng(0)
    wall = time.time()
    for r in range(runs):
        f = EventFile(logdir / f"run{r:04d}")
        for step, v in enumerate((np.exp(-np.arange(steps) / 30) + 0.05 * rng.random(steps) + r / runs).tolist()):
            f.raw(step, wall + step, scalar_summary("loss", v))
        f.close()


def cached_scalar_runs(runs, steps):
    """``write_scalar_runs`` into ``<tmp>/flowlab-bench-cache/scalar-runs-<runs>x<steps>-v1/logdir``, written once
    and kept across invocations (other rows write theirs into the run's temp dir; 10,000 run directories are worth
    keeping); ``(logdir, reused)``. A ``complete`` marker is written last, so an interrupted write is redone, not
    reused. Bump the ``-v1`` when ``write_scalar_runs`` changes what it writes."""
    root = Path(tempfile.gettempdir()) / "flowlab-bench-cache" / f"scalar-runs-{runs}x{steps}-v1"
    marker = root / "complete"
    reused = marker.exists()
    if not reused:
        shutil.rmtree(root, ignore_errors=True)
        write_scalar_runs(root / "logdir", runs, steps)
        marker.write_text(f"{runs} runs x {steps} scalars\n")
    return root / "logdir", reused


def write_million(logdir, n):
    """One run, tag "loss": a smooth curve, SPIKE at 37% of the run and NaN at 71%; returns their steps."""
    spike_step, nan_step = int(n * 0.37), int(n * 0.71)
    values = (1.0 / (1.0 + np.arange(n) / 1000.0) + 0.01 * np.random.default_rng(1).random(n)).astype(np.float32)
    values[spike_step], values[nan_step] = SPIKE, np.nan
    f = EventFile(logdir / "run")
    wall = time.time() - n * 0.01
    tag = _field(1, b"loss") + b"\x15"
    raw, frame, pack = f.f.write, f.frame, struct.Struct("<f").pack
    for step, v in enumerate(values.tolist()):
        raw(frame(event_bytes(step, wall + step * 0.01, _field(1, tag + pack(v)))))
    f.close()
    return spike_step, nan_step


def write_histogram_runs(logdir, runs, tags, steps, variants=40):
    """``runs`` x ``tags`` x ``steps`` histograms; bucket arrays cycle through ``variants`` precomputed ones."""
    rng = np.random.default_rng(2)
    shapes = [buckets_of(rng, 1 + k / 10) for k in range(variants)]
    wall = time.time()
    for r in range(runs):
        f = EventFile(logdir / f"run{r}")
        cache = {}
        for step in range(steps):
            for t in range(tags):
                tag = f"layer{t}/weights"
                first = tag not in f.tagged
                key = (tag, step % variants, first)
                if key not in cache:
                    from flowlab.summary import proto
                    cache[key] = proto.Summary(value=[histogram_value(tag, shapes[step % variants], first)]) \
                        .SerializeToString()
                f.tagged.add(tag)
                f.raw(step, wall + step, cache[key])
        f.close()


HEALTH_SPIKE = 1.0e6        # run B's gradient norm of one layer at one step (the rest are ~0.01-10)


def write_health_runs(logdir, layers, steps):
    """Runs ``A`` and ``B`` of ``watch_health`` reports as ``SummaryWriter.add_health`` writes them (the statistics
    matrix under ``health``, the loss, alert rows every 1,000 steps). Run B's layer 3 has a gradient norm of
    ``HEALTH_SPIKE`` at 60% of the steps and 7 NaN gradient elements (``grad_nan``) at 80%. Returns
    ``(spike step, NaN step)``."""
    from flowlab.health import STATISTICS
    from flowlab.summary import encode, health_log, proto
    names = [f"layer_{i:02d}" for i in range(layers)]
    stats = list(STATISTICS)
    content = health_log.content(names, stats)
    rng = np.random.default_rng(3)
    spike_step, nan_step = int(steps * 0.6), int(steps * 0.8)
    grad, nan = stats.index("grad_norm"), stats.index("grad_nan")
    counts = [stats.index(c) for c in ("act_nan", "act_inf", "weight_nan", "weight_inf", "grad_nan", "grad_inf")]
    fractions = [stats.index(c) for c in ("act_zero_fraction", "dead_fraction")]
    for run in ("A", "B"):
        out = EventFile(logdir / run)
        base = rng.uniform(0.01, 10.0, size=(layers, len(stats)))
        for step in range(steps):
            m = base * (1.0 + 0.05 * np.sin(step / 500.0 + np.arange(layers)[:, None]))
            m[:, counts] = 0.0
            m[:, fractions] /= 10.0
            if run == "B" and step == spike_step:
                m[3, grad] = HEALTH_SPIKE
            if run == "B" and step == nan_step:
                m[3, nan] = 7.0
            values = [encode.tensor("health", m, health_log.PLUGIN, content if step == 0 else b"",
                                    metadata=step == 0),
                      encode.scalar("health/loss", float(2.0 / (1.0 + step / 1000.0)), metadata=step == 0)]
            if step % 1000 == 0:
                values.append(encode.text("health/alerts", [["update_ratio", names[0], f"small updates at {step}"]],
                                          metadata=step == 0))
            out.raw(step, 1.7e9 + step, proto.Summary(value=values).SerializeToString())
        out.close()
    return spike_step, nan_step


def write_image_run(logdir, tags, steps, size=128, variants=50):
    """One run, ``tags`` x ``steps`` noisy RGB images (PNGs cycle through ``variants`` encoded ones)."""
    rng = np.random.default_rng(3)
    y, x = np.mgrid[0:size, 0:size]
    pngs = []
    for k in range(variants):      # gradients plus noise: PNGs of realistic size, not flat colour
        base = np.stack([(x + 5 * k) % 256, (2 * y + k) % 256, ((x + y) // 2 + 3 * k) % 256], axis=-1)
        pngs.append(png_bytes(np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)))
    from flowlab.summary import proto
    f = EventFile(logdir / "run")
    wall = time.time()
    for step in range(steps):
        for t in range(tags):
            tag = f"samples/{t}"
            first = tag not in f.tagged
            f.tagged.add(tag)
            v = image_value(tag, pngs[(step * tags + t) % variants], size, size, first)
            f.raw(step, wall + step, proto.Summary(value=[v]).SerializeToString())
    f.close()


def logdir_mb(path):
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file()) / 1e6


# ------------------------------------------------------------------------------------------------------ processes

PROCS: list[subprocess.Popen] = []


def spawn(args, **kwargs):
    """A child in its own process group (Ctrl-C at the terminal reaches only us; cleanup kills the whole group,
    TensorBoard's data server included)."""
    proc = subprocess.Popen(args, start_new_session=True, **kwargs)
    PROCS.append(proc)
    return proc


def kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def cleanup_all():
    for proc in PROCS:
        kill_group(proc)
    PROCS.clear()


def rss_mb(pid):
    """Resident memory of a process and all its descendants, in MB."""
    import psutil
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 1e6


class Server:
    """A dashboard server in a subprocess: ``.url``, ``.ready_s`` (Popen -> URL printed), ``.stop()``."""

    name = "?"

    def __init__(self, args, log_path, url_stream, timeout):
        self.log_path = log_path
        self.log = open(log_path, "w+")
        self.lines, self.url = [], None
        self.signalled_at = None                 # index into self.lines when SIGINT was sent
        env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="3")
        start = time.perf_counter()
        self.proc = spawn(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        found = threading.Event()

        def pump(stream, label):            # threads: pipes must be drained or the server blocks on a full one
            for line in stream:
                self.lines.append((label, line.rstrip("\n")))
                self.log.write(f"[{label}] {line}")
                m = re.search(r"http://\S+", line) if label == url_stream else None
                if m and self.url is None:
                    self.url = m.group(0)
                    found.set()
        self.pumps = [threading.Thread(target=pump, args=(s, lab), daemon=True)
                      for s, lab in ((self.proc.stdout, "stdout"), (self.proc.stderr, "stderr"))]
        for t in self.pumps:
            t.start()
        deadline = time.perf_counter() + timeout
        while not found.wait(0.05):
            if self.proc.poll() is not None or time.perf_counter() > deadline:
                still_running = self.proc.poll() is None
                self.stop()
                tail = "\n".join(f"  {lab}: {ln}" for lab, ln in self.lines[-8:])
                why = (f"printed no URL within {timeout:.0f} s" if still_running
                       else f"exited (rc {self.proc.returncode}) before printing its URL")
                raise (Timeout if still_running else RuntimeError)(f"{self.name} {why}:\n{tail}")
        self.ready_s = time.perf_counter() - start

    def rss(self):
        return rss_mb(self.proc.pid)

    def interrupt(self, timeout=30.0):
        """SIGINT to the server process alone (as Ctrl-C); seconds until it exited, or None after ``timeout``
        (then it is killed)."""
        self.signalled_at = len(self.lines)
        start = time.perf_counter()
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=timeout)
            took = time.perf_counter() - start
        except subprocess.TimeoutExpired:
            took = None
        kill_group(self.proc)                # helpers it left behind, if any
        for t in self.pumps:
            t.join(timeout=2)
        return took

    def stderr_after_signal(self):
        return [ln for lab, ln in self.lines[self.signalled_at or 0:] if lab == "stderr" and ln.strip()]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        kill_group(self.proc)
        for t in self.pumps:                 # they end with the pipes; then nothing writes to the log any more
            t.join(timeout=2)
        if not self.log.closed:
            self.log.close()


class Flowlab(Server):
    name = "flowlab"

    def __init__(self, logdir, log_path, timeout):
        super().__init__([PY, "-m", "flowlab.cli", "serve", "--logdir", str(logdir), "--port", "0"],
                         log_path, "stdout", timeout)


class TensorBoard(Server):
    name = "TensorBoard"

    def __init__(self, logdir, log_path, timeout):
        super().__init__([TENSORBOARD, "--logdir", str(logdir), "--port", "0", "--host", "127.0.0.1"],
                         log_path, "stderr", timeout)
        self.url = self.url.rstrip("/") + "/"

    def api(self, path, **query):
        url = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        with urllib.request.urlopen(url, timeout=30) as r:
            return json.loads(r.read())

    def wait_loaded(self, plugin, runs, last_step, timeout):
        """Until TensorBoard's HTTP API lists ``runs`` runs for ``plugin`` and the first, middle and last run hold
        ``last_step`` in every tag (its data server loads in the background after the URL is printed)."""
        data_path = {"scalars": "scalars", "histograms": "histograms", "images": "images"}[plugin]
        deadline = time.perf_counter() + timeout
        while True:
            try:
                tags = self.api(f"data/plugin/{plugin}/tags")
                names = sorted(tags)
                if len(names) >= runs:
                    ok = True
                    for run in {names[0], names[len(names) // 2], names[-1]}:
                        for tag in tags[run]:
                            q = dict(run=run, tag=tag) | ({"sample": 0} if plugin == "images" else {})
                            data = self.api(f"data/plugin/{plugin}/{data_path}", **q)
                            step = data[-1]["step"] if plugin == "images" else data[-1][1]
                            ok = ok and step == last_step
                    if ok:
                        return
            except (OSError, ValueError, KeyError, IndexError):
                pass
            if time.perf_counter() > deadline:
                raise Timeout(f"TensorBoard had not loaded the logdir after {timeout:.0f} s")
            time.sleep(0.2)


# ----------------------------------------------------------------------------------------------------- browser

class Browser:
    def __init__(self, pw):
        self.browser = pw.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        self.errors = []

    def page(self, tensorboard=False):
        """A page in a fresh context (no cache shared with earlier loads); close it with ``close(page)``."""
        ctx = self.browser.new_context(viewport={"width": 1400, "height": 900})
        if tensorboard:
            ctx.add_init_script(TB_INIT_JS)
        page = ctx.new_page()
        page.on("console", lambda m: self.errors.append(m.text[:200]) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(str(e)[:200]))
        return page

    @staticmethod
    def close(page):
        try:
            page.context.close()
        except Exception:
            pass


def wait(page, js, timeout, arg=None):
    """Poll ``js`` in the page every 20 ms until truthy; its value. Raises Timeout (also when the page is stuck)."""
    from playwright.sync_api import TimeoutError as PWTimeout
    try:
        return page.wait_for_function(js, arg=arg, polling=20, timeout=max(timeout, 0.01) * 1000).json_value()
    except PWTimeout:
        raise Timeout(f"page condition not met within {timeout:.0f} s") from None


def ask(page, js, timeout, arg=None):
    """``js(arg)`` evaluated once, with a deadline (a plain evaluate waits forever on a page stuck in a task)."""
    return wait(page, f"(a) => [({js})(a)]", timeout, arg)[0]


def goto(page, url, timeout):
    from playwright.sync_api import TimeoutError as PWTimeout
    try:
        page.goto(url, timeout=timeout * 1000, wait_until="commit")
    except PWTimeout:
        raise Timeout(f"goto {url} did not answer within {timeout:.0f} s") from None


def flowlab_first_page(page, url, timeout, last_step=None):
    """goto -> rendered with a non-empty scalar source (and holding ``last_step``); seconds."""
    start = time.perf_counter()
    goto(page, url, timeout)
    cond = (f"() => ({RENDERED_JS})() && (({SCALARS_JS})()).nonempty > 0"
            + ("" if last_step is None else f" && (({SCALARS_JS})()).last >= {last_step}"))
    wait(page, cond, timeout - (time.perf_counter() - start))
    return time.perf_counter() - start


def flowlab_tab(page, title, timeout):
    """Select the card tab ``title`` -> its first page of cards filled (``paging.FILLED_JS``: every card of the page
    built, holding its data and drawn, BokehJS idle); seconds from the selection."""
    start = time.perf_counter()
    if not ask(page, SELECT_TAB_JS, timeout, title):
        raise RuntimeError(f"no tab titled {title!r}")
    wait(page, f"(t) => ({RENDERED_JS})() && (({TAB_JS})(t)).nonempty > 0 && ({FILLED_JS})(t.toLowerCase())",
         timeout - (time.perf_counter() - start), title)
    return time.perf_counter() - start


def flowlab_page_ready(page, url, timeout):
    """goto -> Bokeh document rendered (no data condition: for logdirs without scalars)."""
    start = time.perf_counter()
    goto(page, url, timeout)
    wait(page, RENDERED_JS, timeout - (time.perf_counter() - start))
    return time.perf_counter() - start


def tb_page(page, url, kind, timeout):
    """goto -> TensorBoard's ``kind`` cards rendered (see TB_CARDS_JS); (seconds, cards)."""
    start = time.perf_counter()
    goto(page, url, timeout)
    cards = wait(page, TB_CARDS_JS, timeout - (time.perf_counter() - start), kind)
    ask(page, TWO_FRAMES_JS, 10)
    return time.perf_counter() - start, cards


# ------------------------------------------------------------------------------------------------------- rows

class Row:
    def __init__(self, key, case, target):
        self.key, self.case, self.target = key, case, target
        self.flowlab, self.tensorboard, self.verdict = "-", "-", "-"
        self.notes = []

    def note(self, text):
        self.notes.append(text)
        print(f"    {text}", flush=True)


def verdict_of(value, limit, timed_out=False):
    if value is None:
        return "TIMEOUT" if timed_out else "ERROR"
    return "PASS" if value <= limit else "MISS"


def row_first_page(ctx, row):
    cfg, tmp, br = ctx.cfg, ctx.tmp, ctx.browser
    logdir = tmp / "first_page"
    t0 = time.perf_counter()
    write_scalar_runs(logdir, cfg["runs"], cfg["run_scalars"])
    row.note(f"logdir: {cfg['runs']:,} runs x {cfg['run_scalars']} scalars, {logdir_mb(logdir):.1f} MB, written in "
             f"{time.perf_counter() - t0:.1f} s")
    loads = {"flowlab": [], "TensorBoard": []}
    ready = {"flowlab": [], "TensorBoard": []}
    dead, errored = set(), set()          # sides not retried; of those, the ones that failed other than by a timeout
    for rnd in range(ctx.rounds):
        for side in (("flowlab", "TensorBoard") if rnd % 2 == 0 else ("TensorBoard", "flowlab")):
            if side in dead:
                continue
            server = None
            try:
                start = time.perf_counter()
                if side == "flowlab":
                    server = Flowlab(logdir, tmp / f"fp-fl-{rnd}.log", cfg["wait_s"])
                else:
                    server = TensorBoard(logdir, tmp / f"fp-tb-{rnd}.log", cfg["wait_s"])
                    server.wait_loaded("scalars", cfg["runs"], cfg["run_scalars"] - 1, cfg["wait_s"])
                ready[side].append(time.perf_counter() - start)
                page = br.page(tensorboard=side == "TensorBoard")
                try:
                    if side == "flowlab":
                        s = flowlab_first_page(page, server.url, cfg["wait_s"])
                        info = ask(page, SCALARS_JS, 10)
                        extra = f"{info['nonempty']} of {info['sources']} scalar sources non-empty"
                    else:
                        s, cards = tb_page(page, server.url, "scalar", cfg["wait_s"])
                        extra = f"{cards} scalar card(s)"
                finally:
                    br.close(page)
                loads[side].append(s)
                row.note(f"round {rnd + 1} {side:11s}: server ready {ready[side][-1]:.2f} s, first page {s:.2f} s "
                         f"({extra})")
            except Timeout as e:
                loads[side].append(None)
                dead.add(side)
                row.note(f"round {rnd + 1} {side:11s}: TIMEOUT ({e}); not retried")
            except Exception as e:
                dead.add(side)
                errored.add(side)
                row.note(f"round {rnd + 1} {side:11s}: ERROR {type(e).__name__}: {str(e).strip()[:300]}")
            finally:
                if server is not None:
                    server.stop()
    fl, tb = [x for x in loads["flowlab"] if x is not None], [x for x in loads["TensorBoard"] if x is not None]
    failed = lambda side: "ERROR" if side in errored else f"TIMEOUT > {cfg['wait_s']:.0f} s"
    row.flowlab = (f"{fmt_s(median(fl))} (ready {fmt_s(median(ready['flowlab']))})" if fl and "flowlab" not in dead
                   else failed("flowlab"))
    row.tensorboard = (f"{fmt_s(median(tb))} (ready {fmt_s(median(ready['TensorBoard']))})"
                       if tb and "TensorBoard" not in dead else failed("TensorBoard"))
    row.verdict = verdict_of(median(fl) if "flowlab" not in dead else None, 2.0, timed_out="flowlab" not in errored)


class PeakRss:
    """The largest RSS of a server (process and children) sampled every ``interval`` s in a thread, from now until
    ``stop()``; ``peak`` in MB."""

    def __init__(self, server, interval=0.2):
        self.server, self.peak = server, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(interval,), daemon=True)
        self._thread.start()

    def _sample(self, interval):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.server.rss() or 0.0)
            self._stop.wait(interval)

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=5)
        return self.peak


def search_case(runs):
    """A run-name pattern that matches the list's last ten runs (the last page of any paged list), and those runs."""
    prefix = f"run{runs - 1:04d}"[:-1]
    names = [f"run{r:04d}" for r in range(runs)]
    return f"^{prefix}[0-9]$", [n for n in names if re.fullmatch(f"{prefix}[0-9]", n)]


def row_ten_thousand(ctx, row):
    """10,000 runs x 100 scalars (issue 28's "Scale"). Per round, each side in turn: start the server (flowlab
    serve is a process of its own, as TensorBoard is, so its RSS is its own) and, for TensorBoard, wait until its
    API holds the data; then in a fresh page:
      usable   goto -> the first page usable: flowlab as the first_page row's condition (document rendered, a scalar
               source non-empty), its cards' lines drawn (every run's row expanded into drawn lines, views idle:
               FL_LINES_DRAWN_JS) and the run list drawn with rows; TensorBoard its scalar card drawn
               (TB_CARDS_JS) and its runs table drawn with rows.
      listed   goto -> the run list holds every run (the search below needs them all); also from the server's start
               (ready + listed: flowlab's server answers once its store has read the logdir, TensorBoard's page is
               opened once its API holds every run).
      search   a pattern typed key by key into the run list's search box (flowlab: then Enter, which sends a
               TextInput's value; TensorBoard filters as keys are typed) ->
               the list drawn holds exactly the runs it matches (the last ten, the last page of a paged list).
      RSS      the server's peak RSS (process and children, sampled every 0.2 s from its start), and its RSS once
               settled with the page open after the search.
    The logdir is cached under /tmp (``cached_scalar_runs``)."""
    cfg, tmp, br = ctx.cfg, ctx.tmp, ctx.browser
    n, wait_s = cfg["many_runs"], cfg["many_wait_s"]
    t0 = time.perf_counter()
    logdir, reused = cached_scalar_runs(n, cfg["run_scalars"])
    row.note(f"logdir: {n:,} runs x {cfg['run_scalars']} scalars, {logdir_mb(logdir):.1f} MB at {logdir}, "
             + ("reused from the cache" if reused else f"written in {time.perf_counter() - t0:.1f} s"))
    pattern, wanted = search_case(n)
    row.note(f"search: {pattern!r} -> {len(wanted)} runs ({wanted[0]} ... {wanted[-1]})")
    sides = {"flowlab": (FL_RUNLIST_JS, FL_SEARCH_BOX), "TensorBoard": (TB_RUNLIST_JS, TB_SEARCH_BOX)}
    got = {side: {"ready": [], "usable": [], "listed": [], "search": [], "peak": [], "steady": [], "start_to_listed": []}
           for side in sides}
    dead, errored = set(), set()
    for rnd in range(ctx.rounds):
        for side in (("flowlab", "TensorBoard") if rnd % 2 == 0 else ("TensorBoard", "flowlab")):
            if side in dead:
                continue
            runlist_js, box = sides[side]
            server = sampler = page = None
            stage = "server ready"
            try:
                start = time.perf_counter()
                if side == "flowlab":
                    server = Flowlab(logdir, tmp / f"tt-fl-{rnd}.log", wait_s)
                    sampler = PeakRss(server)
                else:
                    server = TensorBoard(logdir, tmp / f"tt-tb-{rnd}.log", wait_s)
                    sampler = PeakRss(server)
                    server.wait_loaded("scalars", n, cfg["run_scalars"] - 1, wait_s)
                ready = time.perf_counter() - start
                stage = "usable page"
                page = br.page(tensorboard=side == "TensorBoard")
                start = time.perf_counter()
                goto(page, server.url, wait_s)
                drawn = (f"({RENDERED_JS})() && (({SCALARS_JS})()).nonempty > 0 && ({FL_LINES_DRAWN_JS})()"
                         if side == "flowlab" else f"({TB_CARDS_JS})('scalar')")
                wait(page, f"() => {{ const l = ({runlist_js})(); return l && l.names.length > 0 && {drawn}; }}",
                     wait_s - (time.perf_counter() - start))
                usable = time.perf_counter() - start
                stage = "every run listed"
                wait(page, f"() => {{ const l = ({runlist_js})(); return l && l.total === {n}; }}",
                     wait_s - (time.perf_counter() - start))
                listed = time.perf_counter() - start
                start = time.perf_counter()
                stage = "search"
                search = page.locator(box)          # typed key by key (TensorBoard filters on key events)
                search.click(timeout=wait_s * 1000)
                search.press_sequentially(pattern, timeout=wait_s * 1000)
                if side == "flowlab":
                    search.press("Enter", timeout=wait_s * 1000)
                wait(page, f"(w) => {{ const l = ({runlist_js})(); "
                           "return l && JSON.stringify(l.names.slice().sort()) === JSON.stringify(w); }",
                     wait_s - (time.perf_counter() - start), wanted)
                searched = time.perf_counter() - start
                steady, peak, settled = settle_rss(server, 60)
                peak = max(sampler.stop(), peak)
                for key, value in (("ready", ready), ("usable", usable), ("listed", listed), ("search", searched),
                                   ("peak", peak), ("steady", steady), ("start_to_listed", ready + listed)):
                    got[side][key].append(value)
                row.note(f"round {rnd + 1} {side:11s}: server ready {ready:.2f} s, usable page {usable:.2f} s, "
                         f"every run listed {listed:.2f} s, search {searched:.2f} s; RSS peak {peak:.0f} MB, "
                         f"steady {steady:.0f} MB{'' if settled else ' (still moving after 60 s)'}")
            except Timeout as e:
                dead.add(side)
                row.note(f"round {rnd + 1} {side:11s}: TIMEOUT at {stage} ({e}); RSS then "
                         f"{(server and server.rss()) or 0:.0f} MB; not retried")
            except Exception as e:
                dead.add(side)
                errored.add(side)
                row.note(f"round {rnd + 1} {side:11s}: ERROR {type(e).__name__}: {str(e).strip()[:300]}")
            finally:
                if sampler is not None:
                    sampler.stop()
                if page is not None:
                    br.close(page)
                if server is not None:
                    server.stop()

    def cell(side):
        g = got[side]
        if side in dead or not g["usable"]:
            return "ERROR" if side in errored else f"TIMEOUT > {wait_s:.0f} s"
        return (f"{fmt_s(median(g['usable']))}; {fmt_s(median(g['search']))}; {median(g['peak']):.0f} MB peak, "
                f"{median(g['steady']):.0f} steady; all listed {fmt_s(median(g['start_to_listed']))} from start")
    row.flowlab, row.tensorboard = cell("flowlab"), cell("TensorBoard")
    for side in sides:
        if got[side]["usable"]:
            row.note(f"{side}: medians: ready {fmt_s(median(got[side]['ready']))}, every run listed "
                     f"{fmt_s(median(got[side]['listed']))}")
    fl, tb = got["flowlab"], got["TensorBoard"]
    if "flowlab" in dead or not fl["usable"]:
        row.verdict = "ERROR" if "flowlab" in errored else "TIMEOUT"
    elif "TensorBoard" in dead or not tb["usable"]:
        row.verdict = ("PASS (page; RSS without a peer)" if median(fl["usable"]) <= 5.0
                       else "MISS (page; RSS without a peer)")
    else:
        page_ok = median(fl["usable"]) <= 5.0
        rss_ok = median(fl["peak"]) <= median(tb["peak"]) and median(fl["steady"]) <= median(tb["steady"])
        row.verdict = "PASS" if page_ok and rss_ok else \
            f"MISS ({'/'.join(w for w, ok in (('page', page_ok), ('RSS', rss_ok)) if not ok)})"


def row_histograms(ctx, row):
    cfg, tmp, br = ctx.cfg, ctx.tmp, ctx.browser
    logdir = ctx.hist_logdir()
    fl, tb, all_cards = [], [], []
    server = None
    try:
        server = Flowlab(logdir, tmp / "hist-fl.log", cfg["wait_s"])
        for rnd in range(ctx.rounds):
            page = br.page()
            try:
                flowlab_page_ready(page, server.url, cfg["wait_s"])
                s = flowlab_tab(page, "Histograms", cfg["wait_s"])
                info = ask(page, TAB_JS, 10, "Histograms")
                fl.append(s)
                row.note(f"round {rnd + 1} flowlab: Histograms tab filled {s:.2f} s after selecting it ({info['nonempty']} "
                         f"of {info['sources']} sources non-empty)")
            except Timeout as e:
                fl.append(None)
                row.note(f"round {rnd + 1} flowlab: TIMEOUT ({e})")
                break
            finally:
                br.close(page)
    except Timeout as e:
        row.note(f"flowlab server: TIMEOUT ({e})")
    finally:
        if server is not None:
            server.stop()
    server = None
    try:
        server = TensorBoard(logdir, tmp / "hist-tb.log", cfg["wait_s"])
        server.wait_loaded("histograms", cfg["hist_runs"], cfg["hist_steps"] - 1, cfg["wait_s"])
        for rnd in range(ctx.rounds):
            page = br.page(tensorboard=True)
            try:
                s, cards = tb_page(page, server.url, "histogram", cfg["wait_s"])
                tb.append(s)
                row.note(f"round {rnd + 1} TensorBoard: goto -> {cards} histogram cards filled {s:.2f} s")
            finally:
                br.close(page)
    except Timeout as e:
        row.note(f"TensorBoard: TIMEOUT ({e})")
    finally:
        if server is not None:
            server.stop()
    ok = [x for x in fl if x is not None]
    row.flowlab = f"{fmt_s(median(ok))} ({fmt_list(fl)})" if ok else f"TIMEOUT > {cfg['wait_s']:.0f} s"
    row.tensorboard = f"page {fmt_s(median(tb))} (goto -> cards)" if tb else "TIMEOUT"
    row.verdict = verdict_of(median(ok) if ok and None not in fl else None, 1.0, timed_out=True)


# The Health tab's heatmaps, by model name: run A's and B's cells, the divergence of B from A.
HEALTH_FILLED_JS = """(names) => {
    if (!window.Bokeh || Bokeh.documents.length === 0) return false;
    const all = [...Bokeh.documents[0].all_models];
    return names.every((n) => { const m = all.find((x) => x.name === n);
                                 return m && m.data.hi && m.data.hi.length > 0; })
        && Bokeh.index.roots.every((v) => v.is_idle);
}"""
HEALTH_STATISTIC_JS = """(stat) => {
    const select = [...Bokeh.documents[0].all_models].find((m) => m.name === "health-statistic");
    if (!select || !select.options.includes(stat)) return false;
    select.value = stat;
    return true;
}"""
# Every heatmap (A, B, the divergence) redrawn for ``stat`` and the page idle.
HEALTH_REDRAWN_JS = """(stat) => {
    const all = [...Bokeh.documents[0].all_models];
    return ["health-heatmap-figure:A", "health-heatmap-figure:B", "health-divergence-figure"].every((n) => {
        const f = all.find((x) => x.name === n);
        return f && f.title.text.includes(stat); }) && Bokeh.index.roots.every((v) => v.is_idle);
}"""
# At full zoom-out: the largest value run B's heatmap holds, and the steps of the cells marked as holding NaN/Inf.
HEALTH_SPIKE_NAN_JS = """() => {
    const m = [...Bokeh.documents[0].all_models].find((x) => x.name === "health-heatmap:B");
    const d = m.data, marked = [];
    let hi = -Infinity;
    for (let i = 0; i < d.hi.length; i++) {
        if (d.hi[i] > hi) hi = d.hi[i];
        if (d.nonfinite[i] > 0) marked.push([d.first[i], d.last[i]]);
    }
    return {hi, marked, cells: d.hi.length};
}"""


def row_health(ctx, row):
    cfg, tmp, br = ctx.cfg, ctx.tmp, ctx.browser
    logdir = tmp / "health"
    t0 = time.perf_counter()
    spike_step, nan_step = write_health_runs(logdir, cfg["health_layers"], cfg["health_steps"])
    row.note(f"wrote 2 runs x {cfg['health_layers']} layers x {cfg['health_steps']:,} reports in "
             f"{time.perf_counter() - t0:.0f} s ({logdir_mb(logdir):.0f} MB)")
    tab, both, seen = [], [], []
    server = None
    try:
        server = Flowlab(logdir, tmp / "health-fl.log", cfg["wait_s"])
        for rnd in range(ctx.rounds):
            page = br.page()
            try:
                flowlab_page_ready(page, server.url, cfg["wait_s"])
                start = time.perf_counter()
                if not ask(page, SELECT_TAB_JS, 10, "Health"):
                    raise RuntimeError("no Health tab")
                wait(page, HEALTH_FILLED_JS, cfg["wait_s"], ["health-heatmap:A", "health-heatmap:B",
                                                             "health-divergence"])
                tab.append(time.perf_counter() - start)
                found = ask(page, HEALTH_SPIKE_NAN_JS, 10)         # grad_norm, the statistic shown first
                nan_shown = any(a <= nan_step <= b for a, b in found["marked"])
                seen.append(found["hi"] == HEALTH_SPIKE and nan_shown)
                start = time.perf_counter()
                if not ask(page, HEALTH_STATISTIC_JS, 10, "act_max_abs"):
                    raise RuntimeError("act_max_abs is not offered as a statistic")
                wait(page, HEALTH_REDRAWN_JS, cfg["wait_s"], "act_max_abs")
                both.append(time.perf_counter() - start)
                row.note(f"round {rnd + 1}: Health tab (A, B, divergence) filled {tab[-1]:.2f} s after selecting "
                         f"it; run B's {found['cells']} cells: largest {found['hi']:.4g} (spike {HEALTH_SPIKE:g}), "
                         f"NaN step {nan_step} marked: {nan_shown}; another statistic redrawn in {both[-1]:.2f} s")
            except Timeout as e:
                row.note(f"round {rnd + 1}: TIMEOUT ({e})")
                tab.append(None)
                break
            finally:
                br.close(page)
    finally:
        if server is not None:
            server.stop()
    ok_tab, ok_both = [x for x in tab if x is not None], [x for x in both if x is not None]
    row.flowlab = (f"tab {fmt_s(median(ok_tab))}, statistic {fmt_s(median(ok_both))}; spike and NaN "
                   f"{'shown' if seen and all(seen) else 'MISSING'}") if ok_tab else "TIMEOUT"
    row.tensorboard = "(no per-layer health view)"
    if None in tab or not ok_both:
        row.verdict = "TIMEOUT"
    else:
        row.verdict = "PASS" if median(ok_tab) <= 1.0 and median(ok_both) <= 1.0 and all(seen) else "MISS"


# The Graph tab: boxes drawn (their names), the page idle.
GRAPH_DRAWN_JS = """(name) => {
    if (!window.Bokeh || Bokeh.documents.length === 0) return false;
    const boxes = Bokeh.documents[0].get_model_by_name("graph-boxes");
    if (!boxes || !Bokeh.index.roots.every((v) => v.is_idle)) return false;
    const names = boxes.data_source.data.name;
    return names.length > 0 && (name === null || names.includes(name)) ? names.length : false;
}"""
# A tap on the box named ``name`` (what the server's tap handler answers: the scope opens).
GRAPH_TAP_JS = """(name) => {
    const source = Bokeh.documents[0].get_model_by_name("graph-boxes").data_source;
    const i = source.data.name.indexOf(name);
    if (i < 0) return false;
    source.selected.indices = [i];
    return true;
}"""
# TensorBoard's graph dashboard: node groups drawn in its SVG (inside shadow roots), and none still loading.
TB_GRAPH_JS = """() => {
    const count = (root) => {
        let n = root.querySelectorAll("g.node").length;
        for (const el of root.querySelectorAll("*")) if (el.shadowRoot) n += count(el.shadowRoot);
        return n;
    };
    const n = count(document);
    return n > 0 ? n : false;
}"""


def row_graph(ctx, row):
    cfg, tmp, br = ctx.cfg, ctx.tmp, ctx.browser
    import flowlab as flow
    from flowlab.examples import resnet
    logdir = tmp / "graph"
    t0 = time.perf_counter()
    flow.clear_default_session()
    job = resnet.write_run(logdir / "resnet50", steps=3)
    n_ops = len(job.graph().nodes)
    flow.clear_default_session()
    row.note(f"logdir: ResNet-50 train job, {n_ops} ops, 3 steps, written in {time.perf_counter() - t0:.1f} s")
    tab, block, tb = [], [], []
    fl_server = tb_server = None
    try:
        fl_server = Flowlab(logdir, tmp / "graph-fl.log", cfg["wait_s"])
        tb_server = TensorBoard(logdir, tmp / "graph-tb.log", cfg["wait_s"])
        for rnd in range(ctx.rounds):
            for side in (("flowlab", "TensorBoard") if rnd % 2 == 0 else ("TensorBoard", "flowlab")):
                page = br.page(tensorboard=side == "TensorBoard")
                try:
                    if side == "flowlab":
                        flowlab_page_ready(page, fl_server.url, cfg["wait_s"])
                        start = time.perf_counter()
                        if not ask(page, SELECT_TAB_JS, 10, "Graph"):
                            raise RuntimeError("no Graph tab")
                        boxes = wait(page, GRAPH_DRAWN_JS, cfg["wait_s"], None)
                        tab.append(time.perf_counter() - start)
                        start = time.perf_counter()
                        if ask(page, GRAPH_TAP_JS, 10, "Resnet-res3_0"):
                            opened = wait(page, GRAPH_DRAWN_JS, cfg["wait_s"], "Resnet-res3_0_branch2b")
                            block.append(time.perf_counter() - start)
                            opened = f"block res3_0 opened ({opened} boxes) {block[-1]:.2f} s"
                        else:
                            opened = "no box of block res3_0 to open"
                        row.note(f"round {rnd + 1} flowlab:     tab -> {boxes} boxes drawn {tab[-1]:.2f} s; {opened}")
                    else:
                        start = time.perf_counter()
                        goto(page, tb_server.url + "#graphs", cfg["wait_s"])
                        groups = wait(page, TB_GRAPH_JS, cfg["wait_s"])
                        ask(page, TWO_FRAMES_JS, 10)
                        tb.append(time.perf_counter() - start)
                        row.note(f"round {rnd + 1} TensorBoard: goto #graphs -> {groups} node groups drawn "
                                 f"{tb[-1]:.2f} s")
                except Timeout as e:
                    row.note(f"round {rnd + 1} {side}: TIMEOUT ({e})")
                    (tab if side == "flowlab" else tb).append(None)
                finally:
                    br.close(page)
    finally:
        for server in (fl_server, tb_server):
            if server is not None:
                server.stop()
    ok_tab, ok_block, ok_tb = ([x for x in xs if x is not None] for xs in (tab, block, tb))
    row.flowlab = (f"tab {fmt_s(median(ok_tab))}, block {fmt_s(median(ok_block))} ({fmt_list(tab)})"
                   if ok_tab else "TIMEOUT")
    row.tensorboard = f"page {fmt_s(median(ok_tb))} (goto #graphs -> drawn)" if ok_tb else "TIMEOUT"
    if None in tab:
        row.verdict = "TIMEOUT"
    elif not ok_block:
        row.verdict = "MISS"
    else:
        row.verdict = "PASS" if median(ok_tab) <= 2.0 and median(ok_block) <= 1.0 else "MISS"


def row_million(ctx, row):
    cfg, tmp, br = ctx.cfg, ctx.tmp, ctx.browser
    n = cfg["million"]
    logdir = tmp / "million"
    t0 = time.perf_counter()
    spike_step, nan_step = write_million(logdir, n)
    row.note(f"logdir: 1 run x {n:,} points (spike {SPIKE} at step {spike_step:,}, NaN at step {nan_step:,}), "
             f"{logdir_mb(logdir):.1f} MB, written in {time.perf_counter() - t0:.1f} s")
    fl, seen = [], []
    server = None
    try:
        server = Flowlab(logdir, tmp / "million-fl.log", cfg["wait_s"])
        row.note(f"flowlab server ready (URL printed) {server.ready_s:.2f} s after start")
        for rnd in range(ctx.rounds):
            page = br.page()
            try:
                s = flowlab_first_page(page, server.url, cfg["wait_s"], last_step=n - 1)
                got = ask(page, SPIKE_NAN_JS, 30, {"spike": SPIKE, "nan_step": nan_step})
                fl.append(s)
                seen.append(got)
                row.note(f"round {rnd + 1} flowlab: load {s:.2f} s; page holds {got['points']:,} points, spike "
                         f"{'yes' if got['spike'] else 'NO'}, NaN {'yes' if got['nan'] else 'NO'}")
            except Timeout as e:
                fl.append(None)
                row.note(f"round {rnd + 1} flowlab: TIMEOUT ({e})")
                break
            finally:
                br.close(page)
    except Timeout as e:
        row.note(f"flowlab server: TIMEOUT ({e})")
    finally:
        if server is not None:
            server.stop()
    tb, tb_seen = [], None
    server = None
    try:
        start = time.perf_counter()
        server = TensorBoard(logdir, tmp / "million-tb.log", cfg["wait_s"])
        server.wait_loaded("scalars", 1, n - 1, cfg["wait_s"])
        row.note(f"TensorBoard loaded the run {time.perf_counter() - start:.2f} s after start")
        data = server.api("data/plugin/scalars/scalars", run="run", tag="loss")
        values = [d[2] for d in data]
        tb_seen = (len(values), SPIKE in values, any(isinstance(v, float) and v != v for v in values))
        for rnd in range(ctx.rounds):
            page = br.page(tensorboard=True)
            try:
                s, _ = tb_page(page, server.url, "scalar", cfg["wait_s"])
                tb.append(s)
                row.note(f"round {rnd + 1} TensorBoard: load {s:.2f} s")
            finally:
                br.close(page)
        row.note(f"TensorBoard's page receives {tb_seen[0]:,} points: spike {'yes' if tb_seen[1] else 'no'}, "
                 f"NaN {'yes' if tb_seen[2] else 'no'}")
    except Timeout as e:
        row.note(f"TensorBoard: TIMEOUT ({e})")
    finally:
        if server is not None:
            server.stop()
    ok = [x for x in fl if x is not None]
    shown = bool(seen) and all(g["spike"] and g["nan"] for g in seen)
    row.flowlab = (f"{fmt_s(median(ok))}; spike {'yes' if seen and all(g['spike'] for g in seen) else 'no'}, "
                   f"NaN {'yes' if seen and all(g['nan'] for g in seen) else 'no'}") if ok else \
        f"TIMEOUT > {cfg['wait_s']:.0f} s"
    row.tensorboard = (f"{fmt_s(median(tb))}; spike {'yes' if tb_seen[1] else 'no'}, NaN "
                       f"{'yes' if tb_seen[2] else 'no'}") if tb and tb_seen else "TIMEOUT"
    if not ok or None in fl:
        row.verdict = "TIMEOUT"
    else:
        row.verdict = "PASS" if median(ok) <= 2.0 and shown else "MISS"


def settle_rss(server, timeout, window=4.0):
    """RSS once it has settled (max - min over ``window`` s within 2%), and the peak seen; (final, peak, settled)."""
    samples, start = [], time.perf_counter()
    while time.perf_counter() - start < timeout:
        samples.append((time.perf_counter(), server.rss() or 0.0))
        recent = [m for t, m in samples if t >= samples[-1][0] - window]
        if samples[-1][0] - start >= window and max(recent) - min(recent) <= 0.02 * max(recent):
            return samples[-1][1], max(m for _, m in samples), True
        time.sleep(0.25)
    return samples[-1][1], max(m for _, m in samples), False


def row_memory(ctx, row):
    cfg, tmp, br = ctx.cfg, ctx.tmp, ctx.browser
    images, hists = tmp / "mem-images", tmp / "mem-hists"
    t0 = time.perf_counter()
    write_image_run(images, cfg["img_tags"], cfg["img_steps"])
    write_histogram_runs(hists, 1, cfg["mem_hist_tags"], cfg["mem_hist_steps"])
    n_img, n_hist = cfg["img_tags"] * cfg["img_steps"], cfg["mem_hist_tags"] * cfg["mem_hist_steps"]
    row.note(f"logdirs: {n_img:,} images 128x128 ({cfg['img_tags']} tags), {logdir_mb(images):.1f} MB; "
             f"{n_hist:,} histograms ({cfg['mem_hist_tags']} tags x {cfg['mem_hist_steps']:,} steps), "
             f"{logdir_mb(hists):.1f} MB; written in {time.perf_counter() - t0:.1f} s")
    row.note("one measurement per side and logdir (a size, not a timing): RSS of the server and its children, "
             "page open on that kind, after it settled")
    result = {}
    for name, logdir, plugin, tab, kind, last in (
            ("images", images, "images", "Images", "image", cfg["img_steps"] - 1),
            ("histograms", hists, "histograms", "Histograms", "histogram", cfg["mem_hist_steps"] - 1)):
        for side in ("flowlab", "TensorBoard"):
            server = page = None
            try:
                if side == "flowlab":
                    server = Flowlab(logdir, tmp / f"mem-{name}-fl.log", cfg["wait_s"])
                    page = br.page()
                    flowlab_page_ready(page, server.url, cfg["wait_s"])
                    flowlab_tab(page, tab, cfg["wait_s"])
                else:
                    server = TensorBoard(logdir, tmp / f"mem-{name}-tb.log", cfg["wait_s"])
                    server.wait_loaded(plugin, 1, last, cfg["wait_s"])
                    page = br.page(tensorboard=True)
                    tb_page(page, server.url, kind, cfg["wait_s"])
                final, peak, settled = settle_rss(server, 60)
                result[(name, side)] = final
                row.note(f"{name:10s} {side:11s}: RSS {final:.0f} MB (peak {peak:.0f} MB"
                         f"{'' if settled else ', still moving after 60 s'})")
            except Timeout as e:
                result[(name, side)] = None
                row.note(f"{name:10s} {side:11s}: TIMEOUT ({e}); RSS then {(server and server.rss()) or 0:.0f} MB")
            except Exception as e:          # e.g. a server that does not start: this cell only
                result[(name, side)] = "ERROR"
                row.note(f"{name:10s} {side:11s}: ERROR {type(e).__name__}: {str(e).strip()[:300]}")
            finally:
                if page is not None:
                    br.close(page)
                if server is not None:
                    server.stop()
    show = lambda v: "TIMEOUT" if v is None else v if isinstance(v, str) else f"{v:.0f} MB"
    row.flowlab = f"{show(result[('images', 'flowlab')])} / {show(result[('histograms', 'flowlab')])}"
    row.tensorboard = f"{show(result[('images', 'TensorBoard')])} / {show(result[('histograms', 'TensorBoard')])}"
    verdicts = []
    for name in ("images", "histograms"):
        f, t = result[(name, "flowlab")], result[(name, "TensorBoard")]
        verdicts.append("ERROR" if "ERROR" in (f, t) else "TIMEOUT" if f is None or t is None else
                        "PASS" if f <= t else "MISS")
    row.verdict = "PASS" if all(v == "PASS" for v in verdicts) else "ERROR" if "ERROR" in verdicts else \
        "TIMEOUT" if "TIMEOUT" in verdicts else \
        f"MISS ({'/'.join(v.lower() for v in verdicts)})"


TRAIN_SCRIPT = textwrap.dedent(f"""
    import sys
    import numpy as np
    import flowlab as flow
    from flowlab.examples import digits_mlp
    from flowlab.summary import SummaryWriter
    counter = np.memmap(sys.argv[2], dtype=np.int64, mode="r+", shape=(1,))
    (train_x, train_y), _ = flow.data.load_digits(100, 100)
    variables = {{}}
    train_job, _ = digits_mlp.build(100, 128, 0.1, variables)
    flow.train.CheckPoint().init()
    writer = SummaryWriter(sys.argv[1])
    step = 0
    while True:
        for x, y in zip(train_x, train_y):
            writer.add_scalar("train/loss", float(train_job(x, y).mean()), step)
            if step % {HIST_EVERY} == 0:
                flow.sync_default_session()
                for name, (value, grad) in sorted(variables.items()):
                    writer.add_histogram("weights/" + name, value, step)
            step += 1
            counter[0] = step
""")


def row_training(ctx, row):
    cfg, tmp, br = ctx.cfg, ctx.tmp, ctx.browser
    logdir, counter_path = tmp / "training", tmp / "train-steps.bin"
    logdir.mkdir()
    counter = np.memmap(counter_path, dtype=np.int64, mode="w+", shape=(1,))
    log = open(tmp / "train.log", "w")
    trainer = spawn([PY, "-c", TRAIN_SCRIPT, str(logdir), str(counter_path)], stdout=log, stderr=log)
    server = None
    rates = {"none": [], "scalars": [], "histograms": []}
    ratios = {"scalars": [], "histograms": []}
    try:
        deadline = time.perf_counter() + 60
        while counter[0] < 200:              # imports, job tracing, the first histograms on disk
            if trainer.poll() is not None or time.perf_counter() > deadline:
                log.flush()
                raise RuntimeError("the training subprocess did not start: "
                                   + (tmp / "train.log").read_text()[-500:])
            time.sleep(0.1)
        server = Flowlab(logdir, tmp / "train-fl.log", cfg["wait_s"])
        states = ["none", "scalars", "histograms"]
        for rnd in range(ctx.rounds):
            order = states[rnd % 3:] + states[:rnd % 3]
            got = {}
            for state in order:
                page = None
                try:
                    if state != "none":
                        page = br.page()
                        flowlab_first_page(page, server.url, cfg["wait_s"])
                        if state == "histograms":
                            flowlab_tab(page, "Histograms", cfg["wait_s"])
                except Timeout as e:
                    row.note(f"round {rnd + 1} {state}: the page did not get ready ({e}); block measured anyway")
                time.sleep(1.0)              # the page's own start-up is not the steady state
                s0, t0 = int(counter[0]), time.monotonic()
                time.sleep(cfg["block_s"])
                s1, t1 = int(counter[0]), time.monotonic()
                if page is not None:
                    br.close(page)
                got[state] = (s1 - s0) / (t1 - t0)
                rates[state].append(got[state])
            for state in ("scalars", "histograms"):
                ratios[state].append(got[state] / got["none"] if got["none"] else 0.0)
            row.note(f"round {rnd + 1} (order {', '.join(order)}): steps/s none {got['none']:.0f}, Scalars page "
                     f"{got['scalars']:.0f} ({ratios['scalars'][-1]:.2f}x), Histograms page "
                     f"{got['histograms']:.0f} ({ratios['histograms'][-1]:.2f}x)")
    finally:
        if server is not None:
            server.stop()
        kill_group(trainer)
        log.close()
        del counter
    ms, mh = median(ratios["scalars"]), median(ratios["histograms"])
    row.flowlab = (f"{ms:.2f}x; {mh:.2f}x ({median(rates['none']):.0f} steps/s with no page)"
                   if ms is not None else "-")
    row.tensorboard = "n/a (relative target)"
    row.verdict = "ERROR" if ms is None else "PASS" if min(ms, mh) >= 0.9 else "MISS"


def _demo_block(ctx, state, extra, index):
    """One fresh ``flowlab demo``; its training steps/s over a block with ``state``'s page open (or none)."""
    from flowlab.data import load_digits
    cfg, br = ctx.cfg, ctx.browser
    steps_per_epoch = len(load_digits(100, 100)[0][0])
    proc = spawn([PY, "-m", "flowlab.cli", "demo", "--epochs", "100000", "--port", "0", "--logdir",
                  str(ctx.tmp / f"demo-{index}")] + extra, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                 text=True)
    lines, page = [], None            # (time read, epoch) of each progress line, read by a thread

    def read():
        for line in proc.stdout:
            m = re.match(r"epoch\s+(\d+)\s", line)
            if m:
                lines.append((time.monotonic(), int(m.group(1))))

    try:
        first = proc.stdout.readline()
        url = re.search(r"at (http://\S+)", first)
        if url is None:
            raise RuntimeError(f"flowlab demo printed {first!r} first, not its dashboard's URL")
        threading.Thread(target=read, daemon=True).start()
        if state != "none":
            page = br.page()
            flowlab_first_page(page, url.group(1), cfg["wait_s"])
            if state == "health":
                if not ask(page, SELECT_TAB_JS, 10, "Health"):
                    raise RuntimeError("no Health tab")
                time.sleep(1.0)
        time.sleep(1.0)                  # the page's own start-up is not the steady state
        t0 = time.monotonic()
        time.sleep(cfg["block_s"])
        window = [(t, e) for t, e in lines if t >= t0]
        if len(window) < 2:
            raise RuntimeError(f"flowlab demo printed {len(window)} progress lines in {cfg['block_s']} s")
        (ta, ea), (tb, eb) = window[0], window[-1]
        return (eb - ea) * steps_per_epoch / (tb - ta)
    finally:
        if page is not None:
            br.close(page)
        kill_group(proc)


def row_demo(ctx, row):
    help_text = subprocess.run([PY, "-m", "flowlab.cli", "demo", "--help"], capture_output=True, text=True).stdout
    extra = ["--pace", "0"] if "--pace" in help_text else []        # older demos had no pace: always full speed
    states = ["none", "scalars", "health"]
    rates, ratios = {s: [] for s in states}, {"scalars": [], "health": []}
    for rnd in range(ctx.rounds):
        order = states[rnd % 3:] + states[:rnd % 3]
        got = {}
        for i, state in enumerate(order):
            try:
                got[state] = _demo_block(ctx, state, extra, rnd * 3 + i)
            except (Timeout, RuntimeError) as e:
                row.note(f"round {rnd + 1} {state}: {e}")
                got[state] = None
            rates[state].append(got[state])
        if None in got.values():
            continue
        for state in ("scalars", "health"):
            ratios[state].append(got[state] / got["none"])
        row.note(f"round {rnd + 1} (order {', '.join(order)}): steps/s none {got['none']:.0f}, Scalars page "
                 f"{got['scalars']:.0f} ({ratios['scalars'][-1]:.2f}x), Health page {got['health']:.0f} "
                 f"({ratios['health'][-1]:.2f}x)")
    ms, mh = median(ratios["scalars"]), median(ratios["health"])
    none = median([r for r in rates["none"] if r is not None])
    row.flowlab = f"{ms:.2f}x; {mh:.2f}x ({none:.0f} steps/s with no page)" if ms is not None else "-"
    row.tensorboard = "n/a (relative target)"
    row.verdict = "ERROR" if ms is None else "PASS" if min(ms, mh) >= 0.9 else "MISS"


def row_latency(ctx, row):
    from flowlab.summary import SummaryWriter
    cfg, tmp, br = ctx.cfg, ctx.tmp, ctx.browser
    logdir = tmp / "latency"
    writer = SummaryWriter(logdir / "run", flush_secs=10)
    rng = np.random.default_rng(4)
    pixel = lambda i: (i % 256) | ((i // 256) % 256) << 8 | 77 << 16 | 255 << 24
    marker = lambda i: f"marker-{i}-x"

    def write(kind, i):
        if kind == "scalar":
            writer.add_scalar("live/scalar", float(np.sin(i)), i)
        elif kind == "histogram":
            writer.add_histogram("live/histogram", rng.normal(0, 1 + i / 10, 500), i)
        elif kind == "image":
            img = np.empty((16, 16, 3), np.uint8)
            img[...] = (i % 256, (i // 256) % 256, 77)
            writer.add_image("live/image", img, i, dataformats="HWC")
        else:
            writer.add_text("live/text", f"sample {marker(i)}", i)
        writer.flush()

    kinds = {"scalar": "Scalars", "histogram": "Histograms", "image": "Images", "text": "Text"}
    for kind in kinds:
        write(kind, 0)
    server, pages = None, {}
    lat = {k: [] for k in kinds}
    try:
        server = Flowlab(logdir, tmp / "latency-fl.log", cfg["wait_s"])
        for kind, title in kinds.items():
            pages[kind] = br.page()
            flowlab_page_ready(pages[kind], server.url, cfg["wait_s"])
            if kind != "scalar":
                ask(pages[kind], SELECT_TAB_JS, 10, title)
            wait(pages[kind], VISIBLE_JS, cfg["wait_s"],
                 {"title": title, "kind": kind, "step": 0, "pixel": pixel(0), "marker": marker(0)})
        pause = random.Random(0)
        order = list(kinds)
        for i in range(1, cfg["latency_samples"] + 1):
            for kind in order[i % 4:] + order[:i % 4]:
                time.sleep(pause.uniform(0.0, 0.5))
                write(kind, i)
                start = time.perf_counter()
                try:
                    wait(pages[kind], VISIBLE_JS, 10, {"title": kinds[kind], "kind": kind, "step": i,
                                                       "pixel": pixel(i), "marker": marker(i)})
                    lat[kind].append(time.perf_counter() - start)
                except Timeout:
                    lat[kind].append(float("inf"))
    except Timeout as e:
        row.note(f"TIMEOUT getting the pages ready: {e}")
    finally:
        for page in pages.values():
            br.close(page)
        writer.close()
        if server is not None:
            server.stop()
    for kind in kinds:
        if lat[kind]:
            finite = [x for x in lat[kind] if x != float("inf")]
            row.note(f"{kind:9s}: p95 {fmt_s(p95(lat[kind]))}, median {fmt_s(median(lat[kind]))}, max "
                     f"{fmt_s(max(lat[kind]))} over {len(lat[kind])} samples"
                     + (f" ({len(lat[kind]) - len(finite)} not visible within 10 s)" if len(finite) < len(lat[kind])
                        else ""))
    if all(lat.values()):
        row.flowlab = "; ".join(f"{k} {fmt_s(p95(v))}" for k, v in lat.items())
        row.verdict = "PASS" if max(p95(v) for v in lat.values()) <= 0.5 else "MISS"
    else:
        row.flowlab, row.verdict = "TIMEOUT", "TIMEOUT"
    row.tensorboard = "5 s server reload, >= 30 s browser refresh"


def row_sigint(ctx, row):
    cfg, tmp, br = ctx.cfg, ctx.tmp, ctx.browser
    logdir = ctx.hist_logdir()
    took = {"flowlab": [], "TensorBoard": []}
    warnings = []
    for rnd in range(ctx.rounds):
        for side in (("flowlab", "TensorBoard") if rnd % 2 == 0 else ("TensorBoard", "flowlab")):
            server = page = None
            try:
                if side == "flowlab":
                    server = Flowlab(logdir, tmp / f"sigint-fl-{rnd}.log", cfg["wait_s"])
                    page = br.page()
                    flowlab_page_ready(page, server.url, cfg["wait_s"])
                    try:
                        flowlab_tab(page, "Histograms", cfg["wait_s"])
                    except Timeout:
                        row.note(f"round {rnd + 1} flowlab: Histograms tab not filled within {cfg['wait_s']:.0f} s; "
                                 "interrupting anyway")
                else:
                    server = TensorBoard(logdir, tmp / f"sigint-tb-{rnd}.log", cfg["wait_s"])
                    server.wait_loaded("histograms", cfg["hist_runs"], cfg["hist_steps"] - 1, cfg["wait_s"])
                    page = br.page(tensorboard=True)
                    tb_page(page, server.url, "histogram", cfg["wait_s"])
                time.sleep(0.5)              # the page's updates are flowing when the signal comes
                s = server.interrupt(timeout=30)
                err = server.stderr_after_signal()
                took[side].append(s)
                if side == "flowlab":
                    warnings.append(len(err))
                row.note(f"round {rnd + 1} {side:11s}: SIGINT -> exit {'> 30 s (killed)' if s is None else fmt_s(s)}"
                         f", {len(err)} stderr line(s) after the signal"
                         + (f"; first: {err[0][:140]!r}" if err else ""))
            except Timeout as e:
                row.note(f"round {rnd + 1} {side}: TIMEOUT before the signal ({e})")
            except Exception as e:
                row.note(f"round {rnd + 1} {side}: ERROR before the signal: {type(e).__name__}: {str(e).strip()[:300]}")
            finally:
                if page is not None:
                    br.close(page)
                if server is not None:
                    server.stop()
    fl = took["flowlab"]
    ok = [x for x in fl if x is not None]
    row.flowlab = (f"{fmt_s(median(ok)) if len(ok) == len(fl) else 'TIMEOUT'}, stderr lines {sum(warnings)}"
                   if fl else "TIMEOUT")
    tb = [x for x in took["TensorBoard"] if x is not None]
    n_tb = len(took["TensorBoard"])
    row.tensorboard = (fmt_s(median(tb)) if len(tb) == n_tb else f"{n_tb - len(tb)} of {n_tb} over 30 s (killed)"
                       ) if n_tb else "-"
    if not fl or len(ok) < len(fl):
        row.verdict = "TIMEOUT"
    else:
        row.verdict = "PASS" if median(ok) <= 1.0 and sum(warnings) == 0 else "MISS"


READ_FLOWLAB = textwrap.dedent("""
    import sys, time
    from flowlab.dashboard.store import Store
    store = Store(sys.argv[1])          # what `flowlab serve` reads with: columnar polls, sampled kinds
    start = time.perf_counter()
    store.poll()
    seconds = time.perf_counter() - start
    print(seconds, sum(len(s) for s in store.series("scalar")))
""")
READ_TENSORBOARD = textwrap.dedent("""
    import sys, time
    from tensorboard.backend.event_processing import event_accumulator as ea
    acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0})
    start = time.perf_counter()
    acc.Reload()
    seconds = time.perf_counter() - start
    print(seconds, sum(len(acc.Scalars(t)) for t in acc.Tags()[ea.SCALARS]))
""")


def timed_read(script, logdir, timeout):
    """(seconds, records) measured inside a fresh subprocess, or (None, reason)."""
    proc = spawn([PY, "-c", script, str(logdir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                 env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return None, f"over {timeout:.0f} s"
    if proc.returncode != 0:
        return None, (err.strip().splitlines() or [f"rc {proc.returncode}"])[-1]
    seconds, records = out.split()[-2:]
    return float(seconds), int(records)


def row_reader(ctx, row):
    from flowlab.summary.record import frame
    cfg, tmp = ctx.cfg, ctx.tmp
    garbage = tmp / "garbage" / "run"
    garbage.mkdir(parents=True)
    (garbage / "events.out.tfevents.0.junk").write_bytes(np.random.default_rng(5).bytes(cfg["garbage_mib"] << 20))
    damaged = tmp / "damaged" / "run"
    damaged.mkdir(parents=True)
    n = cfg["damaged"]
    with open(damaged / "events.out.tfevents.0.bench", "wb") as f:
        f.write(frame(event_bytes(0, time.time(), file_version="brain.Event:2")))
        wall = time.time()
        for step in range(n):
            rec = bytearray(frame(event_bytes(step, wall + step, scalar_summary("loss", float(step % 97)))))
            if step % 100 == 50:
                rec[len(rec) // 2] ^= 0xFF           # inside the payload: its data checksum fails
            f.write(rec)
    row.note(f"logdirs: {cfg['garbage_mib']} MiB of random bytes in one *tfevents* file; {n:,} scalar records, "
             f"{n // 100:,} damaged (one byte flipped in each 100th)")
    limit = 120.0 if not ctx.quick else 60.0
    results = {}
    # The run directories themselves: EventAccumulator reads the event files of one directory, not its subfolders.
    for case, logdir in (("garbage", garbage), ("damaged", damaged)):
        for side in ("flowlab", "TensorBoard"):
            results[(case, side)] = []
        dead = set()
        for rnd in range(ctx.rounds):
            for side in (("flowlab", "TensorBoard") if rnd % 2 == 0 else ("TensorBoard", "flowlab")):
                if side in dead:
                    continue
                s, info = timed_read(READ_FLOWLAB if side == "flowlab" else READ_TENSORBOARD, logdir, limit)
                results[(case, side)].append((s, info))
                if s is None:
                    dead.add(side)
                row.note(f"{case} round {rnd + 1} {side:11s}: "
                         + (f"{fmt_s(s)}, {info:,} records" if s is not None else f"TIMEOUT/ERROR: {info}"))

    def show(case, side):
        got = results[(case, side)]
        ok = [s for s, _ in got if s is not None]
        if not got or len(ok) < len(got):
            return None, (got[-1][1] if got else "-")
        return median(ok), f"{fmt_s(median(ok))} ({got[-1][1]:,} rec)"

    (g, gs), (d, ds) = show("garbage", "flowlab"), show("damaged", "flowlab")
    (_, tgs), (_, tds) = show("garbage", "TensorBoard"), show("damaged", "TensorBoard")
    row.flowlab = f"{gs if g is not None else 'TIMEOUT ' + gs}; {ds if d is not None else 'TIMEOUT ' + ds}"
    row.tensorboard = f"{tgs}; {tds}"
    if g is None or d is None:
        row.verdict = "TIMEOUT"
    else:
        row.verdict = "PASS" if g <= 0.5 and d <= 0.5 else "MISS"


# ------------------------------------------------------------------------------------------------- tabs
# Drawn: tab ``i`` is the active one, shows a plot with data or a text that is not a "No ..." placeholder (or, for a
# tab the logdir has nothing for, ``empty``, any text: its placeholder), and every root view is idle.
TAB_DRAWN_JS = f"""([i, empty]) => {{ const tabs = Bokeh.documents[0].get_model_by_name("tabs");
    if (tabs.active !== i) return false;
    const s = ({SHOWN_JS})();
    return (s.plots.length > 0 || (s.text.length > 0 && (empty || !/^No /.test(s.text.trim()))))
        && Bokeh.index.roots.every((v) => v.is_idle); }}"""
# The tabs each tabs-row logdir has nothing for (tensorboardX writes no health reports, NaN counts or graph).
EMPTY_TABS = {"demo": (), "tbx20": ("anomalies", "health", "graph")}
MODELS_JS = "() => Bokeh.documents[0].all_models.size"


def write_tabs_logdirs(root):
    """The tabs row's logdirs, as the browser tests' tab tour writes them (tests/dashboard_page.py): ``flowlab
    demo``'s and twenty runs written by tensorboardX."""
    demo, tbx = root / "demo", root / "tbx20"
    if not demo.exists():
        demo_logdir(demo)
    if not tbx.exists():
        tensorboardx_logdir(tbx)
    return {"demo": demo, "tbx20": tbx}


def row_tabs(ctx, row):
    """Each tab's time from a click on its header to drawn, through all ten tabs twice in one page, and the page's
    Bokeh models after each, against the models of that tab alone (a fresh page opened on it) and of the largest."""
    cfg, tmp, br = ctx.cfg, ctx.tmp, ctx.browser
    logdirs = write_tabs_logdirs(tmp / "tabs")
    worst_s, worst_ratio, failed = 0.0, 0.0, False
    summary = []
    for name, logdir in logdirs.items():
        server = None
        try:
            server = Flowlab(logdir, tmp / f"tabs-{name}.log", cfg["wait_s"])
            alone = {}
            for i, tab in enumerate(TABS):          # each tab alone: a fresh page opened on it
                page = br.page()
                try:
                    goto(page, server.url + f"?tab={tab}", cfg["wait_s"])
                    wait(page, f"(a) => ({RENDERED_JS})() && ({TAB_DRAWN_JS})(a)", cfg["wait_s"],
                         [i, tab in EMPTY_TABS[name]])
                    alone[tab] = ask(page, MODELS_JS, 10)
                finally:
                    br.close(page)
            largest = max(alone.values())
            page = br.page()
            times = {tab: [] for tab in TABS}
            try:
                flowlab_page_ready(page, server.url, cfg["wait_s"])
                wait(page, TAB_DRAWN_JS, cfg["wait_s"], [0, False])
                order = TABS[1:] + TABS[:1]
                for rnd in range(2):
                    for tab in order:
                        i = TABS.index(tab)
                        start = time.perf_counter()
                        page.locator(".bk-tab").nth(i).click()
                        wait(page, TAB_DRAWN_JS, cfg["wait_s"], [i, tab in EMPTY_TABS[name]])
                        seconds = time.perf_counter() - start
                        page.wait_for_timeout(300)                 # the tab's later rounds of updates
                        wait(page, RENDERED_JS, cfg["wait_s"])
                        models = ask(page, MODELS_JS, 10)
                        times[tab].append(seconds)
                        worst_ratio = max(worst_ratio, models / largest)
                        row.note(f"{name} round {rnd + 1} {tab:>13}: drawn {seconds:.2f} s, {models} models "
                                 f"(alone {alone[tab]}, largest tab {largest})")
            finally:
                br.close(page)
            slowest = max((max(v), tab) for tab, v in times.items())
            worst_s = max(worst_s, slowest[0])
            summary.append(f"{name}: slowest {slowest[1]} {slowest[0]:.2f} s, median "
                           f"{median([t for v in times.values() for t in v]):.2f} s")
        except Timeout as e:
            failed = True
            row.note(f"{name}: TIMEOUT ({e})")
        finally:
            if server is not None:
                server.stop()
    row.flowlab = "; ".join(summary) + f"; models <= {worst_ratio:.2f}x the largest tab's" if summary else "TIMEOUT"
    row.tensorboard = "(not measured: its plugins share no drawn condition)"
    row.verdict = "TIMEOUT" if failed or not summary else \
        "PASS" if worst_s <= 1.5 and worst_ratio <= 1.5 else "MISS"


CASES = {
    "first_page": ("first page, 1,000 runs x 100 scalars", "<= 2 s", row_first_page),
    "ten_thousand": ("10,000 runs x 100 scalars: page; search; server RSS", "<= 5 s; -; <= TB's", row_ten_thousand),
    "histograms": ("Histograms tab filled, 5 runs x 8 tags x 100 steps", "<= 1 s", row_histograms),
    "million": ("1 run x 1M points: load; spike and NaN at full zoom-out", "<= 2 s; yes", row_million),
    "health": ("Health tab, 2 runs x 24 layers x 100k reports; spike, NaN", "<= 1 s; yes", row_health),
    "memory": ("server RSS, 2,000 128x128 images / 20 tags x 5,000 hist steps", "<= TensorBoard's", row_memory),
    "training": ("training steps/s, page open (Scalars; Histograms) vs none", ">= 0.9x", row_training),
    "demo": ("flowlab demo's training steps/s, page open (Scalars; Health) vs none", ">= 0.9x", row_demo),
    "latency": ("write -> visible, every kind, p95", "<= 0.5 s", row_latency),
    "sigint": ("flowlab serve SIGINT -> exit (Histograms tab opened)", "<= 1 s, no warnings", row_sigint),
    "graph": ("Graph tab, ResNet-50 train job (~1,000 ops); open a block", "<= 2 s; <= 1 s", row_graph),
    "reader": ("read 8 MiB garbage; 100k records, 1% damaged", "<= 0.5 s; <= 0.5 s", row_reader),
    "tabs": ("every tab twice, demo and 20 tensorboardX runs: click -> drawn; models", "<= 1.5 s; <= 1.5x",
             row_tabs),
}


class Context:
    def __init__(self, cfg, tmp, browser, rounds, quick):
        self.cfg, self.tmp, self.browser, self.rounds, self.quick = cfg, tmp, browser, rounds, quick
        self._hist = None

    def hist_logdir(self):
        """The histograms row's logdir (also the SIGINT row's), written once."""
        if self._hist is None:
            self._hist = self.tmp / "histograms"
            c = self.cfg
            write_histogram_runs(self._hist, c["hist_runs"], c["hist_tags"], c["hist_steps"])
        return self._hist


def git_state():
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10).stdout.splitlines()
        return f"{head}" + (f" + uncommitted changes in {len(dirty)} tracked file(s)" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def _terminated(signum, frame):
    raise KeyboardInterrupt


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and 1 round: check the script works")
    parser.add_argument("--only", default="", help="comma-separated rows: " + ",".join(ROWS))
    parser.add_argument("--rounds", type=int, default=None, help="rounds per row (default 3; --quick 1)")
    args = parser.parse_args()
    only = [r.strip() for r in args.only.split(",") if r.strip()] or list(ROWS)
    unknown = [r for r in only if r not in ROWS]
    if unknown:
        parser.error(f"unknown row(s) {unknown}; choose from {', '.join(ROWS)}")
    cfg = QUICK if args.quick else FULL
    rounds = args.rounds or cfg["rounds"]
    if TENSORBOARD is None:
        sys.exit("the `tensorboard` command is not installed (pip install tensorboard)")

    # SIGTERM unwinds like Ctrl-C, so the finally blocks below stop every child and remove the temp dir.
    signal.signal(signal.SIGTERM, _terminated)
    import bokeh
    import tensorboard
    from playwright.sync_api import sync_playwright
    t_start = time.perf_counter()
    print(f"date        {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
    print(f"machine     {cpu_model()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}")
    print(f"software    Python {platform.python_version()}, NumPy {np.__version__}, Bokeh {bokeh.__version__}, "
          f"TensorBoard {tensorboard.__version__}; flowlab at {git_state()}")
    print(f"settings    {'--quick' if args.quick else 'full sizes'}, {rounds} round(s), rows: {', '.join(only)}")
    print(f"load avg    {loadavg()} (1/5/15 min) before", flush=True)
    rows = []
    tmp_dir = tempfile.mkdtemp(prefix="flowlab-data-path-")
    try:
        with sync_playwright() as pw:
            browser = Browser(pw)
            print(f"browser     Chromium {browser.browser.version}", flush=True)
            ctx = Context(cfg, Path(tmp_dir), browser, rounds, args.quick)
            for key in only:
                case, target, fn = CASES[key]
                row = Row(key, case, target)
                rows.append(row)
                print(f"\n[{key}] {case} (target {target})", flush=True)
                errors_before = len(browser.errors)
                t0 = time.perf_counter()
                try:
                    fn(ctx, row)
                except Timeout as e:
                    row.verdict = "TIMEOUT"
                    row.note(f"TIMEOUT: {e}")
                except Exception as e:          # one broken row must not cost the others: report and go on
                    row.verdict = "ERROR"
                    row.note(f"ERROR: {type(e).__name__}: {str(e).strip()[:400]}")
                finally:
                    cleanup_all()
                new_errors = browser.errors[errors_before:]
                row.note(f"({time.perf_counter() - t0:.0f} s; browser console errors: {len(new_errors)}"
                         + (f", first: {new_errors[0]!r}" if new_errors else "") + ")")
            browser.browser.close()
    except KeyboardInterrupt:
        print("\ninterrupted: stopping the servers and removing the temp dir", file=sys.stderr)
    finally:
        cleanup_all()
        shutil.rmtree(tmp_dir, ignore_errors=True)

    print(f"\nload avg    {loadavg()} (1/5/15 min) after; total {time.perf_counter() - t_start:.0f} s")
    how = "quick sizes, not the targets' cases" if args.quick else f"medians of {rounds} interleaved round(s)"
    print(f"\nsummary ({how})")
    w = [max(len(r.case) for r in rows + [Row('', 'case', '')]), 44, 44, 20]
    print(f"  {'case':{w[0]}s}  {'flowlab':{w[1]}s}  {'TensorBoard':{w[2]}s}  {'target':{w[3]}s}  verdict")
    for r in rows:
        print(f"  {r.case:{w[0]}s}  {r.flowlab:{w[1]}s}  {r.tensorboard:{w[2]}s}  {r.target:{w[3]}s}  {r.verdict}")


if __name__ == "__main__":
    main()
