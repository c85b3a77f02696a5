#!/usr/bin/env python
"""Cost of ``flow.watch_health`` on a train step: the unwatched step against ``watch_health(every=1)`` and
``watch_health(every=10)`` (a plain callback handler), and ``watch_health(writer=SummaryWriter)`` (every step's report
written to an event file, histograms every 100th), on two networks:

- ``mlp``: the seed MLP (784-512-10, batch 100, fp32, SGD lr 0.1 momentum 0, as in ``train_step.py``);
- ``conv``: a small conv net (1x28x28 -> conv 5x5 16 ReLU -> pool 2 -> conv 5x5 32 ReLU -> pool 2 -> dense 10,
  batch 32, SGD).

The jobs of a network share one session and its variables. Each of R rounds times a block of N steps of every job
(the order rotates from round to round, 0.2 s idle and one untimed step before each block); the report gives the
median ms/step and the ratios against the targets (<= 1.10x with every=1, <= 1.05x with every=10 on the CPU; the
writer has no target of its own: it is what the dashboard's Health tab costs).

    python benchmarks/health.py                      # both networks, ~2 minutes on 2 cores
    python benchmarks/health.py --net mlp --rounds 40 --steps 50
    python benchmarks/health.py --device gpu         # on CuPy (target <= 1.05x for both)
    python benchmarks/health.py --per-call --net mlp # where every=10's cost lands in its ten-call cycle
    python benchmarks/health.py --floor              # the least any implementation pays for the statistics
"""

# No `from __future__ import annotations`: flowlab reads the job's placeholder annotations at runtime.
import argparse
import itertools
import os
import statistics
import tempfile
import time

import numpy as np

TARGETS = {"cpu": {"every=1": 1.10, "every=10": 1.05}, "gpu": {"every=1": 1.05, "every=10": 1.05}}
NETS = {
    "mlp": dict(batch=100, shape=(784,), describe="seed MLP 784-512-10, batch 100, SGD"),
    "conv": dict(batch=32, shape=(1, 28, 28), describe="conv net 1x28x28 c5x16 p2 c5x32 p2 d10, batch 32, SGD"),
}


def model(flow, net, images):
    if net == "mlp":
        hidden = flow.layers.dense(images, 512, activation=flow.nn.relu, kernel_initializer=flow.truncated_normal(0.1),
                                   name="hidden")
        return flow.layers.dense(hidden, 10, kernel_initializer=flow.truncated_normal(0.1), name="output")
    x = images
    for i, channels in enumerate((16, 32)):
        x = flow.layers.conv2d(x, channels, 5, padding="SAME", activation=flow.nn.relu,
                               kernel_initializer=flow.truncated_normal(0.1), name=f"conv{i}")
        x = flow.nn.max_pool2d(x, ksize=2, strides=2, padding="SAME", data_format="NCHW", name=f"pool{i}")
    x = flow.reshape(x, [x.shape[0], -1])
    return flow.layers.dense(x, 10, kernel_initializer=flow.truncated_normal(0.1), name="output")


def make_job(flow, net, watch, logdir):
    import flowlab.typing as tp
    spec = NETS[net]
    reports, writer = [], None
    if watch == "writer":
        from flowlab.summary import SummaryWriter
        writer = SummaryWriter(os.path.join(logdir, net))

    @flow.global_function(type="train")
    def train_job(images: tp.Numpy.Placeholder((spec["batch"], *spec["shape"])),
                  labels: tp.Numpy.Placeholder((spec["batch"],), dtype=flow.int32)) -> tp.Numpy:
        logits = model(flow, net, images)
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        if watch == "writer":
            flow.watch_health(writer=writer)
        elif watch:
            flow.watch_health(reports.append, every=watch)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss

    train_job.compiled()
    return train_job, reports, writer


def data(net):
    """One batch of the network's inputs and labels (the same every run)."""
    spec, rng = NETS[net], np.random.default_rng(0)
    return (rng.random((spec["batch"], *spec["shape"]), dtype=np.float32),
            rng.integers(0, 10, spec["batch"]).astype(np.int32))


def measure(flow, net, rounds, steps, logdir, targets):
    spec = NETS[net]
    images, labels = data(net)
    watches = {"unwatched": 0, "every=1": 1, "every=10": 10, "writer": "writer"}
    jobs = {name: make_job(flow, net, watch, logdir) for name, watch in watches.items()}
    for job, _, _ in jobs.values():        # warm-up (the first call initialises variables)
        for _ in range(5):
            job(images, labels)
    flow.sync_default_session()
    times = {name: [] for name in jobs}
    names = list(jobs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            job = jobs[name][0]
            time.sleep(0.2)
            job(images, labels)
            start = time.perf_counter()
            for _ in range(steps):
                job(images, labels)
            flow.sync_default_session()
            times[name].append((time.perf_counter() - start) / steps * 1e3)
    for _, _, writer in jobs.values():
        if writer is not None:
            writer.close()
    base = statistics.median(times["unwatched"])
    print(f"{spec['describe']}; {rounds} rounds x {steps} steps, medians")
    print(f"  unwatched                 {base:.3f} ms/step")
    ok = True
    for name, (job, _, _) in jobs.items():      # on a GPU: whether each plan was replayed as a CUDA graph
        notes = [line for plan in (job.compiled().plan, job.compiled().quiet_plan) if plan is not None
                 for line in plan.describe_passes().splitlines() if line.startswith("# cuda_graph")]
        if notes:
            print(f"  {name}: {'; '.join(notes)}")
    for name in ("every=1", "every=10", "writer"):
        median = statistics.median(times[name])
        ratio = median / base
        target = targets.get(name)
        verdict = "" if target is None else f"  (target <= {target:.2f}x: {'PASS' if ratio <= target else 'MISS'})"
        ok &= target is None or ratio <= target
        label = "watch_health(writer=...)" if name == "writer" else f"watch_health({name})"
        print(f"  {label:25s} {median:.3f} ms/step  {ratio:.3f}x{verdict}")
    return ok


def profile(flow, net, steps):
    """cProfile of ``steps`` steps of the every=1 job, the 30 functions with the most time of their own."""
    import cProfile
    import pstats
    images, labels = data(net)
    job = make_job(flow, net, 1, None)[0]
    for _ in range(20):
        job(images, labels)
    flow.sync_default_session()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        job(images, labels)
    flow.sync_default_session()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    return 0


def per_call(flow, net, rounds, steps):
    """What each call of a ten-call cycle costs over the unwatched step (median µs by ``step % 10``): for
    ``every=10`` it splits the delivering call's cost from what it leaves the calls after it. Blocks start at a
    different phase each round (after untimed calls), so no phase is always the first call after the idle gap."""
    images, labels = data(net)
    jobs = {name: make_job(flow, net, watch, None)[0] for name, watch in
            {"unwatched": 0, "every=1": 1, "every=10": 10}.items()}
    for job in jobs.values():
        for _ in range(20):
            job(images, labels)
    flow.sync_default_session()
    times = {name: [[] for _ in range(10)] for name in jobs}
    for r in range(rounds):
        for name, job in jobs.items():
            time.sleep(0.03)
            for _ in range(3 + r % 10):
                job(images, labels)
            for _ in range(steps):
                phase = job.step % 10
                start = time.perf_counter()
                job(images, labels)
                times[name][phase].append((time.perf_counter() - start) * 1e6)
    flow.sync_default_session()
    base = statistics.median([t for phase in times["unwatched"] for t in phase])
    print(f"{NETS[net]['describe']}; {rounds} rounds x {steps} calls; unwatched {base:.0f} µs/call (median)")
    print("µs over it, by step % 10, and the cycle's mean over the unwatched call:")
    for name in ("every=1", "every=10"):
        medians = [statistics.median(t) for t in times[name]]
        print(f"  {name:9s} " + " ".join(f"{m - base:+5.0f}" for m in medians) +
              f"   {statistics.mean(medians) / base:.3f}x")
    return 0


def diagnose(flow, net, rounds, steps):
    """Where watch_health's cost comes from: the same jobs measured as usual, with ``_Monitor._report`` made a
    no-op (statistics computed and delivered, no report), with ``sys.setswitchinterval(1e-4)``, and (on a GPU) with
    the report made on the job's thread (``health.REPORT_BESIDE_NEXT_CALL_ON_GPU``)."""
    import sys
    from flowlab import health
    images, labels = data(net)
    jobs = {name: make_job(flow, net, watch, None)[0] for name, watch in
            {"unwatched": 0, "every=1": 1, "every=10": 10}.items()}
    report = health._Monitor._report
    for variant in ("as usual", "no report", "switch 0.1 ms", "report inline", "as usual"):
        health._Monitor._report = (lambda self, *a: None) if variant == "no report" else report
        sys.setswitchinterval(1e-4 if variant.startswith("switch") else 5e-3)
        health.REPORT_BESIDE_NEXT_CALL_ON_GPU = variant != "report inline"
        times = {name: [] for name in jobs}
        for r in range(rounds):
            for name, job in jobs.items():
                for _ in range(3):
                    job(images, labels)
                flow.sync_default_session()
                time.sleep(0.05)
                start = time.perf_counter()
                for _ in range(steps):
                    job(images, labels)
                flow.sync_default_session()
                times[name].append((time.perf_counter() - start) / steps * 1e3)
        base = statistics.median(times["unwatched"])
        print(f"{variant:14s} unwatched {base:.3f} ms; " + "; ".join(
            f"{name} {statistics.median(times[name]):.3f} ms ({statistics.median(times[name]) / base:.2f}x)"
            for name in ("every=1", "every=10")))
    health._Monitor._report = report
    health.REPORT_BESIDE_NEXT_CALL_ON_GPU = True
    return 0


class LeanStep:
    """The seed MLP's train step in hand-written NumPy, as lean as flowlab's unwatched plan (the hidden kernel's SGD
    step folded into its gradient product, ``runtime.blas``), and with ``stats`` the same step computing only what
    a ``watch_health(every=1)`` report must hold, each in the cheapest form known: for both layers' outputs the sum,
    sum of squares, largest value, non-zeros and per-unit sums of ``|x|`` (dead units); for each variable and gradient the sum
    of squares (the NaN/Inf counts and the plain-SGD update follow from them being finite). The hidden kernel's
    gradient must then exist, so its product is written out and the update made by ``axpy``. No report, no alerts,
    no delivery: any implementation of issue 12 pays at least this over the unwatched step."""

    def __init__(self, batch):
        from flowlab.runtime import blas
        rng = np.random.default_rng(0)
        self.blas, self.rows = blas, np.arange(batch)
        self.x, self.y = data("mlp")
        self.x = self.x.reshape(batch, -1)
        self.W1 = (rng.standard_normal((784, 512)) * 0.1).astype(np.float32)
        self.b1 = np.zeros(512, np.float32)
        self.W2 = (rng.standard_normal((512, 10)) * 0.1).astype(np.float32)
        self.b2 = np.zeros(10, np.float32)
        self.G1 = np.empty_like(self.W1)

    def step(self, stats):
        x, y, rows, lr = self.x, self.y, self.rows, 0.1
        W1, b1, W2, b2 = self.W1, self.b1, self.W2, self.b2
        h = x @ W1
        h += b1
        np.maximum(h, 0, out=h)
        z = h @ W2
        z += b2
        if stats:                       # before softmax overwrites the logits
            numbers = [self._activation(h, True), self._activation(z, False)]
        z -= z.max(axis=1, keepdims=True)
        picked = z[rows, y]
        p = np.exp(z, out=z)
        s = p.sum(axis=1)
        loss = float(np.mean(np.log(s) - picked))
        p /= s[:, None]
        p[rows, y] -= 1
        p /= len(y)
        dW2 = h.T @ p
        db2 = p.sum(axis=0)
        dh = p @ W2.T
        dh *= h > 0
        db1 = dh.sum(axis=0)
        if stats:
            numbers += [self._squares(a) for a in (W1, b1, W2, b2, dW2, db2, db1)]
            np.matmul(x.T, dh, out=self.G1)
            numbers.append(self._squares(self.G1))
            self.blas.axpy(W1, self.G1, -lr)
        else:
            self.blas.gemm_accumulate(W1, x, dh, -lr, True, False)
        b1 -= lr * db1
        W2 -= lr * dW2
        b2 -= lr * db2
        return loss

    @staticmethod
    def _activation(a, nonnegative):
        flat = a.reshape(-1)
        magnitude = a if nonnegative else np.abs(a)
        unit_sums = np.ones(a.shape[0], a.dtype) @ magnitude        # a unit is dead when its sum of |x| is 0
        return (float(unit_sums.sum()), float(np.dot(flat, flat)), float(np.maximum.reduce(magnitude.reshape(-1))),
                int(np.count_nonzero(magnitude > 0)), int(np.count_nonzero(unit_sums == 0)))

    @staticmethod
    def _squares(a):
        flat = a.reshape(-1)
        return float(np.dot(flat, flat))


def floor(flow, rounds, steps):
    """The seed MLP six ways, interleaved: ``LeanStep`` without the statistics, with them every step and every
    10th step (the floors of ``watch_health(every=1)`` and ``every=10`` on this machine), and flowlab unwatched and
    with ``watch_health(every=1)`` and ``(every=10)``."""
    images, labels = data("mlp")
    lean = LeanStep(NETS["mlp"]["batch"])
    jobs = {name: make_job(flow, "mlp", watch, None)[0]
            for name, watch in {"flowlab": 0, "flowlab every=1": 1, "flowlab every=10": 10}.items()}
    calls = itertools.count()
    cases = {"lean NumPy": lambda: lean.step(False), "lean NumPy + statistics": lambda: lean.step(True),
             "lean + statistics every 10th": lambda: lean.step(next(calls) % 10 == 0),
             **{name: (lambda job=job: job(images, labels)) for name, job in jobs.items()}}
    for case in cases.values():
        for _ in range(20):
            case()
    flow.sync_default_session()
    times = {name: [] for name in cases}
    names = list(cases)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            time.sleep(0.2)
            cases[name]()
            start = time.perf_counter()
            for _ in range(steps):
                cases[name]()
            flow.sync_default_session()
            times[name].append((time.perf_counter() - start) / steps * 1e6)
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"{NETS['mlp']['describe']}; {rounds} rounds x {steps} steps, medians")
    for base, watched in (("lean NumPy", ("lean NumPy + statistics", "lean + statistics every 10th")),
                          ("flowlab", ("flowlab every=1", "flowlab every=10"))):
        print(f"  {base:29s} {medians[base]:7.0f} µs/step")
        for name in watched:
            print(f"  {name:29s} {medians[name]:7.0f} µs/step  {medians[name] / medians[base]:.3f}x  "
                  f"(+{medians[name] - medians[base]:.0f} µs)")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=["mlp", "conv", "all"], default="all")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="instead: profile STEPS steps of watch_health(every=1) and print where the time goes")
    parser.add_argument("--diagnose", action="store_true",
                        help="instead: the step with reports made as usual, with reports not made at all (what the "
                             "statistics and their delivery cost), and with a 0.1 ms GIL switch interval")
    parser.add_argument("--per-call", action="store_true",
                        help="instead: median cost of each call of a ten-call cycle over the unwatched call (where "
                             "every=10's cost lands)")
    parser.add_argument("--floor", action="store_true",
                        help="instead: a lean hand-written NumPy step without and with only the statistics a report "
                             "needs (the least any implementation pays), beside flowlab's unwatched, every=1 and every=10 jobs")
    args = parser.parse_args()

    os.environ["FLOWLAB_DEVICE"] = args.device  # before flowlab picks its backend
    import flowlab as flow
    from flowlab.runtime import backend
    print(f"flowlab on {backend.use(args.device).name}")
    if args.profile:
        return profile(flow, "mlp" if args.net == "all" else args.net, args.profile)
    if args.per_call:
        return per_call(flow, "mlp" if args.net == "all" else args.net, args.rounds, args.steps)
    if args.floor:
        return floor(flow, args.rounds, args.steps)
    if args.diagnose:
        return diagnose(flow, "mlp" if args.net == "all" else args.net, args.rounds, args.steps)
    ok = True
    with tempfile.TemporaryDirectory() as logdir:
        for net in (["mlp", "conv"] if args.net == "all" else [args.net]):
            flow.clear_default_session()
            ok &= measure(flow, net, args.rounds, args.steps, logdir, TARGETS[args.device])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
