"""The combine for exactly N over rows that fill its slices, with and without the
tests against a row's end.

    python benchmarks/whole_slices_ab.py [--rounds 5] [--cell DTYPE,N,B,H,D ...]

One GPU, no mpirun; N ranks' buffers on it, as in ``python -m cupy_dcp.bench
--kernels``. At cells where the library runs the combine split over warps
(``_slices``, not a block a row) on rows that fill every slice
(``combine.whole_slices``), the library's launch (``whole``: no load or store
tested against the row's end) beside the same launch built with the tests
(``guarded``: ``whole_slices`` forced false, as every such combine ran before),
timed in a CUDA graph of 20 calls, the median of 15 replays, interleaved over
``--rounds`` rounds, beside the empty kernel in the same grid. Both give the same
bits (``tests/cudasim/test_kernels_sim.py``).
"""

import argparse

import numpy as np

from kernel_shapes import _cell  # run as a script: benchmarks/ is on the path
from register_cap_ab import rule_launches

CELLS = [
    # the 4096-warp cells under 85 % of the copy rate on an H200 (benchmarks/NOTES.md)
    ("bfloat16", 2, 512, 64, 128), ("bfloat16", 4, 512, 64, 128), ("bfloat16", 8, 512, 64, 128),
    ("float16", 2, 512, 64, 128), ("float16", 4, 512, 64, 128), ("float16", 8, 512, 64, 128),
    ("float32", 8, 512, 32, 128),
    # the mid cells that run split over warps
    ("bfloat16", 2, 128, 128, 512), ("bfloat16", 4, 128, 128, 512),
    ("bfloat16", 8, 128, 128, 512), ("bfloat16", 8, 256, 64, 128),
    # many rows: streaming
    ("bfloat16", 2, 2048, 64, 128), ("bfloat16", 8, 2048, 64, 128),
    ("bfloat16", 4, 2048, 128, 512), ("bfloat16", 8, 2048, 128, 512),
    ("float32", 8, 2048, 32, 128),
]


def _launches(cupy, cell):
    """``{"guarded": launch, "whole": launch}`` of the combine in ``cell`` (on zeroed
    buffers, kept alive by the launches' arguments), or ``None`` where the library runs
    the combine for any N or a block a row, or its rows do not fill its slices."""
    from cupy_dcp.kernels import combine
    from cupy_dcp.layout import as_dtype

    dtype_name, n, B, H, D = cell
    dtype = as_dtype(dtype_name)
    elements = D // 2 if np.dtype(dtype).itemsize == 2 and D % 2 == 0 else D  # words in pairs
    rows, shards = B * (H // n), combine.static_shards(n)
    if not shards or combine.by_blocks(elements, B, rows, shards):
        return None  # the combine for any N, or a block a row
    group, unroll, slices = combine._combine_shape(elements, rows, shards)
    if not slices or not combine.whole_slices(elements, group, unroll):
        return None
    return rule_launches(cupy, cell, "whole_slices",
                         {"guarded": lambda *a: False, "whole": combine.whole_slices})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cell", type=_cell, action="append", default=None,
                        help="DTYPE,N,B,H,D: a cell to time in place of the default list "
                             "(repeatable)")
    args = parser.parse_args()

    import cupy

    from cupy_dcp._floors import empty_kernel, quad_words
    from cupy_dcp._kernel_bench import _interleaved_us, floor_blocks
    from cupy_dcp.kernels._arrays import kernel_array

    stream = cupy.cuda.Stream(non_blocking=True)
    empty = empty_kernel()
    words = cupy.zeros(quad_words(16), dtype=cupy.uint32)
    floor_args = (kernel_array(words, np.uint32), kernel_array(words, np.uint32))
    print(f"graph of 20 calls, median of 15 replays, median of {args.rounds} rounds; us; "
          f"empty: the empty kernel in the combine's grid", flush=True)
    with stream:
        for cell in args.cell or CELLS:
            dtype_name, n, B, H, D = cell
            launches = _launches(cupy, cell)
            if launches is None:
                print(f"{dtype_name} N={n} B={B} {H}x{D}: not a combine split over warps on "
                      f"rows that fill its slices, not timed", flush=True)
                continue
            _, grid, block, _ = launches["whole"]
            launches["empty"] = (empty, floor_blocks(grid), block, floor_args)
            us = _interleaved_us(cupy, stream, launches, args.rounds, 20, 15)
            print(f"{dtype_name} N={n} B={B} {H}x{D} grid {tuple(grid)} block {tuple(block)}: "
                  f"empty {us['empty']:.2f}  guarded {us['guarded']:.2f}  whole "
                  f"{us['whole']:.2f}  whole/guarded {us['whole'] / us['guarded']:.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
