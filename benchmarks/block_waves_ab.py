"""The combine a block a row where its launch passes a wave, beside two twins that fit
one, on one GPU, in CUDA-graph replay.

    python benchmarks/block_waves_ab.py [--rounds 3] [--calls 20] [--reps 15] [--cells 0,1]

At float32 N = 2, B = 32, 128 x 512 the block a row (128 threads, 4 values a thread
and shard) links to about 39 registers a thread, so 12 blocks fit an SM and its 2048
row blocks and 32 LSE blocks take 1.31 waves of 132 SMs, where the copy of its bytes
in its grid takes one (``kernel_registers.py``'s second table). For each cell, in one
graph and grid, interleaved:

- ``lib``: the combine as the library launches it (``combine_launch``);
- ``cap32``: the same kernel (``_blocks._row_combiner``'s row, as ``blocks_kernel``
  wraps it) linked with at most 32 registers a thread: 16 blocks an SM;
- ``t64``: the block a row of 64 threads and twice the values a thread (the same
  grid, half the threads a block);
- ``empty`` and ``copy``: the launch and copy floors of ``_floors`` in ``lib``'s grid.

The first cell is the one past a wave; the others (below a wave, several waves at
B = 128, bf16 pairs) say whether a twin's gain there follows the waves or the shape.
Inputs are ``combine_lean``'s (values N(0, 1), LSEs spread over 8); the twins' outputs
and output LSEs are checked bit for bit against ``lib``'s. The last columns are each
time over the empty kernel's (issue 27's target: 0.7 us).
"""

import numpy as np

from combine_lean import cell_buffers, time_cell
from exact_cost import arguments

CELLS = [("float32", 2, 32, 128, 512), ("float32", 4, 32, 128, 512),
         ("float32", 2, 8, 128, 512), ("float32", 2, 128, 128, 512),
         ("bfloat16", 2, 8, 128, 512), ("bfloat16", 8, 32, 128, 512)]
TWINS = ("cap32", "t64")


def _twin(variant, codec, n, per, threads):
    """``(kernel, threads)`` of the twin ``variant`` of the block a row of ``per`` values
    and ``threads`` threads (see the module docstring)."""
    from numba import cuda

    from cupy_dcp.kernels import _blocks

    if variant == "t64":
        return _blocks.blocks_kernel.__wrapped__(codec, n, per * threads // 64, False, 64), 64
    row = _blocks._row_combiner(codec, n, per, threads, False)

    @cuda.jit(max_registers=32)
    def combine(flat_vals, flat_bits, out, out_lse, write_lse, base_e, heads, width, chunk,
                d_count, o0, o1):
        row(flat_vals, flat_bits, out, out_lse, write_lse, base_e, heads, width, chunk,
            d_count, o0, o1)

    return combine, threads


def _launches(cupy, cell, rng):
    """``({variant: (kernel, grid, block, args)}, (recv, outs))`` of ``cell``, or ``None``
    where the library does not run it a block a row."""
    from cupy_dcp.kernels._launch import SpecializedKernel

    made = cell_buffers(cupy, cell, rng, ("lib",) + TWINS)
    if made is None:
        return None
    recv, outs, launch, (codec, per, threads) = made
    launches = {"lib": launch("lib")}
    kernel, grid, block, _ = launches["lib"]
    for variant in TWINS:
        twin, twin_threads = _twin(variant, codec, cell[1], per, threads)
        launches[variant] = (SpecializedKernel(twin, kernel.argtypes), grid,
                             (twin_threads,) + tuple(block[1:]), launch(variant)[3])
    return launches, (recv, outs)


def main():
    args, cells = arguments(__doc__.splitlines()[0], CELLS)

    import cupy

    rng = np.random.default_rng(0)
    stream = cupy.cuda.Stream(non_blocking=True)
    print(f"graph of {args.calls} calls, median of {args.reps} replays, median of "
          f"{args.rounds} rounds; us per call; empty and copy in the combine's grid",
          flush=True)
    print(f"{'cell':<28} {'empty':>6} {'copy':>6} {'lib':>6} {'cap32':>6} {'t64':>6}  "
          f"over empty: copy   lib cap32   t64", flush=True)
    with stream:
        for cell in cells:
            made = _launches(cupy, cell, rng)
            if made is None:
                continue
            launches, (recv, outs) = made
            us, same = time_cell(cupy, stream, launches, recv, outs, args, lambda: all(
                bool(cupy.array_equal(outs["lib"][i], outs[k][i]))
                for k in TWINS for i in (0, 1)))
            dtype_name, n, B, H, D = cell
            e = us["empty"]
            print(f"{f'{dtype_name} N={n} B={B} {H}x{D}':<28} {e:6.2f} {us['copy']:6.2f} "
                  f"{us['lib']:6.2f} {us['cap32']:6.2f} {us['t64']:6.2f}  "
                  f"{us['copy'] - e:15.2f} {us['lib'] - e:5.2f} {us['cap32'] - e:5.2f} "
                  f"{us['t64'] - e:5.2f}{'' if same else '  DIFFERENT BITS'}", flush=True)
            assert same, cell


if __name__ == "__main__":
    main()
