#!/usr/bin/env python
"""A flowlab train step in its steady state on the GPU: what it allocates and which CUDA calls it makes, per step.

The seed MLP (784-512-10, batch 100, SGD) of ``watch_overhead.py`` as variants ``plain``, ``watch`` (watch +
watch_diff), ``scope`` (watch_scope over the last layer) and ``health`` (``watch_health(every=1)``). After a warm-up,
for each variant:

- CuPy's memory-pool requests and the ``cudaMalloc`` calls behind them over N steps (a ``MemoryHook`` on the job's
  thread, where the plan runs and its watches start their copies);
- a PyTorch profiler (CUPTI) trace of N steps: the CUDA runtime/driver calls by name (launches, copies and every
  kind of synchronisation), the kernels by GPU time, and how busy the GPU was against the step's wall time (Chrome
  traces of each variant with ``--trace DIR``);
- the same trace of ``train_step.py``'s large GPU case (batch 4096 x hidden 4096) for flowlab and PyTorch.

    python benchmarks/gpu_steady.py                  # ~20 s on an H100/H200
    python benchmarks/gpu_steady.py --steps 100 --trace /tmp/traces
"""

# No `from __future__ import annotations`: flowlab reads the job's placeholder annotations at runtime.
import argparse
import collections
import os
import sys
import time

import numpy as np

from watch_overhead import BATCH, CLASSES, IN, FlowlabVariant

VARIANTS = ("plain", "watch", "scope", "health")
LARGE = (4096, 4096)     # batch, hidden
SYNCS = ("Synchronize", "cudaMemcpy ", "cudaMemcpy2D ", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2", "cudaFree", "cuMemFree")


def count_pool_requests(impl, steps):
    """(pool requests, cudaMalloc calls, bytes asked) per step, from a MemoryHook around ``steps`` steps."""
    from cupy.cuda import memory_hook

    class Counting(memory_hook.MemoryHook):
        name = "flowlab-steady-count"

        def __init__(self):
            self.requests = self.mallocs = self.nbytes = 0

        def malloc_preprocess(self, **kw):
            self.requests += 1
            self.nbytes += kw["size"]

        def alloc_preprocess(self, **kw):
            self.mallocs += 1

    hook = Counting()
    with hook:
        for _ in range(steps):
            impl.step()
    return hook.requests / steps, hook.mallocs / steps, hook.nbytes / steps


def trace(torch, impl, steps, chrome_path=None):
    """A CUPTI trace of ``steps`` steps through torch.profiler: {name: calls per step} of CUDA API calls, the kernels'
    count and GPU time per step, and the wall time per step."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            impl.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    if chrome_path:
        prof.export_chrome_trace(chrome_path)
    api, kernels, kernel_time = collections.Counter(), collections.Counter(), collections.Counter()
    for event in prof.events():
        device = str(getattr(event, "device_type", ""))
        if device.endswith("CUDA"):
            kernels[event.name] += 1
            kernel_time[event.name] += event.device_time if hasattr(event, "device_time") else event.cuda_time
        elif event.name.startswith(("cuda", "cu")) and not event.name.startswith("cudnn"):
            api[event.name] += 1
    return ({k: v / steps for k, v in api.items()}, {k: v / steps for k, v in kernels.items()},
            {k: v / steps for k, v in kernel_time.items()}, wall * 1e6 / steps)


def report(name, api, kernels, kernel_time, wall_us):
    busy = sum(kernel_time.values())
    syncs = {k: v for k, v in api.items() if any(s in k + " " for s in SYNCS)}
    print(f"  {name}: wall {wall_us:.1f} us/step, GPU busy {busy:.1f} us/step ({100 * busy / wall_us:.0f}%), "
          f"{sum(kernels.values()):.1f} kernels/step")
    print("    API calls/step: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(api.items(), key=lambda kv: -kv[1])))
    print("    synchronising calls/step: " + (", ".join(f"{k} {v:.2f}" for k, v in syncs.items()) or "none"))
    top = sorted(kernel_time.items(), key=lambda kv: -kv[1])[:10]
    print("    GPU time by kernel (us/step, calls/step): " + "; ".join(
        f"{k[:60]} {v:.1f} ({kernels[k]:.0f})" for k, v in top))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=50, help="steps counted per variant (default 50)")
    ap.add_argument("--trace", help="folder for Chrome traces of each variant")
    args = ap.parse_args(argv)
    os.environ["FLOWLAB_DEVICE"] = "gpu"
    import cupy
    import torch
    import flowlab as flow
    from flowlab.runtime import backend
    try:
        backend.use("gpu")
    except Exception as e:
        sys.exit(f"gpu_steady.py needs a GPU: {e}")
    print(f"flowlab steady state on {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}; cupy "
          f"{cupy.__version__}, CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}, driver "
          f"{cupy.cuda.runtime.driverGetVersion()}; torch {torch.__version__}")
    print(f"seed MLP {IN}-512-{CLASSES}, batch {BATCH}; {args.steps} steps per variant after 30 warm-up steps")
    rng = np.random.default_rng(0)
    x = rng.random((BATCH, IN), dtype=np.float32)
    y = rng.integers(0, CLASSES, BATCH).astype(np.int32)
    impls = {v: FlowlabVariant(flow, v) for v in VARIANTS}
    for impl in impls.values():
        impl.set_batch(x, y)
        for _ in range(30):
            impl.step()
    flow.sync_default_session()
    if args.trace:
        os.makedirs(args.trace, exist_ok=True)

    print("\nmemory-pool requests per step (after warm-up)")
    print(f"  {'variant':8s} {'requests':>9s} {'cudaMalloc':>10s} {'bytes asked':>12s}")
    for name, impl in impls.items():
        requests, mallocs, nbytes = count_pool_requests(impl, args.steps)
        print(f"  {name:8s} {requests:9.2f} {mallocs:10.2f} {nbytes:12.0f}")

    print("\nCUDA calls per step (torch.profiler / CUPTI)")
    for name, impl in impls.items():
        path = os.path.join(args.trace, f"{name}.json") if args.trace else None
        try:
            report(name, *trace(torch, impl, args.steps, path))
        except Exception as e:            # a profiler that cannot attach: say so and go on
            print(f"  {name}: no trace ({type(e).__name__}: {e})")
        print(f"    plan: {impl.job.plan().describe_passes().splitlines()[-1]}")

    # issue 13's cuBLAS-bound case next to PyTorch's: where the GPU time goes
    from train_step import FlowlabStep, TorchStep
    large_steps = max(args.steps // 5, 2)
    print(f"\nbatch {LARGE[0]} x hidden {LARGE[1]}: {large_steps} steps each")
    x = rng.random((LARGE[0], IN), dtype=np.float32)
    y = rng.integers(0, CLASSES, LARGE[0]).astype(np.int32)
    for impl in (FlowlabStep(flow, *LARGE), TorchStep(torch, *LARGE, "cuda")):
        impl.set_batch(x, y)
        for _ in range(3):
            impl.step()
        try:
            report(impl.name, *trace(torch, impl, large_steps))
        except Exception as e:
            print(f"  {impl.name}: no trace ({type(e).__name__}: {e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
