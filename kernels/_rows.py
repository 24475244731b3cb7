"""How the kernels map rows (one per (rank, token, head) or (token, head)) to threads.

A row of ``elements`` items is handled by a group of ``group`` lanes of one
warp, each lane moving ``UNROLL`` items per step: a full warp for long rows
(D = 512 in bfloat16 pairs is 256 words), a quarter warp for short ones
(D = 128: 64 words), so that every lane has loads in flight.
"""

import functools

import numpy as np
from numba import cuda

WARP = 32
WARPS_PER_BLOCK = 4
UNROLL = 8
MAX_BLOCKS = 132 * 64  # enough blocks to fill every SM of an H200 several times over
GROUPS = (4, 8, 16, 32)

__all__ = ["MAX_BLOCKS", "UNROLL", "WARP", "WARPS_PER_BLOCK", "lanes_per_row", "row_cursor",
           "row_grid"]


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
