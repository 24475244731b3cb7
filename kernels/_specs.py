"""Argument checks of the kernel launchers, and the conversions they allow."""

from types import SimpleNamespace

import numpy as np
from numba import config

from ._format import as_dtype, bits_dtype, check_heads, is_bfloat16, is_supported, lse_pack_dim

__all__ = ["check_combine_args", "check_mask_arrays", "check_pack_args"]

MAX_RANKS = 256
MAX_ROWS = 2 ** 32 - 1  # the kernels number a buffer's rows ([N, B, H/N] of them) in 32 bits


def _shape(x):
    return tuple(int(s) for s in x.shape)


def _dtype(x, name):
    try:
        dt = as_dtype(x.dtype)
    except TypeError:
        dt = None
    if dt is None or not (is_supported(dt) or dt.kind == "u"):
        raise TypeError(f"{name} dtype must be float16, bfloat16 or float32 (got {x.dtype})")
    return dt


def _convert(x, dtype, stream_ptr, contiguous=False):
    """``x`` as ``dtype`` (and C-contiguous if asked), converted on ``stream_ptr``
    into a temporary; a no-op when it already is so."""
    if as_dtype(x.dtype) == dtype and not (contiguous and not _is_c_contiguous(x)):
        return x
    if config.ENABLE_CUDASIM:
        return np.ascontiguousarray(np.asarray(x), dtype=dtype)
    try:
        import cupy
    except ImportError:
        raise RuntimeError(f"converting a {x.dtype} array to {dtype} on the GPU needs CuPy") from None
    from ._arrays import as_cupy, cupy_stream
    with cupy_stream(stream_ptr):
        return cupy.ascontiguousarray(as_cupy(x), dtype=dtype)


def _is_c_contiguous(x):
    from ._arrays import kernel_array
    return kernel_array(x, as_dtype(x.dtype)).is_c_contiguous()


def _spec(dtype, tokens, heads, head_dim, world_size):
    return SimpleNamespace(
        dtype=dtype, bits=bits_dtype(dtype), tokens=tokens, heads=heads, head_dim=head_dim,
        world_size=world_size, pack_dim=lse_pack_dim(dtype),
        lse_as_float32=lambda x, ptr: _convert(x, np.dtype(np.float32), ptr),
        index_as_int64=lambda x, ptr: _convert(x, np.dtype(np.int64), ptr, contiguous=True))


def _check_buffer(buf, name, shape, dtype):
    if _shape(buf) != shape:
        raise ValueError(f"{name} must have shape {shape} (got {_shape(buf)})")
    rows = shape[0] * shape[1] * shape[2]
    if rows > MAX_ROWS:
        raise ValueError(f"{name} must hold at most 2**32 - 1 rows [N, B, H/N] (got {rows}): "
                         "the kernels number rows in 32 bits")
    got = _dtype(buf, name)
    if got not in (dtype, bits_dtype(dtype)):
        raise TypeError(f"{name} must have dtype {dtype} (got {buf.dtype})")


def check_pack_args(out, lse, send, seq_lens=None, query_start_loc=None, recv=None):
    """Check the arguments of ``pack_send``; return their sizes and dtype."""
    if len(out.shape) != 3:
        raise ValueError(f"out must be [B, H, D] (got shape {_shape(out)})")
    dtype = _dtype(out, "out")
    if not is_supported(dtype):
        raise TypeError(f"out dtype must be float16, bfloat16 or float32 (got {out.dtype})")
    B, H, D = _shape(out)
    if D < 1:
        raise ValueError(f"out's head size D must be >= 1 (got {D})")
    if _shape(lse) != (B, H):
        raise ValueError(f"lse must be [B, H] = {(B, H)} (got shape {_shape(lse)})")
    lse_dtype = as_dtype(lse.dtype)
    if not (lse_dtype.kind == "f" or is_bfloat16(lse_dtype)):
        raise TypeError(f"lse must be a float array (got dtype {lse.dtype})")
    if len(send.shape) != 4 or send.shape[0] < 1:
        raise ValueError(f"send must be [N, B, H/N, D+P] (got shape {_shape(send)})")
    n = int(send.shape[0])
    check_heads(H, n)
    _check_buffer(send, "send", (n, B, H // n, D + lse_pack_dim(dtype)), dtype)
    if recv is not None:
        _check_buffer(recv, "recv", _shape(send), dtype)
    check_mask_arrays(seq_lens, query_start_loc)
    return _spec(dtype, B, H, D, n)


def check_mask_arrays(seq_lens, query_start_loc):
    """``seq_lens [S]`` and ``query_start_loc [S+1]``: both or neither, 1-D integer
    arrays (``ValueError``, ``TypeError``). The kernels read ``query_start_loc``'s
    ``S + 1`` entries unchecked, so a shorter one would be read past its end."""
    if (seq_lens is None) != (query_start_loc is None):
        raise ValueError("seq_lens and query_start_loc must be given together")
    for name, index in (("seq_lens", seq_lens), ("query_start_loc", query_start_loc)):
        if index is not None and (not hasattr(index, "dtype") or len(_shape(index)) != 1 or
                                  as_dtype(index.dtype).kind not in "iu"):
            raise TypeError(f"{name} must be a 1-D integer array (got "
                            f"{getattr(index, 'dtype', type(index).__name__)} of shape "
                            f"{_shape(index) if hasattr(index, 'shape') else None})")
    if seq_lens is not None and _shape(query_start_loc) != (_shape(seq_lens)[0] + 1,):
        raise ValueError(f"query_start_loc must have len(seq_lens) + 1 entries "
                         f"(got {_shape(query_start_loc)} for {_shape(seq_lens)})")


def check_combine_args(recv, out, out_lse=None):
    """Check the arguments of ``unpack_combine``; return their sizes and dtype."""
    if len(out.shape) != 3:
        raise ValueError(f"out must be [B, H/N, D] (got shape {_shape(out)})")
    dtype = _dtype(out, "out")
    if not is_supported(dtype):
        raise TypeError(f"out dtype must be float16, bfloat16 or float32 (got {out.dtype})")
    B, hn, D = _shape(out)
    if D < 1:
        raise ValueError(f"out's head size D must be >= 1 (got {D})")
    if len(recv.shape) != 4 or recv.shape[0] < 1:
        raise ValueError(f"recv must be [N, B, H/N, D+P] (got shape {_shape(recv)})")
    n = int(recv.shape[0])
    if n > MAX_RANKS:
        raise ValueError(f"world_size must be <= {MAX_RANKS} (got {n})")
    _check_buffer(recv, "recv", (n, B, hn, D + lse_pack_dim(dtype)), dtype)
    if out_lse is not None:
        if _shape(out_lse) != (B, hn):
            raise ValueError(f"out_lse must be [B, H/N] = {(B, hn)} (got shape {_shape(out_lse)})")
        if as_dtype(out_lse.dtype) != np.float32:
            raise TypeError(f"out_lse must be float32 (got {out_lse.dtype})")
    return _spec(dtype, B, hn * n, D, n)
