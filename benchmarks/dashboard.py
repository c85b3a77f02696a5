#!/usr/bin/env python
"""The live dashboard in a real headless Chromium, against TensorBoard's anchors.

TensorBoard's server reloads its logdir every 5 s and its browser page refreshes at least every 30 s; its Python
loader (EventMultiplexer / EventAccumulator) takes ~30 s on a big logdir.

    (1) live latency   ``flowlab serve --logdir TMP --port 0`` (default reload interval) in a subprocess, the page
                       open in headless Chromium; N times: ``add_scalar("live", v, step)`` + ``flush()`` with
                       flowlab's SummaryWriter, then ``page.evaluate`` every ~20 ms until that step is in the scalars
                       view's data source. Latency = flush() returned -> step seen in the page. Between samples a
                       random 0-0.5 s pause, so the writes land at every phase of the server's reload loop.
                       Target: p95 <= 1 s.
    (2) first page     a logdir of 4 runs x 100k scalars (tag "loss") + 150 images 64x64 RGB + 1,000 histograms
                       (10 tags x 100 steps), written once per run into a temp dir. Server start-up (Popen -> URL
                       printed; the store's first poll has read the whole logdir by then) is reported separately;
                       then a fresh page: goto -> Bokeh document rendered (all root views idle) and the scalars
                       view's 4 sources non-empty ("first page"; the time until Bokeh.documents holds the
                       document is printed too), and -> their last point is step 99,999 ("complete").
                       Target: first page <= 2 s.
    (3) TensorBoard    EventMultiplexer().AddRunsFromDirectory(logdir).Reload() on the same logdir, timed in a
                       subprocess (import time excluded); --no-tensorboard-loader skips it.

    python benchmarks/dashboard.py                      # about 1.5-2 minutes on 2 cores
    python benchmarks/dashboard.py --samples 20 --no-tensorboard-loader
"""
import argparse
import datetime
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

from machine import cpu_model

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
RUNS, SCALARS, IMAGES, HIST_TAGS, HIST_STEPS = 4, 100_000, 150, 10, 100
LIVE_TARGET_S, FIRST_PAGE_TARGET_S = 1.0, 2.0

# The scalars view's lines as the page drew them (rows of each card's expanded source; x is the step on the default
# axis): the last step each holds (-1 when empty).
LAST_STEPS_JS = """() => !window.Bokeh || Bokeh.documents.length === 0 ? null : [...Bokeh.documents[0].all_models]
    .filter((m) => m.constructor.__name__ === "ColumnDataSource" && "xs" in m.data && "smooth" in m.data)
    .flatMap((m) => m.data.xs.map((s) => s.length ? s[s.length - 1] : -1))"""
RENDERED_JS = ("() => window.Bokeh !== undefined && Bokeh.documents.length > 0 && Bokeh.index.roots.length > 0 && "
               "Bokeh.index.roots.every((v) => v.is_idle)")


def loadavg():
    try:
        return " / ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def percentile(values, q):
    return float(np.percentile(np.asarray(values, np.float64), q))


# ----------------------------------------------------------------------------------------------------- server

class Server:
    """``flowlab serve --logdir DIR --port 0`` in a subprocess; ``.url``, ``.startup_s`` (Popen -> URL printed)."""

    def __init__(self, logdir, log_path):
        self.log = open(log_path, "w+")                 # a file: a pipe could fill up
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        start = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "flowlab.cli", "serve", "--logdir", str(logdir),
                                      "--port", "0"], stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        line = self.proc.stdout.readline()
        self.startup_s = time.perf_counter() - start
        found = re.search(r"http://\S+", line)
        if not found:
            self.stop()
            self.log.seek(0)
            raise RuntimeError(f"flowlab serve printed {line!r}; stderr:\n{self.log.read()}")
        self.url = found.group(0)

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def open_page(browser, url, errors):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return page


# ------------------------------------------------------------------------------------------- (1) live latency

def live_latency(browser, tmp, samples):
    from flowlab.summary import SummaryWriter
    logdir = tmp / "live"
    writer = SummaryWriter(logdir / "run", flush_secs=10)
    writer.add_scalar("live", 0.0, 0)
    writer.flush()
    server = Server(logdir, tmp / "live-server.txt")
    errors, latencies = [], []
    try:
        page = open_page(browser, server.url, errors)
        page.goto(server.url)
        page.wait_for_function("() => { const f = (" + LAST_STEPS_JS + ")(); return f && f.length > 0 && "
                               "f.every((s) => s >= 0); }", polling=20, timeout=30000)
        rng = random.Random(0)
        for step in range(1, samples + 1):
            time.sleep(rng.uniform(0.0, 0.5))
            writer.add_scalar("live", float(np.sin(step / 5)), step)
            writer.flush()
            start = time.perf_counter()
            while True:
                last = page.evaluate(LAST_STEPS_JS)
                if last and max(last) >= step:
                    latencies.append(time.perf_counter() - start)
                    break
                if time.perf_counter() - start > 15:
                    raise RuntimeError(f"step {step} did not reach the page within 15 s (sources: {last})")
                time.sleep(0.02)
        page.close()
    finally:
        writer.close()
        server.stop()
    return latencies, server.startup_s, errors


# ---------------------------------------------------------------------------------------- (2) the big logdir

def write_big_logdir(logdir):
    from flowlab.summary import SummaryWriter
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for r in range(RUNS):
        with SummaryWriter(logdir / f"run{r}", flush_secs=5, max_queue=4096) as w:
            values = np.exp(-np.arange(SCALARS) / 20000) + 0.05 * rng.random(SCALARS) + r * 0.1
            for step, v in enumerate(values.tolist()):
                w.add_scalar("loss", v, step)
            if r == 0:
                for step in range(IMAGES):
                    w.add_image("samples", rng.random((3, 64, 64)), step)
            if r == 1:
                for tag in range(HIST_TAGS):
                    for step in range(HIST_STEPS):
                        w.add_histogram(f"weights/layer{tag}", rng.normal(0, 1 + step / 100, size=1000), step)
    seconds = time.perf_counter() - start
    size = sum(p.stat().st_size for p in logdir.rglob("*") if p.is_file())
    return seconds, size


def first_page(browser, logdir, tmp, loads):
    server = Server(logdir, tmp / "big-server.txt")
    errors, doc, first, complete = [], [], [], []
    try:
        ready_js = ("() => { if (!(" + RENDERED_JS + ")()) return false; const f = (" + LAST_STEPS_JS + ")(); "
                    f"return f.length >= {RUNS} && f.every((s) => s >= 0); }}")
        done_js = ("() => { const f = (" + LAST_STEPS_JS + ")(); "
                   f"return f.length >= {RUNS} && f.every((s) => s === {SCALARS - 1}); }}")
        for _ in range(loads):
            page = open_page(browser, server.url, errors)
            start = time.perf_counter()
            page.goto(server.url)
            page.wait_for_function("() => window.Bokeh !== undefined && Bokeh.documents.length > 0",
                                   polling=20, timeout=60000)
            doc.append(time.perf_counter() - start)
            page.wait_for_function(ready_js, polling=20, timeout=60000)
            first.append(time.perf_counter() - start)
            page.wait_for_function(done_js, polling=20, timeout=60000)
            complete.append(time.perf_counter() - start)
            page.close()
    finally:
        server.stop()
    return server.startup_s, doc, first, complete, errors


# -------------------------------------------------------------------------------------- (3) TensorBoard's loader

TB_SCRIPT = textwrap.dedent("""
    import sys, time
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
    start = time.perf_counter()
    m = EventMultiplexer().AddRunsFromDirectory(sys.argv[1])
    m.Reload()
    seconds = time.perf_counter() - start
    runs = m.Runs()
    tags = sum(len(t.get("scalars", [])) + len(t.get("tensors", [])) for t in runs.values())
    images = sum(len(t.get("images", [])) for t in runs.values())
    histograms = sum(len(t.get("histograms", [])) for t in runs.values())
    print(seconds, len(runs), tags, images, histograms)
""")


def tensorboard_loader(logdir, timeout):
    try:
        out = subprocess.run([sys.executable, "-c", TB_SCRIPT, str(logdir)], capture_output=True, text=True,
                             timeout=timeout, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    except subprocess.TimeoutExpired:
        return None, f"over {timeout} s"
    if out.returncode != 0:
        return None, out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"rc {out.returncode}"
    seconds, runs, tags, images, histograms = out.stdout.split()[-5:]
    return float(seconds), (f"{runs} runs; tags: {tags} scalar/tensor, {images} image, {histograms} histogram; "
                            "default size guidance keeps a reservoir sample, but every record is read")


# ----------------------------------------------------------------------------------------------------- main

def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=50, help="live-latency samples (default 50)")
    parser.add_argument("--loads", type=int, default=3, help="page loads of the big logdir (default 3)")
    parser.add_argument("--no-tensorboard-loader", action="store_true", help="skip timing TensorBoard's loader")
    parser.add_argument("--tensorboard-timeout", type=float, default=120.0)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    import bokeh
    t0 = time.perf_counter()
    print(f"date        {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
    print(f"machine     {cpu_model()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}")
    print(f"software    Python {platform.python_version()}, NumPy {np.__version__}, Bokeh {bokeh.__version__}, "
          f"Chromium {CHROMIUM}")
    print(f"load avg    {loadavg()} (1/5/15 min) before")
    with tempfile.TemporaryDirectory(prefix="flowlab-dashboard-bench-") as tmp_name:
        tmp = Path(tmp_name)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            print(f"browser     {browser.version}")

            lat, live_startup, live_errors = live_latency(browser, tmp, args.samples)
            print(f"\n(1) live latency, {len(lat)} samples (flush() returned -> step in the page's data source)")
            print(f"    median {statistics.median(lat) * 1000:.0f} ms, p95 {percentile(lat, 95) * 1000:.0f} ms, "
                  f"min {min(lat) * 1000:.0f} ms, max {max(lat) * 1000:.0f} ms; server start-up "
                  f"{live_startup:.2f} s; console errors: {len(live_errors)}")

            big = tmp / "big"
            write_s, size = write_big_logdir(big)
            print(f"\n(2) big logdir: {RUNS} runs x {SCALARS:,} scalars + {IMAGES} images 64x64x3 + "
                  f"{HIST_TAGS * HIST_STEPS:,} histograms, {size / 1e6:.1f} MB, written in {write_s:.1f} s")
            startup, doc, first, complete, big_errors = first_page(browser, big, tmp, args.loads)
            print(f"    server start-up (Popen -> URL, whole logdir read) {startup:.2f} s")
            print("    Bokeh document in the page (goto -> Bokeh.documents.length > 0): "
                  + ", ".join(f"{s:.2f}" for s in doc) + " s")
            print("    first page (goto -> rendered, 4 scalar sources non-empty): "
                  + ", ".join(f"{s:.2f}" for s in first) + f" s; median {statistics.median(first):.2f} s")
            print(f"    complete (last step {SCALARS - 1:,} in all 4 sources): "
                  + ", ".join(f"{s:.2f}" for s in complete) + " s")
            print(f"    console errors: {len(big_errors)}")
            browser.close()

        tb_s, tb_note = None, "skipped"
        if not args.no_tensorboard_loader:
            tb_s, tb_note = tensorboard_loader(big, args.tensorboard_timeout)
            shown = f"{tb_s:.1f} s" if tb_s is not None else "-"
            print(f"\n(3) TensorBoard EventMultiplexer Reload() on the big logdir: {shown} ({tb_note})")

    p95, med_first = percentile(lat, 95), statistics.median(first)
    print(f"\nload avg    {loadavg()} (1/5/15 min) after; total {time.perf_counter() - t0:.0f} s")
    print("\nsummary")
    print(f"  live latency p95        {p95 * 1000:6.0f} ms  (median {statistics.median(lat) * 1000:.0f} ms)  "
          f"TensorBoard: 5 s server reload, <= 30 s browser refresh   target <= {LIVE_TARGET_S * 1000:.0f} ms  "
          f"{'PASS' if p95 <= LIVE_TARGET_S else 'MISS'}")
    print(f"  first page (big logdir) {med_first:6.2f} s   (server start-up {startup:.2f} s)  "
          f"TensorBoard loader: {f'{tb_s:.1f} s' if tb_s is not None else tb_note} (anchor ~30 s)   "
          f"target <= {FIRST_PAGE_TARGET_S:.0f} s  {'PASS' if med_first <= FIRST_PAGE_TARGET_S else 'MISS'}")


if __name__ == "__main__":
    main()
