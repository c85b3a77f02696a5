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
come from the heap, and up to ``TRIM_THRESHOLD`` bytes of free heap stay mapped for the next step. It also raises
``M_TOP_PAD``: a thread's arena is a chain of 64 MiB heaps, and glibc unmaps a heap that falls free at its top
unless more than the pad is left below it, whatever the trim threshold, so the host threads' scratch was faulted in
again every step: ResNet-50 took 8,300-8,900 minor faults and 44-64 ms of system time a step, and with a 64 MiB
pad 0.5 faults and 12 ms (total CPU 1,350 against 1,430 ms). The price is
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

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3       # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20                         # glibc's maximum (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 1 << 30
TOP_PAD = 64 << 20                                # one thread heap's size (HEAP_MAX_SIZE)
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
    """Raise glibc's mmap and trim thresholds and its top pad once per process (see the module docstring). True
    when they are raised (now or before); False when turned off, or the C library is not glibc, or glibc refused."""
    with _lock:
        if not _state["done"]:
            _state["done"] = True
            if os.environ.get("FLOWLAB_RETAIN_HEAP", "1").strip().lower() in ("0", "false", "no", "off"):
                log.debug("flowlab: FLOWLAB_RETAIN_HEAP=0: glibc's malloc thresholds left as they are")
            else:
                libc = _glibc()
                if libc is not None:
                    _state["applied"] = all(libc.mallopt(option, value) for option, value in (
                        (M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD)))
                    if not _state["applied"]:
                        log.debug("flowlab: glibc refused the malloc thresholds")
        return _state["applied"]


def wants_retained_blocks(tensor_bytes) -> bool:
    """Whether a host plan whose largest tensor has ``tensor_bytes`` bytes should retain freed blocks."""
    return tensor_bytes >= LARGE_TENSOR_BYTES
