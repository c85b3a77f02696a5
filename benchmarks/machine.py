"""Machine facts every benchmark prints beside its numbers (run the scripts from the repository root), and how a
profile finds a plan's kernels."""
import ctypes
import os
import platform
import re

import numpy as np


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()



def blas_info():
    """(name, threads) of the BLAS NumPy uses; threads is None where it cannot be asked."""
    try:
        import threadpoolctl
        for pool in threadpoolctl.threadpool_info():
            if pool.get("user_api") == "blas":
                return f"{pool.get('internal_api')} {pool.get('version')}", pool.get("num_threads")
    except ImportError:
        pass
    name = "unknown"
    try:
        cfg = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        name = f"{cfg.get('name')} {cfg.get('version')}"
    except Exception:
        pass
    try:   # NumPy's wheels bundle (scipy-)OpenBLAS; ask the loaded library directly
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line}
        for path in sorted(paths):
            lib = ctypes.CDLL(path)
            for fn in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
                       "openblas_get_num_threads"):
                if hasattr(lib, fn):
                    return name, int(getattr(lib, fn)())
    except OSError:
        pass
    return name, None


def cpu_wait_seconds():
    """Seconds the threads of this process have spent runnable but waiting for a CPU (Linux schedstat), or None.

    On a shared machine other processes (a test suite, a notebook) take cores in bursts; the wait time shows it at
    nanosecond resolution, whereas load averages and /proc/stat jiffies are far too coarse for 30 ms blocks."""
    total = 0
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/schedstat") as f:
                total += int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return total * 1e-9


def plan_kernels(plan):
    """``{name in the plan's code: "<node> (<Op>)"}`` of every kernel call of a flowlab plan (``k<i>(...)  # <node>
    (<Op>)`` lines of ``print(plan)``): what a profile wraps to time op by op (``plan._run.__globals__[name]``)."""
    labels = {}
    for line in str(plan).splitlines():
        m = re.search(r"\b(k\d+)\(.*#\s*(.*)$", line)
        if m:
            labels[m.group(1)] = m.group(2)
    return labels
