"""The combine for exactly N ranks as a block of threads per row, for rows that fit one step.

At decode sizes the combine's time is a chain of dependent instructions, and
every one before a row's first load counts. This kernel has the shortest such
chain of the combines: a block of ``threads`` threads (a multiple of 32, at most
:data:`BLOCK_THREADS`) per ``(token, head)`` row (grid ``(H/N, B)``: the head is
``blockIdx.x``, the token ``blockIdx.y``), no loop over tokens or slices, flat
views of the received buffer and of the output with their shapes and strides as
scalar arguments (``heads``, ``width``, ``chunk``; ``d_count`` and the output's
token and head strides ``o0``, ``o1`` in elements), so that no 3-d or 4-d view's
shape and strides are passed or read, and every offset in 32 bits (the launch
keeps both buffers below 2**32 elements: ``combine.combine_launch``). Thread
``t`` owns the row's values ``t, t + threads, ...`` (``per`` of them); it loads
every shard's values and LSE before it weighs any (``held_weights``, each weight
computed once), skips a zero-weight shard (its NaN or inf never reaches the
sum) and stores once. The global LSE (``write_lse`` nonzero) comes from one more
block a token, the last along x (``h = H/N``): its thread ``t`` loads the LSEs of
the token's rows ``t, t + threads, ...`` and nothing else, weighs them and writes
their global LSEs, beside the rows' blocks and off their path (a warp more in each
row's block, or thread 0 after its stores, cost more: ``benchmarks/NOTES.md``).
The same sums in the same order as ``_slices`` and the combine for any N, so the
same bits.

A plan's buffer carries a trailer (``_trailer``): the ``signed`` twin also
takes the buffer's 4-d bits view and the plan's ``(status, state)`` and runs on
one more block along x, the first, dispatched before the rows' blocks: the first
token's such block compares every peer's trailer with rank 0's while the others
combine, so that no row waits on the check (checked by the rows' blocks, the
trailer cost up to 0.3 us a call at B <= 8 on an H200: ``benchmarks/NOTES.md``).
"""

import functools

import numpy as np
from numba import cuda

from ._codecs import RAW, RAW_BITS, codec_functions
from ._device import device_functions, held_weights, inline_device
from ._slices import flat_lse_reader, shard_sums
from ._trailer import WORDS, combine_checks, trailer_functions

__all__ = ["BLOCK_THREADS", "blocks_kernel"]

BLOCK_THREADS = 128  # the threads of a row's block: four warps


@functools.cache
def _row_combiner(codec, shards, per, threads, lead=False):
    """Device function ``combine_row(flat_vals, flat_bits, out, out_lse, write_lse, base_e,
    heads, width, chunk, d_count, o0, o1)``: this block's row of ``threads`` threads,
    combined (see the module docstring); ``lead``: the grid's x has one block before
    the rows'."""
    encode = codec_functions(codec)[4]
    raw = RAW[codec]
    read_lse = flat_lse_reader(codec)
    weigh = held_weights()
    sum_shards = shard_sums(codec, shards, per, weigh)
    global_lse = device_functions()["global_lse"]
    u32 = np.uint32
    threads = u32(threads)
    loaded, accumulators = shards * per, 2 * per

    @inline_device
    def lse_at(row, r, chunk, width):
        """The flat offset of rank ``r``'s LSE for the row at ``row`` in rank 0's chunk."""
        return u32(u32(row + u32(u32(r) * u32(chunk))) + u32(width))

    @inline_device
    def combine_row(flat_vals, flat_bits, out, out_lse, write_lse, base_e, heads, width,
                    chunk, d_count, o0, o1):
        h = u32(u32(cuda.blockIdx.x) - u32(1)) if lead else u32(cuda.blockIdx.x)
        b = u32(cuda.blockIdx.y)
        t = u32(cuda.threadIdx.x)
        d = u32(d_count)
        row = u32(u32(u32(b * u32(heads)) + h) * u32(width))  # the row in rank 0's chunk
        buf = cuda.local.array(loaded, raw)
        lses = cuda.local.array(shards, np.float32)
        weights = cuda.local.array(shards, np.float32)
        acc = cuda.local.array(accumulators, np.float32)
        if h >= u32(heads):  # the token's LSE block: thread t weighs rows t, t + threads, ...
            if write_lse:
                j = t
                while j < u32(heads):
                    at = u32(u32(u32(b * u32(heads)) + j) * u32(width))
                    for r in range(shards):
                        lses[r] = read_lse(flat_vals, flat_bits, lse_at(at, r, chunk, width))
                    m, total = weigh(lses, weights, shards, base_e)
                    out_lse[b, j] = global_lse(total, m, base_e)
                    j = u32(j + threads)
            return
        for r in range(shards):  # every shard's values and LSE load first
            at = u32(row + u32(u32(r) * u32(chunk)))
            for k in range(per):
                e = u32(t + u32(u32(k) * threads))
                if e < d:
                    buf[r * per + k] = flat_vals[u32(at + e)]
        for r in range(shards):
            lses[r] = read_lse(flat_vals, flat_bits, lse_at(row, r, chunk, width))
        sum_shards(buf, lses, weights, acc, base_e)
        dst = u32(u32(b * u32(o0)) + u32(h * u32(o1)))
        for k in range(per):
            e = u32(t + u32(u32(k) * threads))
            if e < d:
                out[u32(dst + e)] = encode(acc[k], acc[per + k])

    return combine_row


@functools.cache
def blocks_kernel(codec, shards, per, signed=False, threads=BLOCK_THREADS):
    """The kernel ``combine(flat_vals, flat_bits, out, out_lse, write_lse, base_e, heads,
    width, chunk, d_count, o0, o1)`` of codec ``codec`` for exactly ``shards`` ranks
    and rows of at most ``per * threads`` values (words in pairs): flat (1-D, C) views
    of the received buffer ``[N, B', H/N, width]`` as the codec's values and as bits,
    the output ``[B, H/N, D]``'s flat view (``DeviceArray.span``), the output LSE
    ``[B, H/N]`` (written where ``write_lse`` is nonzero, by the blocks ``x = H/N``:
    see the module docstring), the LSE base flag, ``H/N``, ``width``,
    one rank's chunk ``B' * H/N * width``, ``D`` and the output's token and head
    strides, in elements; every flat offset of both buffers below 2**32.
    ``signed``: the kernel takes ``(bits, status, state)`` after them (the buffer's
    4-d bits view and a plan's status and state, as ``combine.combine_launch``
    documents) and checks the trailer. Launched on ``(H/N, B)`` blocks, one more along
    x where ``signed`` (the first) and one more where ``write_lse`` (the last), of
    ``threads`` threads (a multiple of 32, at most :data:`BLOCK_THREADS`)."""
    combine_row = _row_combiner(codec, shards, per, threads, signed)
    if not signed:
        @cuda.jit
        def combine(flat_vals, flat_bits, out, out_lse, write_lse, base_e, heads, width,
                    chunk, d_count, o0, o1):
            combine_row(flat_vals, flat_bits, out, out_lse, write_lse, base_e, heads, width,
                        chunk, d_count, o0, o1)

        return combine

    finish_checks = combine_checks(RAW_BITS[codec].itemsize == 2)[1]
    check_words = trailer_functions(RAW_BITS[codec].itemsize == 2)[3]
    u64 = np.uint64
    checked = u64((shards - 1) * WORDS)  # the trailer words a signed call compares

    @cuda.jit
    def signed_combine(flat_vals, flat_bits, out, out_lse, write_lse, base_e, heads, width,
                       chunk, d_count, o0, o1, bits, status, state):
        # The grid's x is H/N + 1 (+ 1 with the LSE block): blocks x = h + 1 combine head
        # h, and the first token's block x = 0 (dispatched first) checks the trailer
        # meanwhile, off the rows' path
        if cuda.blockIdx.x != 0:
            combine_row(flat_vals, flat_bits, out, out_lse, write_lse, base_e, heads, width,
                        chunk, d_count, o0, o1)
            return
        tokens = u64(cuda.gridDim.y)  # B: a token a block along y
        if cuda.blockIdx.y != 0 or u64(bits.shape[1]) <= tokens:  # (no trailer rows)
            return
        t, t_step = u64(cuda.threadIdx.x), u64(cuda.blockDim.x)
        count = np.int64(0)
        if t == u64(0):
            count = state[1]
        ours = theirs = np.uint32(0)
        if t < checked:
            ours, theirs = check_words(bits, tokens, t)
        finish_checks(bits, status, state, tokens, True, checked, t, t_step, count, ours,
                      theirs)

    return signed_combine


