"""Validation at the public boundary: every check runs before anything is exchanged.

The checks of values (masks, the LSE's range) read host arrays only: on device
arrays they would cost a device-to-host synchronisation per call.
"""


import numpy as np

from .kernels._format import check_apart, check_count, check_flag, check_not_overlapping
from .layout import as_dtype, check_heads, is_bfloat16, is_supported

__all__ = ["check_apart", "check_array", "check_count", "check_flag", "check_inputs",
           "check_cache_setting", "check_lse_range", "check_mask", "check_out",
           "lse_float32_dtype"]

_INT64_MAX = np.iinfo(np.int64).max
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _shape(x):
    return tuple(map(int, x.shape))


def _remembered(table, dtype, judge):
    """``judge(dtype)``, remembered in ``table`` per dtype: an eager call checks the
    same few dtypes again and again (an unhashable one is judged every time)."""
    try:
        return table[dtype]
    except (KeyError, TypeError):
        pass
    verdict = judge(dtype)
    try:
        table[dtype] = verdict
    except TypeError:
        pass
    return verdict


def _as_numpy(dtype):
    try:
        return as_dtype(dtype)
    except TypeError:
        return None


def _judge_value(dtype):
    """``dtype`` as a NumPy dtype if the kernels take it, else ``None``."""
    dt = _as_numpy(dtype)
    return dt if dt is not None and is_supported(dt) else None


def _judge_lse(dtype):
    """``dtype`` as a NumPy dtype if it is a float one, else ``None``."""
    dt = _as_numpy(dtype)
    return dt if dt is not None and (dt.kind == "f" or is_bfloat16(dt)) else None


_VALUE_DTYPES: "dict[object, np.dtype | None]" = {}  # dtype -> _judge_value's verdict
_LSE_DTYPES: "dict[object, np.dtype | None]" = {}  # dtype -> _judge_lse's verdict


def check_array(x, name):
    """``x`` must be an array (``shape`` and ``dtype``), and no masked one (``TypeError``)."""
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise TypeError(f"{name} must be an array (NumPy, CuPy or any DLPack / CUDA array) "
                        f"(got {type(x).__name__})")
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"{name} must not be a masked array: its mask would be ignored "
                        "(pass its .data, or a mask through seq_lens)")


def check_inputs(out, lse, world_size):
    """Check ``out [B, H, D]`` and ``lse [B, H]``; return ``(B, H, D, dtype)``."""
    check_array(out, "cp_attn_out")
    check_array(lse, "cp_attn_lse")
    shape = _shape(out)
    if len(shape) != 3:
        raise ValueError(f"cp_attn_out must be [B, H, D] (got shape {shape})")
    dtype = _remembered(_VALUE_DTYPES, out.dtype, _judge_value)
    if dtype is None:
        raise TypeError(
            f"cp_attn_out dtype must be float16, bfloat16 or float32 (got {out.dtype})")
    B, H, D = shape
    if D < 1:
        raise ValueError(f"cp_attn_out head size D must be >= 1 (got {D})")
    if _shape(lse) != (B, H):
        raise ValueError(f"cp_attn_lse must be [B, H] = {(B, H)} (got shape {_shape(lse)})")
    lse_float32_dtype(lse.dtype)
    check_heads(H, world_size)
    return B, H, D, dtype


def lse_float32_dtype(dtype, name="cp_attn_lse"):
    """The LSE is converted to float32 from any float dtype; integers are refused."""
    dt = _remembered(_LSE_DTYPES, dtype, _judge_lse)
    if dt is None:
        raise TypeError(f"{name} must be a float array (got dtype {dtype})")
    return dt


def check_lse_range(lse, name="cp_attn_lse"):
    """A host LSE wider than float32 must fit it: a finite value that would become
    +-inf (+inf means "empty") is a ``ValueError``."""
    if not isinstance(lse, np.ndarray) or lse.dtype.itemsize <= 4 or is_bfloat16(lse.dtype):
        return
    with np.errstate(invalid="ignore", over="ignore"):  # (no warning under -W error either)
        beyond = np.isfinite(lse) & (np.abs(lse) > _FLOAT32_MAX)
        if beyond.any():
            beyond &= np.isinf(lse.astype(np.float32))  # what rounds to the largest float32 is fine
    if beyond.any():
        where = tuple(int(i) for i in np.argwhere(beyond)[0])
        raise ValueError(f"{name} must fit float32: {float(lse[where])!r} at {where} is "
                         f"beyond +-{_FLOAT32_MAX:.6g} (got dtype {lse.dtype})")


def check_out(out, shape, dtype, name="out"):
    """Check a caller-provided result array ``out`` (called ``name`` in errors) against
    ``shape`` and ``dtype``; a read-only NumPy ``out`` is refused."""
    check_array(out, name)
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise ValueError(f"{name} must be writeable (got a read-only array)")
    if _shape(out) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} (got {_shape(out)})")
    try:
        got = as_dtype(out.dtype)
    except TypeError:
        got = out.dtype
    if got != dtype:
        order = " (the byte orders differ)" if isinstance(got, np.dtype) and \
            got.newbyteorder("=") == dtype.newbyteorder("=") else ""
        raise TypeError(f"{name} must have dtype {dtype} (got {out.dtype}){order}")
    strides = getattr(out, "strides", None)  # (NumPy's and CuPy's; others at the launch)
    if isinstance(strides, tuple):
        check_not_overlapping(out.shape, strides, got.itemsize, name)


def check_mask(seq_lens, query_start_loc):
    """``seq_lens [S]`` and ``query_start_loc [S+1]`` come together, as integers."""
    if (seq_lens is None) != (query_start_loc is None):
        raise ValueError("seq_lens and query_start_loc must be given together (got only "
                         + ("seq_lens)" if query_start_loc is None else "query_start_loc)"))
    if seq_lens is None:
        return
    for name, arr in (("seq_lens", seq_lens), ("query_start_loc", query_start_loc)):
        check_array(arr, name)
        if len(arr.shape) != 1 or as_dtype(arr.dtype).kind not in "iu":
            raise TypeError(f"{name} must be a 1-D integer array (got {arr.dtype} of shape {_shape(arr)})")
    if query_start_loc.shape[0] != seq_lens.shape[0] + 1:
        raise ValueError(
            "query_start_loc must have len(seq_lens) + 1 entries "
            f"(got {query_start_loc.shape[0]} for {seq_lens.shape[0]} sequences)")
    if isinstance(seq_lens, np.ndarray) and isinstance(query_start_loc, np.ndarray):
        _check_mask_values(seq_lens, query_start_loc)


def _check_mask_values(seq_lens, query_start_loc):
    """Host masks: lengths >= 0, starts non-decreasing, every value an int64."""
    for name, arr in (("seq_lens", seq_lens), ("query_start_loc", query_start_loc)):
        if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and arr.size:
            big = np.flatnonzero(arr > _INT64_MAX)
            if big.size:
                raise ValueError(f"{name} must be < 2**63 (got {int(arr[big[0]])} at index "
                                 f"{int(big[0])})")
    negative = np.flatnonzero(seq_lens < 0)
    if negative.size:
        i = int(negative[0])
        raise ValueError(f"seq_lens must be >= 0 (got {int(seq_lens[i])} at index {i})")
    starts = query_start_loc.astype(np.int64)
    falls = np.flatnonzero(starts[1:] < starts[:-1])
    if falls.size:
        i = int(falls[0]) + 1
        raise ValueError(f"query_start_loc must be non-decreasing (got {int(starts[i])} after "
                         f"{int(starts[i - 1])} at index {i})")


def check_cache_setting():
    """``ValueError`` where the kernel cache's environment settings are bad
    (``CUPY_DCP_CACHE`` neither 0 nor 1): checked among a call's or a plan's
    arguments, so that every rank raises, not only the one whose first compile reads
    them while its peers wait in the exchange. Read once a process, as the cache
    reads them (:func:`cupy_dcp.kernels._cache.cache_dir`)."""
    from .kernels import _cache

    _cache.cache_dir()

