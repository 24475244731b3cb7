"""The codecs of the combine kernels: how a kernel sees, decodes and encodes values.

A codec names how an output dtype's values are loaded, turned into float32 and
written back: float32 as it is, float16 value by value or in pairs (one uint32
word of two values), bfloat16 as its bits (uint16) or in pairs. The received
buffer is seen twice: as values (:data:`RAW`) and as bits (:data:`RAW_BITS`,
to read the LSE lanes).
"""

import functools

import numpy as np
from numba import cuda, float32, uint32

from ._device import device_functions
from ._format import LSE_HALF_BITS, LSE_HALF_MASK, is_bfloat16

__all__ = ["PAIRS", "RAW", "RAW_BITS", "codec_functions", "combine_codec"]


_F32, _F16, _BF16, _BF16X2 = "float32", "float16", "bfloat16", "bfloat16x2"
_F16X2 = "float16x2"
RAW = {_F32: np.float32, _F16: np.float16, _BF16: np.uint16, _BF16X2: np.uint32,
       _F16X2: np.uint32}  # as loaded
PAIRS = (_BF16X2, _F16X2)  # codecs whose uint32 words hold two values
RAW_BITS = {codec: np.dtype(np.uint32 if np.dtype(raw).itemsize == 4 else np.uint16)
            for codec, raw in RAW.items()}  # the buffer seen as bits


@functools.cache
def codec_functions(codec):
    """Device functions that decode the low and high value of a loaded word, encode
    one output word from two accumulators, and read one shard's LSE."""
    f = device_functions()
    as_float = f["as_float"]
    bf16_to_f32_bits, pack_bf16x2 = f["bf16_to_f32_bits"], f["pack_bf16x2"]
    pack_f16x2, f16_low, f16_high = f["pack_f16x2"], f["f16_low"], f["f16_high"]
    low16, high16, sixteen = np.uint32(0xFFFF), np.uint32(0xFFFF0000), np.uint32(16)
    lse_mask, lse_shift = np.uint32(LSE_HALF_MASK), np.uint32(LSE_HALF_BITS)
    jit = cuda.jit(device=True)

    # ``lse_lanes(vals, bits, b, h, width)`` gives the row's LSE lanes as views over the
    # ranks (the low and high half for 16-bit outputs); ``load_lse(low, high, r)`` reads one.
    if codec in (_F32,) + PAIRS:
        @jit
        def lse_lanes(vals, bits, b, h, width):
            lanes = vals[:, b, h, width - 1]
            return lanes, lanes
    else:
        @jit
        def lse_lanes(vals, bits, b, h, width):
            return bits[:, b, h, width - 2], bits[:, b, h, width - 1]

    if codec == _F32:
        @jit
        def load_lse(low, high, r):
            return low[r]

        @jit
        def decode_lo(x):
            return x

        @jit
        def encode(lo, hi):
            return lo
    elif codec in PAIRS:  # one uint32 word: two 16-bit values, or the LSE's bits
        @jit
        def load_lse(low, high, r):
            return as_float(uint32(low[r]))

        if codec == _BF16X2:
            @jit
            def decode_lo(x):
                return as_float(uint32((uint32(x) & low16) << sixteen))

            @jit
            def encode(lo, hi):  # one cvt.rn.bf16x2.f32 (the sums' NaN is the canonical one)
                return pack_bf16x2(lo, hi)
        else:
            @jit
            def decode_lo(x):
                return f16_low(x)

            @jit
            def decode_hi(x):
                return f16_high(x)

            @jit
            def encode(lo, hi):  # one cvt.rn.f16x2.f32, as the float16 stores round
                return pack_f16x2(lo, hi)
    else:
        @jit
        def load_lse(low, high, r):
            return as_float(uint32((uint32(low[r]) & lse_mask)
                                   | ((uint32(high[r]) & lse_mask) << lse_shift)))

        if codec == _F16:
            @jit
            def decode_lo(x):
                return float32(x)

            @jit
            def encode(lo, hi):
                return lo  # the float16 store rounds to nearest even
        else:
            @jit
            def decode_lo(x):
                return as_float(uint32(bf16_to_f32_bits(x)))

            @jit
            def encode(lo, hi):
                return pack_bf16x2(lo, lo) & low16

    if codec != _F16X2:
        @jit
        def decode_hi(x):
            return as_float(uint32(uint32(x) & high16))

    return lse_lanes, load_lse, decode_lo, decode_hi, encode


def combine_codec(dtype, pairs=False):
    """The codec (how the kernels decode and encode values) for output ``dtype``,
    and the dtype it sees values as.

    ``pairs``: bfloat16 or float16 read and written as uint32 words of two values
    (when ``D`` is even and the output's rows are contiguous and 4-byte aligned).
    """
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return _F32, dtype
    if dtype == np.float16:
        return (_F16X2, np.dtype(np.uint32)) if pairs else (_F16, dtype)
    if not is_bfloat16(dtype):
        raise TypeError(f"output dtype must be float16, bfloat16 or float32 (got {dtype})")
    if pairs:
        return _BF16X2, np.dtype(np.uint32)
    return _BF16, np.dtype(np.uint16)
