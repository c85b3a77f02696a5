#!/usr/bin/env python
"""Cost of ``flow.watch_health`` on the seed MLP train step (784-512-10, batch 100, fp32, SGD lr 0.1 momentum 0,
as in ``train_step.py``): the unwatched step against ``watch_health(every=1)`` and ``watch_health(every=10)``.

The three jobs share one session and its variables. Each of R rounds times a block of N steps of every job (the
order rotates from round to round, 0.2 s idle and one untimed step before each block); the report gives the median
ms/step and the ratios against the targets (<= 1.10x with every=1, <= 1.05x with every=10 on the CPU).

    python benchmarks/health.py                    # ~1 minute on 2 cores
    python benchmarks/health.py --rounds 40 --steps 50
"""

# No `from __future__ import annotations`: flowlab reads the job's placeholder annotations at runtime.
import argparse
import statistics
import time

import numpy as np

IN, HIDDEN, CLASSES, BATCH, LR = 784, 512, 10, 100, 0.1
TARGETS = {"every=1": 1.10, "every=10": 1.05}


def make_job(flow, every):
    import flowlab.typing as tp
    reports = []

    @flow.global_function(type="train")
    def train_job(images: tp.Numpy.Placeholder((BATCH, IN)),
                  labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        hidden = flow.layers.dense(images, HIDDEN, activation=flow.nn.relu,
                                   kernel_initializer=flow.truncated_normal(0.1), name="hidden")
        logits = flow.layers.dense(hidden, CLASSES, kernel_initializer=flow.truncated_normal(0.1), name="output")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        if every:
            flow.watch_health(reports.append, every=every)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [LR]), momentum=0).minimize(loss)
        return loss

    train_job.compiled()
    return train_job, reports


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()

    import flowlab as flow
    rng = np.random.default_rng(0)
    images = rng.random((BATCH, IN), dtype=np.float32)
    labels = rng.integers(0, CLASSES, BATCH).astype(np.int32)
    jobs = {"unwatched": make_job(flow, 0), "every=1": make_job(flow, 1), "every=10": make_job(flow, 10)}
    for job, _ in jobs.values():           # warm-up (first call initialises variables)
        for _ in range(5):
            job(images, labels)
    flow.sync_default_session()

    times = {name: [] for name in jobs}
    names = list(jobs)
    for r in range(args.rounds):
        for name in names[r % 3:] + names[:r % 3]:
            job = jobs[name][0]
            time.sleep(0.2)
            job(images, labels)
            start = time.perf_counter()
            for _ in range(args.steps):
                job(images, labels)
            flow.sync_default_session()
            times[name].append((time.perf_counter() - start) / args.steps * 1e3)

    base = statistics.median(times["unwatched"])
    print(f"seed MLP {IN}-{HIDDEN}-{CLASSES}, batch {BATCH}, SGD; {args.rounds} rounds x {args.steps} steps, medians")
    print(f"  unwatched        {base:.3f} ms/step")
    ok = True
    for name in ("every=1", "every=10"):
        median = statistics.median(times[name])
        ratio = median / base
        ok &= ratio <= TARGETS[name]
        print(f"  watch_health({name:8s}) {median:.3f} ms/step  {ratio:.3f}x  (target <= {TARGETS[name]:.2f}x)")
    reports = jobs["every=10"][1]
    print(f"  (every=10 delivered {len(reports)} reports; every=1 {len(jobs['every=1'][1])})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
