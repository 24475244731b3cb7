"""Which launch shape the pack and the combine run fastest in, at decode sizes.

    python benchmarks/kernel_shapes.py [--rounds 3] [--calls 20] [--reps 15]
                                       [--cell DTYPE,N,B,H,D ...]

One GPU; N ranks' buffers on it, as in ``python -m cupy_dcp.bench --kernels``.
For each of the issue-27 cells of B <= 32 (and the float32 ones), and a few of
many rows at N = 4 and 8, every
candidate shape is timed in a CUDA graph (``--calls`` launches, the median of
``--reps`` replays), the candidates interleaved over ``--rounds`` rounds and
the median of the rounds reported, beside the empty kernel in the shape that
the library picks today:

- the combine for exactly N: the values each lane moves a shard (``unroll``:
  1, 2, 4, 8; the lanes a row and the slices of a row follow from it as in
  ``combine._combine_shape``) and the warps a block (1, 2, 4); the picked tiles
  with each block walking 2, 3 or 4 tokens (a grid of fewer blocks);
  and, where its rows allow it (``combine.by_blocks`` less its bound on the rows),
  the combine with a block a row;
- the pack: the warps a block (1, 2, 4, 8).

``--cell`` (repeatable) times the cells it names in place of the list below.

The shape the library picks today is marked ``*``. The buffers are zeros: the
kernels' work does not depend on the values (a weight of 0 would skip a
shard's FMAs; zero LSEs give every shard the same weight).
"""

import argparse
import contextlib

import numpy as np

# The cells: (dtype, N, B, H, D)
CELLS = [
    ("bfloat16", 2, 1, 128, 512), ("bfloat16", 2, 8, 128, 512), ("bfloat16", 2, 32, 128, 512),
    ("bfloat16", 2, 1, 32, 128), ("bfloat16", 2, 32, 32, 128),
    ("bfloat16", 4, 1, 128, 512),
    ("bfloat16", 8, 1, 128, 512), ("bfloat16", 8, 32, 128, 512), ("bfloat16", 8, 32, 32, 128),
    ("bfloat16", 8, 256, 64, 128),
    ("float32", 2, 32, 128, 512), ("float32", 8, 32, 128, 512),
    # the many rows where N > 2 moves fewer values a lane than it did (8)
    ("bfloat16", 4, 512, 128, 512), ("bfloat16", 4, 2048, 128, 512),
    ("bfloat16", 8, 512, 128, 512), ("bfloat16", 8, 2048, 128, 512),
    ("bfloat16", 8, 2048, 64, 128), ("float32", 8, 2048, 128, 512),
]
UNROLLS = (1, 2, 4, 8)
COMBINE_WARPS = (1, 2, 4)
WALKS = (2, 3, 4)  # tokens a block of the picked combine tiles walks, as candidates
PACK_WARPS = (1, 2, 4, 8)


@contextlib.contextmanager
def _shape(warps=None, unroll=None, by_rows=None, depth=None):
    """The library's launch shape changed for the launches made inside: ``warps`` a
    block (``_rows.WARPS_PER_BLOCK``, and the combine's ``block_warps``), the
    combine's ``unroll``, whether the combine runs a block a row (``by_rows``:
    ``combine.by_blocks``; ``None`` leaves the library's choice), and the most
    tokens along the grid's z (``depth``: ``_rows.tile_grid``'s bound; the tokens
    beyond are the kernels' grid-stride loop, so each block walks several)."""
    from cupy_dcp.kernels import _rows, combine

    saved = _rows.WARPS_PER_BLOCK, combine._combine_shape, combine.block_warps, \
        combine.by_blocks, _rows.MAX_GRID_Z
    if depth is not None:
        _rows.MAX_GRID_Z = depth
    if warps is not None:
        _rows.WARPS_PER_BLOCK = warps
        combine.block_warps = lambda total: warps
    if unroll is not None:
        def forced(elements, rows, shards):
            group, slices = combine._slicing(elements, unroll)
            return group, unroll, slices
        combine._combine_shape = forced
    if by_rows is not None:
        combine.by_blocks = lambda elements, tokens, rows, shards: by_rows
    try:
        yield
    finally:
        _rows.WARPS_PER_BLOCK, combine._combine_shape, combine.block_warps, \
            combine.by_blocks, _rows.MAX_GRID_Z = saved


def _cell(text):
    """``(dtype, N, B, H, D)`` of ``--cell``'s ``DTYPE,N,B,H,D``."""
    parts = text.split(",")
    try:
        n, B, H, D = (int(p) for p in parts[1:])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not DTYPE,N,B,H,D: {text!r}") from None
    if parts[0] not in ("bfloat16", "float16", "float32"):
        raise argparse.ArgumentTypeError(f"DTYPE is bfloat16, float16 or float32: {text!r}")
    if min(n, B, H, D) < 1 or H % n:
        raise argparse.ArgumentTypeError(f"N, B, H, D must be positive, N dividing H: {text!r}")
    return parts[0], n, B, H, D


def _launches(cupy, cell):
    """``{(kernel, shape): (kernel, grid, block, args)}`` of every candidate in ``cell``,
    and the key of what the library picks today for each kernel."""
    from cupy_dcp.kernels import _rows, combine
    from cupy_dcp.kernels._arrays import dummy_index, kernel_array
    from cupy_dcp.kernels.combine import combine_codec, combine_launch
    from cupy_dcp.kernels.pack import pack_launch
    from cupy_dcp.layout import as_dtype, bits_dtype, lse_pack_dim

    dtype_name, n, B, H, D = cell
    dtype = as_dtype(dtype_name)
    bits, value = bits_dtype(dtype), combine_codec(dtype)[1]
    x = cupy.zeros((B, H, D), dtype=dtype)
    lse = cupy.zeros((B, H), dtype=cupy.float32)
    send = cupy.zeros((n, B, H // n, D + lse_pack_dim(dtype)), dtype=bits)
    recv = cupy.zeros_like(send)
    out = cupy.zeros((B, H // n, D), dtype=dtype)
    out_lse = cupy.zeros((B, H // n), dtype=cupy.float32)

    def pack():
        return pack_launch(kernel_array(x, bits), kernel_array(lse, np.uint32), dummy_index(),
                           dummy_index(), -1, kernel_array(send, bits), kernel_array(recv, bits), 0)

    def comb():
        return combine_launch(dtype, kernel_array(recv, bits), kernel_array(out, value),
                              kernel_array(out_lse, np.float32), True)

    launches = {}
    for warps in PACK_WARPS:
        with _shape(warps=warps):
            launches[("pack", f"warps {warps}")] = pack()
    for unroll in UNROLLS:
        for warps in COMBINE_WARPS:
            with _shape(warps=warps, unroll=unroll, by_rows=False):
                launches[("combine", f"unroll {unroll} warps {warps}")] = comb()
    rows = B * (H // n)
    # D in words where 16-bit values go in pairs
    elements = D // 2 if np.dtype(dtype).itemsize == 2 and D % 2 == 0 else D
    if combine.by_blocks(elements, B, 0, n):  # rows 0: where the rows allow a block a row
        with _shape(by_rows=True):
            launches[("combine", "block a row")] = comb()
    # what the library picks: the pack's warps; the combine's block a row, or its unroll
    if combine.by_blocks(elements, B, rows, n):
        picked_combine = "block a row"
    else:
        picked_unroll = combine._combine_shape(elements, rows, n)[1]
        picked_warps = combine.block_warps(combine._warps(elements, rows, picked_unroll)) \
            or _rows.WARPS_PER_BLOCK
        picked_combine = f"unroll {picked_unroll} warps {picked_warps}"
        # the picked tiles with each block walking several tokens (a grid of fewer waves)
        for walk in WALKS:
            if B >= 2 * walk:
                with _shape(warps=picked_warps, unroll=picked_unroll, by_rows=False,
                            depth=-(-B // walk)):
                    launches[("combine", f"{picked_combine} walk {walk}")] = comb()
    picked = {"pack": f"warps {_rows.WARPS_PER_BLOCK}", "combine": picked_combine}
    return launches, picked, (x, lse, send, recv, out, out_lse)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--cell", type=_cell, action="append", default=None,
                        help="DTYPE,N,B,H,D: a cell to time in place of the default list "
                             "(repeatable)")
    args = parser.parse_args()
    cells = args.cell or CELLS

    import cupy

    from cupy_dcp._floors import empty_kernel, quad_words
    from cupy_dcp._kernel_bench import _interleaved_us, floor_blocks
    from cupy_dcp.kernels._arrays import kernel_array

    stream = cupy.cuda.Stream(non_blocking=True)
    empty = empty_kernel()
    words = cupy.zeros(quad_words(16), dtype=cupy.uint32)
    floor_args = (kernel_array(words, np.uint32), kernel_array(words, np.uint32))
    print(f"graph of {args.calls} calls, median of {args.reps} replays, median of "
          f"{args.rounds} rounds; us; * the shape picked today; empty: the empty kernel "
          f"in that shape's grid", flush=True)
    with stream:
        for cell in cells:
            launches, picked, _keep = _launches(cupy, cell)
            timed = dict(launches)
            for name in picked:  # the empty kernel in each picked shape's grid, timed last
                _, grid, block, _ = launches[(name, picked[name])]
                timed[("empty", name)] = (empty, floor_blocks(grid), block, floor_args)
            us = _interleaved_us(cupy, stream, timed, args.rounds, args.calls, args.reps)
            dtype_name, n, B, H, D = cell
            print(f"{dtype_name} N={n} B={B} H={H} D={D}", flush=True)
            for name in picked:
                mine = {shape: us[(k, shape)]
                        for k, shape in launches if k == name}
                best = min(mine, key=mine.get)
                cells = "  ".join(f"{shape}{'*' if shape == picked[name] else ''} {t:.2f}"
                                  for shape, t in mine.items())
                print(f"  {name:<8} empty {us[('empty', name)]:.2f}  best "
                      f"{best} {mine[best]:.2f} (picked {mine[picked[name]]:.2f})\n"
                      f"           {cells}", flush=True)
            stream.synchronize()


if __name__ == "__main__":
    main()
