"""NumPy reference of the DCP combine: the oracle every kernel is tested against.

Depends on NumPy (and ``ml_dtypes`` for bfloat16) only. It states the math (the
README's "The math") in float64 on host arrays, with no attempt at speed, and
checks its inputs as the library's calls do. It takes NumPy arrays, anything
NumPy can convert, and other frameworks' CPU arrays through DLPack (bfloat16
too: ``_host_arrays``).
"""

import numpy as np

from ._checks import check_flag, check_lse_range, lse_float32_dtype
from ._host_arrays import host_view
from .layout import as_dtype, bits_dtype, check_heads, is_bfloat16, is_supported, lse_pack_dim

__all__ = ["lse_weighted_combine", "pack_reference", "unpack_reference"]

_NEG_INF_BITS = np.uint32(0xFF800000)


def _clean_lse(lses):
    """NaN and +inf LSEs mean "this shard contributes nothing": -inf."""
    lses = np.array(lses, dtype=np.float64)
    lses[np.isnan(lses) | (lses == np.inf)] = -np.inf
    return lses


def lse_weighted_combine(outputs, lses, return_lse=False, is_lse_base_on_e=True):
    """Exact LSE-weighted combine of per-shard partial attention outputs.

    Args:
        outputs: ``[N, B, H, D]`` float16, bfloat16, float32 or float64; the
            partial attention output of each of the N shards.
        lses: ``[N, B, H]`` float; the log-sum-exp of the scores each shard saw.
            NaN and +inf are treated as -inf (the shard contributes nothing).
        return_lse: also return the global LSE.
        is_lse_base_on_e: the LSEs are natural logs; ``False`` means base 2.

    Returns:
        ``[B, H, D]`` float32 (float64 for float64 input), accumulated in
        float64; with ``return_lse``, also the global LSE ``[B, H]`` of the same
        dtype (-inf where every shard is empty, whose output is 0).

    Raises:
        ValueError: ``outputs`` not ``[N, B, H, D]`` with N >= 1, or ``lses``
            not ``[N, B, H]``.
        TypeError: ``outputs`` or ``lses`` not a float array, or a flag not a
            bool.
    """
    outputs = np.asarray(host_view(outputs, "outputs"))  # (another framework's CPU arrays
    lses = np.asarray(host_view(lses, "lses"))  # by DLPack, bfloat16 too)
    return_lse = check_flag(return_lse, "return_lse")
    is_lse_base_on_e = check_flag(is_lse_base_on_e, "is_lse_base_on_e")
    if outputs.ndim != 4:
        raise ValueError(f"outputs must be [N, B, H, D] (got shape {outputs.shape})")
    if outputs.shape[0] < 1:
        raise ValueError(f"outputs must hold at least one shard (got shape {outputs.shape})")
    if lses.shape != outputs.shape[:3]:
        raise ValueError(
            f"lses must be [N, B, H] = {outputs.shape[:3]} (got shape {lses.shape})")
    lse_float32_dtype(lses.dtype, "lses")
    if not (outputs.dtype.kind == "f" or is_bfloat16(outputs.dtype)):
        raise TypeError(f"outputs must be a float array (got dtype {outputs.dtype})")
    # float64 of either byte order gives float64 (native), as the docstring says
    result_dtype = np.float64 if outputs.dtype.kind == "f" and outputs.dtype.itemsize == 8 \
        else np.float32
    exp, log = (np.exp, np.log) if is_lse_base_on_e else (np.exp2, np.log2)

    lse = _clean_lse(lses)
    m = lse.max(axis=0)
    m[m == -np.inf] = 0.0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scaled = exp(lse - m)
        total = scaled.sum(axis=0)
        global_lse = log(total) + m
        # exp(l - m) / total, not exp(l - global_lse): where |m| is past about 4.5e15,
        # m + log(total) rounds to m in float64 and the weights would sum to N
        weights = scaled / total
        weights[np.isnan(weights)] = 0.0
        parts = outputs.astype(np.float64)
        terms = np.where(weights[..., None] == 0.0, 0.0, weights[..., None] * parts)
    result = terms.sum(axis=0).astype(result_dtype)
    if return_lse:
        return result, global_lse.astype(result_dtype)
    return result


def _lse_lanes(lse_bits, pack_dim, dtype):
    """The ``P`` lanes (in ``dtype``'s bits) that carry a float32 LSE's bits."""
    if pack_dim == 1:
        return lse_bits[..., None]
    low = (lse_bits & np.uint32(0xFFFF)).astype(np.uint16)
    high = (lse_bits >> np.uint32(16)).astype(np.uint16)
    return np.stack([low, high], axis=-1)


def pack_reference(out, lse, world_size, mask=None):
    """Lay out the send buffer exactly as the pack kernel must, bit for bit.

    Args:
        out: ``[B, H, D]`` float16, bfloat16 or float32; this rank's partials.
        lse: ``[B, H]`` float; converted to float32 (never reinterpreted).
        world_size: N, the number of ranks; must divide H.
        mask: optional ``[B]`` bool; True marks an empty row, whose LSE lanes
            carry -inf.

    Returns:
        ``send [N, B, H/N, D + P]`` in ``out``'s dtype, where
        ``send[r, b, h, :D] = out[b, r*H/N + h]`` and the trailing ``P`` lanes
        hold the bits of ``float32(lse[b, r*H/N + h])``.

    Raises:
        ValueError: a shape is not as above, ``D`` is below 1, N does not
            divide H (or is below 1), or a finite LSE is beyond float32's range
            (it would read as an empty shard's +inf).
        TypeError: ``lse`` not a float array, ``out`` of another dtype,
            ``mask`` not bool, or N not an integer.
    """
    out = np.asarray(host_view(out, "out"))
    lse = np.asarray(host_view(lse, "lse"))
    if out.ndim != 3:
        raise ValueError(f"out must be [B, H, D] (got shape {out.shape})")
    if not is_supported(out.dtype):
        raise TypeError(f"out dtype must be float16, bfloat16 or float32 (got {out.dtype})")
    B, H, D = out.shape
    if D < 1:
        raise ValueError(f"out's head size D must be >= 1 (got {D})")
    if lse.shape != (B, H):
        raise ValueError(f"lse must be [B, H] = {(B, H)} (got shape {lse.shape})")
    if mask is not None:
        mask = np.asarray(mask)
        if mask.shape != (B,):
            raise ValueError(f"mask must be [B] = {(B,)} (got shape {mask.shape})")
        if mask.dtype != np.bool_:
            raise TypeError(f"mask must be a bool array (got dtype {mask.dtype})")
    lse_float32_dtype(lse.dtype, "lse")
    check_lse_range(lse, "lse")
    check_heads(H, world_size)
    pack_dim = lse_pack_dim(out.dtype)
    ubits = bits_dtype(out.dtype)
    lse_bits = np.ascontiguousarray(np.asarray(lse, dtype=np.float32)).view(np.uint32).copy()
    if mask is not None:
        lse_bits[np.asarray(mask, dtype=bool)] = _NEG_INF_BITS
    data = np.ascontiguousarray(out).view(ubits)
    rows = np.concatenate([data, _lse_lanes(lse_bits, pack_dim, out.dtype)], axis=-1)
    hn = H // world_size
    send = rows.reshape(B, world_size, hn, D + pack_dim).transpose(1, 0, 2, 3)
    return np.ascontiguousarray(send).view(out.dtype)


def unpack_reference(recv, head_dim):
    """Split a received buffer into partials and LSEs.

    Args:
        recv: ``[N, B, H/N, D + P]`` float16, bfloat16 or float32.
        head_dim: D.

    Returns:
        ``(partials [N, B, H/N, D]`` in ``recv``'s dtype, ``lses [N, B, H/N]``
        float32).
    """
    recv = np.asarray(host_view(recv, "recv"))
    dtype = as_dtype(recv.dtype)
    pack_dim = lse_pack_dim(dtype)
    if recv.ndim != 4 or recv.shape[-1] != head_dim + pack_dim:
        raise ValueError(
            f"recv must be [N, B, H/N, {head_dim}+{pack_dim}] (got shape {recv.shape})")
    partials = recv[..., :head_dim].copy()
    lanes = np.ascontiguousarray(recv[..., head_dim:]).view(bits_dtype(dtype))
    if pack_dim == 1:
        lse_bits = lanes[..., 0].astype(np.uint32)
    else:
        lse_bits = lanes[..., 0].astype(np.uint32) | (lanes[..., 1].astype(np.uint32) << np.uint32(16))
    return partials, lse_bits.view(np.float32)
