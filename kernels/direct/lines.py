"""The direct kernel in lines: calls too large for words, small enough for the
lines region, in 128-byte lines that carry their own flag (as NCCL's LL128).

A row of the lines region ``lines[2][N][R'][W']`` (uint64) is cut into
128-byte lines of :data:`LINE_WORDS` 32-bit payload words, each line ending in
an 8-byte flag: the call's epoch, which never repeats, so nothing is zeroed.
A line is :data:`LINE_CHUNKS` chunks of 16 bytes; an *item* is a (row, chunk)
couple, and the 8 lanes of a line are 8 consecutive lanes of one warp that
store it with one instruction. Each thread holds all its items
(:func:`line_items`) in registers from its loads to its combine. This rests
on the hardware storing and loading one warp instruction's 128 aligned bytes
whole; see ``docs/direct-kernels.md``.
"""

import functools
from types import SimpleNamespace

import numpy as np
from numba import config, cuda, float32

from .._device import device_functions
from .._rows import WARP
from .._sync import sync_functions
from .._vector import vector_functions
from .._codecs import _BF16X2, _F32, codec_functions
from ..pack import lse_bits_reader
from ._peers import (CHECK_EVERY, COMBINE, PEER_FAILED, PUSH, call_start, grid_dependency,
                     peer_functions, rank_functions, trace_functions)
from ._shared import packed_words, payload_combine
from ._window import (BLOCKS_PER_SM, LINE_CHUNKS, LINE_TILE_ROWS, LINE_WORDS, WARPS,
                      line_items)

__all__ = ["CLASS_SHIFT", "DATA_CHUNK", "EDGE_CHUNK", "LSE_CHUNK", "NO_ITEM", "PAST_CHUNK",
           "lines_kernel"]

NO_ITEM = 0xFFFFFFFF  # the row of an item a thread does not hold
# what a chunk of a row holds, noted in the top byte of its index (CLASS_SHIFT):
# 16 bytes of data (loaded in two), the LSE's bits and zeros (no data), zeros alone
# (nothing loaded, nothing combined), anything else (element by element)
DATA_CHUNK, LSE_CHUNK, PAST_CHUNK, EDGE_CHUNK = 0, 1, 2, 3
CLASS_SHIFT = 24

u64, u32 = np.uint64, np.uint32
u_one, u_two = u64(1), u64(2)
low32, thirty_two = u64(0xFFFFFFFF), u64(32)
u_chunks, u_last, u_line_words = u64(LINE_CHUNKS), u64(LINE_CHUNKS - 1), u64(LINE_WORDS)
no_item = np.uint32(NO_ITEM)
data_class, lse_class = np.uint32(DATA_CHUNK), np.uint32(LSE_CHUNK)
past_class, edge_class = np.uint32(PAST_CHUNK), np.uint32(EDGE_CHUNK)
class_shift, chunk_mask = np.uint32(CLASS_SHIFT), np.uint32((1 << CLASS_SHIFT) - 1)


@functools.cache
def _line_chunks(halves):
    """Device functions that say where a chunk lies in a packed row (16-bit
    elements where ``halves``) and what it holds: ``line_span``, ``may_hold_lse``,
    ``data_below``, ``data_words``, ``class_bounds`` and ``chunk_class``."""
    per_word = u64(2 if halves else 1)  # push elements per 32-bit word
    jit = cuda.jit(device=True)

    @jit
    def line_span(c):
        """Chunk c of a row in lines: its first payload word and how many it has (the
        last chunk of a line ends in the flag)."""
        q = c % u_chunks
        return (c // u_chunks) * u_line_words + q * u64(4), u_two if q == u_last else u64(4)

    @jit
    def may_hold_lse(wb, nw, d_count):
        """Whether payload words ``wb`` to ``wb + nw`` of a packed row of ``d_count``
        elements may hold a part of its LSE (which follows the elements)."""
        return (wb + nw) * per_word > d_count and wb * per_word <= d_count + u_one

    if halves:  # 16-bit elements: no word loads
        @jit
        def data_below(d_count, vector):
            return u32(0)

        @jit
        def data_words(pay, at, src, wb):
            pass
    else:
        load_duo = vector_functions()["load_duo"]

        @jit
        def data_below(d_count, vector):
            """The payload words below which a chunk's (``wb`` to ``wb + 4``) are all
            data of a packed row of ``d_count`` words and the rows allow 8-byte loads of
            them (``vector``: contiguous, 16-byte aligned; ``wb`` is even): 0 for none."""
            return u32(d_count - u64(3)) if vector and d_count >= u64(4) else u32(0)

        @jit
        def data_words(pay, at, src, wb):
            """Words ``wb`` to ``wb + 4`` of a row (below :func:`data_below`) into
            ``pay[at:]``, in two 8-byte loads."""
            a, z = load_duo(src, wb)
            pay[at] = a
            pay[at + 1] = z
            a, z = load_duo(src, wb + u_two)
            pay[at + 2] = a
            pay[at + 3] = z

    @jit
    def class_bounds(d_count, vector):
        """The payload words that :func:`chunk_class` compares a chunk's first word
        with, for a packed row of ``d_count`` elements (32 bits each): data below the
        first, the LSE's chunk at the second, zeros from the third."""
        lse_at = u32(d_count // per_word) if d_count % per_word == u64(0) else no_item
        return (data_below(d_count, vector), lse_at,
                u32((d_count + per_word - u_one) // per_word + u_one))

    @jit
    def chunk_class(c, data_below, lse_at, past_from):
        """What chunk c holds (one of :data:`DATA_CHUNK`, :data:`LSE_CHUNK`,
        :data:`PAST_CHUNK`, :data:`EDGE_CHUNK`), from :func:`class_bounds`: 16 bytes
        of data (loaded in two); the LSE's bits in its first word, zeros after; zeros
        alone; or the data's end, the LSE, in any other way (element by element)."""
        wb = u32((c // u32(LINE_CHUNKS)) * u32(LINE_WORDS) + (c % u32(LINE_CHUNKS)) * u32(4))
        if wb < data_below:
            return data_class
        if wb == lse_at:
            return lse_class
        if wb >= past_from:
            return past_class
        return edge_class

    return SimpleNamespace(line_span=line_span, may_hold_lse=may_hold_lse, data_words=data_words,
                           class_bounds=class_bounds, chunk_class=chunk_class)


@functools.cache
def _chunk_moves(n, halves):
    """Device functions that move one item of ``n`` shards: ``load_line_item`` (from
    this rank's input), ``send_line_item`` (to the peers), ``poll_line_item`` (from a
    peer, with whether its line carries the flag) and ``note_line_item`` (its LSE
    bits)."""
    c = _line_chunks(halves)
    line_span, may_hold_lse, data_words = c.line_span, c.may_hold_lse, c.data_words
    w = packed_words(halves)
    packed_word, note_word = w.packed_word, w.note_word
    r = rank_functions()
    peer_rank, shard_rank = r.peer_rank, r.shard_rank
    row_lse_bits = lse_bits_reader()
    load_pair, store_pair = sync_functions()["load_pair"], sync_functions()["store_pair"]
    jit = cuda.jit(device=True)

    @jit
    def load_line_item(pay, j, data, lse_bits, seq_lens, query_start_loc, num_seqs, b, h, c,
                       holds, me, hn, d_count):
        """Chunk c (of class ``holds``) of every shard's packed row (token b, local head
        h of that shard's rank) from this rank's input into held item j of ``pay``
        (shard k's four words at ``4 * (j * n + k)``). Every load is issued before any
        is used."""
        wb, nw = line_span(c)
        if holds == data_class:
            for k in range(n):
                data_words(pay, 4 * (j * n + k), data[b, shard_rank(k, me) * hn + h], wb)
        elif holds == past_class:  # no load
            for q in range(4 * n):
                pay[4 * j * n + q] = u32(0)
        elif holds == lse_class:  # one load a shard
            for k in range(n):
                at = 4 * (j * n + k)
                pay[at] = row_lse_bits(lse_bits, b, shard_rank(k, me) * hn + h, seq_lens,
                                       query_start_loc, num_seqs)
                pay[at + 1] = u32(0)
                pay[at + 2] = u32(0)
                pay[at + 3] = u32(0)
        else:  # the data's end, the LSE, in any other way: element by element
            for k in range(n):
                head = shard_rank(k, me) * hn + h
                src = data[b, head]
                bits = u32(0)
                if may_hold_lse(wb, nw, d_count):
                    bits = row_lse_bits(lse_bits, b, head, seq_lens, query_start_loc, num_seqs)
                at = 4 * (j * n + k)
                for q in range(4):
                    pay[at + q] = packed_word(src, wb + u64(q), bits, d_count)

    @jit
    def send_line_item(pay, j, lines, slot, me, row, c, flag):
        """Held item j to each peer's lines region, 16 bytes a lane: the 8 lanes of a
        line store it in one instruction, its flag (``flag``) in the last 8 bytes."""
        last = c % u_chunks == u_last
        for k in range(1, n):
            at = 4 * (j * n + k)
            first = u64(pay[at]) | (u64(pay[at + 1]) << thirty_two)
            second = flag if last else u64(pay[at + 2]) | (u64(pay[at + 3]) << thirty_two)
            store_pair(lines[peer_rank(u64(k - 1), me)][slot, me, row], c * u_two, first,
                       second)

    @jit
    def poll_line_item(pay, j, lines, slot, p, k, row, c, flag):
        """Load peer p's (shard k's) chunk c of a row into held item j of ``pay``:
        whether its line carries ``flag``."""
        first, second = load_pair(lines[slot, p, row], c * u_two)
        at = 4 * (j * n + k)
        pay[at] = u32(first & low32)
        pay[at + 1] = u32(first >> thirty_two)
        pay[at + 2] = u32(second & low32)
        pay[at + 3] = u32(second >> thirty_two)
        return c % u_chunks != u_last or second == flag

    @jit
    def note_line_item(lse_low, lse_high, pay, j, r, c, holds, me, d_count):
        """Note the LSE bits that every shard's chunk c (of class ``holds``) of row r
        holds (held item j)."""
        wb, nw = line_span(c)
        if holds == lse_class:  # the first word is the LSE's
            for k in range(n):
                note_word(lse_low, lse_high, r, shard_rank(k, me), wb, pay[4 * (j * n + k)],
                          d_count)
            return
        if holds != edge_class or not may_hold_lse(wb, nw, d_count):
            return
        for k in range(n):
            at = 4 * (j * n + k)
            for q in range(4):
                if u64(q) < nw:
                    note_word(lse_low, lse_high, r, shard_rank(k, me), wb + u64(q), pay[at + q],
                              d_count)

    return SimpleNamespace(load_line_item=load_line_item, send_line_item=send_line_item,
                           poll_line_item=poll_line_item, note_line_item=note_line_item)


@functools.cache
def _held_items(n, halves):
    """Device functions over a thread's held items (their rows, chunks, tokens and
    heads in local arrays of :func:`line_items` entries): ``place_held``,
    ``next_item``, ``token_head``, ``held_chunk``, ``held_class``, ``load_held``,
    ``send_held``, ``poll_held``, ``note_held`` and ``take_held``."""
    chunk_class = _line_chunks(halves).chunk_class
    i = _chunk_moves(n, halves)
    load_line_item, send_line_item = i.load_line_item, i.send_line_item
    poll_line_item, note_line_item = i.poll_line_item, i.note_line_item
    peer_rank = rank_functions().peer_rank
    stopped = peer_functions(n).stopped
    s = sync_functions()
    vote_all, vote_any, now_ns, pause = s["vote_all"], s["vote_any"], s["now_ns"], s["pause"]
    held_items = line_items(n)  # a thread's items in lines, in registers throughout
    jit = cuda.jit(device=True)

    @jit
    def place_held(rows_of, chunks_of, tokens_of, heads_of, j, r, c, b, h, count, tile_first,
                   data_below, lse_at, past_from):
        """Note where this thread's item j of a tile in lines is: row r of the tile's
        ``count`` (:data:`NO_ITEM` past them; token b, local head h), chunk c (its
        class in the top byte); 32 bits each."""
        if r < count:
            rows_of[j] = u32(tile_first + r)
            chunks_of[j] = u32(c) | (u32(chunk_class(u32(c), data_below, lse_at, past_from))
                                     << class_shift)
        else:
            rows_of[j] = no_item
            chunks_of[j] = u32(0)
        tokens_of[j] = u32(b)
        heads_of[j] = u32(h)

    @jit
    def next_item(r, c, b, h, row_step, chunk_step, chunks, hn):
        """(row, chunk, token, local head) of the item ``threads`` after (r, c) of
        token b, head h: no division."""
        c += chunk_step
        if c >= chunks:
            c -= chunks
            row_step += u_one
        r += row_step
        h += row_step
        while h >= hn:
            h -= hn
            b += u_one
        return r, c, b, h

    @jit
    def token_head(row, hn):
        """Row ``row`` of a call (a 32-bit index): its token and local head."""
        return u64(row // u32(hn)), u64(row % u32(hn))

    @jit
    def held_chunk(chunks_of, j):
        """The chunk of this thread's item j."""
        return u64(chunks_of[j] & chunk_mask)

    @jit
    def held_class(chunks_of, j):
        """The class of the chunk of this thread's item j (:func:`chunk_class`)."""
        return u32(chunks_of[j] >> class_shift)

    @jit
    def load_held(pay, j, rows_of, chunks_of, tokens_of, heads_of, data, lse_bits, seq_lens,
                  query_start_loc, num_seqs, me, hn, d_count):
        if rows_of[j] != no_item:
            load_line_item(pay, j, data, lse_bits, seq_lens, query_start_loc, num_seqs,
                           u64(tokens_of[j]), u64(heads_of[j]), held_chunk(chunks_of, j),
                           held_class(chunks_of, j), me, hn, d_count)

    @jit
    def send_held(pay, j, rows_of, chunks_of, lines, slot, me, flag):
        if rows_of[j] != no_item:
            send_line_item(pay, j, lines, slot, me, u64(rows_of[j]), held_chunk(chunks_of, j),
                           flag)

    @jit
    def poll_held(pay, j, rows_of, chunks_of, lines, slot, p, k, flag):
        """:func:`poll_line_item` for this thread's item j (True where it has none)."""
        if rows_of[j] == no_item:
            return True
        return poll_line_item(pay, j, lines, slot, p, k, u64(rows_of[j]),
                              held_chunk(chunks_of, j), flag)

    @jit
    def note_held(pay, j, rows_of, chunks_of, tile_first, lse_low, lse_high, me, d_count):
        if rows_of[j] != no_item:
            note_line_item(lse_low, lse_high, pay, j, u64(rows_of[j]) - tile_first,
                           held_chunk(chunks_of, j), held_class(chunks_of, j), me, d_count)

    @jit
    def take_held(pay, rows_of, chunks_of, warp_first, items, tile_first, lines, slot, me, flag,
                  flags, state, status, timeout_ns, lse_low, lse_high, d_count):
        """Every peer's chunks of this thread's items (once their lines carry ``flag``),
        their LSE bits noted. Warp-wide: every lane of the warp calls it, and it
        returns the same for all: False when a wait failed. A look at all of a
        thread's items is one round trip, however many there are."""
        if warp_first >= items:  # no lane of this warp has an item
            return True
        for k in range(1, n):
            p = peer_rank(u64(k - 1), me)
            start = now_ns()
            spins = 0
            while True:
                ok = poll_held(pay, 0, rows_of, chunks_of, lines, slot, p, k, flag)
                if held_items > 1:
                    ok1 = poll_held(pay, 1, rows_of, chunks_of, lines, slot, p, k, flag)
                    ok = ok and ok1
                if held_items > 2:
                    ok2 = poll_held(pay, 2, rows_of, chunks_of, lines, slot, p, k, flag)
                    ok = ok and ok2
                if held_items > 3:
                    ok3 = poll_held(pay, 3, rows_of, chunks_of, lines, slot, p, k, flag)
                    ok = ok and ok3
                if vote_all(ok):
                    break
                spins += 1
                if spins % CHECK_EVERY == 0:
                    give = False
                    if not ok:
                        give = stopped(flags, state, status, p, me, start, timeout_ns)
                    if vote_any(give):
                        return False
                    pause()
        note_held(pay, 0, rows_of, chunks_of, tile_first, lse_low, lse_high, me, d_count)
        if held_items > 1:
            note_held(pay, 1, rows_of, chunks_of, tile_first, lse_low, lse_high, me, d_count)
        if held_items > 2:
            note_held(pay, 2, rows_of, chunks_of, tile_first, lse_low, lse_high, me, d_count)
        if held_items > 3:
            note_held(pay, 3, rows_of, chunks_of, tile_first, lse_low, lse_high, me, d_count)
        return True

    return SimpleNamespace(place_held=place_held, next_item=next_item, token_head=token_head,
                           held_chunk=held_chunk, held_class=held_class, load_held=load_held,
                           send_held=send_held, take_held=take_held)


@functools.cache
def _held_results(codec, n, halves):
    """Device function ``combine_held``: a held item combined into the output of
    codec ``codec`` (by ``weigh_line`` and ``put_word`` where nothing needs a test)."""
    f = device_functions()
    encode = codec_functions(codec)[4]
    pack_bf16x2, zero = f["pack_bf16x2"], f["zero"]
    pairs, wide = codec == _BF16X2, codec == _F32
    c = payload_combine(codec, n)
    value_low, value_high, weigh_words, nan_row = (c.value_low, c.value_high, c.weigh_words,
                                                   c.nan_row)
    line_span = _line_chunks(halves).line_span
    h = _held_items(n, halves)
    held_chunk, held_class = h.held_chunk, h.held_class
    jit = cuda.jit(device=True)

    @jit
    def put_word(dst, w, low, high):
        """The values of payload word w, rounded once, into the output row (where the
        row has them all)."""
        if pairs:
            dst[w] = pack_bf16x2(low, high)
        elif wide:
            dst[w] = encode(low, low)
        else:
            dst[w * u_two] = encode(low, low)
            dst[w * u_two + u_one] = encode(high, high)

    @jit
    def weigh_line(pay, at, weights, dst, wb, nw):
        """:func:`weigh_words` of a chunk of output values only, with no weight 0 (no
        value to skip): no test but the chunk's length."""
        for q in range(4):
            if u64(q) < nw:
                low = zero
                high = zero
                for k in range(n):
                    word = pay[at + 4 * k + q]
                    low += weights[k] * value_low(word)
                    if not wide:
                        high += weights[k] * value_high(word)
                put_word(dst, wb + u64(q), low, high)

    @jit
    def combine_held(pay, j, rows_of, chunks_of, tokens_of, heads_of, tile_first, bad, weights,
                     line_weights, out, d_values):
        """Combine this thread's item j into the output (NaN if ``bad``), with its
        row's weights as :func:`row_weights` noted them in ``line_weights``."""
        if rows_of[j] != no_item:
            b, h = u64(tokens_of[j]), u64(heads_of[j])
            wb, nw = line_span(held_chunk(chunks_of, j))
            holds = held_class(chunks_of, j)
            if bad:  # no result: NaN, never stale or partial data
                nan_row(b, h, wb, nw, out, d_values)
            elif holds == data_class or holds == edge_class:  # else no output value
                r = u64(rows_of[j]) - tile_first
                live = holds == data_class  # all output values, and no weight 0: no test
                for k in range(n):
                    weights[k] = line_weights[r, k]
                    live = live and weights[k] != zero
                if live:
                    weigh_line(pay, 4 * j * n, weights, out[b, h], wb, nw)
                else:
                    weigh_words(pay, 4 * j * n, 4, weights, b, h, wb, nw, out, d_values)

    return combine_held


@functools.cache
def lines_kernel(codec, n, halves, dependent=False, trace=False):
    """The kernel of the calls in lines, for codec ``codec``, ``n`` ranks and 16-bit
    pushed elements where ``halves`` (the arguments of ``direct_kernel``; its
    word-by-word region's argument is the lines region)."""
    load_relaxed = sync_functions()["load_relaxed"]
    release_dependents = grid_dependency(dependent)[1]
    stamp = trace_functions(trace).stamp
    begin_call = call_start(dependent, trace)
    p = peer_functions(n)
    give_up, arrive = p.give_up, p.arrive
    class_bounds = _line_chunks(halves).class_bounds
    h = _held_items(n, halves)
    place_held, next_item, token_head = h.place_held, h.next_item, h.token_head
    load_held, send_held, take_held = h.load_held, h.send_held, h.take_held
    combine_held = _held_results(codec, n, halves)
    row_weights = payload_combine(codec, n).row_weights
    pairs = codec == _BF16X2
    nan = float32(np.nan)
    held_items = line_items(n)  # a thread's items, in registers throughout
    line_pay_words = 4 * n * held_items  # four words per shard and item
    line_lse_shape = (LINE_TILE_ROWS, n)
    peer_failed = np.int64(PEER_FAILED)
    u_n, u_warp = u64(n), u64(WARP)
    bounds = {} if config.ENABLE_CUDASIM else {"launch_bounds": (WARP * WARPS, BLOCKS_PER_SM)}

    @cuda.jit(**bounds)
    def direct_lines(phases, data_bits, data, lse_bits, lse, seq_lens, query_start_loc, num_seqs,
                     windows, vals, bits, flags, state, status, out, out_lse, write_lse, base_e,
                     self_rank, timeout_ns, tile_rows, push_blocks, lls, push_vector):
        epoch, slot, hn, rows, tiles = begin_call(state, data, vals, tile_rows)
        me = u64(self_rank)
        push_count = u64(data_bits.shape[2])
        vector = push_vector != 0  # the pushes move 16-byte quads
        pushing = (phases & PUSH) != 0
        combining = (phases & COMBINE) != 0
        tid = u64(cuda.threadIdx.y) * u_warp + u64(cuda.threadIdx.x)
        threads = u64(cuda.blockDim.y) * u_warp
        failed = cuda.shared.array(1, np.int32)
        block = u64(cuda.blockIdx.x)
        lse_low = cuda.shared.array(line_lse_shape, np.uint32)
        lse_high = cuda.shared.array(line_lse_shape, np.uint32)
        line_weights = cuda.shared.array(line_lse_shape, np.float32)  # per row and shard
        pay = cuda.local.array(line_pay_words, np.uint32)  # this thread's items
        weights = cuda.local.array(n, np.float32)
        if tid == u64(0):
            failed[0] = 0
        cuda.syncthreads()  # nothing is loaded before it: it costs little
        arrive(state, epoch, combining, tid, threads)  # every thread has read the epoch
        stamp(state, epoch, 2)
        release_dependents()  # the next call may start (it waits for this one)
        dead = load_relaxed(state, 2) != 0  # a dead plan neither pushes nor waits
        peer_flag = np.int64(0)  # as word by word: looked at once this thread has waited
        if combining and tid < u_n and tid != me:
            peer_flag = load_relaxed(flags[me], tid)
        flag = u64(epoch)  # a line's flag: never repeats, so nothing is consumed
        chunks = u64(lls[me].shape[3]) // u_two
        d_values = u64(out.shape[2]) * (u_two if pairs else u_one)
        warp_first = tid - tid % u_warp
        has_tile = block < tiles  # a tile per block (ll_grid), every item of it held
        tile_first = block * u64(tile_rows)
        # the items one at a time, each by its own call: their indices into ``pay``
        # are then constants, and ``pay`` stays in registers; where each is, once
        rows_of = cuda.local.array(held_items, np.uint32)
        chunks_of = cuda.local.array(held_items, np.uint32)
        tokens_of = cuda.local.array(held_items, np.uint32)
        heads_of = cuda.local.array(held_items, np.uint32)
        count = min(u64(tile_rows), rows - tile_first) if has_tile else u64(0)
        row_step, chunk_step = threads // chunks, threads % chunks
        r, c = tid // chunks, tid % chunks  # item tid, then every ``threads``-th
        b, h = token_head(u32(tile_first + r), hn)  # then counted on: no division
        data_below, lse_at, past_from = class_bounds(push_count, vector)
        for j in range(held_items):
            if j > 0:
                r, c, b, h = next_item(r, c, b, h, row_step, chunk_step, chunks, hn)
            place_held(rows_of, chunks_of, tokens_of, heads_of, j, r, c, b, h, count,
                       tile_first, data_below, lse_at, past_from)
        load_held(pay, 0, rows_of, chunks_of, tokens_of, heads_of, data_bits, lse_bits,
                  seq_lens, query_start_loc, num_seqs, me, hn, push_count)
        if held_items > 1:
            load_held(pay, 1, rows_of, chunks_of, tokens_of, heads_of, data_bits, lse_bits,
                      seq_lens, query_start_loc, num_seqs, me, hn, push_count)
        if held_items > 2:
            load_held(pay, 2, rows_of, chunks_of, tokens_of, heads_of, data_bits, lse_bits,
                      seq_lens, query_start_loc, num_seqs, me, hn, push_count)
        if held_items > 3:
            load_held(pay, 3, rows_of, chunks_of, tokens_of, heads_of, data_bits, lse_bits,
                      seq_lens, query_start_loc, num_seqs, me, hn, push_count)
        if pushing and not dead:  # pushes never wait: no deadlock
            send_held(pay, 0, rows_of, chunks_of, lls, slot, me, flag)
            if held_items > 1:
                send_held(pay, 1, rows_of, chunks_of, lls, slot, me, flag)
            if held_items > 2:
                send_held(pay, 2, rows_of, chunks_of, lls, slot, me, flag)
            if held_items > 3:
                send_held(pay, 3, rows_of, chunks_of, lls, slot, me, flag)
        stamp(state, epoch, 3)
        if combining and dead:
            failed[0] = 1
        elif combining:  # a wait's outcome is the same for the whole warp
            if not take_held(pay, rows_of, chunks_of, warp_first, count * chunks, tile_first,
                             lls[me], slot, me, flag, flags, state, status, timeout_ns,
                             lse_low, lse_high, push_count):
                failed[0] = 1
        if has_tile and peer_flag < 0 and failed[0] == 0:
            status[tid] = peer_failed
            give_up(flags, state, me)
            failed[0] = 1
        cuda.syncthreads()  # the tile's LSEs noted
        stamp(state, epoch, 4)
        if combining:
            bad = failed[0] != 0
            if tid < count:  # a row's weights and global LSE, once, by a thread a row
                b, h = token_head(u32(tile_first + tid), hn)
                if bad:
                    if write_lse:
                        out_lse[b, h] = nan
                else:
                    row_weights(weights, lse_low, lse_high, tid, b, h, out_lse, write_lse,
                                base_e, me)
                    for k in range(n):
                        line_weights[tid, k] = weights[k]
            cuda.syncthreads()  # the rows' weights noted
            stamp(state, epoch, 5)
            combine_held(pay, 0, rows_of, chunks_of, tokens_of, heads_of, tile_first, bad,
                         weights, line_weights, out, d_values)
            if held_items > 1:
                combine_held(pay, 1, rows_of, chunks_of, tokens_of, heads_of, tile_first, bad,
                             weights, line_weights, out, d_values)
            if held_items > 2:
                combine_held(pay, 2, rows_of, chunks_of, tokens_of, heads_of, tile_first, bad,
                             weights, line_weights, out, d_values)
            if held_items > 3:
                combine_held(pay, 3, rows_of, chunks_of, tokens_of, heads_of, tile_first, bad,
                             weights, line_weights, out, d_values)
        stamp(state, epoch, 6)

    return direct_lines
