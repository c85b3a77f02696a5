"""In-place BLAS updates NumPy cannot express, through the BLAS NumPy itself loaded.

NumPy's ``matmul`` always writes a fresh product (BLAS's ``beta = 0``) and ``w -= s * g`` makes a temporary (or two
passes in place). An optimizer step is an update of ``w`` in place, so three BLAS routines save whole passes over
kernel-sized tensors:

- ``gemm_accumulate(c, a, b, alpha)``: ``c += alpha * op(a) @ op(b)`` (``beta = 1``). The compiler's
  ``fold_sgd_into_gemm`` runs a plain SGD step on a dense kernel as one product: the gradient is never written,
  scaled and re-read (seed MLP: ~0.15 ms of a ~1.9 ms step on a 2-core CPU; ``benchmarks/train_step.py``).
- ``axpy(y, x, alpha)``: ``y += alpha * x`` in one pass (a plain SGD step whose gradient must exist: 1.6 MB in
  ~45 us against ~100 us for scaling then subtracting).
- ``axpby(y, x, alpha, beta)``: ``y = alpha * x + beta * y`` in one pass (SGD's momentum buffer).

All three run where ``available(dtype)``: NumPy linked against OpenBLAS (every NumPy wheel on PyPI), found through
threadpoolctl, and each routine checked against NumPy once when first bound; anything else keeps NumPy's passes.
Arrays are NumPy arrays of one dtype, ``y``/``c`` C-contiguous and writable; callers check shapes.
"""
from __future__ import annotations

import ctypes
import logging

import numpy as np

log = logging.getLogger("flowlab")

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
# Symbol name patterns ({} is s or d): NumPy's wheels (scipy-openblas, 64-bit ints), its 32-bit-int build, and a
# system OpenBLAS. Integer arguments are passed as 64-bit: on the little-endian 64-bit ABIs NumPy's wheels target, a
# callee taking 32-bit ints reads the low half of each register or stack slot, which holds the same value.
_PATTERNS = ("scipy_cblas_{}{}64_", "scipy_cblas_{}{}", "cblas_{}{}64_", "cblas_{}{}")
_I, _P = ctypes.c_int64, ctypes.c_void_p
_routines: dict | None = None       # dtype -> {"gemm" | "axpy" | "axpby": ctypes function}


def _signatures(scalar):
    return {"gemm": [ctypes.c_int, ctypes.c_int, ctypes.c_int, _I, _I, _I, scalar, _P, _I, _P, _I, scalar, _P, _I],
            "axpy": [_I, scalar, _P, _I, _P, _I],
            "axpby": [_I, scalar, _P, _I, scalar, _P, _I]}


def _bind(library):
    for pattern in _PATTERNS:
        routines = {}
        try:
            for dtype, letter, scalar in ((np.float32, "s", ctypes.c_float), (np.float64, "d", ctypes.c_double)):
                bound = routines[np.dtype(dtype)] = {}
                for name, argtypes in _signatures(scalar).items():
                    routine = getattr(library, pattern.format(letter, name))
                    routine.argtypes, routine.restype = argtypes, None
                    bound[name] = routine
        except AttributeError:
            continue
        return routines
    return None


def _load():
    """The BLAS routines by dtype, or {} where they cannot be found or do not compute what NumPy does."""
    from .backend import one_blas_thread        # (the libraries it limits: the one bound here is among them)
    try:
        for controller in one_blas_thread.controllers():
            if controller.internal_api != "openblas":
                continue
            routines = _bind(ctypes.CDLL(controller.filepath))
            if routines and _agrees(routines):
                return routines
    except Exception as e:      # no threadpoolctl, an unloadable library: NumPy's own passes
        log.debug("flowlab: no in-place BLAS updates: %s", e)
    return {}


def _agrees(routines):
    """Each routine once per dtype against NumPy (the product in all four transpose combinations)."""
    rng = np.random.default_rng(0)
    for dtype, bound in routines.items():
        a, b = rng.standard_normal((3, 4)).astype(dtype), rng.standard_normal((4, 5)).astype(dtype)
        c = rng.standard_normal((3, 5)).astype(dtype)
        for ta, tb in ((False, False), (True, False), (False, True), (True, True)):
            got = c.copy()
            _gemm(bound["gemm"], got, a.T.copy() if ta else a, b.T.copy() if tb else b, -0.5, ta, tb)
            if not np.allclose(got, c - 0.5 * (a @ b), rtol=1e-4, atol=1e-5):
                return False
        x, y = a.ravel(), c.ravel()[:12].copy()
        want_axpy, want_axpby = y + 0.5 * x, 0.5 * x - 2.0 * y
        bound["axpy"](12, 0.5, x.ctypes.data, 1, y.ctypes.data, 1)
        if not np.allclose(y, want_axpy, rtol=1e-5):
            return False
        y = c.ravel()[:12].copy()
        bound["axpby"](12, 0.5, x.ctypes.data, 1, -2.0, y.ctypes.data, 1)
        if not np.allclose(y, want_axpby, rtol=1e-5):
            return False
    return True


def _bound():
    global _routines
    if _routines is None:
        _routines = _load()
    return _routines


def available(dtype) -> bool:
    """Whether these routines can run for NumPy arrays of ``dtype`` (float32, float64)."""
    return np.dtype(dtype) in _bound()


def _operand(array, transpose):
    """(transpose flag, leading dimension, array) of a 2-D operand as row-major BLAS wants it."""
    if array.flags.c_contiguous:
        return (_TRANS if transpose else _NO_TRANS), max(1, array.shape[1]), array
    if array.flags.f_contiguous:        # a transposed view: its memory is the row-major transpose
        return (_NO_TRANS if transpose else _TRANS), max(1, array.shape[0]), array
    array = np.ascontiguousarray(array)
    return (_TRANS if transpose else _NO_TRANS), max(1, array.shape[1]), array


def gemm_accumulate(c, a, b, alpha, transpose_a=False, transpose_b=False):
    """``c += alpha * op(a) @ op(b)`` in place; ``op`` transposes where asked; all 2-D."""
    _gemm(_bound()[c.dtype]["gemm"], c, a, b, alpha, transpose_a, transpose_b)


def _gemm(routine, c, a, b, alpha, transpose_a, transpose_b):
    flag_a, lda, a = _operand(a, transpose_a)
    flag_b, ldb, b = _operand(b, transpose_b)
    m, n = c.shape
    k = a.shape[0] if transpose_a else a.shape[1]
    routine(_ROW_MAJOR, flag_a, flag_b, m, n, k, alpha, a.ctypes.data, lda, b.ctypes.data, ldb, 1.0,
            c.ctypes.data, max(1, n))


def axpy(y, x, alpha):
    """``y += alpha * x`` in place, one pass; ``x`` and ``y`` contiguous, of one size."""
    _bound()[y.dtype]["axpy"](y.size, alpha, x.ctypes.data, 1, y.ctypes.data, 1)


def axpby(y, x, alpha, beta):
    """``y = alpha * x + beta * y`` in place, one pass; ``x`` and ``y`` contiguous, of one size."""
    _bound()[y.dtype]["axpby"](y.size, alpha, x.ctypes.data, 1, beta, y.ctypes.data, 1)
