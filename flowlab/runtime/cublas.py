"""Matrix products on CuPy arrays through cuBLAS itself, so that a CUDA graph can capture them.

CuPy refuses every cuBLAS call while a stream is being captured (its ``setStream`` raises NotImplementedError), so a
plan with a matrix product could not be replayed as a CUDA graph (``runtime.cuda_graph``), though cuBLAS supports
capture. ``gemm(cupy, a, b, out)`` calls ``cublas{S,D}gemm_v2`` of the library CuPy loaded, through ctypes, on CuPy's
own handle and the current stream, with host-side scalars (captured by value). It also skips CuPy's matmul
dispatch, which costs more host time than the call itself on small products.

Operands are 2-D float32/float64 CuPy arrays that are C- or F-contiguous (a matrix or a transposed view of one);
``out`` is C-contiguous. Anything else returns None for the caller to use ``cupy.matmul``. The binding is checked
against ``cupy.matmul`` once, on first use; where it cannot be found or disagrees, ``gemm`` always returns None.

float16 operands (auto mixed precision, ``compiler.amp``) go to ``cublasGemmEx`` with float16 matrices and float32
accumulation (``CUBLAS_COMPUTE_32F``, float32 alpha and beta), what ``cupy.matmul`` computes for them. That routine
is bound and checked against ``cupy.matmul`` apart, on the first float16 product, so that a job without float16
never touches it; where it cannot be found or disagrees, float16 products return None (``cupy.matmul``).
``FLOWLAB_CUBLAS=0`` turns it off.
"""
from __future__ import annotations

import ctypes
import logging
import os

import numpy as np

log = logging.getLogger("flowlab")

_N, _T = 0, 1                 # cublasOperation_t
_HOST_POINTERS = 0            # cublasPointerMode_t
_library = None               # ctypes library, False once found unusable
_routines = {}                # dtype -> gemm function
_CUDA_R_16F = 2               # cudaDataType_t
_COMPUTE_32F = 68             # cublasComputeType_t (CUDA 11 and later)
_GEMM_DEFAULT = -1            # cublasGemmAlgo_t
_half_routine = None          # cublasGemmEx, False once found unusable


def _find_library():
    """libcublas as CuPy loaded it (its path from /proc/self/maps, so no search path is needed)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcublas.so" in line and "libcublasLt" not in line}
    except OSError:
        paths = set()
    for path in sorted(paths) or ["libcublas.so"]:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def _bind(cupy):
    global _library
    if os.environ.get("FLOWLAB_CUBLAS", "1") == "0":
        _library = False
        return
    cupy.matmul(cupy.ones((2, 2), np.float32), cupy.ones((2, 2), np.float32))   # CuPy loads cuBLAS
    library = _find_library()
    if library is None:
        _library = False
        return
    _P, _I = ctypes.c_void_p, ctypes.c_int
    try:
        library.cublasSetStream_v2.argtypes = [_P, _P]
        library.cublasSetPointerMode_v2.argtypes = [_P, _I]
        for dtype, name, scalar in ((np.float32, "cublasSgemm_v2", ctypes.c_float),
                                    (np.float64, "cublasDgemm_v2", ctypes.c_double)):
            routine = getattr(library, name)
            routine.argtypes = [_P, _I, _I, _I, _I, _I, ctypes.POINTER(scalar), _P, _I, _P, _I,
                                ctypes.POINTER(scalar), _P, _I]
            _routines[np.dtype(dtype)] = (routine, scalar)
    except AttributeError as e:
        log.debug("flowlab: cuBLAS gemm not bound: %s", e)
        _library = False
        return
    _library = library
    rng = np.random.default_rng(0)
    for dtype in _routines:       # every layout once against CuPy's own product
        a, b = (cupy.asarray(rng.standard_normal(s).astype(dtype)) for s in ((5, 3), (3, 4)))
        for left, right in ((a, b), (a.T.copy().T, b), (a, b.T.copy().T)):
            got = gemm(cupy, left, right, cupy.empty((5, 4), dtype))
            if got is None or not cupy.allclose(got, cupy.matmul(left, right), rtol=1e-5, atol=1e-6):
                log.warning("flowlab: cuBLAS through ctypes disagrees with cupy.matmul; using cupy.matmul")
                _library = False
                return


def _bind_half(cupy):
    """Bind ``cublasGemmEx`` for float16 and check every layout once against ``cupy.matmul``."""
    global _half_routine
    _half_routine = False
    _P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_float)
    try:
        routine = _library.cublasGemmEx
    except AttributeError as e:
        log.debug("flowlab: cuBLAS float16 gemm not bound: %s", e)
        return
    routine.argtypes = [_P, _I, _I, _I, _I, _I, _F, _P, _I, _I, _P, _I, _I, _F, _P, _I, _I, _I, _I]
    _half_routine = routine
    rng = np.random.default_rng(0)
    a, b = (cupy.asarray(rng.standard_normal(s).astype(np.float16)) for s in ((5, 3), (3, 4)))
    for left, right in ((a, b), (a.T.copy().T, b), (a, b.T.copy().T)):
        try:
            got = gemm(cupy, left, right, cupy.empty((5, 4), np.float16))
        except RuntimeError:        # a status cuBLAS refuses with (no float16 GEMM on this device)
            got = None
        # both accumulate in float32: they may differ by the last bit of the float16 result
        if got is None or not cupy.allclose(got, cupy.matmul(left, right), rtol=1e-2, atol=1e-2):
            log.warning("flowlab: cuBLAS float16 gemm through ctypes disagrees with cupy.matmul; using cupy.matmul")
            _half_routine = False
            return


def _operand(x):
    """(cublas operation, leading dimension) of row-major operand ``x`` as column-major cuBLAS sees it, or None."""
    rows, cols = x.shape
    if x.flags.c_contiguous:
        return _N, max(cols, 1)
    if x.flags.f_contiguous:
        return _T, max(rows, 1)
    return None


def gemm(cupy, a, b, out):
    """``out = a @ b`` (2-D, one float dtype, ``out`` C-contiguous) on the current stream; None where not done."""
    if _library is None:
        _bind(cupy)
    if not _library or a.ndim != 2 or b.ndim != 2 or not out.flags.c_contiguous:
        return None
    half = a.dtype == np.float16
    if half:
        if _half_routine is None:
            _bind_half(cupy)
        bound = (_half_routine, ctypes.c_float) if _half_routine else None
    else:
        bound = _routines.get(a.dtype)
    if bound is None or b.dtype != a.dtype or out.dtype != a.dtype:
        return None
    m, k = a.shape
    n = b.shape[1]
    if b.shape[0] != k or out.shape != (m, n):
        raise ValueError(f"gemm: shapes {a.shape} @ {b.shape} -> {out.shape} do not fit")
    if 0 in (m, n, k):
        return None
    op_a, op_b = _operand(a), _operand(b)
    if op_a is None or op_b is None:
        return None
    routine, scalar = bound
    handle = cupy.cuda.device.get_cublas_handle()
    _library.cublasSetStream_v2(handle, cupy.cuda.get_current_stream().ptr)
    _library.cublasSetPointerMode_v2(handle, _HOST_POINTERS)
    one, zero = scalar(1.0), scalar(0.0)
    # row-major out (m x n) = a @ b is column-major out^T (n x m) = b^T @ a^T: b first
    if half:        # cublasGemmEx: each matrix's data type after it; compute type and algorithm at the end
        status = routine(handle, op_b[0], op_a[0], n, m, k, ctypes.byref(one), b.data.ptr, _CUDA_R_16F, op_b[1],
                         a.data.ptr, _CUDA_R_16F, op_a[1], ctypes.byref(zero), out.data.ptr, _CUDA_R_16F, n,
                         _COMPUTE_32F, _GEMM_DEFAULT)
    else:
        status = routine(handle, op_b[0], op_a[0], n, m, k, ctypes.byref(one), b.data.ptr, op_b[1], a.data.ptr,
                         op_a[1], ctypes.byref(zero), out.data.ptr, n)
    if status != 0:
        raise RuntimeError(f"cublas gemm failed with status {status}")
    return out
