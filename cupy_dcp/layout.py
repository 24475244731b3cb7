"""The packed send-buffer format, as the public package names it: see
``cupy_dcp.kernels._format``, where it is defined (the kernels build on it)."""

from .kernels._format import (BFLOAT16, SUPPORTED_DTYPES, as_dtype, bits_dtype, c_strides,
                              check_heads, lse_pack_dim, round_from_float64, send_buffer_shape)

__all__ = ["BFLOAT16", "SUPPORTED_DTYPES", "as_dtype", "bits_dtype", "c_strides", "check_heads",
           "lse_pack_dim", "round_from_float64", "send_buffer_shape"]
