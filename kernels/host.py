"""Host (Numba ``njit``) twins of the pack and combine kernels.

They share the row math of ``_math`` with the CUDA kernels and work on NumPy
arrays: ``pack_host`` on bit patterns, ``combine_host`` on float32 partials
accumulated in float64. Compiled lazily, on first use, and kept in the
kernel cache (``_cache``): a later process loads them instead.
"""

import functools

import numpy as np
from numba import njit, prange

from ._cache import cached_njit
from ._format import (LSE_HALF_BITS, LSE_HALF_MASK, WRITES_BOTH, check_flag,
                      check_not_overlapping, check_rank, views_share)
from ._math import NEG_INF_BITS, build_mask, build_math, build_row_weights
from ._specs import check_mask_arrays

__all__ = ["agrs_correct_host", "agrs_lse_host", "combine_host", "mask_lse_host", "pack_host"]

_EMPTY_INDEX = np.zeros(1, dtype=np.int64)


PARALLEL_MIN_ELEMENTS = 1 << 21  # below this, threads cost more than they save


@functools.cache
def _host_math():
    """The shared row math in float64, and ``row_weights(lses_of_row) -> (m,
    inv_total, total)`` (``_math.build_row_weights``)."""
    jit = njit(cache=False, error_model="numpy")
    m = build_math(np.float64, jit)
    inline = njit(cache=False, error_model="numpy", inline="always")

    @inline
    def gathered(lses, r):
        return np.float64(lses[r])

    weigh = build_row_weights(m, inline, gathered)

    @jit
    def row_weights(lses, base_e):
        return weigh(lses, lses.shape[0], base_e)

    return m, build_mask(jit), row_weights


@functools.cache
def _compiled(parallel):
    m, row_is_empty, row_weights = _host_math()
    neg_inf_bits = np.uint32(NEG_INF_BITS)
    lse_mask, lse_shift = np.uint32(LSE_HALF_MASK), np.uint32(LSE_HALF_BITS)
    global_lse, shard_weight, zero = m.global_lse, m.shard_weight, m.zero

    @cached_njit(parallel=parallel, error_model="numpy")
    def pack(data, lse_bits, seq_lens, query_start_loc, num_seqs, send):
        n, b_count, hn, width = send.shape
        d_count = data.shape[2]
        for row in prange(n * b_count * hn):
            r = row // (b_count * hn)
            b = (row // hn) % b_count
            h = row % hn
            head = r * hn + h
            for d in range(d_count):
                send[r, b, h, d] = data[b, head, d]
            bits = lse_bits[b, head]
            if row_is_empty(b, seq_lens, query_start_loc, num_seqs):
                bits = neg_inf_bits
            if width - d_count == 1:
                send[r, b, h, d_count] = bits
            else:
                send[r, b, h, d_count] = bits & lse_mask
                send[r, b, h, d_count + 1] = bits >> lse_shift

    @cached_njit(parallel=parallel, error_model="numpy")
    def combine(parts, lses, out, out_lse, base_e):
        n, b_count, hn, d_count = parts.shape
        for row in prange(b_count * hn):
            b = row // hn
            h = row % hn
            m, inv_total, total = row_weights(lses[:, b, h], base_e)
            out_lse[b, h] = global_lse(total, m, base_e)
            for d in range(d_count):
                out[b, h, d] = zero
            for r in range(n):
                w = shard_weight(np.float64(lses[r, b, h]), m, inv_total, base_e)
                if w != zero:
                    for d in range(d_count):
                        out[b, h, d] += w * parts[r, b, h, d]

    return pack, combine


_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))  # the twins' float inputs
_SUMS = (np.dtype(np.float64),)  # the twins' float results: float64 sums


def _check(name, arr, shape, kinds, dtypes=None):
    """``arr`` must be a NumPy array of ``shape`` whose dtype kind is in ``kinds`` (and,
    where ``dtypes`` is given, one of them): the twins are Numba code without bounds
    checks, so a wrong size reads or writes past an array instead of raising."""
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array (got {type(arr).__name__})")
    if arr.shape != tuple(int(e) for e in shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} (got {arr.shape})")
    if arr.dtype.kind not in kinds:
        raise TypeError(f"{name} has dtype {arr.dtype}, not one of the kinds {kinds!r}")
    if dtypes is not None and arr.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(map(str, dtypes))} in the "
                        f"machine's byte order (got {arr.dtype.str})")


def _check_written(name, arr):
    """An array a twin writes (``arr``, checked by :func:`_check`): writeable, and no
    two of its elements in the same memory (the README's rule for written arrays; the
    twins' threads would race on them)."""
    if not arr.flags.writeable:
        raise ValueError(f"{name} must be writeable (got a read-only array)")
    check_not_overlapping(arr.shape, arr.strides, arr.itemsize, name)


def _check_results_apart(out, out_lse):
    """``ValueError`` where the two results of one call share memory (as
    ``check_apart`` judges the kernels' results)."""
    if views_share(out, out_lse):
        raise ValueError(f"out_lse shares memory with out: {WRITES_BOTH}")


def _mask_args(seq_lens, query_start_loc):
    """The twins' mask arguments, checked as ``pack_send`` checks them, and host arrays."""
    check_mask_arrays(seq_lens, query_start_loc)
    if seq_lens is None:
        return _EMPTY_INDEX, _EMPTY_INDEX, -1
    for name, index in (("seq_lens", seq_lens), ("query_start_loc", query_start_loc)):
        if not isinstance(index, np.ndarray):
            raise TypeError(f"{name} must be a NumPy array (got {type(index).__name__})")
    return (np.ascontiguousarray(seq_lens, dtype=np.int64),
            np.ascontiguousarray(query_start_loc, dtype=np.int64), len(seq_lens))


def pack_host(data_bits, lse_bits, send_bits, seq_lens=None, query_start_loc=None):
    """Fill ``send_bits [N, B, H/N, D+P]`` from ``data_bits [B, H, D]``.

    Args:
        data_bits: ``[B, H, D]`` uint16 or uint32, any strides; the partials'
            bit patterns.
        lse_bits: ``[B, H]`` uint32; the float32 LSEs' bit patterns.
        send_bits: ``[N, B, H/N, D+P]`` of ``data_bits``'s dtype, written.
        seq_lens, query_start_loc: optional ``[S]`` and ``[S+1]`` integer
            NumPy arrays, both or neither (``ValueError``, ``TypeError``, as
            ``pack_send``); rows of empty sequences and padding rows get LSE -inf.
    """
    if not isinstance(data_bits, np.ndarray) or data_bits.ndim != 3 or \
            data_bits.dtype not in (np.uint16, np.uint32):
        raise TypeError("data_bits must be a [B, H, D] NumPy array of uint16 or uint32 bits")
    b, h, d = data_bits.shape
    if not isinstance(send_bits, np.ndarray) or send_bits.ndim != 4 or send_bits.shape[0] < 1 \
            or h % send_bits.shape[0]:
        raise ValueError(f"send_bits must be [N, B, H/N, D+P] with N dividing H = {h}")
    n, pack_dim = send_bits.shape[0], 2 if data_bits.dtype == np.uint16 else 1
    _check("lse_bits", lse_bits, (b, h), "u")
    if lse_bits.dtype != np.uint32:
        raise TypeError(f"lse_bits must be uint32 (got {lse_bits.dtype})")
    _check("send_bits", send_bits, (n, b, h // n, d + pack_dim), "u")
    if send_bits.dtype != data_bits.dtype:
        raise TypeError(f"send_bits must have data_bits' dtype {data_bits.dtype} "
                        f"(got {send_bits.dtype})")
    _check_written("send_bits", send_bits)
    pack, _ = _compiled(send_bits.size >= PARALLEL_MIN_ELEMENTS)
    pack(data_bits, lse_bits, *_mask_args(seq_lens, query_start_loc), send_bits)


def combine_host(parts, lses, out, out_lse, is_lse_base_on_e=True):
    """Exact combine of ``parts [N, B, H/N, D]`` float32 weighted by ``lses [N, B, H/N]``.

    Writes ``out [B, H/N, D]`` and ``out_lse [B, H/N]``, both float64;
    ``is_lse_base_on_e`` must be ``True`` or ``False`` (``TypeError``), as in every
    twin that takes it. The inputs may be float64 too; other dtypes are refused
    (``TypeError``), and so are results that are read-only, have two elements in
    the same memory or share memory with each other (``ValueError``).
    """
    if not isinstance(parts, np.ndarray) or parts.ndim != 4:
        raise ValueError("parts must be a [N, B, H/N, D] NumPy array")
    n, b, hn, d = parts.shape
    _check("parts", parts, (n, b, hn, d), "f", _FLOATS)
    _check("lses", lses, (n, b, hn), "f", _FLOATS)
    _check("out", out, (b, hn, d), "f", _SUMS)
    _check("out_lse", out_lse, (b, hn), "f", _SUMS)
    _check_written("out", out)
    _check_written("out_lse", out_lse)
    _check_results_apart(out, out_lse)
    _, combine = _compiled(parts.size >= PARALLEL_MIN_ELEMENTS)
    combine(parts, lses, out, out_lse, check_flag(is_lse_base_on_e, "is_lse_base_on_e"))


@functools.cache
def _compiled_agrs():
    m, row_is_empty, row_weights = _host_math()
    global_lse, shard_weight, zero = m.global_lse, m.shard_weight, m.zero

    @cached_njit(error_model="numpy")
    def mask(lse, seq_lens, query_start_loc, num_seqs):
        for b in range(lse.shape[0]):
            if row_is_empty(b, seq_lens, query_start_loc, num_seqs):
                lse[b, :] = -np.inf

    @cached_njit(error_model="numpy")
    def correct(data, lses, self_rank, base_e, corrected):
        n, b_count, hn, d_count = corrected.shape
        for b in range(b_count):
            for head in range(n * hn):
                top, inv_total, _ = row_weights(lses[:, b, head], base_e)
                w = shard_weight(np.float64(lses[self_rank, b, head]), top, inv_total, base_e)
                for d in range(d_count):
                    corrected[head // hn, b, head % hn, d] = w * data[b, head, d] if w != zero else zero

    @cached_njit(error_model="numpy")
    def local_lse(lses, self_rank, hn, base_e, out_lse):
        for b in range(out_lse.shape[0]):
            for h in range(hn):
                top, _, total = row_weights(lses[:, b, self_rank * hn + h], base_e)
                out_lse[b, h] = global_lse(total, top, base_e)

    return mask, correct, local_lse


def mask_lse_host(lse, seq_lens, query_start_loc):
    """Set, in place, the LSE ``[B, H]`` of empty and padding tokens to -inf."""
    mask = _mask_args(seq_lens, query_start_loc)
    if seq_lens is not None:
        if not isinstance(lse, np.ndarray) or lse.ndim != 2 or lse.dtype.kind != "f":
            raise ValueError("lse must be a [B, H] float NumPy array")
        _check("lse", lse, lse.shape, "f", _FLOATS)
        _check_written("lse", lse)
        _compiled_agrs()[0](lse, *mask)


def agrs_correct_host(data, lses, self_rank, corrected, is_lse_base_on_e=True):
    """AG+RS correction: ``corrected[r, b, h] = w_self * data[b, r*H/N + h]`` (float64).

    ``data [B, H, D]`` float32, ``lses [N, B, H]`` float32 (every rank's), and
    ``w_self`` this rank's exact weight (0 for an empty shard: its term is 0). The
    inputs may be float64 too, and ``corrected`` must be float64, writeable, with no
    two elements in the same memory.
    """
    if not isinstance(lses, np.ndarray) or lses.ndim != 3 or lses.shape[0] < 1 or \
            lses.shape[2] % lses.shape[0]:
        raise ValueError("lses must be a [N, B, H] NumPy array, N dividing H")
    n, b, h = lses.shape
    _check("lses", lses, (n, b, h), "f", _FLOATS)
    if not isinstance(data, np.ndarray) or data.ndim != 3:
        raise ValueError("data must be a [B, H, D] NumPy array")
    _check("data", data, (b, h, data.shape[2]), "f", _FLOATS)
    _check("corrected", corrected, (n, b, h // n, data.shape[2]), "f", _SUMS)
    _check_written("corrected", corrected)
    check_rank(self_rank, n)
    base_e = check_flag(is_lse_base_on_e, "is_lse_base_on_e")
    _compiled_agrs()[1](data, lses, int(self_rank), base_e, corrected)


def agrs_lse_host(lses, self_rank, local_heads, out_lse, is_lse_base_on_e=True):
    """The global LSE ``out_lse [B, H/N]`` (float64, writeable, no two elements in the
    same memory) of this rank's heads from ``lses [N, B, H]`` (float32 or float64)."""
    if not isinstance(lses, np.ndarray) or lses.ndim != 3 or \
            lses.shape[2] != lses.shape[0] * int(local_heads):
        raise ValueError(f"lses must be a [N, B, H] NumPy array with H = N * local_heads "
                         f"({local_heads})")
    _check("lses", lses, lses.shape, "f", _FLOATS)
    _check("out_lse", out_lse, (lses.shape[1], int(local_heads)), "f", _SUMS)
    _check_written("out_lse", out_lse)
    check_rank(self_rank, lses.shape[0])
    base_e = check_flag(is_lse_base_on_e, "is_lse_base_on_e")
    _compiled_agrs()[2](lses, int(self_rank), int(local_heads), base_e, out_lse)
