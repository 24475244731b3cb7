"""The combine kernel: the exact LSE-weighted sum of the N received partials.

For each (token, local head) row, one warp reads the N LSEs from the packed
lanes, computes the weights of ``_math`` in float32 into shared memory, then
each lane accumulates ``UNROLL`` output elements in float32 (a zero-weight
shard is skipped, so its NaN or inf never reaches the sum) and rounds them
once to the output dtype: round to nearest even, NaN kept NaN.

The received buffer is seen twice: as values (float32, float16, or the
bfloat16 bits as uint16) and as bits (to read the LSE lanes).
"""

import functools

import numpy as np
from numba import cuda, float32, uint32

from ._arrays import kernel_array, launch_stream
from ._device import device_functions
from ._specs import MAX_RANKS, check_combine_args

__all__ = ["unpack_combine"]

WARP = 32
ROWS_PER_BLOCK = 4
UNROLL = 8
MAX_BLOCKS = 132 * 16

_F32, _F16, _BF16 = "float32", "float16", "bfloat16"


def _codecs(kind, f):
    """Device functions that read one value and one LSE, and encode one output."""
    as_float, as_bits = f["as_float"], f["as_bits"]
    bf16_to_f32_bits, f32_to_bf16_bits = f["bf16_to_f32_bits"], f["f32_to_bf16_bits"]
    low16, sixteen = np.uint32(0xFFFF), np.uint32(16)
    jit = cuda.jit(device=True)

    if kind == _F32:
        @jit
        def decode(x):
            return x

        @jit
        def encode(acc):
            return acc

        @jit
        def load_lse(vals, bits, r, b, h, d_count):
            return vals[r, b, h, d_count]
        return decode, encode, load_lse

    @jit
    def load_lse(vals, bits, r, b, h, d_count):
        low = uint32(bits[r, b, h, d_count]) & low16
        high = uint32(bits[r, b, h, d_count + 1]) & low16
        return as_float(uint32(low | (high << sixteen)))

    if kind == _F16:
        @jit
        def decode(x):
            return float32(x)

        @jit
        def encode(acc):
            return acc  # the float16 store rounds to nearest even
    else:
        @jit
        def decode(x):
            return as_float(uint32(bf16_to_f32_bits(x)))

        @jit
        def encode(acc):
            return f32_to_bf16_bits(as_bits(acc))
    return decode, encode, load_lse


@functools.cache
def _combine_kernel(kind):
    f = device_functions()
    decode, encode, load_lse = _codecs(kind, f)
    clean_lse, finish_max, lse_exp = f["clean_lse"], f["finish_max"], f["lse_exp"]
    inverse_total, global_lse, shard_weight = f["inverse_total"], f["global_lse"], f["shard_weight"]
    zero, neg_inf = f["zero"], f["neg_inf"]
    step = WARP * UNROLL

    @cuda.jit
    def combine(vals, bits, out, out_lse, write_lse, base_e):
        n, b_count, hn, width = vals.shape
        d_count = out.shape[2]
        weights = cuda.shared.array((ROWS_PER_BLOCK, MAX_RANKS), np.float32)
        lane = cuda.threadIdx.x
        slot = cuda.threadIdx.y
        first = cuda.blockIdx.x * ROWS_PER_BLOCK
        while first < b_count * hn:  # uniform over the block: __syncthreads is safe
            row = min(first + slot, b_count * hn - 1)  # spare warps redo the last row
            b = row // hn
            h = row % hn
            m = neg_inf
            for r in range(n):
                m = max(m, clean_lse(load_lse(vals, bits, r, b, h, d_count)))
            m = finish_max(m)
            total = zero
            for r in range(n):
                total += lse_exp(clean_lse(load_lse(vals, bits, r, b, h, d_count)) - m, base_e)
            inv_total = inverse_total(total)
            r = lane
            while r < n:
                weights[slot, r] = shard_weight(load_lse(vals, bits, r, b, h, d_count), m,
                                                inv_total, base_e)
                r += WARP
            if write_lse and lane == 0 and row == first + slot:
                out_lse[b, h] = global_lse(total, m, base_e)
            cuda.syncthreads()
            acc = cuda.local.array(UNROLL, np.float32)
            base = lane
            while base < d_count:
                for k in range(UNROLL):
                    acc[k] = zero
                for r in range(n):
                    w = weights[slot, r]
                    if w != zero:
                        for k in range(UNROLL):
                            d = base + k * WARP
                            if d < d_count:
                                acc[k] += w * decode(vals[r, b, h, d])
                for k in range(UNROLL):
                    d = base + k * WARP
                    if d < d_count and row == first + slot:
                        out[b, h, d] = encode(acc[k])
                base += step
            cuda.syncthreads()
            first += cuda.gridDim.x * ROWS_PER_BLOCK

    return combine


def unpack_combine(recv, out, out_lse=None, is_lse_base_on_e=True, stream=None):
    """Combine the received partials exactly, on ``stream``.

    Args:
        recv: ``[N, B, H/N, D + P]`` device array in the output dtype (or its
            unsigned-integer twin), C-contiguous; ``recv[r]`` came from rank r.
        out: ``[B, H/N, D]`` float16, bfloat16 or float32 device array, any
            strides (token-major, or head-major storage ``[H/N, B, D]`` seen as
            ``[B, H/N, D]``); written.
        out_lse: optional ``[B, H/N]`` float32 device array; receives the
            global LSE (-inf where every shard is empty).
        is_lse_base_on_e: natural-log LSEs; ``False`` for base 2.
        stream: the stream to run on; ``None`` is CuPy's current stream.
    """
    spec = check_combine_args(recv, out, out_lse)
    if spec.tokens == 0:
        return
    kind = {np.dtype(np.float32): _F32, np.dtype(np.float16): _F16}.get(spec.dtype, _BF16)
    value_dtype = spec.bits if kind == _BF16 else spec.dtype
    vals = kernel_array(recv, value_dtype, "recv")
    bits = kernel_array(recv, spec.bits, "recv")
    out_k = kernel_array(out, value_dtype, "out")
    write_lse = out_lse is not None
    lse_k = kernel_array(out_lse, np.float32, "out_lse") if write_lse else out_k
    rows = spec.tokens * (spec.heads // spec.world_size)
    blocks = min(-(-rows // ROWS_PER_BLOCK), MAX_BLOCKS)
    _combine_kernel(kind)[blocks, (WARP, ROWS_PER_BLOCK), launch_stream(stream)](
        vals, bits, out_k, lse_k, write_lse, bool(is_lse_base_on_e))
