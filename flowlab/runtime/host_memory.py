"""Keep large freed blocks in the process's heap, so that a step's big temporaries do not fault in fresh pages.

glibc's ``malloc`` serves blocks above ``M_MMAP_THRESHOLD`` (128 KiB at first, rising by itself up to 32 MiB as
such blocks are freed) with a fresh ``mmap`` and gives them back to the kernel on ``free``; it also returns the
heap's free top beyond ``M_TRIM_THRESHOLD``. Each step of a convolutional network allocates and frees hundreds of
megabytes of NumPy temporaries (im2col matrices, activations, gradients), so much of that memory is faulted in
again and zeroed by the kernel every step: on ResNet-50 (batch 4, 224 pixels, one BLAS thread, CPU time) a step took
2.39 s with the thresholds held at 128 KiB against 1.70 s with the blocks kept (the two settings alternated in one
process), and about 1.94 s against 1.78 s with glibc's adaptive default (separate runs). A convolution computed
straight from its input, as PyTorch's are, needs far less scratch memory, so the defaults hurt it much less.

``retain_freed_blocks()`` raises both thresholds once per process: blocks up to 32 MiB (glibc's largest threshold)
come from the heap, and up to ``TRIM_THRESHOLD`` bytes of free heap stay mapped for the next step. The price is
memory: a process keeps the heap of its largest step. Plans call it on NumPy only, and only for jobs with tensors
that glibc would map afresh (``LARGE_TENSOR_BYTES``); ``FLOWLAB_RETAIN_HEAP=0`` turns it off. Elsewhere than glibc
it does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading

log = logging.getLogger("flowlab")

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3       # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20                         # glibc's maximum (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 1 << 30
# Plans with a tensor this large or larger retain blocks: glibc's initial mmap threshold, from which a block is mapped
# afresh. Its adaptive threshold does not keep such blocks either: the small BERT encoder's step (largest tensor
# 512 KiB) faulted in ~770 pages a step, ~2 ms of its ~22 ms of CPU, until this was lowered from 1 MiB. A plan of
# smaller tensors only (a small MLP) never maps memory per step and leaves the thresholds alone.
LARGE_TENSOR_BYTES = 128 << 10

_lock = threading.Lock()
_state = {"done": False, "applied": False}


def _glibc():
    """The C library when it is glibc (it has ``mallopt``), else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version            # glibc only: musl and others have no such tuning
        return libc
    except (OSError, AttributeError):
        return None


def retain_freed_blocks() -> bool:
    """Raise glibc's mmap and trim thresholds once per process (see the module docstring). True when they are
    raised (now or before); False when turned off, or the C library is not glibc, or glibc refused."""
    with _lock:
        if not _state["done"]:
            _state["done"] = True
            if os.environ.get("FLOWLAB_RETAIN_HEAP", "1").strip().lower() in ("0", "false", "no", "off"):
                log.debug("flowlab: FLOWLAB_RETAIN_HEAP=0: glibc's malloc thresholds left as they are")
            else:
                libc = _glibc()
                if libc is not None:
                    _state["applied"] = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
                        bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
                    if not _state["applied"]:
                        log.debug("flowlab: glibc refused the malloc thresholds")
        return _state["applied"]


def wants_retained_blocks(tensor_bytes) -> bool:
    """Whether a host plan whose largest tensor has ``tensor_bytes`` bytes should retain freed blocks."""
    return tensor_bytes >= LARGE_TENSOR_BYTES
