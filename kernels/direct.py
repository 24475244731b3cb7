"""The direct kernels: push head slices into the peers' windows, then combine.

Every rank owns a *window* that its peers write into (CUDA IPC memory):
``flags[N]`` int64 and two receive slots ``slot[2][N][max_tokens][H/N][D + P]``
in the packed format of ``cupy_dcp.layout`` (a call of B tokens uses the first
B of each rank's chunk, so the slots never move with B). It also owns a
private ``state[4]`` int64 in device memory: ``state[0]`` the epoch (calls pushed so far),
``state[1]`` the push's block-arrival counter, ``state[2]`` non-zero once a
wait failed (the plan is then dead: pushes stop, combines write NaN).

Call ``e`` (``e = 1, 2, ...``) uses slot ``e % 2``:

1. ``push`` (rank r): for every peer j, the packed rows of j's heads go
   straight into ``window_j.slot[e % 2][r]``. Each block, after a barrier,
   fences (GPU scope) and arrives on ``state[1]``; the last block to arrive
   fences again and stores ``e`` into ``window_j.flags[r]`` of every peer with
   ``st.release.sys``, then advances ``state[0]`` to ``e``.
2. ``combine`` (rank j): one thread per block polls ``flags[r] >= e`` of every
   peer with ``ld.acquire.sys`` (for at most ``timeout_ns``), then the block
   combines: peer slices from ``slot[e % 2]``, its own slice from its input.

The epoch lives in device memory and only kernels advance it, so a call
captured in a CUDA graph advances it at every replay, like an eager call.

Why no call overwrites a slot its owner still reads. Rank r's push of call
``e + 2`` writes ``window_j.slot[e % 2]``, which j's combine of call ``e``
reads. On r's stream that push follows r's combine of call ``e + 1``, which
returned only after it saw ``window_r.flags[j] >= e + 1``: a value j stores
at the end of its push of call ``e + 1`` or later, and j's stream runs that
push only after j's combine of call ``e`` has finished. So j's reads of call
``e`` are done before r's writes of call ``e + 2`` begin. Within a call, the
reader sees the data because every store of the push precedes, in causality
order, the release store of the flag: the barrier orders a block's stores
before its first thread's fence and arrival (a release pattern, GPU scope:
every block runs on one GPU); the last block's arrival reads every other's,
and its fence after it makes an acquire pattern; the flag store is a release
at system scope, which is cumulative. The reader's one thread loads the flag
with an acquire at system scope, and a barrier orders its block's loads
after it. (A system-scope fence per block instead measured 0.6 us slower per
push on an H200, for nothing the argument needs.) The argument needs only
that the calls of one plan are ordered on each rank (one stream, or
synchronised) and that every rank makes the same calls, as with any
collective.

A failed wait (a peer missing for ``timeout_ns``, or a peer that announced
its own failure with flag ``-1``) records, in the host-visible ``status[N]``,
``1`` (timed out) or ``2`` (peer failed) for that peer, sets ``state[2]``,
stores ``-1`` into its own flag at every peer (so they fail fast instead of
waiting), and writes NaN into the rows of every block that has not combined
yet (the others stop waiting once one has given up). Nothing traps: the host
reads ``status`` and raises.
"""

import functools

import numpy as np
from numba import cuda, float32, types

from ._device import device_functions
from ._launch import DeviceArray, SpecializedKernel, array_type
from ._rows import UNROLL, WARP, lanes_per_row, row_cursor, row_grid
from ._sync import sync_functions
from .combine import _BF16, _BF16X2, RAW, _codecs, combine_kind, row_accumulator
from .pack import packed_row_writer

__all__ = ["STATE_WORDS", "TIMED_OUT", "PEER_FAILED", "direct_combine_kernel",
           "direct_combine_launch", "push_kernel", "push_launch"]

STATE_WORDS = 4
TIMED_OUT, PEER_FAILED = 1, 2


@functools.cache
def _push_kernel(n, group=WARP):
    write_packed_row = packed_row_writer(group)
    store_release = sync_functions()["store_release"]
    cursor = row_cursor()

    u64 = np.uint64
    u_group, u_one, u_n = u64(group), u64(1), u64(n)

    @cuda.jit
    def push(data, lse_bits, seq_lens, query_start_loc, num_seqs, windows, flags, state,
             self_rank):
        me = u64(self_rank)
        epoch = state[0] + 1
        slot = u64(epoch & 1)
        b_count = u64(data.shape[0])
        hn = u64(windows[0].shape[3])
        width = u64(windows[0].shape[4])
        d_count = u64(data.shape[2])
        alive = state[2] == 0
        rows = (u_n - u_one) * b_count * hn if alive else u64(0)
        lane, row, row_step = cursor(u_group)
        while row < rows:
            h = row % hn
            b = (row // hn) % b_count
            k = row // (b_count * hn)
            j = k + u_one if k >= me else k  # the peers, this rank skipped
            head = j * hn + h
            write_packed_row(data[b, head], windows[j][slot, me, b, h], lse_bits, b, head,
                             seq_lens, query_start_loc, num_seqs, lane, d_count, width)
            row += row_step
        cuda.syncthreads()  # the block's stores, before its first thread's fence
        if cuda.threadIdx.x == 0 and cuda.threadIdx.y == 0:
            cuda.threadfence()  # release, then arrive
            arrived = cuda.atomic.add(state, 1, 1)
            if arrived == cuda.gridDim.x - 1:  # the last block: every block has arrived
                cuda.threadfence()  # acquire: their stores precede the flags' release
                if alive:
                    for p in range(n):
                        if p != self_rank:
                            store_release(flags[p], self_rank, epoch)
                state[1] = 0
                state[0] = epoch

    return push


@functools.cache
def push_kernel(n, bits, group=WARP):
    """The push kernel for ``n`` ranks, element bits ``bits`` (uint16 or uint32) and
    ``group`` lanes per row."""
    i64 = types.int64
    window = array_type(bits, 5, True)
    flag = array_type(np.int64, 1, True)
    argtypes = (array_type(bits, 3, False), array_type(np.uint32, 2, False),
                array_type(np.int64, 1, True), array_type(np.int64, 1, True), i64,
                types.UniTuple(window, n), types.UniTuple(flag, n), flag, i64)
    return SpecializedKernel(_push_kernel(n, group), argtypes)


def push_launch(data, lse_bits, seq_lens, query_start_loc, num_seqs, windows, flags, state,
                self_rank):
    """``(kernel, grid, block, args)`` of one push, :class:`DeviceArray` arguments in
    (``windows``: each rank's ``[2, N, max_tokens, H/N, D + P]`` bits view, of
    which the first B tokens are used; ``flags``: each rank's ``[N]`` int64); moved as uint32 words where the 16-bit data allows."""
    n = len(windows)
    if data.dtype.itemsize == 2:
        words = [data.as_words()] + [w.as_words() for w in windows]
        if None not in words:
            data, windows = words[0], tuple(words[1:])
    group = lanes_per_row(data.shape[2])
    grid, block = row_grid(max(1, (n - 1) * data.shape[0] * windows[0].shape[3]), group)
    return push_kernel(n, data.dtype, group), grid, block, (
        data, lse_bits, seq_lens, query_start_loc, int(num_seqs), tuple(windows), tuple(flags),
        state, int(self_rank))


@functools.cache
def _direct_combine_kernel(kind, n, group=WARP, unroll=UNROLL):
    f = device_functions()
    s = sync_functions()
    load_acquire, store_release, now_ns, pause = (s["load_acquire"], s["store_release"],
                                                  s["now_ns"], s["pause"])
    row_is_empty = f["row_is_empty"]
    accumulators = 2 * unroll
    lse_lanes, load_lse, _, _, encode = _codecs(kind)
    add_weighted, store_row = row_accumulator(kind, group, unroll)
    raw = RAW[kind]
    clean_lse, finish_max, lse_exp = f["clean_lse"], f["finish_max"], f["lse_exp"]
    inverse_total, global_lse, shard_weight = f["inverse_total"], f["global_lse"], f["shard_weight"]
    zero, neg_inf, nan = f["zero"], f["neg_inf"], float32(np.nan)
    timed_out, peer_failed = np.int64(TIMED_OUT), np.int64(PEER_FAILED)
    cursor = row_cursor()

    u64 = np.uint64
    u_group, u_step, u_one, u_two, u_n = u64(group), u64(group * unroll), u64(1), u64(2), u64(n)

    @cuda.jit(device=True)
    def wait_for_peers(flags, peer_flags, state, status, epoch, me, timeout_ns):
        """Poll every peer's flag for this epoch; on failure record it and tell the peers."""
        # state[2] is read past the L1 cache (another block of this grid may set it):
        # once one block has given up, the others stop waiting too
        failed = load_acquire(state, 2) != 0
        start = now_ns()
        p = 0
        while p < n and not failed:
            if p != me:
                seen = load_acquire(flags, p)
                while seen < epoch and not failed:
                    if seen < 0:
                        status[p] = peer_failed
                        failed = True
                    elif now_ns() - start > timeout_ns:
                        status[p] = timed_out
                        failed = True
                    elif load_acquire(state, 2) != 0:
                        failed = True
                    else:
                        pause()
                        seen = load_acquire(flags, p)
            p += 1
        if failed and cuda.atomic.exch(state, 2, 1) == 0:  # the first to fail tells the peers
            cuda.threadfence_system()
            for q in range(n):
                if q != me:
                    store_release(peer_flags[q], me, np.int64(-1))
        return failed

    @cuda.jit
    def combine(data, lse, seq_lens, query_start_loc, num_seqs, vals, bits, flags, peer_flags,
                state, status, out, out_lse, write_lse, base_e, self_rank, timeout_ns):
        me = u64(self_rank)
        epoch = state[0]
        slot = u64(epoch & 1)
        hn = u64(vals.shape[3])
        rows = u64(out.shape[0]) * hn
        width = u64(vals.shape[4])
        d_count = u64(out.shape[2])
        failed = cuda.shared.array(1, np.int32)
        if cuda.threadIdx.x == 0 and cuda.threadIdx.y == 0:
            failed[0] = wait_for_peers(flags, peer_flags, state, status, epoch, self_rank,
                                       timeout_ns)
        cuda.syncthreads()
        lane, row, row_step = cursor(u_group)
        if failed[0]:  # no result: NaN, never stale or partial data
            while row < rows:
                b = row // hn
                h = row % hn
                base = lane
                while base < d_count:
                    out[b, h, base] = encode(nan, nan)
                    base += u_group
                if write_lse and lane == 0:
                    out_lse[b, h] = nan
                row += row_step
            return
        window_vals = vals[slot]
        window_bits = bits[slot]
        acc = cuda.local.array(accumulators, np.float32)
        first = cuda.local.array(unroll, raw)
        second = cuda.local.array(unroll, raw)
        while row < rows:
            b = row // hn
            h = row % hn
            head = me * hn + h
            dst = out[b, h]
            own = data[b, head]
            own_lse = lse[b, head]
            if row_is_empty(np.int64(b), seq_lens, query_start_loc, num_seqs):
                own_lse = neg_inf
            low, high = lse_lanes(window_vals, window_bits, b, h, width)
            # shard p: this rank's own for p == 0, else peer p - 1 or p (this rank skipped)
            m = clean_lse(own_lse)
            for p in range(n):
                if p != self_rank:
                    m = max(m, clean_lse(load_lse(low, high, p)))
            m = finish_max(m)
            total = lse_exp(clean_lse(own_lse) - m, base_e)
            for p in range(n):
                if p != self_rank:
                    total += lse_exp(clean_lse(load_lse(low, high, p)) - m, base_e)
            inv_total = inverse_total(total)
            if write_lse and lane == 0:
                out_lse[b, h] = global_lse(total, m, base_e)
            base = lane
            while base < d_count:
                for k in range(accumulators):
                    acc[k] = zero
                p = u64(0)
                while p < u_n:  # two shards at a time
                    p1 = min(p + u_one, u_n - u_one)
                    r1 = p1 - u_one if p1 - u_one < me else p1  # p1 >= 1
                    src1 = window_vals[r1, b, h]
                    if p == u64(0):
                        for k in range(unroll):  # every load issued before any is used
                            d = base + u64(k) * u_group
                            if d < d_count:
                                first[k] = own[d]
                                second[k] = src1[d]
                        w0 = shard_weight(own_lse, m, inv_total, base_e)
                    else:
                        r0 = p - u_one if p - u_one < me else p
                        src0 = window_vals[r0, b, h]
                        for k in range(unroll):
                            d = base + u64(k) * u_group
                            if d < d_count:
                                first[k] = src0[d]
                                second[k] = src1[d]
                        w0 = shard_weight(load_lse(low, high, r0), m, inv_total, base_e)
                    w1 = zero
                    if p1 != p:
                        w1 = shard_weight(load_lse(low, high, r1), m, inv_total, base_e)
                    add_weighted(acc, first, second, w0, w1, base, d_count)
                    p += u_two
                store_row(dst, acc, base, d_count)
                base += u_step
            row += row_step

    return combine


@functools.cache
def direct_combine_kernel(dtype, n, pairs=False, group=WARP):
    """The direct combine for output ``dtype`` (bfloat16 ``pairs``: uint32 words),
    ``n`` ranks and ``group`` lanes per row."""
    kind, value = combine_kind(dtype, pairs)
    bits = np.dtype(np.uint32 if value.itemsize == 4 else np.uint16)
    i64 = types.int64
    flag = array_type(np.int64, 1, True)
    argtypes = (array_type(value, 3, False), array_type(np.float32, 2, False),
                array_type(np.int64, 1, True), array_type(np.int64, 1, True), i64,
                array_type(value, 5, True), array_type(bits, 5, True), flag,
                types.UniTuple(flag, n), flag, flag,
                array_type(value, 3, False), array_type(np.float32, 2, False), i64, i64, i64, i64)
    return SpecializedKernel(_direct_combine_kernel(kind, n, group), argtypes)


def direct_combine_launch(dtype, data, lse, seq_lens, query_start_loc, num_seqs, window,
                          flags, peer_flags, state, status, out, out_lse, is_lse_base_on_e,
                          self_rank, timeout_ns):
    """``(kernel, grid, block, args)`` of one direct combine.

    ``data`` is this rank's ``[B, H, D]`` partials seen as the kind's values,
    ``lse`` its float32 ``[B, H]``, ``window`` its own ``[2, N, max_tokens, H/N,
    D + P]`` bits view; bfloat16 goes in pairs where the data, window and output allow.
    """
    kind, value = combine_kind(dtype)
    n = len(peer_flags)
    window_vals = window.view(value)
    window_bits = window
    if kind == _BF16:
        words = data.as_words(), window.as_words(), out.as_words()
        if None not in words:
            kind = _BF16X2
            data, window_vals, out = words
            window_bits = window_vals
    write_lse = out_lse is not None
    if not write_lse:  # never read: a placeholder of the right type
        out_lse = DeviceArray(out.ptr, (0, 0), (4, 4), np.float32, out.owner)
    group = lanes_per_row(out.shape[2])
    grid, block = row_grid(out.shape[0] * out.shape[1], group)
    kernel = direct_combine_kernel(dtype, n, kind == _BF16X2, group)
    return kernel, grid, block, (
        data, lse, seq_lens, query_start_loc, int(num_seqs), window_vals, window_bits, flags,
        tuple(peer_flags), state, status, out, out_lse, int(write_lse),
        int(bool(is_lse_base_on_e)), int(self_rank), int(timeout_ns))
