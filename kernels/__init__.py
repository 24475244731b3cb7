"""Kernels of cupy_dcp (installed as ``cupy_dcp.kernels``).

``pack_send`` and ``unpack_combine`` are Numba CUDA kernels for device arrays;
``pack_host`` and ``combine_host`` are their Numba ``njit`` twins for NumPy
arrays. Both share the row math of ``_math``. Nothing here knows about
communicators. Every kernel is compiled lazily, on first use (or loaded from
the kernel cache, ``_cache``), so importing needs no GPU.
"""

from ._lazy import lazy_names

_HOMES = {"agrs_correct": "agrs", "agrs_finish": "agrs", "unpack_combine": "combine",
          "agrs_correct_host": "host", "agrs_lse_host": "host", "combine_host": "host",
          "mask_lse_host": "host", "pack_host": "host", "pack_send": "pack"}

__all__ = ["agrs_correct", "agrs_correct_host", "agrs_finish", "agrs_lse_host", "combine_host", "mask_lse_host", "pack_host",
           "pack_send", "unpack_combine"]


__getattr__ = lazy_names(__name__, _HOMES)
