"""Choose the array module: CuPy when a CUDA device really works, else NumPy.

``FLOWLAB_DEVICE=cpu`` forces NumPy, ``FLOWLAB_DEVICE=gpu`` demands CuPy (a clear error without a working GPU).
``import cupy`` succeeds on machines without a GPU, so the probe makes a tiny allocation (DESIGN.md §8).
"""
from __future__ import annotations

import logging
import os
import threading

import numpy as np

from ..errors import DeviceError

log = logging.getLogger("flowlab")


class Backend:
    """The array module a job runs with, plus host<->device moves."""

    def __init__(self, name: str, xp):
        self.name = name
        self.xp = xp
        self.is_gpu = name == "cupy"
        self.notice = f"flowlab: running on {name}."     # replaced by select() with why it was chosen
        self._copy_stream = None

    def asarray(self, host):
        return self.xp.asarray(host)

    def to_host(self, array) -> np.ndarray:
        return array.get() if self.is_gpu else np.asarray(array)

    def to_host_copy(self, array) -> np.ndarray:
        """A host array that no later kernel can change."""
        return array.get() if self.is_gpu else np.array(array, copy=True)

    def host_copy_async(self, array):
        """Start copying ``array`` to the host; returns the copy (NumPy) or a function that waits for it (CuPy).

        On CuPy a device-side snapshot is taken on the compute stream (later kernels and in-place optimizer updates
        may overwrite ``array``, never the snapshot); a side stream copies it into pinned memory while the compute
        stream goes on. The returned function keeps the snapshot alive until the copy has finished.
        """
        if not self.is_gpu:
            return np.array(array, copy=True)
        cupy = self.xp
        if self._copy_stream is None:
            self._copy_stream = cupy.cuda.Stream(non_blocking=True)
        import cupyx
        snapshot = array.copy()
        produced = cupy.cuda.get_current_stream().record()
        pinned = cupyx.empty_pinned(array.shape, array.dtype)
        self._copy_stream.wait_event(produced)
        snapshot.get(stream=self._copy_stream, out=pinned)
        done = self._copy_stream.record()

        def wait(snapshot=snapshot):
            done.synchronize()
            return pinned
        return wait

    def blas_limit(self, largest_product):
        """The context a plan whose largest matrix product has ``largest_product`` multiply-adds runs in: one BLAS
        thread below ``ONE_BLAS_THREAD_BELOW`` on NumPy (see below), else None (on NumPy the plan then runs in
        ``host_threads.spread_kernels``: BLAS on one thread, kernels splitting their work over as many threads as
        BLAS had)."""
        return one_blas_thread if not self.is_gpu and largest_product < ONE_BLAS_THREAD_BELOW else None

    def random_generator(self, seed):
        return self.xp.random.default_rng(seed)

    def __repr__(self):
        return f"Backend({self.name})"


# BLAS threads. On small matrix products a second BLAS thread gains nothing and its hand-offs cost much, above all
# when another process (a browser drawing a live panel, say) takes the other core: the README's digits MLP (largest
# product 0.8M multiply-adds) trains 1.07x faster on one thread on an idle 2-core machine, 1.24x beside a bursty
# load and 2.9x beside a busy core. From a few million multiply-adds two threads win on an idle machine (2.5M: 1.35x,
# 40M: 1.7x) though they still lose beside a busy core (benchmarks/blas_threads.py, RESULTS.md). So plans whose
# products are all below this many multiply-adds run BLAS on one thread; in larger ones the kernels split their
# work over the BLAS thread count themselves (runtime/host_threads.py).
ONE_BLAS_THREAD_BELOW = 2_000_000


class OneBlasThread:
    """``with one_blas_thread:`` runs NumPy's BLAS on one thread, and restores its thread count when the last
    thread inside leaves (through threadpoolctl; a few microseconds; a no-op where no BLAS can be controlled)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._inside = 0
        self._libraries = None
        self._saved = ()

    def controllers(self):
        """threadpoolctl's controllers of the BLAS libraries loaded when first asked (NumPy's, and SciPy's when it
        was loaded by then), the ones this context limits; ``runtime.blas`` binds its routines from one of them, so
        the BLAS flowlab calls directly is always one the context limits (a library loaded later is not: SciPy's
        came first in threadpoolctl's list once loaded, and was left at two threads)."""
        if self._libraries is None:
            try:
                from threadpoolctl import ThreadpoolController
                self._libraries = ThreadpoolController().select(user_api="blas").lib_controllers
            except Exception as e:        # an exotic BLAS: run as configured
                log.debug("flowlab: BLAS threads not controllable: %s", e)
                self._libraries = []
        return self._libraries

    def __enter__(self):
        with self._lock:
            if self._inside == 0:
                libraries = self.controllers()
                self._saved = [lib.num_threads for lib in libraries]
                for lib in libraries:
                    if lib.num_threads != 1:
                        lib.set_num_threads(1)
            self._inside += 1

    def __exit__(self, *exc):
        with self._lock:
            self._inside -= 1
            if self._inside == 0:
                for lib, threads in zip(self._libraries, self._saved):
                    if threads != 1:
                        lib.set_num_threads(threads)


one_blas_thread = OneBlasThread()

NUMPY = Backend("numpy", np)
_current: Backend | None = None


def _probe_cupy():
    """Return (cupy, None) when a CUDA device works, else (None, reason)."""
    try:
        import cupy
    except ImportError as e:
        missing = "CuPy is not installed" if e.name in (None, "cupy") else f"CuPy needs {e.name}, which is missing"
        return None, f"{missing}; install flowlab[cuda12] or flowlab[cuda13] to use one"
    try:
        if not cupy.cuda.is_available():
            return None, "CuPy found no CUDA device"
        cupy.zeros(1, dtype=cupy.float32).sum().item()   # the first allocation is what fails without a GPU
    except Exception as e:  # CUDARuntimeError, missing CUDA libraries: any failure means "no usable GPU"
        return None, f"CUDA is not usable: {type(e).__name__}: {e}"
    return cupy, None


def select(device: str | None = None) -> Backend:
    """Pick the backend once: ``device`` or ``$FLOWLAB_DEVICE`` (``cpu``/``gpu``/``auto``)."""
    global _current
    choice = (device or os.environ.get("FLOWLAB_DEVICE") or "auto").lower()
    if choice not in ("auto", "cpu", "gpu"):
        raise ValueError(f"FLOWLAB_DEVICE must be 'cpu', 'gpu' or 'auto', got {choice!r}")
    cupy, reason = _probe_cupy() if choice != "cpu" else (None, None)
    if choice == "cpu":
        _current = NUMPY
        NUMPY.notice = "flowlab: running on NumPy, as FLOWLAB_DEVICE=cpu asks."
    elif cupy is not None:
        _current = Backend("cupy", cupy)
        _current.notice = f"flowlab: running on the GPU with CuPy {cupy.__version__}."
    elif choice == "gpu":
        raise DeviceError(f"FLOWLAB_DEVICE=gpu asks for a GPU, but {reason}")
    else:
        _current = NUMPY
        NUMPY.notice = f"flowlab: running on NumPy without a GPU, as {reason}."
    # INFO, and flowlab adds no handler of its own: a normal condition, so it never reaches stderr (which a notebook
    # draws as a red error box) unless the user turns INFO logging on. flow.device() and `flowlab demo` say it.
    log.info(_current.notice)
    return _current


def current() -> Backend:
    return _current if _current is not None else select()


def use(device: str) -> Backend:
    """Switch backends (``"cpu"`` or ``"gpu"``) before jobs are compiled; tests use it."""
    return select(device)
