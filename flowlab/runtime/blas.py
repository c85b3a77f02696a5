"""``gemm_accumulate``: ``C += alpha * op(A) @ op(B)`` in place, through the BLAS NumPy itself loaded.

NumPy's ``matmul`` always writes a fresh product (BLAS's ``beta = 0``). A plain SGD step on a dense layer's kernel
needs ``W -= lr * (dyᵀ @ x)``: NumPy writes the gradient, scales it and subtracts it, three passes over a tensor the
size of the kernel; the BLAS call with ``beta = 1`` does it in the product itself (the seed MLP's hidden kernel:
~0.15 ms of a ~1.9 ms step on a 2-core CPU; ``benchmarks/train_step.py``). The compiler's ``fold_sgd_into_gemm``
uses it when ``available()``: NumPy linked against OpenBLAS (every NumPy wheel on PyPI), found through
threadpoolctl, and one product checked against NumPy's when first bound. Anything else: NumPy's three passes.
"""
from __future__ import annotations

import ctypes
import logging

import numpy as np

log = logging.getLogger("flowlab")

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
# (symbol for float32, symbol for float64): NumPy's wheels (scipy-openblas, 64-bit ints), its 32-bit-int build, and
# a system OpenBLAS. Integer arguments are passed as 64-bit: on the little-endian 64-bit ABIs NumPy's wheels target,
# a callee taking 32-bit ints reads the low half of each register or stack slot, which holds the same value.
_SYMBOLS = (("scipy_cblas_sgemm64_", "scipy_cblas_dgemm64_"), ("scipy_cblas_sgemm", "scipy_cblas_dgemm"),
            ("cblas_sgemm64_", "cblas_dgemm64_"), ("cblas_sgemm", "cblas_dgemm"))
_routines: dict | None = None


def _bind(library):
    for single, double in _SYMBOLS:
        try:
            routines = {np.dtype(np.float32): getattr(library, single), np.dtype(np.float64): getattr(library, double)}
        except AttributeError:
            continue
        for dtype, routine in routines.items():
            scalar = ctypes.c_float if dtype == np.float32 else ctypes.c_double
            i = ctypes.c_int64
            routine.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, i, i, i, scalar, ctypes.c_void_p, i,
                                ctypes.c_void_p, i, scalar, ctypes.c_void_p, i]
            routine.restype = None
        return routines
    return None


def _load():
    """The BLAS routines by dtype, or {} where they cannot be found or do not compute what NumPy does."""
    try:
        from threadpoolctl import ThreadpoolController
        for controller in ThreadpoolController().select(internal_api="openblas").lib_controllers:
            routines = _bind(ctypes.CDLL(controller.filepath))
            if routines and _agrees(routines):
                return routines
    except Exception as e:      # no threadpoolctl, an unloadable library: NumPy's own passes
        log.debug("flowlab: no BLAS gemm with beta=1: %s", e)
    return {}


def _agrees(routines):
    """One small product per dtype through each routine, against NumPy's, in all four transpose combinations."""
    rng = np.random.default_rng(0)
    for dtype, routine in routines.items():
        a, b = rng.standard_normal((3, 4)).astype(dtype), rng.standard_normal((4, 5)).astype(dtype)
        c = rng.standard_normal((3, 5)).astype(dtype)
        for ta, tb in ((False, False), (True, False), (False, True), (True, True)):
            got = c.copy()
            _gemm(routine, got, a.T.copy() if ta else a, b.T.copy() if tb else b, -0.5, ta, tb)
            if not np.allclose(got, c - 0.5 * (a @ b), rtol=1e-4, atol=1e-5):
                return False
    return True


def available(dtype) -> bool:
    """Whether ``gemm_accumulate`` can run for arrays of ``dtype`` (float32, float64)."""
    global _routines
    if _routines is None:
        _routines = _load()
    return np.dtype(dtype) in _routines


def _operand(array, transpose):
    """(transpose flag, leading dimension, array) of a 2-D operand as row-major BLAS wants it."""
    if array.flags.c_contiguous:
        return (_TRANS if transpose else _NO_TRANS), max(1, array.shape[1]), array
    if array.flags.f_contiguous:        # a transposed view: its memory is the row-major transpose
        return (_NO_TRANS if transpose else _TRANS), max(1, array.shape[0]), array
    array = np.ascontiguousarray(array)
    return (_TRANS if transpose else _NO_TRANS), max(1, array.shape[1]), array


def gemm_accumulate(c, a, b, alpha, transpose_a=False, transpose_b=False):
    """``c += alpha * op(a) @ op(b)`` in place; ``op`` transposes where asked. ``c`` C-contiguous, all 2-D NumPy
    arrays of one dtype for which ``available()``; the caller checks shapes (the compiler already has)."""
    _gemm(_routines[c.dtype], c, a, b, alpha, transpose_a, transpose_b)


def _gemm(routine, c, a, b, alpha, transpose_a, transpose_b):
    flag_a, lda, a = _operand(a, transpose_a)
    flag_b, ldb, b = _operand(b, transpose_b)
    m, n = c.shape
    k = a.shape[0] if transpose_a else a.shape[1]
    routine(_ROW_MAJOR, flag_a, flag_b, m, n, k, alpha, a.ctypes.data, lda, b.ctypes.data, ldb, 1.0,
            c.ctypes.data, max(1, n))
