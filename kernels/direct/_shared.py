"""What the direct kernels word by word and in lines share: packed rows as 32-bit
payload words, their LSE bits noted per (row, shard), and their combine.

A packed row of ``d_count`` elements (16-bit where ``halves``, else 32-bit)
followed by its LSE's bits (``_format``) is read as 32-bit payload words:
word ``w`` holds elements ``2w`` and ``2w + 1`` (the low half the first) of
16-bit data, element ``w`` of 32-bit data. The threads whose words hold a
row's LSE note its low and high 16 bits in ``lse_low[r, p]`` and
``lse_high[r, p]`` (shared memory, per row of the tile and shard); a row's
weights come from these notes.
"""

import functools
from types import SimpleNamespace

import numpy as np
from numba import cuda, float32

from .._device import device_functions, inline_device, row_weights_of
from .._format import LSE_HALF_BITS, LSE_HALF_MASK
from .._codecs import _F16, _F32, _BF16X2, codec_functions
from ._peers import rank_functions

__all__ = ["packed_words", "payload_combine"]

u64, u32 = np.uint64, np.uint32
u_one, u_two = u64(1), u64(2)
low16, sixteen, high16 = u32(0xFFFF), u32(16), u32(0xFFFF0000)
lse_mask, lse_shift = u32(LSE_HALF_MASK), u32(LSE_HALF_BITS)


@functools.cache
def packed_words(halves):
    """Device functions ``packed_element(src, i, bits, d_count)`` and
    ``packed_word(src, w, bits, d_count)`` (element i, 32-bit word w of the packed
    row of ``src`` whose LSE has the uint32 ``bits``) and ``note_word(lse_low,
    lse_high, r, p, w, word, d_count)`` (note the LSE bits that word w holds, if
    any), for 16-bit elements where ``halves``."""
    jit = cuda.jit(device=True)

    @jit
    def packed_element(src, i, bits, d_count):
        """Element i of a packed row (data, the LSE's bits, then zeros), as uint32."""
        if i < d_count:
            return u32(src[i])
        if halves:
            if i == d_count:
                return bits & lse_mask
            if i == d_count + u_one:
                return bits >> lse_shift
            return u32(0)
        return bits if i == d_count else u32(0)

    @jit
    def packed_word(src, w, bits, d_count):
        """32-bit word w of a packed row."""
        if halves:
            i = w * u_two
            return packed_element(src, i, bits, d_count) | (
                packed_element(src, i + u_one, bits, d_count) << sixteen)
        return packed_element(src, w, bits, d_count)

    @jit
    def note_word(lse_low, lse_high, r, p, w, word, d_count):
        """Note the halves of the LSE's bits that word w of a packed row holds, if any."""
        if halves:  # the word holds elements 2w (its low half) and 2w + 1
            e = w * u_two
            if e == d_count:
                lse_low[r, p] = word & lse_mask
                lse_high[r, p] = word >> lse_shift
            elif e + u_one == d_count:
                lse_low[r, p] = word >> lse_shift
            elif e == d_count + u_one:
                lse_high[r, p] = word & lse_mask
        elif w == d_count:
            lse_low[r, p] = word & lse_mask
            lse_high[r, p] = word >> lse_shift

    return SimpleNamespace(packed_element=packed_element, packed_word=packed_word,
                           note_word=note_word)


@functools.cache
def payload_combine(codec, n):
    """Device functions of ``n`` ranks combining payload words into an output of
    codec ``codec``: ``noted_lse``, ``value_low``, ``value_high``, ``store_word``,
    ``row_weights``, ``weigh_words`` and ``nan_row`` (each documented below)."""
    f = device_functions()
    encode = codec_functions(codec)[4]
    shard_rank = rank_functions().shard_rank
    global_lse, shard_weight = f["global_lse"], f["shard_weight"]
    zero, nan = f["zero"], float32(np.nan)
    as_float, f16_to_f32_bits = f["as_float"], f["f16_to_f32_bits"]
    # output words of two values; of one; float16 values
    pairs, wide, f16 = codec == _BF16X2, codec == _F32, codec == _F16
    jit = cuda.jit(device=True)

    @jit
    def noted_lse(lse_low, lse_high, r, p):
        return as_float(lse_low[r, p] | (lse_high[r, p] << lse_shift))

    @jit
    def value_low(word):
        """The first (or only) value of a 32-bit payload word, in float32."""
        if wide:
            return as_float(word)
        if f16:
            return as_float(f16_to_f32_bits(word & low16))
        return as_float(word << sixteen)

    @jit
    def value_high(word):
        """The second value of a 32-bit payload word of 16-bit values."""
        if f16:
            return as_float(f16_to_f32_bits(word >> sixteen))
        return as_float(word & high16)

    @jit
    def store_word(dst, w, low, high, d_values):
        """The values of payload word w, rounded once, into the output row."""
        if pairs:
            if w * u_two < d_values:
                dst[w] = encode(low, high)
        elif wide:
            if w < d_values:
                dst[w] = encode(low, low)
        else:
            if w * u_two < d_values:
                dst[w * u_two] = encode(low, low)
            if w * u_two + u_one < d_values:
                dst[w * u_two + u_one] = encode(high, high)

    @inline_device
    def noted(notes, p):
        return noted_lse(notes[0], notes[1], notes[2], p)

    weigh = row_weights_of(noted, own_first=True)

    @jit
    def row_weights(weights, lse_low, lse_high, r, b, h, out_lse, write_lse, base_e, me):
        """Row r's (token b, local head h) weight of each shard (this rank's own first,
        then the peers in rank order) into ``weights``, from the LSEs as noted; its
        global LSE into ``out_lse`` if ``write_lse``."""
        own = noted_lse(lse_low, lse_high, r, me)
        m, inv_total, total = weigh((lse_low, lse_high, r), own, me, n, base_e)
        if write_lse:
            out_lse[b, h] = global_lse(total, m, base_e)
        for k in range(n):
            weights[k] = shard_weight(noted_lse(lse_low, lse_high, r, shard_rank(k, me)), m,
                                      inv_total, base_e)

    @jit
    def weigh_words(pay, at, per, weights, b, h, wb, nw, out, d_values):
        """Payload words ``wb`` to ``wb + nw`` (at most 4) of row (b, h), combined with
        the shards' ``weights``: shard k's in ``pay[at + per * k:]``."""
        dst = out[b, h]
        for q in range(4):
            w = wb + u64(q)
            if u64(q) >= nw or (w if wide else w * u_two) >= d_values:  # the LSE or padding
                continue
            low = zero
            high = zero
            for k in range(n):
                if weights[k] != zero:  # a zero weight adds nothing, even NaN
                    word = pay[at + per * k + q]
                    low += weights[k] * value_low(word)
                    if not wide:
                        high += weights[k] * value_high(word)
            store_word(dst, w, low, high, d_values)

    @jit
    def nan_row(b, h, wb, nw, out, d_values):
        dst = out[b, h]
        for q in range(4):
            if u64(q) < nw:
                store_word(dst, wb + u64(q), nan, nan, d_values)

    return SimpleNamespace(noted_lse=noted_lse, value_low=value_low, value_high=value_high,
                           store_word=store_word, row_weights=row_weights,
                           weigh_words=weigh_words, nan_row=nan_row)
