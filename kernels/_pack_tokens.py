"""The pack of rows that fit one step, a block row per token: no loop, scalar arguments.

At decode sizes the pack's time is the chain of instructions before a row's
first load and after its last store, as for the combine (``_blocks``). This
kernel has the shortest such chain of the packs: the grid of ``_rows.tile_grid``
with exactly one token per block along z (grid ``(x, N, B)``), so there is no
loop over tokens; the input is read through its flat view (``DeviceArray.span``)
at its strides in elements, passed as scalars, and the buffers are written
through flat views, their shape passed as scalars (``heads``, ``width``,
``chunk_tokens``), so that no 3-d or 4-d view's shape and strides are passed or
read. A group of ``group`` lanes a row, each lane loading its (at most
:data:`~._rows.UNROLL`) elements before it stores any; the row's first lane
loads the LSE bits (and a mask's words) beside them and judges the mask after
the row's stores. The same bits as ``pack``'s kernels.

A plan's buffers carry a trailer (``_trailer``): the ``signed`` twin also takes
the plan's ``(signature, state)`` and writes every chunk's trailer, found flat
right after its ``B`` token rows. Where the grid is small (:func:`signs_ahead`) a
block of its own signs, in one more plane along z dispatched before the rows'
(the ``lead`` twin), so that no row's block does more than its row; elsewhere
the threads of the first token's first rank's blocks load the trailer's words
before their rows and write them after, where the rows of other blocks hide
them (a plane of blocks more costs more there: ``benchmarks/NOTES.md``).

The ``staged`` twin (rows of uint32 words, at many tokens and any bytes:
:func:`stages`) writes its rows into shared memory instead, and after a barrier the
block copies its rows' span of the buffer, which is contiguous, out as aligned
16-byte quads (the words before the span's first quad boundary and after its last
one alone): a quarter of the store instructions, each of whole sectors, where a
row's group of lanes stores words of rows that start off a sector. Its loads, masks
and trailer are the plain kernel's, and so are its bits. Where the input's rows
start 16-byte aligned and hold 4k words, and a row takes few lanes
(:func:`loads_quads`), it also reads them as quads (``quad_loads``): lane ``l`` of a
row's group loads quads ``l`` and ``l + group``, a quarter of the load instructions,
and writes their words into shared memory as the plain twin does.

Where a token's rows of one rank fit one warp (few heads a rank, short rows), a block
row a token is a block of one warp: many small blocks, too small to stage. The
``block_tokens`` twin takes that many consecutive tokens a block, a warp each, on a grid
``(1, N, B / block_tokens)``; their rows are one contiguous span of each chunk, so its
staged form gathers and writes them as one (:func:`tokens_a_block` says where).
"""

import functools
from typing import NamedTuple

import numpy as np
from numba import config, cuda

from numba.core import types

from ._device import inline_device
from ._format import LSE_HALF_BITS, LSE_HALF_MASK
from ._launch import SpecializedKernel, array_type
from ._rows import (GROUPS, MAX_GRID_Z, MAX_REGISTERS, UNROLL, WARP, WARPS_PER_BLOCK,
                    lanes_per_row)
from ._trailer import CALL, TOKENS, WORDS
from ._vector import QUAD, vector_functions

__all__ = ["BLOCK_TOKENS", "BLOCK_TOKENS_LEAST", "LEAD_MOST_BLOCKS", "QUAD_LOADS_GROUP_MOST",
           "STAGED_TOKENS_LEAST", "STAGED_WARPS_LEAST", "STAGE_WORDS", "TOKEN_BLOCKS_MOST",
           "TOKEN_BYTES_MOST", "TokensVariant", "by_tokens", "can_load_quads", "can_stage",
           "fits_a_warp", "loads_quads", "may_load_quads", "signs_ahead", "stages",
           "token_block_grid", "tokens_a_block", "tokens_kernel", "variant_of"]

# This kernel takes at most TOKEN_BLOCKS_MOST tokens, or more where the input holds at
# most TOKEN_BYTES_MOST bytes: beyond both, ``pack``'s kernels were as fast or faster in
# some cells on an H200 (``benchmarks/NOTES.md``, 2026-12-04, seventh).
TOKEN_BLOCKS_MOST = 256
TOKEN_BYTES_MOST = 8 << 20
# The most blocks of a signed pack that signs in a plane of blocks of its own: on an
# H200 that saved 0.04-0.13 us a call up to 64 blocks and cost up to 0.35 us from 256
# (``benchmarks/NOTES.md``, 2026-12-04, seventh).
LEAD_MOST_BLOCKS = 64
# The staged twin from this many tokens on, in blocks of at least this many warps (on an
# H100 it ran 0.70-0.98x the plain kernel's time from 256 tokens in blocks of 2 and 4
# warps, 1.05-1.21x in blocks of one: ``benchmarks/NOTES.md``, 2026-12-06, second).
STAGED_TOKENS_LEAST = 256
STAGED_WARPS_LEAST = 2
# A block's staged rows: at most WARPS_PER_BLOCK warps of WARP // group rows of at most
# group * UNROLL + 1 words (one step and the LSE word), and up to three words before the
# span's first quad boundary, so that the shared words and the buffer agree modulo a quad.
STAGE_WORDS = WARPS_PER_BLOCK * (WARP * UNROLL + WARP // GROUPS[0]) + QUAD - 1
QUADS = UNROLL // QUAD  # the quads a lane of the staged twin loads, where it loads quads
# The staged twin reads its rows as quads where they are of at most this many lanes: on an
# H200 it took 0.88x the time of word loads at rows of 8 lanes (the geometric mean without a
# mask; 0.79-0.99 in all), 0.96x at 16 (0.90-1.01), 1.00x at 32, the same bits
# (``benchmarks/pack_quad_loads_ab.py``; ``benchmarks/NOTES.md``, 2026-12-06, ninth).
QUAD_LOADS_GROUP_MOST = 16
# Where a token's rows fit one warp, a pack by tokens of at least BLOCK_TOKENS_LEAST
# tokens takes BLOCK_TOKENS of them a block, a warp each (1: a block row a token), so that
# its blocks are fewer and, from STAGED_WARPS_LEAST warps, staged. On an H100, at N = 8
# and B of 256, 512 and 2048, 4 tokens a block took 0.90x, 0.77x and 0.75x the time of
# one (geometric means over 7 cells, plain pack; 0.90x, 0.78x, 0.71x masked), and 2 took
# 0.91x, 0.80x, 0.79x; the same bits (``benchmarks/pack_block_tokens_ab.py``;
# ``benchmarks/NOTES.md``, 2026-12-07, third).
BLOCK_TOKENS = 4
BLOCK_TOKENS_LEAST = STAGED_TOKENS_LEAST


def by_tokens(data, grid, wide, most=None, block_tokens=1):
    """Whether a pack of ``data`` (:class:`DeviceArray`, ``[B, H, D]`` as the kernel
    moves it) on ``grid`` (``_rows.tile_grid``'s, or :func:`token_block_grid`'s) takes
    this kernel: rows of one step (not ``wide``), read through a flat view
    (:meth:`DeviceArray.span` not empty), a block row for each token (the grid's z is
    B), or for each ``block_tokens`` tokens, and at most ``most`` tokens (``None``:
    :data:`TOKEN_BLOCKS_MOST`, or any number where ``data`` holds at most
    :data:`TOKEN_BYTES_MOST` bytes)."""
    tokens = data.shape[0]
    if most is None:
        most = MAX_GRID_Z if data.size * data.dtype.itemsize <= TOKEN_BYTES_MOST else \
            TOKEN_BLOCKS_MOST
    return not wide and 0 < tokens <= min(most, MAX_GRID_Z) and \
        grid[2] * block_tokens == tokens and data.span().shape[0] > 0


def fits_a_warp(heads, group):
    """Whether a token's ``heads`` rows of ``group`` lanes fit one warp, as a pack of
    several tokens a block (:func:`tokens_kernel`'s ``block_tokens``) takes them."""
    return 0 < heads <= WARP // group


def token_block_grid(send, tokens, block_tokens):
    """``(grid, block)`` of a pack of ``tokens`` tokens into ``send``
    (:class:`DeviceArray` ``[N, B', H/N, W]``), ``block_tokens`` tokens a block, a
    warp each: ``(1, N, tokens / block_tokens)`` blocks of ``(32, block_tokens)``."""
    return (1, send.shape[0], tokens // block_tokens), (WARP, block_tokens)


def tokens_a_block(data, send, recv, wide, staged=None):
    """The tokens a block of a pack of ``data`` into ``send`` and ``recv`` by tokens:
    :data:`BLOCK_TOKENS` where a token's rows fit one warp (:func:`fits_a_warp`), the
    tokens are at least :data:`BLOCK_TOKENS_LEAST` and a multiple of it, and on that
    grid the pack goes by tokens (:func:`by_tokens`, or staged: :func:`stages`, unless
    ``staged`` is ``False``; ``True``: staged, as asked); else 1, a block row a token."""
    tokens, block_tokens = data.shape[0], BLOCK_TOKENS
    if block_tokens < 2 or wide or tokens < BLOCK_TOKENS_LEAST or tokens % block_tokens or \
            not fits_a_warp(send.shape[2], lanes_per_row(data.shape[2])):
        return 1
    grid, block = token_block_grid(send, tokens, block_tokens)
    if staged:  # asked for: a pack by tokens at any bytes
        taken = by_tokens(data, grid, wide, MAX_GRID_Z, block_tokens)
    else:
        taken = by_tokens(data, grid, wide, None, block_tokens) or (
            staged is None and stages(data, send, recv, grid, block, wide, block_tokens))
    return block_tokens if taken else 1


def can_stage(data, send, recv, block):
    """Whether the staged twin can pack ``data`` into ``send`` and ``recv``
    (:class:`DeviceArray`, as the kernel moves them) in blocks of ``block``: rows of
    uint32 words (16-bit values moved in pairs, or float32), both buffers 16-byte
    aligned (as CuPy's allocations and a plan's are), a block's rows within
    :data:`STAGE_WORDS`."""
    rows = block[1] * (WARP // lanes_per_row(data.shape[2]))
    return data.dtype.itemsize == 4 and send.ptr % 16 == 0 and recv.ptr % 16 == 0 and \
        rows * send.shape[3] + QUAD - 1 <= STAGE_WORDS


def can_load_quads(data):
    """Whether the staged twin can read ``data`` (:class:`DeviceArray` of uint32 words,
    ``[B, H, D]`` as the kernel moves it) as 16-byte quads: every row starts 16-byte
    aligned and runs contiguously, and ``D`` is a multiple of four."""
    return data.dtype.itemsize == 4 and data.shape[2] % QUAD == 0 and data.rows_aligned(16)


def may_load_quads(words, group):
    """Whether the staged twin reads rows of ``words`` words in groups of ``group`` lanes
    as quads where the input is aligned for it: ``words`` a multiple of four, ``group``
    at most :data:`QUAD_LOADS_GROUP_MOST` (the rule that :func:`loads_quads` applies to
    an input, and a plan's warm-up to a shape)."""
    return group <= QUAD_LOADS_GROUP_MOST and words % QUAD == 0


def loads_quads(data, group):
    """Whether a staged pack of ``data`` reads it as quads: :func:`may_load_quads` for
    its rows and :func:`can_load_quads`."""
    return may_load_quads(data.shape[2], group) and can_load_quads(data)


def stages(data, send, recv, grid, block, wide, block_tokens=1):
    """Whether a pack of ``data`` on ``grid`` and ``block`` (``_rows.tile_grid``'s,
    its z set to the tokens, or :func:`token_block_grid`'s for ``block_tokens``)
    takes the staged twin: where it can (:func:`can_stage`), by tokens (rows of one
    step read through a flat view, a token a block row or ``block_tokens`` a block:
    :func:`by_tokens` at any bytes), at least :data:`STAGED_TOKENS_LEAST` tokens,
    blocks of at least :data:`STAGED_WARPS_LEAST` warps."""
    return data.shape[0] >= STAGED_TOKENS_LEAST and block[1] >= STAGED_WARPS_LEAST and \
        by_tokens(data, grid, wide, MAX_GRID_Z, block_tokens) and \
        can_stage(data, send, recv, block)


def signs_ahead(grid):
    """Whether a signed pack on ``grid`` (:func:`by_tokens`'s) signs in a plane of its
    own (the ``lead`` twin of :func:`tokens_kernel`): at most :data:`LEAD_MOST_BLOCKS`
    blocks."""
    return grid[0] * grid[1] * grid[2] <= LEAD_MOST_BLOCKS


@functools.cache
def _tokens_kernel(group, half, masked, signed, lead=False, staged=False, quad_loads=False,
                   block_tokens=1):
    lead = lead and signed
    one = block_tokens == 1  # a token a block row; else a warp a token, block_tokens a block
    u_block_tokens = np.uint32(block_tokens)
    from .pack import lse_bits_steps  # (pack imports this module)

    row_lse_fetch, row_lse_of = lse_bits_steps()
    lse_mask, lse_shift = np.uint32(LSE_HALF_MASK), np.uint32(LSE_HALF_BITS)
    u32, u64 = np.uint32, np.uint64
    u_group, per_warp, last = u32(group), u32(WARP // group), u32((UNROLL - 1) * group)
    u_words, u_tokens, u_call = u32(WORDS), u32(TOKENS), u32(CALL)
    low32, low16, sixteen = np.int64(0xFFFFFFFF), np.uint32(0xFFFF), np.uint32(16)
    jit = cuda.jit(device=True)

    @jit
    def put_word(dst, at, f, value):
        """Word ``f`` of a trailer that starts at element ``at`` of ``dst``."""
        if half:
            dst[at + u64(u32(2) * f)] = value & low16
            dst[at + u64(u32(2) * f + u32(1))] = value >> sixteen
        else:
            dst[at + u64(f)] = value

    @inline_device
    def fetch_lse(lse_bits, seq_lens, query_start_loc, num_seqs, b, head, lane):
        """``(first, bits, fetched)``: for the row's first lane (``first``), its LSE bits
        or, ``masked``, the fetch that ``row_lse_of`` finishes after the stores."""
        first = lane == u32(0)
        bits = np.uint32(0)
        fetched = (np.uint32(0), (np.int64(0), np.int64(0), np.int64(0)))
        if first:
            if masked:
                fetched = row_lse_fetch(lse_bits, b, head, seq_lens, query_start_loc, num_seqs)
            else:
                bits = np.uint32(lse_bits[b, head])
        return first, bits, fetched

    @inline_device
    def load_row(data, lse_bits, seq_lens, query_start_loc, num_seqs, buf, b, head, lane, d,
                 s0, s1):
        """Row ``head`` of token ``b`` into ``buf``: lane ``lane``'s values of it, and, for
        the row's first lane, its LSE bits (or, ``masked``, the fetch that
        ``row_lse_of`` finishes after the stores); ``(whole, first, bits, fetched)``,
        ``whole`` where every value of the lane's step is in the row."""
        src = u64(b) * u64(s0) + u64(head) * u64(s1) + u64(lane)
        whole = u32(lane + last) < d
        if whole:
            for k in range(UNROLL):
                buf[k] = data[src + u64(k * group)]
        else:
            for k in range(UNROLL):
                if u32(lane + u32(k * group)) < d:
                    buf[k] = data[src + u64(k * group)]
        first, bits, fetched = fetch_lse(lse_bits, seq_lens, query_start_loc, num_seqs, b,
                                         head, lane)
        return whole, first, bits, fetched

    @jit
    def pack_row(data, lse_bits, seq_lens, query_start_loc, num_seqs, send, recv, self_rank,
                 heads, width, d_count, s0, s1, chunk_tokens):
        tx = u32(cuda.threadIdx.x)
        lane = u32(tx % u_group)
        if one:
            warp = u32(u32(cuda.blockIdx.x) * u32(cuda.blockDim.y) + u32(cuda.threadIdx.y))
            h = u32(u32(warp * per_warp) + u32(tx // u_group))
        else:  # a token's rows are one warp's: the grid's x is 1
            h = u32(tx // u_group)
        hn = u32(heads)
        if h >= hn:
            return
        r = u32(cuda.blockIdx.y)
        if one:
            b = u32(u32(cuda.blockIdx.z) - u32(1)) if lead else u32(cuda.blockIdx.z)
        else:
            b = u32(u32(u32(cuda.blockIdx.z) * u_block_tokens) + u32(cuda.threadIdx.y))
        d = u32(d_count)
        head = u32(u32(r * hn) + h)
        buf = cuda.local.array(UNROLL, send.dtype)
        whole, first, bits, fetched = load_row(data, lse_bits, seq_lens, query_start_loc,
                                               num_seqs, buf, b, head, lane, d, s0, s1)
        # our own chunk skips the exchange: it goes straight to the receive buffer
        dst = recv if self_rank >= 0 and np.int64(r) == self_rank else send
        row = u64(u32(u32(u32(r * u32(chunk_tokens)) + b) * hn) + h) * u64(width)
        at = row + u64(lane)
        if whole:
            for k in range(UNROLL):
                dst[at + u64(k * group)] = buf[k]
        else:
            for k in range(UNROLL):
                if u32(lane + u32(k * group)) < d:
                    dst[at + u64(k * group)] = buf[k]
        if first:
            if masked:
                bits = row_lse_of(fetched, b, seq_lens, query_start_loc, num_seqs)
            end = row + u64(d)
            if u32(u32(width) - d) == u32(1):
                dst[end] = bits
            else:
                dst[end] = bits & lse_mask
                dst[end + u64(1)] = (bits >> lse_shift) & lse_mask

    if staged:
        v = vector_functions()
        load_quad, store_quad = v["load_quad"], v["store_quad"]
        u_quad, quad_mask = u32(QUAD), u32(QUAD - 1)
        # the shared words' first quad is 16-byte aligned (the simulator takes no alignment)
        aligned = None if config.ENABLE_CUDASIM else 16
        quad_floor = u32(~quad_mask)

        @inline_device
        def load_quads(data, lse_bits, seq_lens, query_start_loc, num_seqs, buf, b, head,
                       lane, d, s0, s1):
            """``load_row``'s loads as 16-byte quads: lane ``lane`` of the row's group
            loads its quads ``lane, lane + group, ...`` (those within the row's ``d``
            words, a multiple of four) into ``buf``; ``(first, bits, fetched)``."""
            src = u64(b) * u64(s0) + u64(head) * u64(s1)
            for k in range(QUADS):
                q = u32(u32(lane + u32(k * group)) * u_quad)
                if q < d:
                    w0, w1, w2, w3 = load_quad(data, src + u64(q))
                    buf[k * QUAD] = w0
                    buf[k * QUAD + 1] = w1
                    buf[k * QUAD + 2] = w2
                    buf[k * QUAD + 3] = w3
            return fetch_lse(lse_bits, seq_lens, query_start_loc, num_seqs, b, head, lane)

        @jit
        def stage_row(data, lse_bits, seq_lens, query_start_loc, num_seqs, send, recv, self_rank,
                      heads, width, d_count, s0, s1, chunk_tokens):
            """``pack_row``'s row, through shared memory: the block's rows are one span
            of the buffer (a token's rows ``x * R .. x * R + R - 1`` of one chunk, ``R``
            the block's rows), gathered in ``stage`` at the span's offset modulo a quad,
            then written out as aligned quads by every thread of the block."""
            stage = cuda.shared.array(STAGE_WORDS, np.uint32, alignment=aligned)
            tx = u32(cuda.threadIdx.x)
            lane = u32(tx % u_group)
            if one:
                per_block = u32(u32(cuda.blockDim.y) * per_warp)
                first_row = u32(u32(cuda.blockIdx.x) * per_block)
                j = u32(u32(u32(cuda.threadIdx.y) * per_warp) + u32(tx // u_group))
                h = u32(first_row + j)
            else:  # warp y holds token y's rows, which follow token y - 1's in the chunk
                h = u32(tx // u_group)
            hn = u32(heads)
            r = u32(cuda.blockIdx.y)
            if one:
                b = u32(u32(cuda.blockIdx.z) - u32(1)) if lead else u32(cuda.blockIdx.z)
            else:
                first = u32(u32(cuda.blockIdx.z) * u_block_tokens)
                b = u32(first + u32(cuda.threadIdx.y))
                j = u32(u32(u32(cuda.threadIdx.y) * hn) + h)
            d, w = u32(d_count), u32(width)
            if one:
                span = u64(u32(u32(u32(r * u32(chunk_tokens)) + b) * hn) + first_row) * u64(w)
            else:
                span = u64(u32(u32(r * u32(chunk_tokens)) + first) * hn) * u64(w)
            off = u32(u32(span) & quad_mask)
            if h < hn:
                head = u32(u32(r * hn) + h)
                buf = cuda.local.array(UNROLL, send.dtype)
                if quad_loads:
                    first, bits, fetched = load_quads(data, lse_bits, seq_lens,
                                                      query_start_loc, num_seqs, buf, b, head,
                                                      lane, d, s0, s1)
                    row = u32(off + u32(j * w))
                    for k in range(QUADS):
                        q = u32(u32(lane + u32(k * group)) * u_quad)
                        if q < d:
                            for i in range(QUAD):
                                stage[u32(row + q) + u32(i)] = buf[k * QUAD + i]
                else:
                    whole, first, bits, fetched = load_row(data, lse_bits, seq_lens,
                                                           query_start_loc, num_seqs, buf, b,
                                                           head, lane, d, s0, s1)
                    row = u32(off + u32(j * w))
                    at = u32(row + lane)
                    if whole:
                        for k in range(UNROLL):
                            stage[at + u32(k * group)] = buf[k]
                    else:
                        for k in range(UNROLL):
                            if u32(lane + u32(k * group)) < d:
                                stage[at + u32(k * group)] = buf[k]
                if first:
                    if masked:
                        bits = row_lse_of(fetched, b, seq_lens, query_start_loc, num_seqs)
                    stage[row + d] = bits  # (rows of words: the LSE is one word)
            cuda.syncthreads()
            dst = recv if self_rank >= 0 and np.int64(r) == self_rank else send
            base = span - u64(off)  # the quad boundary at or before the span
            if one:
                end = u32(off + u32(u32(min(u32(hn - first_row), per_block)) * w))
            else:
                end = u32(off + u32(u32(u_block_tokens * hn) * w))
            quads = u32(u32(off + quad_mask) & quad_floor)  # the first quad boundary in it
            stop = u32(end & quad_floor)  # the last
            if stop < quads:  # no whole quad: every word alone
                quads = stop = end
            threads = u32(u32(cuda.blockDim.x) * u32(cuda.blockDim.y))
            t = u32(u32(u32(cuda.threadIdx.y) * u32(cuda.blockDim.x)) + tx)
            alone = u32(off + t)
            if alone < quads:
                dst[base + u64(alone)] = stage[alone]
            alone = u32(stop + t)
            if alone < end:
                dst[base + u64(alone)] = stage[alone]
            q = u32(quads + u32(t * u_quad))
            while q < stop:
                w0, w1, w2, w3 = load_quad(stage, q)
                store_quad(dst, base + u64(q), w0, w1, w2, w3)
                q = u32(q + u32(threads * u_quad))

        row_of = stage_row
    else:
        row_of = pack_row

    limits = {} if config.ENABLE_CUDASIM else {"max_registers": MAX_REGISTERS}

    if not signed:
        @cuda.jit(**limits)
        def pack(data, lse_bits, seq_lens, query_start_loc, num_seqs, send, recv, self_rank,
                 heads, width, d_count, s0, s1, chunk_tokens):
            row_of(data, lse_bits, seq_lens, query_start_loc, num_seqs, send, recv,
                   self_rank, heads, width, d_count, s0, s1, chunk_tokens)

        return pack

    @jit
    def sign(send, recv, self_rank, signature, state, heads, width, chunk_tokens, tokens, t,
             t_step, words, count, word):
        """Words ``t, t + t_step, ...`` (below ``words``) of every chunk's trailer, right
        after its ``tokens`` token rows; ``count`` (``state[0]``) and ``word``
        (``signature[t % WORDS]``) loaded by the caller; thread 0 copies ``count`` into
        ``state[1]`` for the combine."""
        if t == u32(0):
            state[1] = count
        call = np.uint32(count & low32)
        rows = u64(u32(heads)) * u64(width)  # a token's elements in a chunk
        while True:
            chunk, f = u32(t // u_words), u32(t % u_words)
            value = word
            if f == u_tokens:
                value = tokens
            elif f == u_call:
                value = call
            at = (u64(chunk) * u64(chunk_tokens) + u64(tokens)) * rows
            if self_rank >= 0 and np.int64(chunk) == self_rank:
                put_word(recv, at, f, value)
            else:
                put_word(send, at, f, value)
            t = u32(t + t_step)
            if t >= words:
                break
            word = np.uint32(signature[t % u_words])

    if lead:
        @cuda.jit(**limits)
        def lead_pack(data, lse_bits, seq_lens, query_start_loc, num_seqs, send, recv,
                      self_rank, heads, width, d_count, s0, s1, chunk_tokens, signature, state):
            # The grid's z is B + 1: blocks z = b + 1 pack token b, and the first block
            # of z = 0 (dispatched first) signs every chunk meanwhile, off the rows' path
            if cuda.blockIdx.z != 0:
                row_of(data, lse_bits, seq_lens, query_start_loc, num_seqs, send, recv,
                       self_rank, heads, width, d_count, s0, s1, chunk_tokens)
                return
            if cuda.blockIdx.x != 0 or cuda.blockIdx.y != 0:
                return
            t = u32(u32(u32(cuda.threadIdx.y) * u32(cuda.blockDim.x)) + u32(cuda.threadIdx.x))
            words = u32(u32(cuda.gridDim.y) * u_words)
            if t < words:
                sign(send, recv, self_rank, signature, state, heads, width, chunk_tokens,
                     u32(u32(cuda.gridDim.z) - u32(1)), t,
                     u32(u32(cuda.blockDim.x) * u32(cuda.blockDim.y)), words, state[0],
                     np.uint32(signature[t % u_words]))

        return lead_pack

    @cuda.jit(**limits)
    def signed_pack(data, lse_bits, seq_lens, query_start_loc, num_seqs, send, recv,
                    self_rank, heads, width, d_count, s0, s1, chunk_tokens, signature, state):
        # The first token's first rank's blocks sign every chunk: their threads 0 ..
        # N * WORDS - 1 load what they write before their rows and write it after, so
        # that no row waits on those loads. state[0] is read here and written only by
        # the combine, state[1] the reverse. The other blocks skip even the set-up.
        signs = cuda.blockIdx.y == 0 and cuda.blockIdx.z == 0
        words = u32(u32(cuda.gridDim.y) * u_words) if signs else u32(0)
        t = t_step = u32(0)
        count = np.int64(0)
        word = np.uint32(0)
        if signs:
            per_block = u32(u32(cuda.blockDim.x) * u32(cuda.blockDim.y))
            t = u32(u32(u32(cuda.blockIdx.x) * per_block) +
                    u32(u32(u32(cuda.threadIdx.y) * u32(cuda.blockDim.x)) + u32(cuda.threadIdx.x)))
            t_step = u32(u32(cuda.gridDim.x) * per_block)
            if t < words:
                count = state[0]
                word = np.uint32(signature[t % u_words])
        row_of(data, lse_bits, seq_lens, query_start_loc, num_seqs, send, recv, self_rank,
               heads, width, d_count, s0, s1, chunk_tokens)
        if t < words:
            tokens = u32(cuda.gridDim.z) if one else u32(u32(cuda.gridDim.z) * u_block_tokens)
            sign(send, recv, self_rank, signature, state, heads, width, chunk_tokens,
                 tokens, t, t_step, words, count, word)

    return signed_pack


def tokens_kernel(bits, group, masked=True, signed=False, lead=False, staged=False,
                  quad_loads=False, block_tokens=1):
    """This kernel for element bits ``bits`` (uint16 or uint32), ``group`` lanes a
    row, with a mask or without one (``masked``: one without reads no ``seq_lens``),
    and signing a plan's trailer (``signed``). Its arguments: ``data.span()`` (the
    input ``[B, H, D]``'s flat view), the LSE bits ``[B, H]`` (uint32), ``seq_lens``,
    ``query_start_loc``, ``num_seqs`` (as ``pack.pack_launch`` takes them), flat views
    of ``send`` and ``recv`` ``[N, B', H/N, W]``, ``self_rank``, then ``H/N``, ``W``,
    ``D``, the input's token and head strides in elements
    (:meth:`DeviceArray.element_strides`) and ``B'``; ``signed``: then the plan's
    ``(signature, state)``. Launched on ``tile_grid(H/N, B, group, N)`` with its z
    equal to ``B`` (:func:`by_tokens`); ``lead`` (signed only): with one more plane
    along z, the first, whose first block signs the chunks (:func:`signs_ahead`);
    ``staged`` (uint32 only): the rows go out through shared memory as aligned quads
    (:func:`stages`); ``quad_loads`` (staged only): it reads them as 16-byte quads too
    (:func:`loads_quads`); ``block_tokens`` (not ``lead``): that many tokens a block, a
    warp each, where a token's rows fit one warp (:func:`tokens_a_block`), on a grid
    ``(1, N, B / block_tokens)`` of blocks ``(32, block_tokens)``."""
    # one kernel object for the same kernel, however the flags are passed (a plan warms
    # up the very objects that its launches then pick)
    return _specialized(np.dtype(bits), int(group), bool(masked), bool(signed), bool(lead),
                        bool(staged), bool(quad_loads), int(block_tokens))


@functools.cache
def _specialized(bits, group, masked, signed, lead, staged, quad_loads, block_tokens):
    if staged and bits.itemsize != 4:
        raise ValueError(f"the staged pack moves rows of uint32 words (got {bits})")
    if quad_loads and not staged:
        raise ValueError("only the staged pack reads its rows as quads")
    if not 1 <= block_tokens <= WARPS_PER_BLOCK:
        raise ValueError(f"a block takes 1 to {WARPS_PER_BLOCK} tokens (got {block_tokens})")
    if block_tokens > 1 and lead and signed:
        raise ValueError("a pack of several tokens a block signs in the rows' blocks, "
                         "not in a lead plane")
    i64 = types.int64
    flat = array_type(bits, 1, True)
    index = array_type(np.int64, 1, True)
    argtypes = (flat, array_type(np.uint32, 2, False), index, index, i64, flat, flat, i64,
                i64, i64, i64, i64, i64, i64) + ((index, index) if signed else ())
    kernel = SpecializedKernel(_tokens_kernel(group, bits.itemsize == 2, masked, signed, lead,
                                              staged, quad_loads, block_tokens), argtypes)
    kernel.tokens_variant = TokensVariant(bits, group, masked, signed, lead, staged, quad_loads,
                                          block_tokens)
    return kernel


class TokensVariant(NamedTuple):
    """Which kernel of :func:`tokens_kernel` a kernel is: that function's arguments, by
    name (``bits`` a NumPy dtype)."""
    bits: np.dtype
    group: int
    masked: bool
    signed: bool
    lead: bool
    staged: bool
    quad_loads: bool
    block_tokens: int


def variant_of(kernel):
    """The :class:`TokensVariant` of ``kernel`` (as ``pack.pack_launch`` returns it), or
    ``None`` where it is not a pack by tokens (one of ``pack``'s kernels)."""
    return getattr(kernel, "tokens_variant", None)
