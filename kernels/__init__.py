"""Kernels of cupy_dcp (installed as ``cupy_dcp.kernels``).

``pack_send`` and ``unpack_combine`` are Numba CUDA kernels for device arrays;
``pack_host`` and ``combine_host`` are their Numba ``njit`` twins for NumPy
arrays. Both share the row math of ``_math``. Nothing here knows about
communicators. Every kernel is compiled lazily, on first use, so importing
needs no GPU.
"""

from .agrs import agrs_correct, agrs_finish
from .combine import unpack_combine
from .host import agrs_correct_host, agrs_lse_host, combine_host, mask_lse_host, pack_host
from .pack import pack_send

__all__ = ["agrs_correct", "agrs_correct_host", "agrs_finish", "agrs_lse_host", "combine_host", "mask_lse_host", "pack_host",
           "pack_send", "unpack_combine"]
