"""The combine math of one (token, head) row, written once for every target.

``build_math(ftype, jit)`` compiles these scalar functions with ``jit`` (Numba's
``njit`` for the host kernels, ``cuda.jit(device=True)`` for the CUDA kernels)
in the float type ``ftype`` (float64 on the host, float32 on the GPU). Every
constant is typed through ``ftype`` so that no float32 kernel silently widens
to float64.

For a row with shard LSEs ``l_r`` (NaN and +inf cleaned to -inf):

- ``m = max_r l_r``, 0 when every shard is empty;
- ``s = sum_r exp(l_r - m)``;
- the global LSE ``G = log(s) + m``, -inf when ``s == 0``;
- the weight ``w_r = exp(l_r - m) / s``, which equals ``exp(l_r - G)`` but
  keeps full precision when the LSEs are large (``l_r - m`` is exact, while
  ``G`` rounded to float32 near 3000 is off by 1e-4); every weight is 0 when
  every shard is empty.

A shard with weight 0 adds exactly 0 to the output, even when its partial is
NaN or inf: callers test ``w != 0`` before they multiply.

The bfloat16 helpers work on bit patterns with integer operations only, so the
same source runs in ``njit``, in compiled CUDA and in the CUDA simulator.
"""

import math
from types import SimpleNamespace

import numpy as np

__all__ = ["NEG_INF_BITS", "build_bits", "build_held_weights", "build_mask", "build_mask_steps",
           "build_math", "build_row_weights"]

NEG_INF_BITS = 0xFF800000
_LN2 = math.log(2.0)


def build_math(ftype, jit):
    """Compile the row math for float type ``ftype`` with decorator ``jit``."""
    zero, one = ftype(0), ftype(1)
    neg_inf, pos_inf = ftype(-np.inf), ftype(np.inf)
    ln2, inv_ln2 = ftype(_LN2), ftype(1.0 / _LN2)
    has_exp2 = hasattr(math, "exp2")

    @jit
    def clean_lse(lse):
        if lse != lse or lse == pos_inf:
            return neg_inf
        return lse

    @jit
    def finish_max(m):
        if m == neg_inf:
            return zero
        return m

    if has_exp2:
        @jit
        def lse_exp(x, base_e):
            if base_e:
                return math.exp(x)
            return math.exp2(x)

        @jit
        def lse_log(x, base_e):
            if base_e:
                return math.log(x)
            return math.log2(x)
    else:  # Python 3.10: math has no exp2 (nor does the CUDA simulator there)
        @jit
        def lse_exp(x, base_e):
            if base_e:
                return math.exp(x)
            return math.exp(x * ln2)

        @jit
        def lse_log(x, base_e):
            if base_e:
                return math.log(x)
            return math.log(x) * inv_ln2

    @jit
    def inverse_total(total):
        if total > zero:
            return one / total
        return zero

    @jit
    def global_lse(total, m, base_e):
        if total > zero:
            return lse_log(total, base_e) + m
        return neg_inf

    @jit
    def shard_weight(lse, m, inv_total, base_e):
        return lse_exp(clean_lse(lse) - m, base_e) * inv_total

    return SimpleNamespace(
        clean_lse=clean_lse, finish_max=finish_max, lse_exp=lse_exp,
        lse_log=lse_log, inverse_total=inverse_total, global_lse=global_lse,
        shard_weight=shard_weight, zero=zero, neg_inf=neg_inf)


def build_row_weights(math, inline_jit, lse_of, own_first=False):
    """Compile, with ``inline_jit`` (a decorator that inlines at Numba's IR level:
    ``inline="always"``, so the weights cost no call), the weights of one row from
    ``math`` (:func:`build_math`): ``row_weights(lses, count, base_e) -> (m,
    inv_total, total)``, ``m`` the rows' max LSE (0 when every shard is empty),
    ``total`` the sum of ``exp(l - m)`` and ``inv_total`` its inverse (0 when 0),
    over the shards ``k < count`` whose LSE is ``lse_of(lses, k)`` (an inlined
    function too), in that order. ``own_first``: ``row_weights(lses, own, me,
    count, base_e)`` instead, its own shard's LSE ``own`` first and then every
    shard ``k != me``; the weights are the same, the sums' rounding follows the
    order. Every kernel (host twins, combine, AG+RS, every direct protocol) takes
    its weights from here: the shard weight is then ``math.shard_weight(l, m,
    inv_total, base_e)`` and the global LSE ``math.global_lse(total, m, base_e)``.
    """
    clean_lse, finish_max, lse_exp = math.clean_lse, math.finish_max, math.lse_exp
    inverse_total, zero, neg_inf = math.inverse_total, math.zero, math.neg_inf

    if own_first:
        @inline_jit
        def row_weights(lses, own, me, count, base_e):
            m = clean_lse(own)
            for p in range(count):
                if p != me:
                    m = max(m, clean_lse(lse_of(lses, p)))
            m = finish_max(m)
            total = lse_exp(clean_lse(own) - m, base_e)
            for p in range(count):
                if p != me:
                    total += lse_exp(clean_lse(lse_of(lses, p)) - m, base_e)
            return m, inverse_total(total), total
    else:
        @inline_jit
        def row_weights(lses, count, base_e):
            m = neg_inf
            for r in range(count):
                m = max(m, clean_lse(lse_of(lses, r)))
            m = finish_max(m)
            total = zero
            for r in range(count):
                total += lse_exp(clean_lse(lse_of(lses, r)) - m, base_e)
            return m, inverse_total(total), total

    return row_weights


def build_held_weights(math, inline_jit):
    """Compile, with ``inline_jit``, ``held_weights(lses, weights, count, base_e) -> (m,
    total)``: for LSEs held in ``lses[:count]`` (a local array), write every shard's
    weight into ``weights[:count]`` and return the row's max LSE and sum, each
    ``exp`` computed once. The same operations in the same order as
    :func:`build_row_weights`' ``row_weights`` followed by ``math.shard_weight`` per
    shard, so the same bits; for kernels that hold a row's LSEs in registers."""
    clean_lse, finish_max, lse_exp = math.clean_lse, math.finish_max, math.lse_exp
    inverse_total, zero, neg_inf = math.inverse_total, math.zero, math.neg_inf

    @inline_jit
    def held_weights(lses, weights, count, base_e):
        m = neg_inf
        for r in range(count):
            m = max(m, clean_lse(lses[r]))
        m = finish_max(m)
        total = zero
        for r in range(count):
            weights[r] = lse_exp(clean_lse(lses[r]) - m, base_e)
            total += weights[r]
        inv_total = inverse_total(total)
        for r in range(count):
            weights[r] = weights[r] * inv_total
        return m, total

    return held_weights


def build_bits(jit):
    """Compile the bfloat16 <-> float32 and float16 -> float32 bit conversions with
    decorator ``jit``."""
    u32 = np.uint32
    abs_mask, inf_bits, quiet = u32(0x7FFFFFFF), u32(0x7F800000), u32(0x00400000)
    half_minus_one, one_bit = u32(0x7FFF), u32(1)
    sixteen, low16 = u32(16), u32(0xFFFF)
    f16_sign, f16_top, f16_fraction, f16_lead = u32(0x8000), u32(0x1F), u32(0x3FF), u32(0x400)
    ten, thirteen, twenty_three = u32(10), u32(13), u32(23)
    rebias, subnormal_exponent = u32(127 - 15), u32(127 - 14)

    @jit
    def bf16_to_f32_bits(bits):
        """bfloat16 bits (any unsigned int) -> float32 bits."""
        return (u32(bits) & low16) << sixteen

    @jit
    def f32_to_bf16_bits(bits):
        """float32 bits -> bfloat16 bits, rounded to nearest even; NaN stays NaN.
        In 32 bits and without a branch: no rounding of a non-NaN carries past bit 31
        (-inf, the largest, becomes 0xFF807FFF)."""
        bits = u32(bits)
        rounded = u32(bits + half_minus_one + ((bits >> sixteen) & one_bit)) >> sixteen
        quieted = (bits | quiet) >> sixteen
        return quieted if (bits & abs_mask) > inf_bits else rounded

    @jit
    def f16_to_f32_bits(bits):
        """float16 bits (the low 16 of any unsigned int) -> float32 bits, exactly
        (every float16 is a float32; a NaN keeps its payload)."""
        bits = u32(bits)
        sign = (bits & f16_sign) << sixteen
        exponent = (bits >> ten) & f16_top
        fraction = bits & f16_fraction
        if exponent == f16_top:  # inf or NaN
            return sign | inf_bits | (fraction << thirteen)
        if exponent == u32(0):
            if fraction == u32(0):
                return sign
            exponent = subnormal_exponent  # normalise: 0.f * 2**-14 = 1.g * 2**-(14 + s)
            while (fraction & f16_lead) == u32(0):
                fraction = fraction << one_bit
                exponent -= one_bit
            return sign | (exponent << twenty_three) | ((fraction & f16_fraction) << thirteen)
        return sign | ((exponent + rebias) << twenty_three) | (fraction << thirteen)

    return SimpleNamespace(bf16_to_f32_bits=bf16_to_f32_bits,
                           f32_to_bf16_bits=f32_to_bf16_bits, f16_to_f32_bits=f16_to_f32_bits)


def build_mask_steps(jit):
    """Compile :func:`build_mask`'s ``row_is_empty`` in its two steps, with decorator
    ``jit``: ``mask_fetch(b, seq_lens, query_start_loc, num_seqs) -> fetched`` (the
    guess's loads; none without a mask) and ``mask_decide(b, fetched, seq_lens,
    query_start_loc, num_seqs) -> bool``. A kernel that holds two rows fetches
    both rows' words before its stores and decides each after them, so that
    neither row's stores wait on a mask."""

    @jit
    def mask_fetch(b, seq_lens, query_start_loc, num_seqs):
        if num_seqs <= 0:
            return np.int64(0), np.int64(0), np.int64(0)
        # unsigned indices: no negative-index wraparound to compute before the loads
        guess = np.uint64(min(max(b, 0), num_seqs - 1))
        return seq_lens[guess], query_start_loc[guess], query_start_loc[guess + np.uint64(1)]

    @jit
    def mask_decide(b, fetched, seq_lens, query_start_loc, num_seqs):
        if num_seqs <= 0:  # no mask; or no sequence, so that every token is padding
            return num_seqs == 0
        guessed_len, start, after = fetched
        last = num_seqs - 1
        found = (start <= b) & (b < after)
        past = (min(max(b, 0), last) == last) & (b >= after)  # at or past the batch's end
        empty = past | (guessed_len <= 0)
        if not (found | past):  # the guess missed
            first, end = query_start_loc[np.uint64(0)], query_start_loc[np.uint64(num_seqs)]
            if (b < first) | (b >= end):
                empty = True
            else:
                lo = 0
                hi = last
                while lo < hi:  # the last sequence whose start is <= b
                    mid = (lo + hi + 1) // 2
                    if query_start_loc[mid] <= b:
                        lo = mid
                    else:
                        hi = mid - 1
                empty = seq_lens[lo] <= 0
        return empty

    return mask_fetch, mask_decide


def build_mask(jit, steps=None):
    """Compile ``row_is_empty``: does token ``b`` have no KV on this rank?
    ``steps``: :func:`build_mask_steps`' pair, already built with ``jit``, to
    compose (built here by default).

    ``seq_lens [S]`` and ``query_start_loc [S+1]`` describe the batch; with
    ``num_seqs < 0`` nothing is masked. A token is empty when it lies outside
    ``[query_start_loc[0], query_start_loc[S])`` (padding) or when its
    sequence's ``seq_lens`` is 0.

    Token ``b``'s sequence is the last ``s`` with ``query_start_loc[s] <= b``.
    Decode batches hold one token a sequence from 0 (``query_start_loc[s] = s``),
    so ``s = b`` (the last sequence for ``b >= S``) is tried first: its two
    starts and its length load together, one round trip in all. Starts never
    decrease, so a token within the guess's starts is within the batch's
    bounds, and one at or past the last sequence's end is padding: only a guess
    that misses reads the bounds, and pays the binary search's dependent loads.
    The guess is judged with ``|`` and ``&``, not ``or`` and ``and``: a short
    circuit would let the compiler issue each load only after the test before
    it has its answer, a round trip apiece.
    """

    mask_fetch, mask_decide = steps or build_mask_steps(jit)

    @jit
    def row_is_empty(b, seq_lens, query_start_loc, num_seqs):
        return mask_decide(b, mask_fetch(b, seq_lens, query_start_loc, num_seqs), seq_lens,
                           query_start_loc, num_seqs)

    return row_is_empty
