"""The combine beside a copy that moves its bytes with its own lanes.

    python benchmarks/row_floor.py [--rounds 3] [--calls 20] [--reps 15] [--cells 0,2]

``word_floor.py`` sets each kernel beside a copy of the same bytes in 4-byte
words, each warp moving 128 contiguous bytes. The combine for exactly N reads
its rows otherwise: a row slice of ``group`` lanes, ``unroll`` words a lane
``group`` apart, every shard's words and LSE word loaded before any is used;
a warp's load then spans ``32 / group`` rows that start off a 32-byte sector
(rows of ``D + P`` values). This times, in the combine's grid and block, for
each cell (dtype, N, B, H, D) whose rows fill the combine's slices:

- ``empty``: the launch floor (``_floors.floor_empty``);
- ``words``: ``word_floor``'s copy;
- ``rows``: the same loads as the combine (lanes, slices, shards, the LSE word),
  their XOR stored where the combine stores its output: a copy with the
  combine's access pattern and none of its arithmetic;
- ``kernel``: the combine as the library launches it.

If ``rows`` runs as fast as ``words``, the combine's time over the words' copy
is its arithmetic (weights, decodes, sums), not the way it reads its rows.
"""

import functools

import numpy as np
from numba import cuda
from numba.core import types

from exact_cost import arguments
from word_floor import word_floors

# the combine's 4096-warp cells at B = 512, the same shapes at B = 2048, two small ones
CELLS = [("bfloat16", 2, 512, 64, 128), ("bfloat16", 4, 512, 64, 128),
         ("bfloat16", 8, 512, 64, 128), ("float32", 8, 512, 32, 128),
         ("float16", 8, 512, 64, 128), ("bfloat16", 2, 2048, 64, 128),
         ("bfloat16", 8, 32, 64, 128), ("bfloat16", 2, 8, 64, 128)]


@functools.cache
def row_copy(group, unroll, shards):
    """A :class:`SpecializedKernel` of ``floor_row_copy(src, dst, tokens, hn, width,
    d_count, chunk)``: ``src`` the received words ``[shards, tokens, hn, width]``
    (``chunk`` a shard's words), ``dst`` ``[tokens, hn, d_count]``; on the combine's
    ``tile_grid(hn, tokens, group, slices)`` with rows that fill their slices,
    ``dst[b, h, d]`` is the XOR over the shards of word ``d`` and the LSE word (the
    last) of row ``(b, h)``, loaded as the combine for exactly N loads them."""
    from cupy_dcp.kernels._launch import SpecializedKernel, array_type

    u32, u64 = np.uint32, np.uint64
    u_group, u_step, per_warp = u32(group), u32(group * unroll), u32(32 // group)
    held_words = shards * unroll

    @cuda.jit
    def floor_row_copy(src, dst, tokens, hn, width, d_count, chunk):
        tx = u32(cuda.threadIdx.x)
        warp = u32(u32(cuda.blockIdx.x) * u32(cuda.blockDim.y) + u32(cuda.threadIdx.y))
        h = u32(u32(warp * per_warp) + u32(tx // u_group))
        start = u32(u32(tx % u_group) + u32(u32(cuda.blockIdx.y) * u_step))
        b = u32(cuda.blockIdx.z)
        held = cuda.local.array(held_words, np.uint32)
        lses = cuda.local.array(shards, np.uint32)
        while h < u32(hn) and b < u32(tokens):
            row = u64(u32(u32(b * u32(hn)) + h)) * u64(width)
            for r in range(shards):
                at = row + u64(r) * u64(chunk) + u64(start)
                for k in range(unroll):
                    held[r * unroll + k] = src[at + u64(k * group)]
            for r in range(shards):
                lses[r] = src[row + u64(r) * u64(chunk) + u64(width) - u64(1)]
            out = u64(u32(u32(b * u32(hn)) + h)) * u64(d_count) + u64(start)
            for k in range(unroll):
                value = u32(0)
                for r in range(shards):
                    value ^= held[r * unroll + k] ^ lses[r]
                dst[out + u64(k * group)] = value
            b = u32(b + u32(cuda.gridDim.z))

    i64 = types.int64
    return SpecializedKernel(floor_row_copy, (array_type(np.uint32, 1, True),
                                              array_type(np.uint32, 1, True),
                                              i64, i64, i64, i64, i64))


def row_launch(cupy, combine_launch_tuple):
    """``(launch, src, dst)`` of the row copy beside a combine launch on words (16-bit
    pairs or float32), or ``None`` where the combine is not the one for exactly N
    on rows that fill its slices."""
    from cupy_dcp.kernels import combine
    from cupy_dcp.kernels._arrays import kernel_array

    _, grid, block, args = combine_launch_tuple
    if len(args) != 10 or np.dtype(args[0].dtype).itemsize != 4:
        return None  # a block a row, the kernel for any N, or 16-bit values one by one
    n, tokens, hn, width = args[0].shape
    d_count = args[2].shape[2]
    group, unroll, slices = combine._combine_shape(d_count, tokens * hn, n)
    if not combine.whole_slices(d_count, group, unroll):
        return None
    src = cupy.zeros(n * tokens * hn * width, dtype=cupy.uint32)
    dst = cupy.zeros(tokens * hn * d_count, dtype=cupy.uint32)
    return (row_copy(group, unroll, n), grid, block,
            (kernel_array(src, np.uint32), kernel_array(dst, np.uint32), tokens, hn, width,
             d_count, tokens * hn * width)), src, dst


def main():
    args, cells = arguments(__doc__.splitlines()[0], CELLS)
    import cupy

    from cupy_dcp._kernel_bench import _case_kernels, _interleaved_us

    stream = cupy.cuda.Stream(non_blocking=True)
    print(f"graph of {args.calls} calls, median of {args.reps} replays, median of "
          f"{args.rounds} rounds; us per call, all in the combine's grid", flush=True)
    print(f"{'cell':<27} {'empty':>6} {'words':>6} {'rows':>6} {'kernel':>6}  "
          f"rows/words kernel/rows kernel/words", flush=True)
    with stream:
        for cell in cells:
            dtype_name, n, B, H, D = cell
            label = f"{dtype_name} N={n} B={B} {H}x{D}"
            _, launch, nread, nwritten = [c for c in _case_kernels(cupy, cell)
                                          if c[0] == "combine"][0]
            rows = row_launch(cupy, launch)
            if rows is None:
                print(f"{label:<27} not the combine for its N on whole slices: skipped")
                continue
            _, grid, block, _ = launch
            us = _interleaved_us(cupy, stream, {
                **word_floors(cupy, nread, nwritten, grid, block), "rows": rows[0],
                "kernel": launch}, args.rounds, args.calls, args.reps)
            print(f"{label:<27} {us['empty']:6.2f} {us['words']:6.2f} {us['rows']:6.2f} "
                  f"{us['kernel']:6.2f}  {us['rows'] / us['words']:10.3f} "
                  f"{us['kernel'] / us['rows']:11.3f} {us['kernel'] / us['words']:12.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
