"""The combine for exactly N ranks (N from 2 to 32): a lane group per slice of a row.

At decode sizes a combine is a chain of dependent instructions per warp, not a
stream of bytes: every instruction before a row's first load, and every one
between the loads' arrival and the stores, adds to the kernel's time. This
kernel keeps that chain short. Each row ``(b, h)`` is split over the grid's y
into slices of ``group * unroll`` values (few values a lane for few rows, so
that many warps share the work; more for many rows); its lane group finds its
token, head and slice from the grid alone (``_rows.tile_grid``: heads along
x, slices along y, tokens along z, a grid-stride loop over the tokens), reads
the received buffer through flat views (a row's start as a 64-bit offset,
everything within a row in 32 bits), loads every shard's values and LSE
before it weighs any (every loop over the shards unrolled, the LSEs and
weights in registers, each weight computed once: ``held_weights``), and
stores once. The same sums in the same order as the combine for any N
(``combine._combine_kernel``), so the same bits.
"""

import functools

import numpy as np
from numba import config, cuda

from ._codecs import PAIRS, RAW, RAW_BITS, codec_functions
from ._device import device_functions, held_weights, inline_device
from ._format import LSE_HALF_BITS, LSE_HALF_MASK
from ._rows import WARP
from ._trailer import WORDS, combine_checks

__all__ = ["flat_lse_reader", "shard_sums", "slices_kernel"]


@functools.cache
def flat_lse_reader(codec):
    """Device function ``read_lse(vals, bits, end) -> float32``: the LSE of the row whose
    lanes end before flat offset ``end`` (uint64), from the flat views ``vals`` (the
    codec's values) and ``bits``: the last value for float32 and for word pairs (the
    LSE's bits as one word), the last two 16-bit lanes (low half first) otherwise."""
    as_float = device_functions()["as_float"]
    u32, u64 = np.uint32, np.uint64
    one, two = u64(1), u64(2)
    lse_mask, lse_shift = u32(LSE_HALF_MASK), u32(LSE_HALF_BITS)
    jit = cuda.jit(device=True)

    if codec == "float32":
        @jit
        def read_lse(vals, bits, end):
            return vals[end - one]
    elif codec in PAIRS:
        @jit
        def read_lse(vals, bits, end):
            return as_float(u32(vals[end - one]))
    else:
        @jit
        def read_lse(vals, bits, end):
            return as_float((u32(bits[end - two]) & lse_mask)
                            | ((u32(bits[end - one]) & lse_mask) << lse_shift))

    return read_lse


def shard_sums(codec, shards, per, weigh):
    """Device function ``sum_shards(buf, lses, weights, acc, base_e) -> (m, total)``, inlined:
    the weights of a row's held LSEs (``weigh``: ``held_weights`` or a twin of it),
    then the float32 sums of its ``shards`` shards' ``per`` held values each
    (``buf[r * per + k]``) into ``acc`` (``2 * per``: low and high value of each word
    in pairs), shard by shard in order; a zero-weight shard adds nothing, even NaN.
    The combines for exactly N share it, so that they give the same bits."""
    decode_lo, decode_hi = codec_functions(codec)[2:4]
    pairs, zero = codec in PAIRS, device_functions()["zero"]
    accumulators = 2 * per

    @inline_device
    def sum_shards(buf, lses, weights, acc, base_e):
        m, total = weigh(lses, weights, shards, base_e)
        for k in range(accumulators):
            acc[k] = zero
        for r in range(shards):
            w = weights[r]
            if w != zero:  # an empty shard adds exactly 0, even NaN
                for k in range(per):
                    acc[k] += w * decode_lo(buf[r * per + k])
                    if pairs:
                        acc[per + k] += w * decode_hi(buf[r * per + k])
        return m, total

    return sum_shards


@functools.cache
def slices_kernel(codec, shards, group, unroll, max_registers=0, whole=False):
    """The kernel ``combine(vals, bits, out, out_lse, write_lse, base_e, status, state,
    flat_vals, flat_bits)`` of codec ``codec`` for exactly ``shards`` ranks, rows of
    ``group`` lanes and ``unroll`` values a lane and shard: the arguments of
    ``combine.combine_kernel``'s kernel for any N, then flat (1-D, C) views of
    ``vals`` and ``bits``; launched on ``_rows.tile_grid(H/N, B, group, slices)``,
    ``slices`` of ``group * unroll`` values covering a row. ``max_registers``: the
    linker's cap on a thread's registers (0: none; the PTX is the same either way,
    and the simulator takes no cap). ``whole``: every slice lies within its row
    (``combine.whole_slices``: a row's values are a multiple of ``group * unroll``),
    so no load or store is tested against the row's end."""
    f = device_functions()
    encode = codec_functions(codec)[4]
    raw, half = RAW[codec], RAW_BITS[codec].itemsize == 2
    read_lse = flat_lse_reader(codec)
    sum_shards = shard_sums(codec, shards, unroll, held_weights())
    global_lse = f["global_lse"]
    begin_checks, finish_checks = combine_checks(half)

    u32, u64 = np.uint32, np.uint64
    u_group, u_step, per_warp = u32(group), u32(group * unroll), u32(WARP // group)
    checked = u64((shards - 1) * WORDS)  # the trailer words a signed call compares
    loaded, accumulators = shards * unroll, 2 * unroll

    limits = {"max_registers": max_registers} if max_registers and \
        not config.ENABLE_CUDASIM else {}

    @cuda.jit(**limits)
    def combine(vals, bits, out, out_lse, write_lse, base_e, status, state, flat_vals,
                flat_bits):
        # Offsets within a row are uint32 (Numba widens integer arithmetic to 64 bits:
        # each uint32 result is cast back, and NVVM then computes it in 32 bits).
        tokens = u32(out.shape[0])
        hn = u32(vals.shape[2])
        width = u32(vals.shape[3])
        d_count = u32(out.shape[2])
        chunk = u64(vals.shape[1]) * u64(hn) * u64(width)  # one rank's chunk, in elements
        first_slice = cuda.blockIdx.y == 0
        # A plan's trailer: the first slice's blocks of the first token check it (as the
        # combine for any N does); the other blocks skip even the checks' set-up
        signed = first_slice and cuda.blockIdx.z == 0 and u64(vals.shape[1]) > u64(tokens)
        t = t_step = u64(0)
        count = np.int64(0)
        ours = theirs = np.uint32(0)
        if signed:
            t, t_step, count, ours, theirs = begin_checks(bits, state, u64(tokens), signed,
                                                          checked)
        tx = u32(cuda.threadIdx.x)
        lane = u32(tx % u_group)
        warp = u32(u32(cuda.blockIdx.x) * u32(cuda.blockDim.y) + u32(cuda.threadIdx.y))
        h = u32(u32(warp * per_warp) + u32(tx // u_group))
        start = u32(lane + u32(u32(cuda.blockIdx.y) * u_step))
        b = u32(cuda.blockIdx.z)
        buf = cuda.local.array(loaded, raw)
        lses = cuda.local.array(shards, np.float32)
        weights = cuda.local.array(shards, np.float32)
        acc = cuda.local.array(accumulators, np.float32)
        while h < hn and b < tokens:
            row = u64(u32(u32(b * hn) + h)) * u64(width)  # the row's start in rank 0's chunk
            # every shard's values and LSE load first, then the output's address is made
            for r in range(shards):
                at = row + u64(r) * chunk + u64(start)
                for k in range(unroll):
                    if whole or u32(start + u32(k * group)) < d_count:
                        buf[r * unroll + k] = flat_vals[at + u64(k * group)]
            for r in range(shards):
                lses[r] = read_lse(flat_vals, flat_bits, row + u64(r) * chunk + u64(width))
            dst = out[b, h]
            m, total = sum_shards(buf, lses, weights, acc, base_e)
            for k in range(unroll):
                d = u32(start + u32(k * group))
                if whole or d < d_count:
                    dst[d] = encode(acc[k], acc[unroll + k])
            if write_lse and first_slice and lane == u32(0):  # after the stores: off their path
                out_lse[b, h] = global_lse(total, m, base_e)
            b = u32(b + u32(cuda.gridDim.z))
        if signed:
            finish_checks(bits, status, state, u64(tokens), signed, checked, t, t_step, count,
                          ours, theirs)

    return combine
