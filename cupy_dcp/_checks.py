"""Validation at the public boundary: every check runs before anything is exchanged."""

from .layout import BFLOAT16, SUPPORTED_DTYPES, as_dtype, check_heads

__all__ = ["check_inputs", "check_mask", "check_out", "lse_float32_dtype"]


def _shape(x):
    return tuple(int(s) for s in x.shape)


def _check_array(x, name):
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise TypeError(f"{name} must be an array (NumPy, CuPy or any DLPack / CUDA array) "
                        f"(got {type(x).__name__})")


def check_inputs(out, lse, world_size):
    """Check ``out [B, H, D]`` and ``lse [B, H]``; return ``(B, H, D, dtype)``."""
    _check_array(out, "cp_attn_out")
    _check_array(lse, "cp_attn_lse")
    shape = _shape(out)
    if len(shape) != 3:
        raise ValueError(f"cp_attn_out must be [B, H, D] (got shape {shape})")
    try:
        dtype = as_dtype(out.dtype)
    except TypeError:
        dtype = None
    if dtype not in SUPPORTED_DTYPES:
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


def lse_float32_dtype(dtype):
    """The LSE is converted to float32 from any float dtype; integers are refused."""
    try:
        dt = as_dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or not (dt.kind == "f" or dt == BFLOAT16):
        raise TypeError(f"cp_attn_lse must be a float array (got dtype {dtype})")
    return dt


def check_out(out, shape, dtype):
    """Check a caller-provided result array ``out`` against ``shape`` and ``dtype``."""
    _check_array(out, "out")
    if _shape(out) != tuple(shape):
        raise ValueError(f"out must have shape {tuple(shape)} (got {_shape(out)})")
    try:
        got = as_dtype(out.dtype)
    except TypeError:
        got = out.dtype
    if got != dtype:
        raise TypeError(f"out must have dtype {dtype} (got {out.dtype})")


def check_mask(seq_lens, query_start_loc):
    """``seq_lens [S]`` and ``query_start_loc [S+1]`` come together, as integers."""
    if (seq_lens is None) != (query_start_loc is None):
        raise ValueError("seq_lens and query_start_loc must be given together (got only "
                         + ("seq_lens)" if query_start_loc is None else "query_start_loc)"))
    if seq_lens is None:
        return
    for name, arr in (("seq_lens", seq_lens), ("query_start_loc", query_start_loc)):
        _check_array(arr, name)
        if len(arr.shape) != 1 or as_dtype(arr.dtype).kind not in "iu":
            raise TypeError(f"{name} must be a 1-D integer array (got {arr.dtype} of shape {_shape(arr)})")
    if query_start_loc.shape[0] != seq_lens.shape[0] + 1:
        raise ValueError(
            "query_start_loc must have len(seq_lens) + 1 entries "
            f"(got {query_start_loc.shape[0]} for {seq_lens.shape[0]} sequences)")
