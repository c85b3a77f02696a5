#!/usr/bin/env python
"""Where a second BLAS thread pays: flowlab's train step on one and on two BLAS threads, for MLPs whose largest
matrix product grows, on an idle machine and beside a load on the other core. It backs ``ONE_BLAS_THREAD_BELOW`` in
flowlab/runtime/backend.py (plans of smaller products run BLAS on one thread).

Models (batch 100, ReLU, SGD lr 0.1, sparse softmax cross-entropy), by their largest product in multiply-adds:
    digits    64-128-10     0.8M   (the README's)
    wide      64-384-10     2.5M
    wider     64-1024-10    6.6M
    seed      784-512-10   40.1M   (the seed program's)
Loads on the other core: ``idle``; ``bursty`` (a process busy 20 ms of every 50, like a browser drawing a live
panel); ``busy`` (a process spinning). Each block is one setting for ``--seconds``; the two thread counts alternate
and swap order every round. Reported: median steps/s per thread count and their ratio (1 thread / 2 threads).

    python benchmarks/blas_threads.py                # about 4 minutes on 2 cores
    python benchmarks/blas_threads.py --rounds 3 --seconds 0.5
"""
import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
from threadpoolctl import ThreadpoolController

from machine import blas_info, cpu_model

MODELS = {"digits": (64, 128), "wide": (64, 384), "wider": (64, 1024), "seed": (784, 512)}
LOADS = {
    "idle": None,
    "bursty": "import time\nwhile True:\n    s = time.time()\n    while time.time() - s < 0.02: pass\n    time.sleep(0.03)",
    "busy": "while True: pass",
}


def make_job(flow, tp, n_in, hidden, name):
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((100, n_in)), y: tp.Numpy.Placeholder((100,), dtype=flow.int32)) -> tp.Numpy:
        h = flow.layers.dense(x, hidden, activation=flow.nn.relu, name=f"{name}_hidden")
        logits = flow.layers.dense(h, 10, name=f"{name}_out")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss
    return job


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    import flowlab as flow
    import flowlab.typing as tp
    blas = ThreadpoolController().select(user_api="blas").lib_controllers[0]
    name, threads = blas_info()
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; Python {platform.python_version()}, NumPy "
          f"{np.__version__} ({name}, {threads} threads by default); "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    rng = np.random.default_rng(0)
    print(f"{'model':8s} {'largest product':>16s} {'load':7s} {'1 thread':>10s} {'2 threads':>10s} {'1/2':>6s}")
    for model, (n_in, hidden) in MODELS.items():
        job = make_job(flow, tp, n_in, hidden, model)
        x = rng.normal(size=(100, n_in)).astype(np.float32)
        y = rng.integers(0, 10, 100).astype(np.int32)
        plan = job.plan()
        plan.blas_limit = None                 # measure both thread counts, whatever flowlab would choose

        def block(n_threads):
            blas.set_num_threads(n_threads)
            job(x, y)
            steps, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < args.seconds:
                job(x, y)
                steps += 1
            return steps / (time.perf_counter() - t0)

        for load, code in LOADS.items():
            hog = subprocess.Popen([sys.executable, "-c", code]) if code else None
            try:
                rates = {1: [], 2: []}
                for r in range(args.rounds):
                    for n in ((1, 2) if r % 2 else (2, 1)):
                        time.sleep(0.2)
                        rates[n].append(block(n))
            finally:
                if hog:
                    hog.kill()
            one, two = statistics.median(rates[1]), statistics.median(rates[2])
            print(f"{model:8s} {plan.largest_gemm / 1e6:15.1f}M {load:7s} {one:10.0f} {two:10.0f} {one / two:6.2f}")
    blas.set_num_threads(threads or 2)


if __name__ == "__main__":
    main()
