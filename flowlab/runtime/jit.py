"""Compiled CPU kernels: one vectorised loop where NumPy makes one pass per operation.

A NumPy kernel streams its block through memory once per ufunc: GELU is 22 passes, layer norm's gradient ~12. A loop
compiled by numba does the same arithmetic in one pass, in AVX2 / AVX-512 registers. numba is a dependency, but its
loops are only used where they are measured faster, and every one has a NumPy twin that stays the reference its tests
compare against (``FLOWLAB_JIT=0``, or numba missing, runs the NumPy twins; CuPy has its own fused kernels).

Writing one (beside its op, as the op's shape rule and gradient are)::

    @jit.kernel
    def _gelu_float32(x, out):              # flat float32 arrays; compiled on its first call, cached on disk
        for i in range(x.size):
            ...jit.exp32(...)...

and in the op, ``if jit.enabled(): ...`` picks it. A kernel may call another by its module-level name (a loop two
kernels share, declared ``inline=True``); it is compiled into the caller. Kernels are compiled ``nogil``
(``host_threads`` runs them on both cores at once), with NumPy's error model (a division by zero gives inf or NaN, never
an exception), and with only the fast-math flags that cannot change a NaN or an infinity: ``contract`` (fused
multiply-adds) and ``arcp`` (a reciprocal for a division). ``@jit.kernel(reduce=True)`` adds ``reassoc``, which lets a
sum vectorise (its rounding then differs from a sequential sum's, as NumPy's pairwise sum does).

Helpers for kernel bodies (``jit.exp32``, from ``jit_math``, imported on first use): numba's ``math.exp`` is a scalar
call into libm (llvmlite carries no SVML), so a loop that calls it does not vectorise: GELU at 131k float32 took 740 us,
against NumPy's 405 and 70 with ``exp32``.

The disk cache (numba's ``cache=True``, in ``__pycache__`` or a user cache when that is read-only) is keyed on the
kernel's own file: after editing a helper in ``jit_math``, or a kernel that another file's kernels call, delete the
``*.nbi`` / ``*.nbc`` files in ``__pycache__``.
"""
from __future__ import annotations

import importlib.util
import os
import threading
import types

import numpy as np

_FAST = frozenset({"contract", "arcp"})
_lock = threading.RLock()      # a kernel's compile compiles the kernels it calls
_local = threading.local()


def available() -> bool:
    """Whether numba can be imported (without importing it: ``import numba`` costs ~0.2 s)."""
    return _AVAILABLE


_AVAILABLE = importlib.util.find_spec("numba") is not None


def _switched_off() -> bool:
    return os.environ.get("FLOWLAB_JIT", "1").strip().lower() in ("0", "false", "no", "off")


def enabled() -> bool:
    """Whether ops run their compiled kernels now: numba is there, ``FLOWLAB_JIT`` does not turn it off, and the
    calling thread is not inside ``using(False)``. Ops ask this on every call: while no ``using`` block is open it
    reads one global."""
    if not _overrides:
        return _DEFAULT
    choice = getattr(_local, "choice", None)
    return _AVAILABLE and (choice if choice is not None else _DEFAULT)


def takes(*arrays, contiguous: bool = False) -> bool:
    """Whether compiled kernels run on ``arrays`` now: ``enabled()``, and each a NumPy float32 array (C-contiguous
    too with ``contiguous``, for kernels that read them flat). The common test of the ops' compiled paths."""
    return enabled() and all(isinstance(a, np.ndarray) and a.dtype == np.float32 and
                             (not contiguous or a.flags.c_contiguous) for a in arrays)


_SWITCHED_OFF = _switched_off()
_DEFAULT = _AVAILABLE and not _SWITCHED_OFF
_overrides = 0          # ``using`` blocks open in any thread


class using:
    """``with jit.using(False):`` the calling thread's ops run their NumPy kernels (``True``: compiled ones, where
    numba is there). Tests run both sides of each op this way."""

    def __init__(self, on: bool):
        self.on = bool(on)

    def __enter__(self):
        global _overrides
        self._saved = getattr(_local, "choice", None)
        _local.choice = self.on
        with _lock:
            _overrides += 1
        return self

    def __exit__(self, *exc):
        global _overrides
        _local.choice = self._saved
        with _lock:
            _overrides -= 1


class Kernel:
    """A Python loop compiled by numba on its first call (``kernel``). Calling it before numba is there raises."""

    def __init__(self, function, reduce: bool = False, inline: bool = False, atomic: bool = False):
        self.function = function
        self.reduce = reduce
        self.inline = inline
        self.atomic = atomic
        self.compiled = None
        self.__name__ = function.__name__
        self.__doc__ = function.__doc__
        self.__wrapped__ = function

    def compile(self):
        with _lock:
            if self.compiled is None:
                import numba
                flags = set(_FAST) | ({"reassoc"} if self.reduce else set())
                options = dict(nogil=not self.atomic, error_model="numpy", fastmath=flags)
                if self.inline:
                    options["inline"] = "always"
                function = self._with_kernels_compiled()
                try:
                    self.compiled = numba.njit(cache=True, **options)(function)
                except RuntimeError:        # no file to key a cache on (a notebook cell, an interactive session)
                    self.compiled = numba.njit(**options)(function)
        return self.compiled

    def _with_kernels_compiled(self):
        """The function, reading the other kernels it calls by name as their compiled forms (numba cannot call a
        ``Kernel`` object): one loop shared by two kernels is written once, and LLVM inlines it into both."""
        function = self.function
        called = {name: value.compile() for name, value in function.__globals__.items()
                  if isinstance(value, Kernel) and value is not self and name in function.__code__.co_names}
        if not called:
            return function
        copy = types.FunctionType(function.__code__, {**function.__globals__, **called}, function.__name__,
                                  function.__defaults__, function.__closure__)
        copy.__qualname__, copy.__module__ = function.__qualname__, function.__module__
        return copy

    def ready(self):
        """The compiled dispatcher, compiling it on the first call. Hot paths call it directly: ``__call__``'s
        argument packing costs ~0.4 us beside a ~1 us pass."""
        return self.compiled or self.compile()

    def __call__(self, *args):
        return self.ready()(*args)

    def __repr__(self):
        return f"<jit.kernel {self.function.__module__}.{self.__name__}>"


def kernel(function=None, *, reduce: bool = False, inline: bool = False, atomic: bool = False):
    """Decorator: ``function`` (a loop over NumPy arrays and scalars) compiled by numba on its first call.
    Kernels release the interpreter lock while they run, unless ``atomic``: then no other Python thread runs
    meanwhile, so a kernel can update shared arrays as one step (``ops.stats``' blocks of statistics rows).
    ``inline``: a loop other kernels call, inlined into them by numba (LLVM alone does not inline it across numba's
    modules: a call per row cost the softmax 40 %). Inlined, it takes its caller's fast-math flags: a caller of a
    ``reduce`` loop is ``reduce`` too."""
    if function is None:
        return lambda f: Kernel(f, reduce=reduce, inline=inline, atomic=atomic)
    return Kernel(function, reduce=reduce, inline=inline, atomic=atomic)


_HELPERS = ("exp32", "float32_from_bits")


def __getattr__(name):
    # kernel bodies read ``jit.exp32``: numba resolves it when it compiles the kernel, which builds the helpers (and
    # imports numba) on first use only
    if name in _HELPERS and _AVAILABLE:
        from . import jit_math            # imports numba
        return getattr(jit_math, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
