"""The direct kernel: push head slices into the peers' windows and combine, in tiles.

Every rank owns a *window* that its peers write into (CUDA IPC memory):
int64 ``flags`` (``flags[p]``, ``p < N``: set to ``-1`` by peer ``p`` when it
gave up; then ``flags[N + p * max_tiles + t]``: the last call whose tile
``t`` peer ``p`` has delivered) and two receive slots
``slot[2][N][max_tokens][H/N][D + P]`` in the packed format of
``cupy_dcp.layout``, its rows padded to :func:`row_stride` elements so that
each starts on a 32-byte sector (on a 128-byte line where that costs little):
the pushes then cross NVLink as whole sectors; then the *word-by-word region*
``ll[2][N][R][W]`` of uint64 words (``R = ll_rows``, ``W = ll_words``, see
below), then the *lines region* (below). A call of B tokens uses the
first B of each rank's chunk, so the slots never move with B. It also owns a private
``state[4]`` int64 in device memory: ``state[0]`` the epoch (calls made so
far: a call advances it once every block has read it), ``state[1]`` the
blocks' arrival counter, ``state[2]`` non-zero once
a wait failed (the plan is then dead: pushes stop, combines write NaN).

A call of B tokens has ``B * H/N`` rows per rank pair, cut into tiles of
``tile_rows`` consecutive (token, head) rows (the same cut on every rank: it
depends on B alone). Call ``e`` (``e = state[0] + 1``) uses slot ``e % 2``.
Pushing tile ``t`` means: for every peer j, the tile's packed rows of j's
heads go straight into ``window_j.slot[e % 2][r]`` (16 bytes a store where
the rows allow, see :func:`direct_launch`); after a barrier, thread
j stores ``e`` into j's flag of (r, t) with ``st.release.sys``. Combining it
means: thread p polls this rank's flag of (p, t) for ``>= e`` with
``ld.acquire.sys`` (for at most ``timeout_ns``); after a barrier the block
combines the tile's rows: peer slices from ``slot[e % 2]``, its own slice
from its input. :func:`tile_grid` picks one of two schedules by the call's size:

- *small calls* (``push_blocks == 0``): each block takes the tiles
  ``t = blockIdx, blockIdx + grid, ...`` and pushes each one step before it
  combines it (push ``t``, push ``t + grid``, combine ``t``, ...). With a
  tile per block (of up to :data:`SMALL_TILE_ROWS` rows; several tiles only
  where a rank has fewer than three blocks), a call is one push, one fence
  and one flag away from its combine: the more blocks, the sooner (on two
  H200s, 32 tokens of 64 heads a rank took 16.1 us in 256 blocks of 8 rows,
  16.3 in 128 of 16, 18.1 split as a large call, and 21.0 in 264 blocks
  taking two tiles of 4 rows each, with the flags' minimum tile lowered for
  the measurement). The first push's loads are issued before the block's
  first barrier, beside those of the plan's state; the block counts its
  arrival (a fence and an atomic) only once its first pushes are out; and a tile's
  combine loads its first values with the LSEs, in one memory round trip;
- *large calls*: blocks ``b < push_blocks`` only push (tiles ``b``,
  ``b + push_blocks``, ...) and never wait; the others only combine, in the
  same order. The link then carries pushes without pause while the
  combining blocks work out of HBM behind them (in the bench on two H200s
  a 2048-token call went from 532 to 431 us).

The smallest calls (no more than ``R`` rows per rank pair: B <= 4 at
H/N = 64, in tiles of at most :data:`LL_TILE_ROWS` rows) go *word by word*
instead, with no fence and no flag, in a kernel of their own (its registers
then do not cost the tiled kernel its occupancy): each uint64 word of ``ll``
carries 4 bytes of the packed row and, in its high half, the call's tag
(``e mod (2**32 - 1) + 1``, never 0), and the words are stored two at a time
with ``st.relaxed.sys.v2.b64`` (each word of the pair is single-copy atomic,
so a reader sees a word whole, old or new). A tile's *items* are its (row,
pair of words) couples, one per thread and more where a tile has more than
the block has threads. A thread loads its first item from its input for
every shard at once (its own slice, and what it sends each peer), stores the
peers' pairs, polls each peer's pair of the same item until both words carry
``e``'s tag, and zeroes it. The threads whose pairs hold a row's LSE bits
note them in shared memory; after one barrier every thread combines its
first item straight from its registers and stores it. Later items are taken
after the barrier (their LSEs noted before it, their words read twice). No
block waits for a peer before its pushes, and no memory round trip follows
the words' arrival but the stores of the result. Twice the bytes cross, for the link
latency of a flag and a fence less (on two H200s a 1-token call takes 4.9 us
against 7.3 us for the kernel that unpacked the words into the slot and then
combined from there, and 8.1 us for NCCL's raw all-to-all; from 8 tokens on,
the flags win). The region's size in rows is the threshold, measured for
bf16 at D = 512 only.

Calls too large to go word by word but small enough for the *lines region*
(``lines[2][N][R'][W']`` uint64, after the word-by-word region: ``R'`` rows
of ``W'`` words, :func:`line_words`) go *in lines*, as NCCL's LL128 protocol
does, in a kernel of their own: a row is cut into 128-byte lines of
:data:`LINE_WORDS` 32-bit words of the packed row, each line ending in an
8-byte flag, the call's epoch ``e`` itself (it never repeats, so nothing is
zeroed). A line is 8 chunks of 16 bytes; an *item* is a (row, chunk) couple
and the items of a tile are taken by the threads in turn, so the 8 lanes
of a line are 8 consecutive lanes of one warp and store it with one
instruction (``st.relaxed.sys.v2.b64``, the last lane's second word the
flag). Each thread holds all its items (:func:`line_items`, at most 4;
:func:`line_tile_rows` bounds a tile so that they suffice) in registers
from the loads of its input to its combine: it loads them for every shard
at once, stores the peers' chunks, then polls its own region's chunks of
every item until every lane of its warp sees, in each line it reads, the
flag ``e`` (a warp vote: one memory round trip per look, however many
items). The threads whose chunks hold a row's LSE note it in shared memory;
after a barrier one thread a row works out the row's weights (and its
global LSE) into shared memory, and after a second each thread combines its
items from its registers. No fence, no flag store, no second read: against
a tile behind flags a call saves the fence's round trip and the flag's, and
each warp starts on its lines as soon as they are in (two H200s, B = 8: 6.4
us against 9.1 in tiles; B = 32: 14.4 against 16.0, before the weights went
per row). The combine is bound by the instructions it issues: when each
thread worked out the weights of every item it held, a B = 32 call spent
its last 3.3 us combining (``cupy_dcp._direct_trace``), 2.3 us with the
weights once a row (and a branch-free bfloat16 rounding); the call went
from 14.1 to 13.7 us. Nsight Compute counted, in a B = 32 call's combine
phase run alone, 1564 instructions per warp, a third of them integer
multiply-adds (index arithmetic) and few of them loads, stores or
floating-point work. So a thread works out where its items are once, when
it places them: their tokens and heads counted on from its first (no
division an item) and what each chunk holds (:data:`DATA_CHUNK` and the
others, in the top byte of its index); its loads, notes and combine branch
on that. A chunk of data is two 8-byte loads a shard and the LSE's chunk one
(not the element-by-element path, which a warp runs whole for any one lane);
a chunk of output values whose row has no zero weight is combined without a
test a word, bfloat16 pairs rounded by ``cvt.rn.bf16x2.f32``. That took the
count to 1098 (the combine proper from 527 to 215) and the call from 13.6 to
12.1 us (one run, both kernels).

The lines lean on the hardware more than the words do: that the 8 stores of
a line, made by one warp instruction to 128 consecutive aligned bytes,
reach the peer's memory together, and that one warp instruction's loads of
those bytes see them all or none. NCCL's LL128 protocol relies on the same
on NVLink (and enables it only where it holds); no documented memory model
promises it. ``CUPY_DCP_LINES=0`` (see ``cupy_dcp.direct``) turns the lines
off: those calls then go in tiles. Across calls the argument below holds as
it does for words: a line of call ``e + 2`` can only be stored once its
reader has finished call ``e``; and a stale line never passes, as its flag
is an older epoch.

A kernel built ``dependent`` is launched as a programmatic dependent of the
kernel before it on the stream: it may be scheduled while that kernel ends,
and waits for it (``griddepcontrol.wait``: complete, its memory visible)
before its first load, so all that follows holds as for an ordinary launch.
A small call (no pushing-only blocks) then lets the kernel after it start
early likewise; a large one does not (its blocks fill the GPU: little to
overlap). Waits poll :data:`CHECK_EVERY` times before their first look at
the clock and the failure flags, and as often between two looks.

Every block counts its arrival once all its threads have read the epoch
(a small call's blocks in tiles once their first pushes are out, to keep a
fence and an atomic off their path; blocks of a call word by word or in
lines at their first barrier, before their loads: the arriving thread's
fence and atomic then overlap the other warps' pushes, where after the
waits they held the block's combine back at its next barrier: on two
H200s, B = 8 in lines went from 6.5 to 6.2 us, B = 32 from 13.7 to 13.4),
and the last block to arrive advances
``state[0]`` to ``e`` (the next call reads it only once this one is
complete). The epoch lives in device memory and only the kernel advances it,
so a call captured in a CUDA graph advances it at every replay, like an
eager call.

Why no call overwrites a slot its owner still reads. Rank r's call ``e + 2``
writes ``window_j.slot[e % 2]``, which j's call ``e`` reads. On r's stream
call ``e + 2`` follows r's call ``e + 1``, which completed only after it saw
j's flags of call ``e + 1`` (``>= e + 1``; every call has a tile), or its
words tagged ``e + 1``, or its lines flagged ``e + 1``: values j stores
during its call ``e + 1``, and j's
stream runs that call only after j's call ``e`` has completed, its reads
included. So j's reads of call ``e`` are done before r's writes of call
``e + 2`` begin, whichever way each call went (a word-by-word call writes
``ll[e % 2]`` alone, a call in lines ``lines[e % 2]`` alone, and their reads
are done by then too). A flag can
already hold
``e + 1`` when j waits for ``e``: r then finished call ``e``, whose data (in
the other slot than call ``e + 1``'s) came before. A word's tag is never
stale, however long the plan lives: every word a call sends is read, and
zeroed, by that call's reader (before its call completes, so before the word
can be sent again), and no call's tag is zero. (A call that fails leaves
words behind, but the plan is dead after it.) A line's flag needs no such
care: it is the 64-bit epoch of the call that stored it, and the reader of
call ``e`` takes only ``e``.

For word-by-word calls (and calls in lines) this argument leans on the
hardware rather than on a release/acquire pair, as NCCL's LL protocol does:
the words are stored and polled relaxed, so "j's reads and zeroing stores of
call ``e`` come before r's stores of call ``e + 2``" holds because a kernel
completes only once its loads have returned and its stores are performed,
and j's stream starts call ``e + 1``, whose words r waited for, only after
that.

Within a call the reader sees the tile's data because every store of it
precedes, in causality order, the release store of its flag: the barrier
orders the block's stores before the releasing thread's store, and a
release at system scope is cumulative. The polling thread loads the flag
with an acquire at system scope, and a barrier orders its block's loads
after it. The argument needs only that the calls of one plan are ordered on
each rank (one stream, or synchronised) and that every rank makes the same
calls, as with any collective.

No deadlock: a block waits only for tiles that the peers' blocks push
before they wait themselves (one step ahead, all of them, or in blocks that
never wait), and the host sizes the grid so that every block of every rank
sharing a GPU is resident at once.

A failed wait (a peer missing for ``timeout_ns``, or a peer that announced
its own failure) records, in the host-visible ``status[N]``, ``1`` (timed
out) or ``2`` (peer failed) for that peer, sets ``state[2]``, stores ``-1``
into its own failure flag at every peer (so they fail fast instead of
waiting), and writes NaN into every row not combined yet (the other blocks
stop waiting once one has given up). A peer found to have given up at the
start of a call fails that call at its first wait, on every rank alike, even
where its flags show tiles (or its words, or lines) that it pushed before it
gave up. That call still pushes to it, into the slot (or word or lines
region) of this call,
which the peer's last call does not read; a dead plan pushes nothing, and
every peer's next call fails. Nothing traps: the host reads ``status`` and
raises.

For tests and measurement, ``phases`` can run the push alone (``PUSH``:
the epoch is not advanced) and then the combine alone (``COMBINE``), which
lets one process play every rank in turn (the CUDA simulator).
"""

import functools
import typing

import numpy as np
from numba import config, cuda, float32, types

from ._format import BFLOAT16, c_strides
from ._device import device_functions
from ._launch import DeviceArray, SpecializedKernel, array_type
from ._rows import UNROLL, WARP, lanes_per_row
from ._sync import sync_functions
from ._vector import QUAD, vector_functions
from .combine import _BF16, _BF16X2, _F16, _F32, RAW, _codecs, combine_kind, row_accumulator
from .pack import lse_bits_reader, packed_row_steps

__all__ = ["COMBINE", "PUSH", "WORDS", "LINES", "LINE_MAX_ROWS", "line_items", "line_rows",
           "line_tile_rows", "line_words", "region_grid", "STATE_WORDS", "TIMED_OUT",
           "PEER_FAILED", "MIN_TILE_ROWS", "SMALL_TILE_ROWS",
           "LL_MAX_ROWS", "LL_TILE_ROWS", "WindowLayout", "call_grid", "call_kernels",
           "direct_kernel", "direct_launch", "flag_words",
           "ll_grid", "ll_rows", "ll_words", "row_stride", "tile_grid", "window_layout"]

STATE_WORDS = 4
TRACE_STAMPS = 8  # per block and call parity, after ``state``, in a traced kernel
TIMED_OUT, PEER_FAILED = 1, 2
PUSH, COMBINE = 1, 2
WARPS = 8  # per block
BLOCKS_PER_SM = 2  # of WARPS warps, that the kernels' registers leave room for (launch bounds)
MIN_TILE_ROWS = 8  # bounds the flags: a tile has at least this many rows
SMALL_TILE_ROWS = 16  # the most rows of a small call's tiles (one per block)
TILES_PER_BLOCK = 32  # tiles a pushing block takes in a large call: the pipeline's depth
SPLIT_TILE_ROWS = 24  # the fewest rows of a tile in a large call
PUSH_SHARE = 1 / 3  # of the blocks of a large call, those that only push
LL_MAX_ROWS = 256  # the most (token, head) rows per rank pair that a call sends word by word
LL_TILE_ROWS = 16  # the most rows of a word-by-word tile (a block notes their LSEs)
CHECK_EVERY = 64  # polls between two looks at the clock and the failure flags
LINE_BYTES = 128  # a line of the lines region: 120 payload bytes, then its 8-byte flag
LINE_WORDS = 30  # the 32-bit payload words of a line
LINE_CHUNKS = 8  # 16-byte chunks of a line (a lane's store each; the last ends in the flag)
LINE_TILE_ROWS = 64  # the most rows of a tile in lines (a block notes their LSEs)
LINE_MAX_ROWS = 4096  # the most (token, head) rows per rank pair that a call sends in lines
NO_ITEM = 0xFFFFFFFF  # the row of an item a thread does not hold, in lines
# what a chunk of a row in lines holds, noted in the top byte of its index (CLASS_SHIFT):
# 16 bytes of data (loaded in two), the LSE's bits and zeros (no data), zeros alone
# (nothing loaded, nothing combined), anything else (element by element)
DATA_CHUNK, LSE_CHUNK, PAST_CHUNK, EDGE_CHUNK = 0, 1, 2, 3
CLASS_SHIFT = 24


def row_stride(width, itemsize):
    """Elements from one window row to the next, for rows of ``width`` elements."""
    sector = -(-width * itemsize // 32) * 32
    line = -(-width * itemsize // 128) * 128
    return (line if 8 * line <= 9 * sector else sector) // itemsize


def flag_words(n, max_tokens, local_heads):
    """The int64 words of a window's flags for ``n`` ranks."""
    return n * (1 + -(-max_tokens * local_heads // MIN_TILE_ROWS))


def ll_words(width, itemsize):
    """The uint64 words of one row in the word-by-word region: 4 bytes of the packed
    row and the call's tag in each, an even number (they are stored in pairs)."""
    return 2 * -(-width * itemsize // 8)


def line_words(width, itemsize):
    """The uint64 words of one row in the lines region: whole 128-byte lines of
    :data:`LINE_WORDS` 32-bit words of the packed row and a flag each."""
    words = -(-width * itemsize // 4)  # 32-bit words of the packed row
    return LINE_BYTES // 8 * -(-words // LINE_WORDS)


def line_items(n):
    """The items (16-byte chunks of a row) that one thread of a call in lines holds in
    registers from its loads to its combine, for ``n`` ranks: 32 words in all
    (four per shard and item) up to 8 ranks."""
    return max(1, 8 // n)


def line_tile_rows(n, words, threads):
    """The most rows of a tile in lines, for rows of ``words`` uint64 words
    (:func:`line_words`) and blocks of ``threads``: every item of the tile held at
    once (:func:`line_items` a thread); 0 where a row is more than a block holds."""
    return min(LINE_TILE_ROWS, line_items(n) * threads // max(1, words // 2))


def line_rows(n, max_tokens, local_heads, width, itemsize, max_blocks, threads=WARP * WARPS):
    """The rows per rank pair of the lines region: as many as a call in lines may
    have, on ``max_blocks`` blocks of ``threads`` (each holds a tile of at most
    :func:`line_tile_rows`), :data:`LINE_MAX_ROWS` at most; 0 where a row is more
    than a block holds."""
    tile = line_tile_rows(n, line_words(width, itemsize), threads)
    return min(max_tokens * local_heads, LINE_MAX_ROWS, tile * max_blocks)


def ll_rows(max_tokens, local_heads):
    """The rows per rank pair of the word-by-word region: calls of no more rows
    take that path."""
    return min(max_tokens * local_heads, LL_MAX_ROWS)


class WindowLayout(typing.NamedTuple):
    """Where everything lies in one rank's window (:func:`window_layout`)."""

    flag_words: int  # int64 words of the flags, from byte 0
    slots_offset: int  # bytes from the window's start to the receive slots
    slots_shape: tuple  # (2, N, max_tokens, H/N, width) elements of the packed rows
    slots_strides: tuple  # their byte strides (rows padded to ``row_stride``)
    ll_offset: int  # bytes to the word-by-word region
    ll_shape: tuple  # (2, N, R, W) uint64, C-contiguous
    line_offset: int  # bytes to the lines region (a multiple of LINE_BYTES)
    line_shape: tuple  # (2, N, R', W') uint64, C-contiguous
    nbytes: int  # the whole window

    @property
    def padded_slots_shape(self):
        """The slots' shape, padding included: what holds them apart from a window."""
        return self.slots_shape[:-1] + (self.slots_strides[-2] // self.slots_strides[-1],)


def window_layout(n, max_tokens, local_heads, width, itemsize, rows=None, line_rows=None):
    """The window of ``n`` ranks for ``max_tokens`` tokens of ``local_heads`` heads of
    packed rows of ``width`` elements of ``itemsize`` bytes: flags, then the slots
    (512-byte aligned), then the word-by-word region of ``rows`` rows per rank pair
    (:func:`ll_rows` by default; 0 sends nothing word by word), then the lines
    region of ``line_rows`` (:func:`line_rows` for the plan's grid; by default
    every row of ``max_tokens``, :data:`LINE_MAX_ROWS` at most; 0 sends nothing
    in lines)."""
    words = flag_words(n, max_tokens, local_heads)
    slots_offset = -(-8 * words // 512) * 512
    padded = (2, n, max_tokens, local_heads, row_stride(width, itemsize))
    slots_bytes = int(np.prod(padded)) * itemsize
    rows = ll_rows(max_tokens, local_heads) if rows is None else rows
    ll_shape = (2, n, rows, ll_words(width, itemsize))
    ll_offset = slots_offset + slots_bytes  # a multiple of 32: row_stride's sectors
    if line_rows is None:
        line_rows = min(max_tokens * local_heads, LINE_MAX_ROWS)
    line_shape = (2, n, line_rows, line_words(width, itemsize))
    line_offset = -(-(ll_offset + 8 * int(np.prod(ll_shape))) // LINE_BYTES) * LINE_BYTES
    return WindowLayout(words, slots_offset, padded[:-1] + (width,), c_strides(padded, itemsize),
                        ll_offset, ll_shape, line_offset, line_shape,
                        line_offset + 8 * int(np.prod(line_shape)))


def ll_grid(rows, max_blocks):
    """``(tile_rows, blocks)`` of a word-by-word call: as many blocks as can help."""
    per_tile = max(1, -(-rows // max_blocks))
    return per_tile, -(-rows // per_tile)


def tile_grid(rows, max_blocks):
    """``(tile_rows, blocks, push_blocks)`` for a call of ``rows`` (token, head) rows
    per rank pair, on at most ``max_blocks`` blocks.

    A small call (a tile of at most :data:`SMALL_TILE_ROWS` rows per block) has
    every block push its tile and combine it (``push_blocks == 0``): the latency
    of one push, fence and flag is all there is; its tiles have the fewest rows
    (a multiple of :data:`MIN_TILE_ROWS`) that let the blocks hold them all.
    On fewer than three blocks (a sliver of a shared GPU) every call is small:
    each block takes about :data:`TILES_PER_BLOCK` tiles, as large as that
    needs. A larger call on more blocks splits them: a share (:data:`PUSH_SHARE`) only push, ahead
    of the rest, which only combine; its tiles have at least
    :data:`SPLIT_TILE_ROWS` rows, and a pushing block takes about
    :data:`TILES_PER_BLOCK` of them. (On two H200s, at 64 tokens of 64 heads
    a rank, one tile of 16 rows per block took 25.1 us and the split 27.4.)
    """
    def tile_rows(takers, fewest=MIN_TILE_ROWS):  # rows a tile for ``takers`` tiles or fewer
        return max(fewest, -(-rows // (takers * MIN_TILE_ROWS)) * MIN_TILE_ROWS)

    if max_blocks >= 3 and rows <= max_blocks * SMALL_TILE_ROWS:
        per_tile = tile_rows(max_blocks)
        return per_tile, max(1, -(-rows // per_tile)), 0
    if max_blocks < 3:  # a sliver of a GPU: every block takes many tiles
        per_tile = tile_rows(max_blocks * TILES_PER_BLOCK)
        tiles = -(-rows // per_tile)
        return per_tile, max(1, min(tiles, max_blocks)), 0
    pushers = max(1, int(max_blocks * PUSH_SHARE))
    per_tile = tile_rows(pushers * TILES_PER_BLOCK, SPLIT_TILE_ROWS)
    tiles = -(-rows // per_tile)
    pushers = min(tiles, pushers)
    return per_tile, pushers + min(tiles, max_blocks - pushers), pushers


WORDS, LINES = -1, -2  # ``push_blocks`` of a call word by word, of one in lines


def call_grid(rows, ll_capacity, max_blocks, ll_max_blocks=None, line_capacity=0,
              line_max_rows=0, line_max_blocks=None):
    """``(tile_rows, blocks, push_blocks)`` of a call of ``rows`` rows per rank pair:
    word by word (``push_blocks == WORDS``, :func:`ll_grid` on ``ll_max_blocks``,
    by default ``max_blocks``) where the call's rows fit the word-by-word region
    (``ll_capacity`` rows) and a block's tile has no more than :data:`LL_TILE_ROWS`;
    else in lines (``LINES``, :func:`ll_grid` on ``line_max_blocks``, by default
    ``max_blocks``) where they fit the lines region (``line_capacity`` rows) and a
    block's tile has no more than ``line_max_rows`` (:func:`line_tile_rows`); else
    behind flags (:func:`tile_grid`)."""
    if rows <= ll_capacity:
        tile_rows, blocks = ll_grid(rows, max_blocks if ll_max_blocks is None else ll_max_blocks)
        if tile_rows <= LL_TILE_ROWS:
            return tile_rows, blocks, WORDS
    if rows <= line_capacity:
        tile_rows, blocks = ll_grid(rows, max_blocks if line_max_blocks is None
                                    else line_max_blocks)
        if tile_rows <= line_max_rows:
            return tile_rows, blocks, LINES
    return tile_grid(rows, max_blocks)


def region_grid(n, rows, ll_shape, line_shape, max_blocks, ll_max_blocks=None,
                line_max_blocks=None, threads=WARP * WARPS):
    """:func:`call_grid` of a call of ``rows`` rows per rank pair among ``n`` ranks,
    for a word-by-word region and a lines region of these shapes (uint64 ``[2, N,
    rows, words]``; ``line_shape`` ``None``: none) and blocks of ``threads``."""
    line_capacity = line_max_rows = 0
    if line_shape is not None and line_shape[2]:
        line_capacity = line_shape[2]
        line_max_rows = line_tile_rows(n, line_shape[3], threads)
    return call_grid(rows, ll_shape[2], max_blocks, ll_max_blocks, line_capacity, line_max_rows,
                     line_max_blocks)


@functools.cache
def _direct_kernel(kind, n, push_group, group, halves, dependent=False, unroll=UNROLL,
                   trace=False, word_by_word=False, lines=False):
    f = device_functions()
    s = sync_functions()
    if dependent:  # griddepcontrol: Hopper and later
        await_predecessor, release_dependents = s["grid_dependency_wait"], s["launch_dependents"]
    else:
        @cuda.jit(device=True)
        def await_predecessor():
            pass

        release_dependents = await_predecessor
    load_acquire, load_relaxed, store_release = (s["load_acquire"], s["load_relaxed"],
                                                 s["store_release"])
    load_pair, store_pair = s["load_pair"], s["store_pair"]
    vote_all, vote_any = s["vote_all"], s["vote_any"]
    now_ns, pause = s["now_ns"], s["pause"]
    load_first_step, write_packed_row_from = packed_row_steps(push_group, quads=not halves)
    row_lse_bits = lse_bits_reader()
    row_is_empty = f["row_is_empty"]
    accumulators = 2 * unroll
    lse_lanes, load_lse, _, _, encode = _codecs(kind)
    load_two, add_weighted, store_row = row_accumulator(kind, group, unroll)
    raw = RAW[kind]
    push_raw = np.uint16 if halves else np.uint32  # the pushed elements
    clean_lse, finish_max, lse_exp = f["clean_lse"], f["finish_max"], f["lse_exp"]
    inverse_total, global_lse, shard_weight = f["inverse_total"], f["global_lse"], f["shard_weight"]
    zero, neg_inf, nan = f["zero"], f["neg_inf"], float32(np.nan)
    as_float, f16_to_f32_bits = f["as_float"], f["f16_to_f32_bits"]
    pack_bf16x2 = f["pack_bf16x2"]
    # output words of two values; of one; float16 values
    pairs, wide, f16 = kind == _BF16X2, kind == _F32, kind == _F16
    pay_words = 2 * n  # a (row, pair) item's words: two per shard
    lse_shape = (LL_TILE_ROWS, n)  # a word-by-word tile's LSE bits, per row and shard
    held_items = line_items(n)  # a thread's items in lines, in registers throughout
    line_pay_words = 4 * n * held_items  # four words per shard and item
    line_lse_shape = (LINE_TILE_ROWS, n)
    no_item = np.uint32(NO_ITEM)
    data_class, lse_class = np.uint32(DATA_CHUNK), np.uint32(LSE_CHUNK)
    past_class, edge_class = np.uint32(PAST_CHUNK), np.uint32(EDGE_CHUNK)
    class_shift, chunk_mask = np.uint32(CLASS_SHIFT), np.uint32((1 << CLASS_SHIFT) - 1)
    timed_out, peer_failed, gave_up = np.int64(TIMED_OUT), np.int64(PEER_FAILED), np.int64(-1)

    u64 = np.uint64
    u_warp = u64(WARP)
    u_group, u_step, u_one, u_two, u_n = u64(group), u64(group * unroll), u64(1), u64(2), u64(n)
    u_push_group = u64(push_group)
    u32 = np.uint32
    low32, thirty_two, sixteen, low16 = u64(0xFFFFFFFF), u64(32), u32(16), u32(0xFFFF)
    high16 = u32(0xFFFF0000)
    per_word = u64(2 if halves else 1)  # push elements per 32-bit word
    u_chunks, u_last, u_line_words = u64(LINE_CHUNKS), u64(LINE_CHUNKS - 1), u64(LINE_WORDS)
    jit = cuda.jit(device=True)

    if trace:  # measurement only: each block's first thread notes the clock at milestones
        @jit
        def clock():
            return now_ns()

        @jit
        def stamp_at(state, epoch, k, value):
            if cuda.threadIdx.x == 0 and cuda.threadIdx.y == 0:
                blocks = (state.shape[0] - STATE_WORDS) // (2 * TRACE_STAMPS)  # per parity
                at = ((epoch & 1) * blocks + cuda.blockIdx.x) * TRACE_STAMPS + k
                if cuda.blockIdx.x < blocks:
                    state[STATE_WORDS + at] = value
    else:
        @jit
        def clock():
            return 0

        @jit
        def stamp_at(state, epoch, k, value):
            pass

    @jit
    def stamp(state, epoch, k):
        stamp_at(state, epoch, k, clock())

    @jit
    def give_up(flags, state, me):
        """Mark the plan dead; the first block to do so tells every peer."""
        if cuda.atomic.exch(state, 2, 1) == 0:
            cuda.threadfence_system()
            for q in range(n):
                if q != me:
                    store_release(flags[q], me, gave_up)

    @jit
    def stopped(flags, state, status, p, me, start, timeout_ns):
        """Whether a wait for peer p must end: the plan is dead, p gave up, or the wait
        begun at ``start`` has run past ``timeout_ns`` (recorded, and the peers told)."""
        if load_acquire(state, 2) != 0:
            return True
        if load_acquire(flags[me], p) < 0:
            status[p] = peer_failed
            give_up(flags, state, me)
            return True
        if now_ns() - start > timeout_ns:
            status[p] = timed_out
            give_up(flags, state, me)
            return True
        return False

    @jit
    def wait_for(flags, state, status, p, at, epoch, me, timeout_ns, doomed):
        """Poll my flag ``at`` (peer ``p``'s tile) until it reaches ``epoch``; False
        when the wait failed (recorded, and the peers told) or the plan is dead.
        ``doomed``: p had given up before this call (its data may be partial)."""
        if doomed:
            status[p] = peer_failed
            give_up(flags, state, me)
            return False
        mine = flags[me]
        seen = load_acquire(mine, at)
        if seen >= epoch:
            return True
        start = now_ns()
        spins = 1  # the first look at the clock comes after CHECK_EVERY polls
        while seen < epoch:
            if spins % CHECK_EVERY == 0:
                if stopped(flags, state, status, p, me, start, timeout_ns):
                    return False
                pause()
            spins += 1
            seen = load_acquire(mine, at)
        return True

    @jit
    def peer_rank(k, me):
        """The rank of peer k (0 <= k < N - 1): the ranks in order, this one skipped."""
        return k + u_one if k >= me else k

    @jit
    def packed_element(src, i, bits, d_count):
        """Element i of a packed row (data, the LSE's bits, then zeros), as uint32."""
        if i < d_count:
            return u32(src[i])
        if halves:
            if i == d_count:
                return bits & low16
            if i == d_count + u_one:
                return bits >> sixteen
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
    def tile_cursor(t, tile_rows, rows, tid, group):
        """Tile t's first row and row count, this thread's lane in its row's group of
        ``group`` lanes, and the group's first row in the tile."""
        first = t * tile_rows
        return first, min(tile_rows, rows - first), tid % group, tid // group

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
    def shard_rank(k, me):
        """The rank of shard k of a combine: this one for k == 0, then the peers in order."""
        return me if k == 0 else peer_rank(u64(k - 1), me)

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
    def note_item(lse_low, lse_high, pay, r, c, me, d_count):
        """Note the LSE bits that every shard's pair c of row r holds (``pay``)."""
        for k in range(n):
            note_lse(lse_low, lse_high, r, shard_rank(k, me), c, pay[2 * k], pay[2 * k + 1],
                     d_count)

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

    @jit
    def note_word(lse_low, lse_high, r, p, w, word, d_count):
        """Note the halves of the LSE's bits that word w of a packed row holds, if any."""
        if halves:  # the word holds elements 2w (its low half) and 2w + 1
            e = w * u_two
            if e == d_count:
                lse_low[r, p] = word & low16
                lse_high[r, p] = word >> sixteen
            elif e + u_one == d_count:
                lse_low[r, p] = word >> sixteen
            elif e == d_count + u_one:
                lse_high[r, p] = word & low16
        elif w == d_count:
            lse_low[r, p] = word & low16
            lse_high[r, p] = word >> sixteen

    @jit
    def note_lse(lse_low, lse_high, r, p, c, a, z, d_count):
        """Note the LSE's bits that pair c (words a, z) of shard p's row r holds."""
        note_word(lse_low, lse_high, r, p, c * u_two, a, d_count)
        note_word(lse_low, lse_high, r, p, c * u_two + u_one, z, d_count)

    @jit
    def noted_lse(lse_low, lse_high, r, p):
        return as_float(lse_low[r, p] | (lse_high[r, p] << sixteen))

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

    @jit
    def row_weights(weights, lse_low, lse_high, r, b, h, out_lse, write_lse, base_e, me):
        """Row r's (token b, local head h) weight of each shard (this rank's own first,
        then the peers in rank order) into ``weights``, from the LSEs as noted; its
        global LSE into ``out_lse`` if ``write_lse``."""
        own = noted_lse(lse_low, lse_high, r, me)
        m = clean_lse(own)
        for p in range(n):
            if p != me:
                m = max(m, clean_lse(noted_lse(lse_low, lse_high, r, p)))
        m = finish_max(m)
        total = lse_exp(clean_lse(own) - m, base_e)
        for p in range(n):
            if p != me:
                total += lse_exp(clean_lse(noted_lse(lse_low, lse_high, r, p)) - m, base_e)
        inv_total = inverse_total(total)
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
    def combine_words(pay, at, per, weights, lse_low, lse_high, r, b, h, wb, nw, out, out_lse,
                      write_lse, base_e, me, d_values):
        """The exact combine of payload words ``wb`` to ``wb + nw`` (at most 4) of row r
        (token b, local head h): shard k's in ``pay[at + per * k:]``, the LSEs as
        noted."""
        row_weights(weights, lse_low, lse_high, r, b, h, out_lse, write_lse and wb == u64(0),
                    base_e, me)
        weigh_words(pay, at, per, weights, b, h, wb, nw, out, d_values)

    @jit
    def nan_row(b, h, wb, nw, out, d_values):
        dst = out[b, h]
        for q in range(4):
            if u64(q) < nw:
                store_word(dst, wb + u64(q), nan, nan, d_values)

    @jit
    def nan_words(b, h, wb, nw, out, out_lse, write_lse, d_values):
        if write_lse and wb == u64(0):
            out_lse[b, h] = nan
        nan_row(b, h, wb, nw, out, d_values)

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

    @jit
    def load_line_item(pay, j, data, lse_bits, seq_lens, query_start_loc, num_seqs, b, h, c,
                       kind, me, hn, d_count):
        """Chunk c (of class ``kind``) of every shard's packed row (token b, local head
        h of that shard's rank) from this rank's input into held item j of ``pay``
        (shard k's four words at ``4 * (j * n + k)``). Every load is issued before any
        is used."""
        wb, nw = line_span(c)
        if kind == data_class:
            for k in range(n):
                data_words(pay, 4 * (j * n + k), data[b, shard_rank(k, me) * hn + h], wb)
        elif kind == past_class:  # no load
            for q in range(4 * n):
                pay[4 * j * n + q] = u32(0)
        elif kind == lse_class:  # one load a shard
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
    def note_line_item(lse_low, lse_high, pay, j, r, c, kind, me, d_count):
        """Note the LSE bits that every shard's chunk c (of class ``kind``) of row r
        holds (held item j)."""
        wb, nw = line_span(c)
        if kind == lse_class:  # the first word is the LSE's
            for k in range(n):
                note_word(lse_low, lse_high, r, shard_rank(k, me), wb, pay[4 * (j * n + k)],
                          d_count)
            return
        if kind != edge_class or not may_hold_lse(wb, nw, d_count):
            return
        for k in range(n):
            at = 4 * (j * n + k)
            for q in range(4):
                if u64(q) < nw:
                    note_word(lse_low, lse_high, r, shard_rank(k, me), wb + u64(q), pay[at + q],
                              d_count)

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

    @jit
    def combine_held(pay, j, rows_of, chunks_of, tokens_of, heads_of, tile_first, bad, weights,
                     line_weights, out, d_values):
        """Combine this thread's item j into the output (NaN if ``bad``), with its
        row's weights as :func:`row_weights` noted them in ``line_weights``."""
        if rows_of[j] != no_item:
            b, h = u64(tokens_of[j]), u64(heads_of[j])
            wb, nw = line_span(held_chunk(chunks_of, j))
            kind = held_class(chunks_of, j)
            if bad:  # no result: NaN, never stale or partial data
                nan_row(b, h, wb, nw, out, d_values)
            elif kind == data_class or kind == edge_class:  # else no output value
                r = u64(rows_of[j]) - tile_first
                live = kind == data_class  # all output values, and no weight 0: no test
                for k in range(n):
                    weights[k] = line_weights[r, k]
                    live = live and weights[k] != zero
                if live:
                    weigh_line(pay, 4 * j * n, weights, out[b, h], wb, nw)
                else:
                    weigh_words(pay, 4 * j * n, 4, weights, b, h, wb, nw, out, d_values)

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
            m = clean_lse(own_lse)
            for p in range(n):
                if p != me:
                    m = max(m, clean_lse(load_lse(low, high, p)))
            m = finish_max(m)
            total = lse_exp(clean_lse(own_lse) - m, base_e)
            for p in range(n):
                if p != me:
                    total += lse_exp(clean_lse(load_lse(low, high, p)) - m, base_e)
            inv_total = inverse_total(total)
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
    def arrive(state, epoch, combining, tid, threads):
        """The block's arrival, once every thread of it has read the epoch: the last
        block to arrive resets the count and, in a call that combines, advances it."""
        if tid == threads - u_one:  # the last thread (it has the least work)
            cuda.threadfence()
            if cuda.atomic.add(state, 1, 1) == cuda.gridDim.x - 1:  # every block has
                state[1] = 0
                if combining:
                    state[0] = epoch

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
    # traced or not) to keep BLOCKS_PER_SM blocks of at most WARPS warps
    bounds = {} if config.ENABLE_CUDASIM else {"launch_bounds": (WARP * WARPS, BLOCKS_PER_SM)}

    @cuda.jit(**bounds)
    def direct(phases, data_bits, data, lse_bits, lse, seq_lens, query_start_loc, num_seqs,
               windows, vals, bits, flags, state, status, out, out_lse, write_lse, base_e,
               self_rank, timeout_ns, tile_rows, push_blocks, lls, push_vector):
        entered = clock()
        await_predecessor()  # a dependent launch: before the first load of anything
        awaited = clock()
        me = u64(self_rank)
        epoch = state[0] + 1
        stamp_at(state, epoch, 0, entered)
        stamp_at(state, epoch, 1, awaited)
        slot = u64(epoch & 1)
        hn = u64(vals.shape[3])
        rows = u64(data.shape[0]) * hn
        tiles = (rows + u64(tile_rows) - u_one) // u64(tile_rows)
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
        if lines:  # 128-byte lines with their own flags (a kernel of its own)
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
            return
        if word_by_word:  # no flag, no fence (a kernel of its own: its registers too)
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
            return
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

    return direct


@functools.cache
def direct_kernel(dtype, n, push_bits, pairs=False, push_group=WARP, group=WARP,
                  dependent=False, trace=False, word_by_word=False, lines=False):
    """The direct kernel for output ``dtype`` (bfloat16 ``pairs``: uint32 words in
    the combine), ``n`` ranks, the push's element bits ``push_bits`` (uint16 or
    uint32) and the push's and combine's lanes per row. ``dependent``: launched as
    a programmatic dependent of the kernel before it on its stream (Hopper and
    later): it may start while that kernel ends, and lets the next one do so.
    ``word_by_word``: the kernel of the word-by-word calls, ``lines``: of the calls
    in lines, else that of the calls in tiles behind flags (the same arguments;
    the word-by-word region's argument is the lines region for ``lines``).
    ``trace``: for measurement only, each block's first thread stores the global
    timer at the call's milestones
    into ``state``, after its :data:`STATE_WORDS`: ``[2][blocks][TRACE_STAMPS]``
    by call parity, ``blocks`` as many as the rest of ``state`` holds (see
    ``cupy_dcp._direct_trace``)."""
    kind, value = combine_kind(dtype, pairs)
    bits = np.dtype(np.uint32 if value.itemsize == 4 else np.uint16)
    i64 = types.int64
    flag = array_type(np.int64, 1, True)
    argtypes = (i64, array_type(push_bits, 3, False), array_type(value, 3, False),
                array_type(np.uint32, 2, False), array_type(np.float32, 2, False),
                array_type(np.int64, 1, True), array_type(np.int64, 1, True), i64,
                types.UniTuple(array_type(push_bits, 5, False), n),
                array_type(value, 5, False), array_type(bits, 5, False),
                types.UniTuple(flag, n), flag, flag,
                array_type(value, 3, False), array_type(np.float32, 2, False),
                i64, i64, i64, i64, i64, i64,
                types.UniTuple(array_type(np.uint64, 4, True), n), i64)
    return SpecializedKernel(_direct_kernel(kind, n, push_group, group,
                                            np.dtype(push_bits).itemsize == 2, dependent,
                                            trace=trace, word_by_word=word_by_word,
                                            lines=lines),
                             argtypes, dependent=dependent)


def call_kernels(dtype, n, bits, head_dim, dependent=False, word_by_word=False, lines=False):
    """The kernels that the calls of a plan (output ``dtype``, element ``bits``,
    ``head_dim``) may launch on one path (``word_by_word``, in ``lines`` or in
    tiles): their residency bounds the grid (``resident_blocks``)."""
    D = head_dim
    path = dict(word_by_word=word_by_word, lines=lines)
    kernels = [direct_kernel(dtype, n, bits, False, lanes_per_row(D), lanes_per_row(D),
                             dependent, **path)]
    if np.dtype(bits).itemsize == 2 and D % 2 == 0:  # the usual case: 16-bit data as words
        kernels.append(direct_kernel(dtype, n, np.dtype(np.uint32), False, lanes_per_row(D // 2),
                                     lanes_per_row(D), dependent, **path))
        if np.dtype(dtype) == BFLOAT16:  # and combined in pairs, where the output allows
            kernels.append(direct_kernel(dtype, n, np.dtype(np.uint32), True,
                                         lanes_per_row(D // 2), lanes_per_row(D // 2), dependent,
                                         **path))
    return kernels


def direct_launch(dtype, data, lse, seq_lens, query_start_loc, num_seqs, windows, flags, lls,
                  state, status, out, out_lse, is_lse_base_on_e, self_rank, timeout_ns,
                  max_blocks, phases=PUSH | COMBINE, warps=WARPS, dependent=False,
                  ll_max_blocks=None, lines=None, line_max_blocks=None):
    """``(kernel, grid, block, args)`` of one direct call, :class:`DeviceArray`
    arguments in.

    ``data``: this rank's ``[B, H, D]`` partials seen as bits (uint16 or
    uint32), ``lse`` its float32 ``[B, H]``; ``windows``: every rank's
    ``[2, N, max_tokens, H/N, D + P]`` bits view (rows may be padded);
    ``flags``: every rank's int64 flags (:func:`flag_words`); ``lls``: every
    rank's word-by-word region, uint64 ``[2, N, R, ll_words]`` (``R`` rows, may
    be 0); ``out`` ``[B, H/N, D]`` seen as bits (``None`` for ``phases ==
    PUSH``); ``lines``: every rank's lines region, uint64 ``[2, N, R',
    line_words]`` (``None``: none); ``max_blocks``, ``ll_max_blocks`` and
    ``line_max_blocks`` (by default the first): the
    most blocks of the tiled, of the word-by-word and of the lines kernel that are sure to be
    resident at once beside those of the other ranks on this GPU (blocks of
    ``warps`` warps, at most :data:`WARPS`: the kernels' launch bounds;
    :func:`call_grid` picks the kernel); ``dependent``: launch
    as a programmatic dependent (see
    :func:`direct_kernel`; never where ranks share a GPU: a call's blocks that
    start early could take the places a peer's blocks need). 16-bit data
    moves as uint32 words where the arrays allow, and bfloat16 is combined in pairs.
    The pushes load and store 16 bytes at a time (``vector``, the last argument)
    where the words allow it: a whole number of 4-word quads per row, and every
    row of the input and of the windows 16-byte aligned; else a word (or a
    16-bit element) at a time.
    """
    if not 1 <= warps <= WARPS:  # the launch would fail, less clearly
        raise ValueError(f"a direct call's blocks have 1 to {WARPS} warps (got {warps}): "
                         "the kernels are built for no more")
    kind, value = combine_kind(dtype)
    n = len(windows)
    me = int(self_rank)
    push_data, push_windows = data, tuple(windows)
    if data.dtype.itemsize == 2:
        words = [data.as_words()] + [w.as_words() for w in windows]
        if None not in words:
            push_data, push_windows = words[0], tuple(words[1:])
    if out is None:  # push alone: never written, shaped like the result
        shape = (data.shape[0], windows[0].shape[3], data.shape[2])
        out = DeviceArray(data.ptr, shape, c_strides(shape, data.dtype.itemsize), data.dtype,
                          data.owner)
    vals_data, vals, bits, vals_out = data.view(value), windows[me].view(value), windows[me], \
        out.view(value)
    if kind == _BF16:
        words = data.as_words(), windows[me].as_words(), out.as_words()
        if None not in words:
            kind = _BF16X2
            vals_data, vals, vals_out = words
            bits = vals
    write_lse = out_lse is not None
    if not write_lse:  # never read: a placeholder of the right type
        out_lse = DeviceArray(out.ptr, (0, 0), (4, 4), np.float32, out.owner)
    # 16-byte pushes where the words allow: whole quads, every row aligned at both ends
    vector = (push_data.dtype.itemsize == 4 and push_data.shape[2] % QUAD == 0
              and all(a.rows_aligned(16) for a in (push_data,) + push_windows))
    rows = data.shape[0] * windows[0].shape[3]
    if lines is not None and lines[me].shape[2]:
        for region in lines:  # lines stored whole: 128-byte aligned, whole lines a row
            if (region.ptr % LINE_BYTES or not region.is_c_contiguous()
                    or region.shape[3] % (LINE_BYTES // 8)):
                raise ValueError("a lines region must be C-contiguous, 128-byte aligned, "
                                 "with whole 128-byte lines per row")
    tile_rows, blocks, push_blocks = region_grid(
        n, rows, lls[me].shape, None if lines is None else lines[me].shape, max_blocks,
        ll_max_blocks, line_max_blocks, WARP * warps)
    for ll in lls:  # stored and loaded 16 bytes at a time: a misaligned pair faults
        if ll.shape[2] and (ll.ptr % 16 or not ll.is_c_contiguous() or ll.shape[3] % 2):
            raise ValueError("a word-by-word region must be C-contiguous, 16-byte aligned, "
                             "with an even number of words per row")
    kernel = direct_kernel(dtype, n, push_data.dtype, kind == _BF16X2,
                           lanes_per_row(push_data.shape[2]), lanes_per_row(vals_out.shape[2]),
                           dependent, word_by_word=push_blocks == WORDS,
                           lines=push_blocks == LINES)
    return kernel, (blocks,), (WARP, warps), (
        int(phases), push_data, vals_data, lse.view(np.uint32), lse, seq_lens, query_start_loc,
        int(num_seqs), push_windows, vals, bits, tuple(flags), state, status, vals_out, out_lse,
        int(write_lse), int(bool(is_lse_base_on_e)), me, int(timeout_ns), int(tile_rows),
        int(push_blocks), tuple(lines if push_blocks == LINES else lls), int(vector))
