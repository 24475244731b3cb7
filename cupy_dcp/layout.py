"""The packed send-buffer format, as the public package names it: see
``cupy_dcp.kernels._format``, where it is defined (the kernels build on it)."""

from .kernels import _format
from .kernels._format import (as_dtype, bits_dtype, c_strides, check_heads, is_bfloat16,
                              is_supported, lse_pack_dim, round_from_float64,
                              send_buffer_shape)

__all__ = ["BFLOAT16", "SUPPORTED_DTYPES", "as_dtype", "bits_dtype", "c_strides", "check_heads",
           "is_bfloat16", "is_supported", "lse_pack_dim", "round_from_float64",
           "send_buffer_shape"]


def __getattr__(name):  # BFLOAT16 and SUPPORTED_DTYPES import ml_dtypes: on first use
    if name in ("BFLOAT16", "SUPPORTED_DTYPES"):
        return getattr(_format, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
