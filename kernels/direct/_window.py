"""The direct path's host-side arithmetic: a window's layout and a call's grid.

A window (one a rank, mapped by every peer) holds, in order: the int64 flags
(:func:`flag_words`), two receive slots of packed rows padded to
:func:`row_stride` (the tiles' data), the word-by-word region
``[2, N, R, W]`` uint64 (:func:`ll_rows`, :func:`ll_words`) and the lines
region ``[2, N, R', W']`` uint64 (:func:`line_rows`, :func:`line_words`):
:func:`window_layout` places them. :func:`call_grid` picks a call's
:class:`Protocol` and cuts its rows into tiles and blocks; every rank computes
the same cut from the same sizes.
"""

import enum
import typing

import numpy as np

from .._format import c_strides
from .._rows import WARP

__all__ = ["BLOCKS_PER_SM", "LINE_BYTES", "LINE_CHUNKS", "LINE_MAX_ROWS", "LINE_TILE_ROWS",
           "LINE_WORDS", "LL_MAX_ROWS", "LL_TILE_ROWS", "MIN_TILE_ROWS", "PUSH_SHARE",
           "SMALL_TILE_ROWS", "SPLIT_TILE_ROWS", "TILES_PER_BLOCK", "WARPS", "CallGrid",
           "Protocol", "WindowLayout", "call_grid", "flag_words", "line_items", "line_rows",
           "line_tile_rows", "line_words", "ll_grid", "ll_rows", "ll_words", "region_grid",
           "row_stride", "tile_grid", "window_layout"]

WARPS = 8  # per block
BLOCKS_PER_SM = 2  # of WARPS warps, that the kernels' registers leave room for (launch bounds)
MIN_TILE_ROWS = 8  # bounds the flags: a tile has at least this many rows
SMALL_TILE_ROWS = 16  # the most rows of a small call's tiles (one per block)
TILES_PER_BLOCK = 32  # tiles a pushing block takes in a large call: the pipeline's depth
SPLIT_TILE_ROWS = 24  # the fewest rows of a tile in a large call
PUSH_SHARE = 1 / 3  # of the blocks of a large call, those that only push
LL_MAX_ROWS = 256  # the most (token, head) rows per rank pair that a call sends word by word
LL_TILE_ROWS = 16  # the most rows of a word-by-word tile (a block notes their LSEs)
LINE_BYTES = 128  # a line of the lines region: 120 payload bytes, then its 8-byte flag
LINE_WORDS = 30  # the 32-bit payload words of a line
LINE_CHUNKS = 8  # 16-byte chunks of a line (a lane's store each; the last ends in the flag)
LINE_TILE_ROWS = 64  # the most rows of a tile in lines (a block notes their LSEs)
LINE_MAX_ROWS = 4096  # the most (token, head) rows per rank pair that a call sends in lines


class Protocol(enum.Enum):
    """How a direct call's rows cross: each protocol has a kernel of its own."""

    TILES = "tiles"  # tiles of packed rows in the slots, each behind a flag
    WORDS = "words"  # 8-byte words of 4 payload bytes and the call's tag
    LINES = "lines"  # 128-byte lines of payload ending in the call's epoch


class CallGrid(typing.NamedTuple):
    """A call's cut (:func:`call_grid`): the same on every rank."""

    tile_rows: int  # (token, head) rows per tile
    blocks: int  # the grid
    push_blocks: int  # in tiles: the blocks that only push (0: every block pushes and combines)
    protocol: Protocol


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


def call_grid(rows, ll_capacity, max_blocks, ll_max_blocks=None, line_capacity=0,
              line_max_rows=0, line_max_blocks=None):
    """The :class:`CallGrid` of a call of ``rows`` rows per rank pair: word by word
    (:func:`ll_grid` on ``ll_max_blocks``, by default ``max_blocks``) where the
    call's rows fit the word-by-word region (``ll_capacity`` rows) and a block's
    tile has no more than :data:`LL_TILE_ROWS`; else in lines (:func:`ll_grid` on
    ``line_max_blocks``, by default ``max_blocks``) where they fit the lines region
    (``line_capacity`` rows) and a block's tile has no more than ``line_max_rows``
    (:func:`line_tile_rows`); else in tiles behind flags (:func:`tile_grid`)."""
    if rows <= ll_capacity:
        tile_rows, blocks = ll_grid(rows, max_blocks if ll_max_blocks is None else ll_max_blocks)
        if tile_rows <= LL_TILE_ROWS:
            return CallGrid(tile_rows, blocks, 0, Protocol.WORDS)
    if rows <= line_capacity:
        tile_rows, blocks = ll_grid(rows, max_blocks if line_max_blocks is None
                                    else line_max_blocks)
        if tile_rows <= line_max_rows:
            return CallGrid(tile_rows, blocks, 0, Protocol.LINES)
    return CallGrid(*tile_grid(rows, max_blocks), Protocol.TILES)


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

