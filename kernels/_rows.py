"""How the kernels map rows (one per (rank, token, head) or (token, head)) to threads.

A row of ``elements`` items is handled by a group of ``group`` lanes of one
warp, each lane moving ``UNROLL`` items per step: a full warp for long rows
(D = 512 in bfloat16 pairs is 256 words), a quarter warp for short ones
(D = 128: 64 words), so that every lane has loads in flight.

Two maps of rows to the grid. :func:`row_grid` and :func:`row_cursor`: rows
numbered flat along x, a grid-stride loop over them. :func:`tile_grid` and
:func:`tile_cursor`: a token's rows along x, the tokens along z (a
grid-stride loop over them), and y free for the kernel (a rank, or a slice of
each row), so that a thread finds its token and row from the grid alone,
without the 64-bit divisions of a flat row number (a few dozen dependent
instructions before a row's first load).
"""

import functools

import numpy as np
from numba import cuda

WARP = 32
WARPS_PER_BLOCK = 4
UNROLL = 8
MAX_BLOCKS = 132 * 64  # enough blocks to fill every SM of an H200 several times over
GROUPS = (4, 8, 16, 32)
# The most registers a thread of a kernel linked with a cap: at 64, 8 blocks of 128
# threads fit an SM (at 72-80, as NVVM leaves some kernels, 6 or 7).
MAX_REGISTERS = 64

__all__ = ["MAX_BLOCKS", "MAX_GRID_Z", "MAX_REGISTERS", "UNROLL", "WARP", "WARPS_PER_BLOCK",
           "lanes_per_row", "row_cursor", "row_grid", "tile_cursor", "tile_grid"]

MAX_GRID_Z = 65535  # the largest grid extent along y or z


def lanes_per_row(elements, unroll=UNROLL):
    """The lanes that share a row of ``elements`` items: a power of two from 4 to 32."""
    for group in GROUPS:
        if group * unroll >= elements:
            return group
    return WARP


def row_grid(rows, group):
    """``(grid, block)`` for ``rows`` rows of ``group`` lanes each."""
    rows_per_block = WARPS_PER_BLOCK * (WARP // group)
    return (max(1, min(-(-rows // rows_per_block), MAX_BLOCKS)),), (WARP, WARPS_PER_BLOCK)


@functools.cache
def row_cursor():
    """Device function ``row_cursor(group) -> (lane, row, row_step)``, all uint64.

    The lane of this thread within its row's group of ``group`` lanes, the
    first row of its group, and the stride to its next row (a grid-stride
    loop over rows). Unsigned, so that indexing emits no wraparound code.
    """
    u64 = np.uint64
    warp_size = u64(WARP)

    @cuda.jit(device=True)
    def cursor(group):
        per_warp = warp_size // group
        warp = u64(cuda.blockIdx.x) * u64(cuda.blockDim.y) + u64(cuda.threadIdx.y)
        lane = u64(cuda.threadIdx.x) % group
        row = warp * per_warp + u64(cuda.threadIdx.x) // group
        return lane, row, u64(cuda.gridDim.x) * u64(cuda.blockDim.y) * per_warp

    return cursor


def tile_grid(rows, tokens, group, planes=1, warps=None):
    """``(grid, block)`` for :func:`tile_cursor`: ``rows`` rows of ``group`` lanes
    each per token along x (blocks of up to ``warps`` warps, :data:`WARPS_PER_BLOCK`
    if ``None``, fewer when the rows are few), ``planes`` along y, and up to
    ``tokens`` along z (at most :data:`MAX_GRID_Z`, and about :data:`MAX_BLOCKS`
    blocks in all: the tokens beyond are a grid-stride loop)."""
    per_warp = WARP // group
    most = WARPS_PER_BLOCK if warps is None else warps
    warps = max(1, min(most, -(-rows // per_warp)))
    across = max(1, -(-rows // (warps * per_warp)))
    planes = max(1, planes)
    deep = max(1, min(tokens, MAX_GRID_Z, -(-MAX_BLOCKS // (across * planes))))
    return (across, planes, deep), (WARP, warps)


@functools.cache
def tile_cursor():
    """Device function ``tile_cursor(group) -> (lane, row, token, token_step)``, all
    uint64, for a launch on :func:`tile_grid`.

    The lane of this thread within its row's group of ``group`` lanes, the row
    of its group within a token (it may be past the last: the caller skips it),
    its first token and the stride to its next (a grid-stride loop over
    tokens). The grid's y index is the caller's.
    """
    u64 = np.uint64
    warp_size = u64(WARP)

    @cuda.jit(device=True)
    def cursor(group):
        warp = u64(cuda.blockIdx.x) * u64(cuda.blockDim.y) + u64(cuda.threadIdx.y)
        lane = u64(cuda.threadIdx.x) % group
        row = warp * (warp_size // group) + u64(cuda.threadIdx.x) // group
        return lane, row, u64(cuda.blockIdx.z), u64(cuda.gridDim.z)

    return cursor

