"""A group of one on the device: the rules of a larger group, without a kernel of its own.

With one shard, the combine keeps a row's partial as it is (its weight is 1)
and its LSE, except where the row is empty: a NaN or infinite LSE, an empty
sequence or a padding token gives output 0 and LSE -inf, and a partial of
-0.0 becomes +0.0 (the combine's sum starts from +0.0). Written against the
array API that NumPy and CuPy share, so that the host tests check the same
function the device runs; on the device every step is a kernel on the
current stream (no host synchronisation).
"""

import numpy as np

__all__ = ["empty_rows", "single_combine"]


def empty_rows(xp, lse32, seq_lens=None, query_start_loc=None):
    """``[B, H]`` bool: the (token, head) rows a group of one leaves empty."""
    empty = xp.isnan(lse32) | xp.isinf(lse32)  # -inf: a shard with no scores
    if seq_lens is None:
        return empty
    tokens = lse32.shape[0]
    starts = query_start_loc.astype(np.int64)
    lengths = seq_lens.astype(np.int64)
    token = xp.arange(tokens, dtype=np.int64)
    outside = (token < starts[0]) | (token >= starts[-1])
    if lengths.shape[0] == 0:
        return empty | outside[:, None]
    # the last sequence whose start is <= the token, as the kernels' binary search finds it
    seq = xp.clip(xp.searchsorted(starts[:-1], token, side="right") - 1, 0, lengths.shape[0] - 1)
    return empty | (outside | (lengths[seq] <= 0))[:, None]


def single_combine(xp, x_bits, lse32, seq_lens=None, query_start_loc=None):
    """``(result bits [B, H, D], global LSE [B, H] float32)`` of a group of one.

    ``x_bits``: the partials' bit patterns (uint16 or uint32), ``lse32``: float32.
    """
    empty = empty_rows(xp, lse32, seq_lens, query_start_loc)
    sign = x_bits.dtype.type(1 << (8 * x_bits.dtype.itemsize - 1))
    zero = empty[..., None] | (x_bits == sign)
    result = xp.where(zero, x_bits.dtype.type(0), x_bits).astype(x_bits.dtype)
    return result, xp.where(empty, np.float32(-np.inf), lse32).astype(np.float32)
