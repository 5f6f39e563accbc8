"""Process memory settings of training: glibc's malloc keeps freed memory for reuse.

Below training, models and inference (:mod:`avsr.train.trainer` and the ESPnet plug-in's training entry both
call it), so no module imports it up a floor.
"""

from __future__ import annotations

__all__ = ["keep_freed_memory"]

#: mallopt(3) parameters of glibc (malloc.h) and the values :func:`keep_freed_memory` sets
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_MALLOC_SETTINGS = ((_M_MMAP_THRESHOLD, 1 << 30), (_M_TRIM_THRESHOLD, 2**31 - 1), (_M_TOP_PAD, 256 << 20))


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse instead of returning it to the kernel.

    A training step on CPU frees and allocates the same activation buffers (tens of MiB each for the video
    front-end) step after step. With glibc's defaults, blocks above the mmap threshold (at most 32 MiB) are
    mapped afresh and freed memory at the top of the heap is trimmed, so the kernel zero-fills those pages
    again on first touch: ~50,000 page faults per video batch of the SynthGRID recipe, 10% of its video
    front-end's time (``benchmarks/profile_train.py``). Sets, through ``mallopt(3)``, the mmap threshold to
    1 GiB, the trim threshold to 2 GiB and the top pad to 256 MiB (what the environment variables
    ``MALLOC_MMAP_THRESHOLD_`` etc. would set at start-up): the process keeps its peak heap and reuses it.
    Process-wide, for allocations made afterwards; :class:`avsr.train.trainer.Trainer` calls it. Returns
    whether glibc took all settings (False, and nothing changed, where the C library is not glibc).
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in _MALLOC_SETTINGS)
