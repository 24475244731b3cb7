"""The direct window's layout and the tile cut of a call (pure arithmetic, no GPU).

Every rank cuts a call into the same tiles, and a tile's flag must exist in
every window: for every token count up to ``max_tokens`` the tiles fit the
flags the window was sized with.
"""

import itertools

import numpy as np
import pytest

from cupy_dcp.kernels.direct import (LINE_BYTES, LINE_MAX_ROWS, LINE_TILE_ROWS, LINE_WORDS,
                                     LL_MAX_ROWS, LL_TILE_ROWS, MIN_TILE_ROWS, SMALL_TILE_ROWS,
                                     SPLIT_TILE_ROWS, TILES_PER_BLOCK, WARPS, Protocol, call_grid,
                                     direct_launch, flag_words, line_items, line_rows,
                                     line_tile_rows, line_words, ll_grid, ll_rows, ll_words,
                                     region_grid, row_stride, tile_grid, window_layout)


@pytest.mark.parametrize("n, max_tokens, local_heads", [(2, 1, 1), (2, 7, 3), (4, 33, 16),
                                                        (2, 2048, 64), (8, 513, 5)])
@pytest.mark.parametrize("max_blocks", [1, 3, 66, 264, 1056])
def test_every_call_fits_the_flags(n, max_tokens, local_heads, max_blocks):
    tiles_per_rank = flag_words(n, max_tokens, local_heads) // n - 1  # past the failure flags
    for tokens in sorted({1, 2, 3, max_tokens // 2 or 1, max_tokens - 1 or 1, max_tokens}):
        rows = tokens * local_heads
        tile_rows, blocks, pushers = tile_grid(rows, max_blocks)
        tiles = -(-rows // tile_rows)
        assert tile_rows >= MIN_TILE_ROWS and tile_rows % MIN_TILE_ROWS == 0
        assert tiles <= tiles_per_rank, (tokens, tile_rows, tiles, tiles_per_rank)
        assert 1 <= blocks <= max_blocks
        if pushers == 0:  # every block pushes and combines: each has a tile
            assert blocks <= tiles
            if max_blocks >= 3:  # one tile each, as small as the blocks allow
                assert blocks == tiles and tile_rows <= SMALL_TILE_ROWS
                assert (tile_rows == MIN_TILE_ROWS
                        or rows > max_blocks * (tile_rows - MIN_TILE_ROWS))
            smallest, takers = MIN_TILE_ROWS, blocks
        else:  # some blocks only push, the others only combine: each has a tile
            assert 1 <= pushers < blocks and max(pushers, blocks - pushers) <= tiles
            assert rows > max_blocks * SMALL_TILE_ROWS  # a small call is never split
            smallest, takers = SPLIT_TILE_ROWS, pushers
            assert tile_rows >= smallest
        if tile_rows > smallest:  # a few tiles per block, not more
            assert tiles <= takers * TILES_PER_BLOCK
        # the tiles cover the rows exactly once
        assert (tiles - 1) * tile_rows < rows <= tiles * tile_rows


@pytest.mark.parametrize("itemsize, width", list(itertools.product((2, 4), (1, 3, 7, 66, 130, 257,
                                                                            514, 1025))))
def test_window_rows_start_on_sectors(itemsize, width):
    stride = row_stride(width, itemsize)
    nbytes = stride * itemsize
    sector = -(-width * itemsize // 32) * 32
    assert stride >= width and nbytes % 32 == 0
    assert nbytes == sector or (nbytes % 128 == 0 and 8 * nbytes <= 9 * sector)
    if sector % 128 == 0:
        assert nbytes == sector  # already on a line: no padding beyond the sector
    # a word-by-word row (4 payload bytes per word, in pairs) unpacks into the window's row
    words = ll_words(width, itemsize)
    assert words % 2 == 0 and width * itemsize <= 4 * words <= nbytes


@pytest.mark.parametrize("max_tokens, local_heads", [(1, 1), (3, 5), (64, 64), (2048, 64)])
@pytest.mark.parametrize("max_blocks", [1, 3, 66, 264])
def test_word_by_word_calls(max_tokens, local_heads, max_blocks):
    capacity = ll_rows(max_tokens, local_heads)
    assert capacity == min(max_tokens * local_heads, LL_MAX_ROWS)
    for rows in range(1, capacity + 1):
        tile_rows, blocks = ll_grid(rows, max_blocks)
        assert 1 <= blocks <= max_blocks  # every block resident, so none waits for ever
        assert (blocks - 1) * tile_rows < rows <= blocks * tile_rows  # each block has rows
        assert tile_rows == -(-rows // max_blocks)  # spread over as many blocks as allowed


@pytest.mark.parametrize("capacity", [0, 16, 256])
@pytest.mark.parametrize("max_blocks", [1, 3, 66, 264])
def test_call_grid_sends_small_tiles_word_by_word(capacity, max_blocks):
    for rows in range(1, 600):
        tile_rows, blocks, push_blocks, protocol = call_grid(rows, capacity, max_blocks)
        if protocol is Protocol.WORDS:
            assert rows <= capacity and tile_rows <= LL_TILE_ROWS
            assert (tile_rows, blocks) == ll_grid(rows, max_blocks)
        else:
            assert rows > capacity or ll_grid(rows, max_blocks)[0] > LL_TILE_ROWS
            assert protocol is Protocol.TILES
            assert (tile_rows, blocks, push_blocks) == tile_grid(rows, max_blocks)


@pytest.mark.parametrize("itemsize, width", list(itertools.product((2, 4), (1, 3, 30, 59, 60, 61,
                                                                            514, 1025))))
def test_rows_in_lines(itemsize, width):
    """A row in lines: whole 128-byte lines, each with 30 words of the row, no more
    lines than it takes."""
    words = line_words(width, itemsize)
    lines = words * 8 // LINE_BYTES
    assert words % (LINE_BYTES // 8) == 0
    assert (lines - 1) * LINE_WORDS < -(-width * itemsize // 4) <= lines * LINE_WORDS


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16])
@pytest.mark.parametrize("words", [16, 48, 144, 288, 2048])
@pytest.mark.parametrize("threads", [64, 256])
def test_a_tile_in_lines_is_held_whole(n, words, threads):
    """Every item (16-byte chunk of a row) of a tile in lines has a thread's register
    place to stay in: at most ``line_items`` per thread, 32 words of them up to 8 ranks."""
    rows, chunks = line_tile_rows(n, words, threads), words // 2
    assert 0 <= rows <= LINE_TILE_ROWS and rows * chunks <= line_items(n) * threads
    assert rows == LINE_TILE_ROWS or (rows + 1) * chunks > line_items(n) * threads
    assert 1 <= line_items(n) <= 4 and (n > 8 or 4 * n * line_items(n) <= 32)


@pytest.mark.parametrize("n, max_tokens, local_heads, width, itemsize, max_blocks, expect", [
    (2, 2048, 64, 514, 2, 264, 14 * 264),  # bf16 D = 512: 9 lines, 14 rows a block
    (2, 9, 64, 514, 2, 264, 9 * 64),  # every row of max_tokens
    (2, 4096, 64, 130, 2, 1056, LINE_MAX_ROWS),
    (8, 2048, 16, 514, 2, 264, 3 * 264),  # one item a thread: 3 rows a block
    (8, 2048, 16, 2050, 2, 264, 0),  # a row of 33 lines: more than a block holds
])
def test_the_lines_region_holds_what_a_call_in_lines_may_send(n, max_tokens, local_heads, width,
                                                              itemsize, max_blocks, expect):
    """No larger (a plan of 8 ranks would hold rows no call could use), no smaller:
    every call that fits it goes in lines (past the words' rows)."""
    rows = line_rows(n, max_tokens, local_heads, width, itemsize, max_blocks)
    assert rows == expect
    most = line_tile_rows(n, line_words(width, itemsize), 32 * WARPS)
    for call in range(1, max_tokens * local_heads + 1, 7):
        protocol = call_grid(call, 0, max_blocks, None, rows, most, max_blocks).protocol
        assert (protocol is Protocol.LINES) == (call <= rows), call


@pytest.mark.parametrize("max_blocks", [3, 66, 264])
@pytest.mark.parametrize("line_max_rows", [0, 3, 14, 64])
def test_call_grid_sends_calls_in_lines_between_words_and_tiles(max_blocks, line_max_rows):
    """Word by word up to the words' capacity; then in lines where the lines' region
    holds the call and a block's tile in lines no more than ``line_max_rows``;
    else in tiles. The lines take a grid of their own blocks."""
    words, lines = 16, 1000
    for rows in range(1, 1200):
        tile_rows, blocks, push_blocks, protocol = call_grid(rows, words, max_blocks, None, lines,
                                                             line_max_rows, max_blocks - 1)
        if rows <= words and ll_grid(rows, max_blocks)[0] <= LL_TILE_ROWS:
            assert protocol is Protocol.WORDS
        elif rows <= lines and ll_grid(rows, max_blocks - 1)[0] <= line_max_rows:
            assert protocol is Protocol.LINES
            assert (tile_rows, blocks) == ll_grid(rows, max_blocks - 1)
        else:
            assert protocol is Protocol.TILES
            assert (tile_rows, blocks, push_blocks) == tile_grid(rows, max_blocks)


def test_region_grid_reads_the_regions_shapes():
    """The grid a launch cuts from its regions (and a plan reports, for the race test
    and the trace): ``call_grid`` of their rows, and of the rows a block holds."""
    from types import SimpleNamespace

    from cupy_dcp.direct import DcpDirectPlan

    words, lines = (2, 2, 16, 258), (2, 2, 1000, 144)
    most = line_tile_rows(2, 144, 32 * WARPS)
    for rows in range(1, 1200, 3):
        assert region_grid(2, rows, words, lines, 264, 200, 132) == \
            call_grid(rows, 16, 264, 200, 1000, most, 132)
    for none in (None, (2, 2, 0, 144)):  # no lines region
        assert region_grid(2, 100, words, none, 264) == call_grid(100, 16, 264)
    plan = object.__new__(DcpDirectPlan)  # the fields a plan's grid is made of
    plan.comm, plan.local_heads = SimpleNamespace(rank=1, world_size=2), 64
    plan._lls = [None, SimpleNamespace(shape=words)]
    plan._line_regions = [None, SimpleNamespace(shape=lines)]
    plan._max_blocks, plan._ll_max_blocks, plan._line_max_blocks = 264, 200, 132
    assert plan._call_grid(9) == call_grid(9 * 64, 16, 264, 200, 1000, most, 132)


@pytest.mark.parametrize("n, max_tokens, local_heads", [(2, 1, 1), (2, 9, 64), (4, 33, 5),
                                                        (8, 2048, 16)])
@pytest.mark.parametrize("itemsize, width", [(2, 514), (2, 131), (4, 513), (4, 1)])
@pytest.mark.parametrize("rows", [None, 0, 3])
def test_window_layout(n, max_tokens, local_heads, itemsize, width, rows):
    layout = window_layout(n, max_tokens, local_heads, width, itemsize, rows)
    assert layout.flag_words == flag_words(n, max_tokens, local_heads)
    # flags, then the slots from a 512-byte boundary, then the 16-byte aligned words
    assert layout.flag_words * 8 <= layout.slots_offset and layout.slots_offset % 512 == 0
    assert layout.slots_shape == (2, n, max_tokens, local_heads, width)
    stride = row_stride(width, itemsize)
    assert layout.padded_slots_shape == (2, n, max_tokens, local_heads, stride)
    # C order over the padded rows
    step, strides = itemsize, []
    for extent in reversed(layout.padded_slots_shape):
        strides.insert(0, step)
        step *= extent
    assert layout.slots_strides == tuple(strides)
    assert layout.ll_offset == layout.slots_offset + step and layout.ll_offset % 16 == 0
    expect_rows = ll_rows(max_tokens, local_heads) if rows is None else rows
    assert layout.ll_shape == (2, n, expect_rows, ll_words(width, itemsize))
    # then the lines, from the next 128-byte boundary: whole lines per row
    ll_end = layout.ll_offset + 8 * int(np.prod(layout.ll_shape))
    assert layout.line_offset % LINE_BYTES == 0 and 0 <= layout.line_offset - ll_end < LINE_BYTES
    lines = min(max_tokens * local_heads, LINE_MAX_ROWS)
    assert layout.line_shape == (2, n, lines, line_words(width, itemsize))
    assert layout.nbytes == layout.line_offset + 8 * int(np.prod(layout.line_shape))
    assert window_layout(n, max_tokens, local_heads, width, itemsize, rows, 0).line_shape[2] == 0


def test_window_layout_in_bytes():
    """Two windows worked out by hand: bf16 rows of 1028 bytes padded to 1152 (a
    line), float32 rows of 2052 bytes padded to 2176."""
    layout = window_layout(2, 9, 64, 514, 2)
    assert (layout.flag_words, layout.slots_offset, layout.ll_offset, layout.line_offset) == (
        146, 1536, 1536 + 2 * 2 * 9 * 64 * 1152, 2655744 + 8 * 2 * 2 * 256 * 258)
    assert layout.slots_strides == (2 * 9 * 64 * 1152, 9 * 64 * 1152, 64 * 1152, 1152, 2)
    # 1028 bytes a row: 257 words, 9 lines of 30
    assert layout.line_shape == (2, 2, 576, 9 * 16)
    assert layout.nbytes == 4769280 + 8 * 2 * 2 * 576 * 144
    layout = window_layout(4, 33, 5, 513, 4)
    assert (layout.flag_words, layout.slots_offset, layout.ll_offset, layout.line_offset) == (
        88, 1024, 1024 + 2 * 4 * 33 * 5 * 2176, 2873344 + 8 * 2 * 4 * 165 * 514)
    assert layout.ll_shape == (2, 4, 165, 514)
    assert layout.line_shape == (2, 4, 165, 18 * 16)  # 513 words: 18 lines
    assert layout.nbytes == 8301184 + 8 * 2 * 4 * 165 * 288


@pytest.mark.parametrize("warps", [0, WARPS + 1, 4 * WARPS])
def test_direct_blocks_have_no_more_warps_than_the_kernels_are_built_for(warps):
    """The kernels' launch bounds cap a block at WARPS warps: a larger block is refused
    with a clear error before anything is launched."""
    with pytest.raises(ValueError, match=f"1 to {WARPS} warps"):
        direct_launch(np.float32, *([None] * 16), warps=warps)


@pytest.mark.parametrize("ptr, shape, strides, aligned", [
    (256, (3, 4, 8), (128, 32, 4), True),
    (256 + 16, (3, 4, 8), (128, 32, 4), True),  # a view into aligned rows
    (256 + 4, (3, 4, 8), (128, 32, 4), False),  # rows start 4 bytes off
    (256, (3, 4, 9), (144, 36, 4), False),  # rows 36 bytes apart
    (256, (3, 4, 8), (128, 32, 8), False),  # not contiguous along the row
    (256, (1, 4, 8), (36, 32, 4), True),  # an axis of one element imposes nothing
    (256, (3, 1, 1), (16, 4, 4), True),
    (256, (), (), False),
])
def test_rows_aligned_for_16_byte_pushes(ptr, shape, strides, aligned):
    from cupy_dcp.kernels._launch import DeviceArray

    assert DeviceArray(ptr, shape, strides, np.uint32, None).rows_aligned(16) == aligned


@pytest.mark.parametrize("shape, strides, span", [
    ((3, 4, 8), (128, 32, 4), 96),  # C-contiguous: every element
    ((3, 4, 8), (32, 96, 4), 96),  # heads major: the same elements, in another order
    ((3, 4, 8), (256, 64, 4), 2 * 64 + 3 * 16 + 8),  # rows with gaps between them
    ((1, 4, 8), (-7, 32, 4), 32),  # an axis of one element imposes nothing
    ((3, 4, 8), (128, 32, 8), 0),  # rows not unit-stride
    ((3, 4, 8), (-128, 32, 4), 0),  # a negative stride
    ((3, 4, 8), (130, 32, 4), 0),  # a stride of part of an element
    ((3, 4, 8), (2 ** 34, 32, 4), 0),  # a stride of 2**32 elements or more
    ((0, 4, 8), (128, 32, 4), 0),  # no elements
])
def test_span_reaches_every_element_or_is_empty(shape, strides, span):
    """The pack reads rows through ``span()`` where it is not empty: a flat view from
    the array's pointer reaching its last element, offsets ``i * s_0 + j * s_1 + k``."""
    from cupy_dcp.kernels._launch import DeviceArray

    flat = DeviceArray(256, shape, strides, np.uint32, None).span()
    assert (flat.ptr, flat.shape, flat.strides) == (256, (span,), (4,))
