"""The direct kernel in tiles: packed rows pushed into the peers' slots, each tile
behind a flag.

Pushing tile ``t`` of call ``e``: for every peer j, the tile's packed rows of
j's heads go straight into ``window_j.slot[e % 2][r]``; after a barrier,
thread j stores ``e`` into j's flag of (r, t) with a release at system
scope. Combining it: thread p polls this rank's flag of (p, t) for ``>= e``
with an acquire at system scope (bounded), and after a barrier the block
combines the tile's rows, peer slices from the slot, its own from its input.
A small call (``push_blocks == 0``) has every block push its tile one step
before it combines it; a large one has ``push_blocks`` blocks that only push
and the rest only combine. See ``docs/direct-kernels.md``.
"""

import functools

import numpy as np
from numba import config, cuda, float32

from .._device import device_functions
from .._rows import UNROLL, WARP
from .._sync import sync_functions
from .._codecs import RAW, codec_functions
from ..combine import lane_weights, row_accumulator
from ..pack import packed_row_steps
from ._peers import (COMBINE, PUSH, call_start, grid_dependency, peer_functions, rank_functions,
                     trace_functions)
from ._window import BLOCKS_PER_SM, WARPS

__all__ = ["tiles_kernel"]

u64 = np.uint64
u_one, u_two = u64(1), u64(2)


@functools.cache
def _tile_cursor():
    jit = cuda.jit(device=True)

    @jit
    def tile_cursor(t, tile_rows, rows, tid, group):
        """Tile t's first row and row count, this thread's lane in its row's group of
        ``group`` lanes, and the group's first row in the tile."""
        first = t * tile_rows
        return first, min(tile_rows, rows - first), tid % group, tid // group

    return tile_cursor


@functools.cache
def _tile_pushes(n, push_group, halves):
    """Device functions ``preload_push`` (a thread's first push step, loaded early)
    and ``push_and_release`` (a tile into every peer's slot, then its flags), for
    rows of ``push_group`` lanes of 16-bit elements where ``halves``."""
    load_first_step, write_packed_row_from = packed_row_steps(push_group, quads=not halves)
    peer_rank = rank_functions().peer_rank
    tile_cursor = _tile_cursor()
    store_release = sync_functions()["store_release"]
    u_push_group, u_n = u64(push_group), u64(n)
    jit = cuda.jit(device=True)

    @jit
    def push_target(i, first, count, me, hn):
        """Item i of pushing a tile of ``count`` rows from row ``first`` (every row to
        the first peer, then to the next, ...): the peer, the token, the local head."""
        row = first + i % count
        return peer_rank(i // count, me), row // hn, row % hn

    @jit
    def preload_push(t, tile_rows, rows, data, me, hn, d_count, tid, buf, vector):
        """Load this thread's first step of its first item of tile t into ``buf``
        (its loads then need not wait for anything): whether it had one."""
        first, count, lane, i = tile_cursor(t, tile_rows, rows, tid, u_push_group)
        if i < (u_n - u_one) * count:
            j, b, h = push_target(i, first, count, me, hn)
            load_first_step(data[b, j * hn + h], buf, lane, d_count, vector)
            return True
        return False

    @jit
    def push_tile(t, tile_rows, rows, data, lse_bits, seq_lens, query_start_loc, num_seqs,
                  windows, slot, me, hn, width, d_count, tid, groups, buf, loaded, vector):
        """This thread's share of tile t's rows into every peer's window; ``loaded``:
        ``buf`` holds its first step (:func:`preload_push`); ``vector``: in 16-byte
        quads (``packed_row_steps``)."""
        first, count, lane, i = tile_cursor(t, tile_rows, rows, tid, u_push_group)
        items = (u_n - u_one) * count
        while i < items:
            j, b, h = push_target(i, first, count, me, hn)
            head = j * hn + h
            write_packed_row_from(data[b, head], windows[j][slot, me, b, h], lse_bits, b, head,
                                  seq_lens, query_start_loc, num_seqs, lane, d_count, width,
                                  buf, loaded, vector)
            loaded = False
            i += groups

    @jit
    def push_and_release(t, tile_rows, rows, data, lse_bits, seq_lens, query_start_loc, num_seqs,
                         windows, flags, slot, me, hn, width, d_count, tid, threads, max_tiles,
                         epoch, buf, loaded, vector):
        """Push tile t to every peer, then raise its flag at each."""
        push_tile(t, tile_rows, rows, data, lse_bits, seq_lens, query_start_loc, num_seqs,
                  windows, slot, me, hn, width, d_count, tid, threads // u_push_group, buf,
                  loaded, vector)
        cuda.syncthreads()  # the tile's stores, before the flags' release
        if tid < u_n and tid != me:
            store_release(flags[tid], u_n + me * max_tiles + t, epoch)

    return preload_push, push_and_release


@functools.cache
def _tile_combines(codec, n, group, unroll, trace):
    """Device function ``wait_and_combine``: wait for every peer's tile, then combine
    it into the output of codec ``codec`` (NaN once a wait failed), ``group`` lanes
    a row, ``unroll`` elements a lane and step."""
    f = device_functions()
    lse_lanes, load_lse, _, _, encode = codec_functions(codec)
    load_two, add_weighted, store_row = row_accumulator(codec, group, unroll)
    row_is_empty = f["row_is_empty"]
    row_weights = lane_weights(codec, own_first=True)
    global_lse, shard_weight = f["global_lse"], f["shard_weight"]
    zero, neg_inf, nan = f["zero"], f["neg_inf"], float32(np.nan)
    peer_rank = rank_functions().peer_rank
    wait_for = peer_functions(n).wait_for
    stamp = trace_functions(trace).stamp
    tile_cursor = _tile_cursor()
    accumulators = 2 * unroll
    u_group, u_step, u_n = u64(group), u64(group * unroll), u64(n)
    jit = cuda.jit(device=True)

    @jit
    def nan_tile(t, tile_rows, rows, out, out_lse, write_lse, hn, tid, groups):
        first, count, lane, i = tile_cursor(t, tile_rows, rows, tid, u_group)
        while i < count:
            b = (first + i) // hn
            h = (first + i) % hn
            base = lane
            while base < u64(out.shape[2]):
                out[b, h, base] = encode(nan, nan)
                base += u_group
            if write_lse and lane == u64(0):
                out_lse[b, h] = nan
            i += groups

    @jit
    def combine_tile(t, tile_rows, rows, data, lse, seq_lens, query_start_loc, num_seqs,
                     vals, bits, slot, out, out_lse, write_lse, base_e, me, hn, tid, groups,
                     acc, first, second):
        width = u64(vals.shape[4])
        d_count = u64(out.shape[2])
        window_vals = vals[slot]
        window_bits = bits[slot]
        start, count, lane, i = tile_cursor(t, tile_rows, rows, tid, u_group)
        while i < count:
            b = (start + i) // hn
            h = (start + i) % hn
            head = me * hn + h
            dst = out[b, h]
            own = data[b, head]
            # the first step's loads of this rank's and the first peer's values go out
            # with those of the LSEs: one memory round trip, not two
            load_two(first, second, own, window_vals[peer_rank(u64(0), me), b, h], lane,
                     d_count)
            loaded = True
            own_lse = lse[b, head]
            if row_is_empty(np.int64(b), seq_lens, query_start_loc, num_seqs):
                own_lse = neg_inf
            low, high = lse_lanes(window_vals, window_bits, b, h, width)
            m, inv_total, total = row_weights((low, high), own_lse, me, n, base_e)
            if write_lse and lane == u64(0):
                out_lse[b, h] = global_lse(total, m, base_e)
            base = lane
            while base < d_count:
                for k in range(accumulators):
                    acc[k] = zero
                # shard p: this rank's own for p == 0, else peer p - 1's
                p = u64(0)
                while p < u_n:  # two shards at a time
                    p1 = min(p + u_one, u_n - u_one)
                    r1 = peer_rank(p1 - u_one, me)  # p1 >= 1
                    src1 = window_vals[r1, b, h]
                    if p == u64(0):
                        if not loaded:
                            load_two(first, second, own, src1, base, d_count)
                        loaded = False
                        w0 = shard_weight(own_lse, m, inv_total, base_e)
                    else:
                        r0 = peer_rank(p - u_one, me)
                        load_two(first, second, window_vals[r0, b, h], src1, base, d_count)
                        w0 = shard_weight(load_lse(low, high, r0), m, inv_total, base_e)
                    w1 = zero
                    if p1 != p:
                        w1 = shard_weight(load_lse(low, high, r1), m, inv_total, base_e)
                    add_weighted(acc, first, second, w0, w1, base, d_count)
                    p += u_two
                store_row(dst, acc, base, d_count)
                base += u_step
            i += groups

    @jit
    def wait_and_combine(t, tile_rows, rows, data, lse, seq_lens, query_start_loc, num_seqs,
                         vals, bits, flags, state, status, slot, out, out_lse, write_lse, base_e,
                         me, hn, tid, threads, max_tiles, epoch, timeout_ns, doomed, failed, acc,
                         first, second):
        """Wait for every peer's tile t, then combine it (NaN once a wait failed)."""
        if tid < u_n and tid != me and failed[0] == 0:
            if not wait_for(flags, state, status, tid, u_n + tid * max_tiles + t, epoch, me,
                            timeout_ns, doomed):
                failed[0] = 1
        cuda.syncthreads()  # the polls' acquires, before the block's loads
        stamp(state, epoch, 4)
        if failed[0] != 0:  # no result: NaN, never stale or partial data
            nan_tile(t, tile_rows, rows, out, out_lse, write_lse, hn, tid, threads // u_group)
        else:
            combine_tile(t, tile_rows, rows, data, lse, seq_lens, query_start_loc, num_seqs,
                         vals, bits, slot, out, out_lse, write_lse, base_e, me, hn, tid,
                         threads // u_group, acc, first, second)
        cuda.syncthreads()  # every thread read ``failed`` before the next wait

    # a block waits for its tiles' pushes: the more blocks resident at once (each with
    # a tile), the sooner a call ends; the bounds cap the registers (of either kernel,

    return wait_and_combine


@functools.cache
def tiles_kernel(codec, n, push_group, group, halves, dependent=False, unroll=UNROLL,
                 trace=False):
    """The kernel of the calls in tiles, for codec ``codec``, ``n`` ranks, ``push_group``
    and ``group`` lanes a row in the push and the combine, and 16-bit pushed
    elements where ``halves`` (the arguments of ``direct_kernel``)."""
    load_relaxed = sync_functions()["load_relaxed"]
    release_dependents = grid_dependency(dependent)[1]
    stamp = trace_functions(trace).stamp
    begin_call = call_start(dependent, trace)
    arrive = peer_functions(n).arrive
    preload_push, push_and_release = _tile_pushes(n, push_group, halves)
    wait_and_combine = _tile_combines(codec, n, group, unroll, trace)
    accumulators = 2 * unroll
    raw = RAW[codec]
    push_raw = np.uint16 if halves else np.uint32  # the pushed elements
    u_n, u_warp = u64(n), u64(WARP)
    # a block waits for its tiles' pushes: the more blocks resident at once (each with
    # a tile), the sooner a call ends; the bounds cap the registers (of either kernel,
    # traced or not) to keep BLOCKS_PER_SM blocks of at most WARPS warps
    bounds = {} if config.ENABLE_CUDASIM else {"launch_bounds": (WARP * WARPS, BLOCKS_PER_SM)}

    @cuda.jit(**bounds)
    def direct_tiles(phases, data_bits, data, lse_bits, lse, seq_lens, query_start_loc, num_seqs,
                     windows, vals, bits, flags, state, status, out, out_lse, write_lse, base_e,
                     self_rank, timeout_ns, tile_rows, push_blocks, lls, push_vector):
        epoch, slot, hn, rows, tiles = begin_call(state, data, vals, tile_rows)
        me = u64(self_rank)
        max_tiles = (u64(flags[0].shape[0]) - u_n) // u_n
        push_width = u64(windows[0].shape[4])
        push_count = u64(data_bits.shape[2])
        vector = push_vector != 0  # the pushes move 16-byte quads
        pushing = (phases & PUSH) != 0
        combining = (phases & COMBINE) != 0
        tid = u64(cuda.threadIdx.y) * u_warp + u64(cuda.threadIdx.x)
        threads = u64(cuda.blockDim.y) * u_warp
        failed = cuda.shared.array(1, np.int32)
        block = u64(cuda.blockIdx.x)
        grid = u64(cuda.gridDim.x)
        acc = cuda.local.array(accumulators, np.float32)
        first = cuda.local.array(unroll, raw)
        second = cuda.local.array(unroll, raw)
        buf = cuda.local.array(UNROLL, push_raw)  # a push's first step, loaded early
        if tid == u64(0):  # a fast start only: blocks that fail later tell each other
            failed[0] = load_relaxed(state, 2) != 0
        # a peer that gave up in an earlier call fails this one on every rank alike
        # (its flags may show tiles it pushed before it gave up); the load, issued now,
        # is awaited only by the first wait
        doomed = False
        if combining and tid < u_n and tid != me:
            doomed = load_relaxed(flags[me], tid) < 0
        pushers = u64(push_blocks)
        small = pushers == u64(0)
        # a small call's first push loads its data now, beside the state's loads
        loaded = False
        if small and pushing and block < tiles:
            loaded = preload_push(block, u64(tile_rows), rows, data_bits, me, hn, push_count,
                                  tid, buf, vector)
        cuda.syncthreads()
        stamp(state, epoch, 2)
        if small:  # the next call may start (it waits for this one)
            release_dependents()
        else:  # every thread has read the epoch
            arrive(state, epoch, combining, tid, threads)
        if small:  # every block pushes a tile one step before it combines it
            t = block
            ahead = t  # the next tile to push
            while t < tiles:
                # ``failed`` is the same for every thread here: it changes only between
                # the barriers of the wait below
                while pushing and ahead <= t + grid and ahead < tiles and failed[0] == 0:
                    push_and_release(ahead, u64(tile_rows), rows, data_bits, lse_bits, seq_lens,
                                     query_start_loc, num_seqs, windows, flags, slot, me, hn,
                                     push_width, push_count, tid, threads, max_tiles, epoch,
                                     buf, loaded and ahead == block, vector)
                    ahead += grid
                    stamp(state, epoch, 3)
                if t == block:  # every thread has read the epoch; arriving (a fence and an
                    # atomic) once the first pushes are out keeps it off their path
                    arrive(state, epoch, combining, tid, threads)
                if combining:
                    wait_and_combine(t, u64(tile_rows), rows, data, lse, seq_lens,
                                     query_start_loc, num_seqs, vals, bits, flags, state, status,
                                     slot, out, out_lse, write_lse, base_e, me, hn, tid, threads,
                                     max_tiles, epoch, timeout_ns, doomed, failed, acc, first,
                                     second)
                t += grid
            if block >= tiles:  # a block without a tile (tile_grid's grids have none but
                # for a call of no rows, which the plan never launches)
                arrive(state, epoch, combining, tid, threads)
        elif block < pushers:  # a pushing block: it never waits
            t = block
            while pushing and t < tiles and failed[0] == 0:
                push_and_release(t, u64(tile_rows), rows, data_bits, lse_bits, seq_lens,
                                 query_start_loc, num_seqs, windows, flags, slot, me, hn,
                                 push_width, push_count, tid, threads, max_tiles, epoch, buf,
                                 False, vector)
                t += pushers
            stamp(state, epoch, 3)
        else:  # a combining block
            t = block - pushers
            while combining and t < tiles:
                wait_and_combine(t, u64(tile_rows), rows, data, lse, seq_lens, query_start_loc,
                                 num_seqs, vals, bits, flags, state, status, slot, out, out_lse,
                                 write_lse, base_e, me, hn, tid, threads, max_tiles, epoch,
                                 timeout_ns, doomed, failed, acc, first, second)
                t += grid - pushers
        stamp(state, epoch, 6)

    return direct_tiles
