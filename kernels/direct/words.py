"""The direct kernel word by word: the smallest calls, with no fence and no flag.

Each uint64 word of the word-by-word region ``ll[2][N][R][W]`` carries 4
bytes of a packed row and, in its high half, the call's tag (never 0); the
words are stored and polled two at a time (``store_pair``, ``load_pair``),
and the reader zeroes each word it takes. See ``docs/direct-kernels.md``
for the protocol and why no word is ever read stale.
"""

import functools
from types import SimpleNamespace

import numpy as np
from numba import config, cuda

from .._rows import WARP
from .._sync import sync_functions
from .._codecs import _BF16X2
from ..pack import lse_bits_reader
from ._peers import (CHECK_EVERY, COMBINE, PEER_FAILED, PUSH, call_start, grid_dependency,
                     peer_functions, rank_functions, trace_functions)
from ._shared import packed_words, payload_combine
from ._window import BLOCKS_PER_SM, LL_TILE_ROWS, WARPS

__all__ = ["words_kernel"]

u64, u32 = np.uint64, np.uint32
u_one, u_two = u64(1), u64(2)
low32, thirty_two = u64(0xFFFFFFFF), u64(32)


@functools.cache
def _word_items(n, halves):
    """Device functions that place a word-by-word tile's items (``ll_item``), load
    them from this rank's input for every shard (``load_item``, by
    ``packed_pair``), store them at the peers (``send_item``) and note the LSE
    bits they hold (``note_item``, by ``note_lse``)."""
    row_lse_bits = lse_bits_reader()
    w = packed_words(halves)
    packed_word, note_word = w.packed_word, w.note_word
    r = rank_functions()
    peer_rank, shard_rank = r.peer_rank, r.shard_rank
    store_pair = sync_functions()["store_pair"]
    per_word = u64(2 if halves else 1)  # push elements per 32-bit word
    jit = cuda.jit(device=True)

    @jit
    def packed_pair(src, c, lse_bits, b, head, seq_lens, query_start_loc, num_seqs, d_count):
        """32-bit words ``2c`` and ``2c + 1`` of the packed row of ``src`` (token b, head)."""
        bits = u32(0)
        if (c + u_one) * u_two * per_word > d_count:  # the LSE may be in this pair
            bits = row_lse_bits(lse_bits, b, head, seq_lens, query_start_loc, num_seqs)
        w = c * u_two
        return packed_word(src, w, bits, d_count), packed_word(src, w + u_one, bits, d_count)

    @jit
    def ll_item(i, first, chunks, hn):
        """Item i of a word-by-word tile from row ``first``: (row in the tile, token,
        local head, pair of words), pairs fastest."""
        r = i // chunks
        return r, (first + r) // hn, (first + r) % hn, i % chunks

    @jit
    def load_item(pay, data, lse_bits, seq_lens, query_start_loc, num_seqs, b, h, c, me, hn,
                  d_count):
        """Pair c of every shard's packed row (token b, local head h of that shard's
        rank) from this rank's input into ``pay`` (shard k at ``2k``): its own, and
        what it sends each peer. Every load is issued before any is used."""
        for k in range(n):
            head = shard_rank(k, me) * hn + h
            a, z = packed_pair(data[b, head], c, lse_bits, b, head, seq_lens, query_start_loc,
                               num_seqs, d_count)
            pay[2 * k] = a
            pay[2 * k + 1] = z

    @jit
    def send_item(pay, lls, slot, me, row, c, tag):
        """The loaded pairs to each peer's word-by-word region: 4 bytes of the packed
        row and the tag per word, two words per store; no fence."""
        for k in range(1, n):
            store_pair(lls[peer_rank(u64(k - 1), me)][slot, me, row], c * u_two,
                       u64(pay[2 * k]) | tag, u64(pay[2 * k + 1]) | tag)

    @jit
    def note_item(lse_low, lse_high, pay, r, c, me, d_count):
        """Note the LSE bits that every shard's pair c of row r holds (``pay``)."""
        for k in range(n):
            note_lse(lse_low, lse_high, r, shard_rank(k, me), c, pay[2 * k], pay[2 * k + 1],
                     d_count)

    @jit
    def note_lse(lse_low, lse_high, r, p, c, a, z, d_count):
        """Note the LSE's bits that pair c (words a, z) of shard p's row r holds."""
        note_word(lse_low, lse_high, r, p, c * u_two, a, d_count)
        note_word(lse_low, lse_high, r, p, c * u_two + u_one, z, d_count)

    return SimpleNamespace(ll_item=ll_item, load_item=load_item, send_item=send_item,
                           note_item=note_item)


@functools.cache
def _word_waits(n):
    """Device function ``take_item``: every peer's pair of words of an item, once
    they carry the call's tag (bounded: ``stopped``), by ``ll_take``, ``ll_wait``
    and ``carries``."""
    load_pair, now_ns, pause = (sync_functions()[k] for k in ("load_pair", "now_ns", "pause"))
    stopped = peer_functions(n).stopped
    peer_rank = rank_functions().peer_rank
    jit = cuda.jit(device=True)

    @jit
    def take_item(pay, lls, slot, me, row, c, tag, flags, state, status, timeout_ns, consume):
        """Every peer's pair c of a row into ``pay`` (shard k at ``2k``), once it carries
        ``tag``; False when a wait failed."""
        for k in range(1, n):
            arrived, a, z = ll_take(lls[me], slot, peer_rank(u64(k - 1), me), row, c, tag,
                                    flags, state, status, me, timeout_ns, consume)
            if not arrived:
                return False
            pay[2 * k] = a
            pay[2 * k + 1] = z
        return True

    @jit
    def carries(first, second, tag):
        """Whether both words of a pair carry ``tag`` (in their high halves)."""
        return (first & ~low32) == tag and (second & ~low32) == tag

    @jit
    def ll_wait(words, w, tag, flags, state, status, p, me, timeout_ns):
        """Poll a pair of words until both carry ``tag`` (bounded, as ``wait_for``):
        ``(arrived, first, second)``."""
        first, second = load_pair(words, w)
        if carries(first, second, tag):
            return True, first, second
        start = now_ns()
        spins = 1  # the first look at the clock comes after CHECK_EVERY polls
        while True:
            if spins % CHECK_EVERY == 0:
                if stopped(flags, state, status, p, me, start, timeout_ns):
                    return False, first, second
                pause()
            spins += 1
            first, second = load_pair(words, w)
            if carries(first, second, tag):
                return True, first, second

    @jit
    def ll_take(ll, slot, p, row, c, tag, flags, state, status, me, timeout_ns, consume):
        """Peer p's pair c of a row, once it carries ``tag``: ``(arrived, first
        payload, second)``; ``consume`` zeroes the words (no later call can then mistake
        them for its own)."""
        words = ll[slot, p, row]
        w = c * u_two
        arrived, a, z = ll_wait(words, w, tag, flags, state, status, p, me, timeout_ns)
        if arrived and consume:
            words[w] = u64(0)
            words[w + u_one] = u64(0)
        return arrived, u32(a & low32), u32(z & low32)

    return take_item


@functools.cache
def _word_results(codec, n):
    """Device functions ``combine_words`` and ``nan_words``: an item's words combined
    into the output, or NaN."""
    c = payload_combine(codec, n)
    row_weights, weigh_words, nan_row = c.row_weights, c.weigh_words, c.nan_row
    nan = np.float32(np.nan)
    jit = cuda.jit(device=True)

    @jit
    def combine_words(pay, at, per, weights, lse_low, lse_high, r, b, h, wb, nw, out, out_lse,
                      write_lse, base_e, me, d_values):
        """The exact combine of payload words ``wb`` to ``wb + nw`` (at most 4) of row r
        (token b, local head h): shard k's in ``pay[at + per * k:]``, the LSEs as
        noted."""
        row_weights(weights, lse_low, lse_high, r, b, h, out_lse, write_lse and wb == u64(0),
                    base_e, me)
        weigh_words(pay, at, per, weights, b, h, wb, nw, out, d_values)

    @jit
    def nan_words(b, h, wb, nw, out, out_lse, write_lse, d_values):
        if write_lse and wb == u64(0):
            out_lse[b, h] = nan
        nan_row(b, h, wb, nw, out, d_values)

    return combine_words, nan_words


@functools.cache
def words_kernel(codec, n, halves, dependent=False, trace=False):
    """The kernel of the calls word by word, for codec ``codec``, ``n`` ranks and
    16-bit pushed elements where ``halves`` (the arguments of ``direct_kernel``)."""
    s = sync_functions()
    load_relaxed = s["load_relaxed"]
    release_dependents = grid_dependency(dependent)[1]
    stamp = trace_functions(trace).stamp
    begin_call = call_start(dependent, trace)
    p = peer_functions(n)
    give_up, arrive = p.give_up, p.arrive
    i = _word_items(n, halves)
    ll_item, load_item, send_item, note_item = i.ll_item, i.load_item, i.send_item, i.note_item
    take_item = _word_waits(n)
    combine_words, nan_words = _word_results(codec, n)
    pairs = codec == _BF16X2
    pay_words = 2 * n  # a (row, pair) item's words: two per shard
    lse_shape = (LL_TILE_ROWS, n)  # a word-by-word tile's LSE bits, per row and shard
    peer_failed = np.int64(PEER_FAILED)
    u_n, u_warp = u64(n), u64(WARP)
    bounds = {} if config.ENABLE_CUDASIM else {"launch_bounds": (WARP * WARPS, BLOCKS_PER_SM)}

    @cuda.jit(**bounds)
    def direct_words(phases, data_bits, data, lse_bits, lse, seq_lens, query_start_loc, num_seqs,
                     windows, vals, bits, flags, state, status, out, out_lse, write_lse, base_e,
                     self_rank, timeout_ns, tile_rows, push_blocks, lls, push_vector):
        epoch, slot, hn, rows, tiles = begin_call(state, data, vals, tile_rows)
        me = u64(self_rank)
        push_count = u64(data_bits.shape[2])
        pushing = (phases & PUSH) != 0
        combining = (phases & COMBINE) != 0
        tid = u64(cuda.threadIdx.y) * u_warp + u64(cuda.threadIdx.x)
        threads = u64(cuda.blockDim.y) * u_warp
        failed = cuda.shared.array(1, np.int32)
        block = u64(cuda.blockIdx.x)
        grid = u64(cuda.gridDim.x)
        lse_low = cuda.shared.array(lse_shape, np.uint32)
        lse_high = cuda.shared.array(lse_shape, np.uint32)
        pay = cuda.local.array(pay_words, np.uint32)  # this thread's first item
        pay2 = cuda.local.array(pay_words, np.uint32)  # a later one
        weights = cuda.local.array(n, np.float32)
        if tid == u64(0):
            failed[0] = 0
        cuda.syncthreads()  # nothing is loaded before it: it costs little
        arrive(state, epoch, combining, tid, threads)  # every thread has read the epoch
        stamp(state, epoch, 2)
        release_dependents()  # the next call may start (it waits for this one)
        dead = load_relaxed(state, 2) != 0  # a dead plan neither pushes nor waits
        # a peer that gave up before this call fails it on every rank alike (it may
        # have pushed this call's words before it gave up); the load is issued now,
        # its value looked at only once this thread has waited
        peer_flag = np.int64(0)
        if combining and tid < u_n and tid != me:
            peer_flag = load_relaxed(flags[me], tid)
        tag = (u64(epoch) % low32 + u_one) << thirty_two  # never 0, the consumed words
        chunks = u64(lls[me].shape[3]) // u_two
        lse_at = push_count * (u_two if halves else u64(4))  # the LSE's first byte
        lse_first, lse_last = lse_at // u64(8), (lse_at + u64(3)) // u64(8)  # its pairs
        d_values = u64(out.shape[2]) * (u_two if pairs else u_one)
        t = block
        while t < tiles:
            tile_first = t * u64(tile_rows)
            items = min(u64(tile_rows), rows - tile_first) * chunks
            # this thread's first item stays in registers (``pay``) from its loads to
            # its combine; every load of it is issued before anything waits
            held = tid < items
            r, b, h, c = ll_item(tid, tile_first, chunks, hn)
            if held:
                load_item(pay, data_bits, lse_bits, seq_lens, query_start_loc, num_seqs, b,
                          h, c, me, hn, push_count)
            if pushing and not dead:  # pushes never wait: no deadlock
                if held:
                    send_item(pay, lls, slot, me, tile_first + r, c, tag)
                i = tid + threads
                while i < items:
                    r2, b2, h2, c2 = ll_item(i, tile_first, chunks, hn)
                    load_item(pay2, data_bits, lse_bits, seq_lens, query_start_loc, num_seqs,
                              b2, h2, c2, me, hn, push_count)
                    send_item(pay2, lls, slot, me, tile_first + r2, c2, tag)
                    i += threads
            stamp(state, epoch, 3)
            if combining and dead:
                failed[0] = 1
            elif combining and held:
                if take_item(pay, lls, slot, me, tile_first + r, c, tag, flags, state, status,
                             timeout_ns, True):
                    note_item(lse_low, lse_high, pay, r, c, me, push_count)
                else:
                    failed[0] = 1
            # the LSEs among this thread's later items: noted now, combined after
            i = tid + threads
            while combining and i < items and failed[0] == 0:
                r2, b2, h2, c2 = ll_item(i, tile_first, chunks, hn)
                if c2 == lse_first or c2 == lse_last:
                    load_item(pay2, data_bits, lse_bits, seq_lens, query_start_loc, num_seqs,
                              b2, h2, c2, me, hn, push_count)
                    if take_item(pay2, lls, slot, me, tile_first + r2, c2, tag, flags, state,
                                 status, timeout_ns, False):
                        note_item(lse_low, lse_high, pay2, r2, c2, me, push_count)
                    else:
                        failed[0] = 1
                i += threads
            if peer_flag < 0 and failed[0] == 0:
                status[tid] = peer_failed
                give_up(flags, state, me)
                failed[0] = 1
            cuda.syncthreads()  # the tile's LSEs noted
            stamp(state, epoch, 4)
            i = tid
            while combining and i < items:
                if i != tid:  # a later item: its words now
                    r, b, h, c = ll_item(i, tile_first, chunks, hn)
                    if failed[0] == 0:
                        load_item(pay, data_bits, lse_bits, seq_lens, query_start_loc,
                                  num_seqs, b, h, c, me, hn, push_count)
                        if not take_item(pay, lls, slot, me, tile_first + r, c, tag, flags,
                                         state, status, timeout_ns, True):
                            failed[0] = 1
                if failed[0] != 0:  # no result: NaN, never stale or partial data
                    nan_words(b, h, c * u_two, u_two, out, out_lse, write_lse, d_values)
                else:
                    combine_words(pay, 0, 2, weights, lse_low, lse_high, r, b, h, c * u_two,
                                  u_two, out, out_lse, write_lse, base_e, me, d_values)
                i += threads
            cuda.syncthreads()  # the LSEs read, before the next tile notes its own
            t += grid
        stamp(state, epoch, 6)

    return direct_words
