"""The combine for exactly N with a row's weights tested once, beside the library's.

    python benchmarks/one_test_ab.py [--rounds 5] [--calls 20] [--reps 15] [--cells 0,3]

One GPU, no mpirun; N ranks' buffers on it, as in ``python -m cupy_dcp.bench
--kernels``. The library's combines for exactly N (``_slices`` and ``_blocks``)
sum a row's shards one by one, each behind a test of its weight (``w != 0``: an
empty shard's NaN or inf never reaches the sum). The twin tests the row's weights
once: where every one is nonzero it sums the N shards with no branch, otherwise
it takes the library's path; the same sums in the same order, so the same bits
(checked here on the GPU at every cell, and in the simulator by
``tests/cudasim/test_kernel_bench_sim.py``). At each cell: the empty kernel and a
copy of the same bytes in 4-byte words (``word_floor.py``) in the combine's grid,
the library's launch and the twin's (the same grid and arguments), timed in a CUDA
graph of ``--calls`` calls, the median of ``--reps`` replays, interleaved over
``--rounds`` rounds; then the geometric mean of twin / library for each kernel.
Cells where the library runs the combine for any N are skipped.
"""

import math

import numpy as np

from exact_cost import arguments  # run as a script: benchmarks/ on the path
from word_floor import word_floors

# issue 27's cells (and a few more at B <= 32), then the 4096-warp cells at B = 512
CELLS = [
    ("bfloat16", 2, 1, 128, 512), ("bfloat16", 2, 8, 128, 512), ("bfloat16", 2, 32, 128, 512),
    ("bfloat16", 2, 128, 128, 512), ("bfloat16", 2, 1, 32, 128), ("bfloat16", 2, 32, 32, 128),
    ("bfloat16", 4, 1, 128, 512), ("bfloat16", 4, 128, 128, 512), ("bfloat16", 8, 1, 128, 512),
    ("bfloat16", 8, 32, 128, 512), ("bfloat16", 8, 128, 128, 512), ("bfloat16", 8, 32, 32, 128),
    ("bfloat16", 8, 256, 64, 128), ("float16", 8, 32, 128, 512), ("float32", 2, 32, 128, 512),
    ("float32", 8, 32, 128, 512), ("bfloat16", 4, 8, 64, 128), ("bfloat16", 8, 8, 64, 128),
    ("float16", 4, 32, 32, 128), ("float32", 4, 8, 32, 128),
    ("bfloat16", 2, 512, 64, 128), ("bfloat16", 4, 512, 64, 128), ("bfloat16", 8, 512, 64, 128),
    ("float16", 8, 512, 64, 128), ("float32", 8, 512, 32, 128), ("float16", 2, 512, 64, 128),
    ("float16", 4, 512, 64, 128), ("bfloat16", 8, 2048, 64, 128), ("bfloat16", 2, 512, 128, 512),
]


def one_test_sums(codec, shards, per, weigh):
    """A twin of ``_slices.shard_sums`` that tests a row's weights once."""
    from cupy_dcp.kernels._codecs import PAIRS, codec_functions
    from cupy_dcp.kernels._device import device_functions, inline_device

    decode_lo, decode_hi = codec_functions(codec)[2:4]
    pairs, zero = codec in PAIRS, device_functions()["zero"]
    accumulators = 2 * per

    @inline_device
    def add_shard(buf, acc, w, r):
        for k in range(per):
            acc[k] += w * decode_lo(buf[r * per + k])
            if pairs:
                acc[per + k] += w * decode_hi(buf[r * per + k])

    @inline_device
    def sum_shards(buf, lses, weights, acc, base_e):
        m, total = weigh(lses, weights, shards, base_e)
        for k in range(accumulators):
            acc[k] = zero
        every = True
        for r in range(shards):
            every = every & (weights[r] != zero)
        if every:  # one test a row: the N shards' sums with no branch
            for r in range(shards):
                add_shard(buf, acc, weights[r], r)
        else:  # the library's path: an empty shard adds exactly 0, even NaN
            for r in range(shards):
                if weights[r] != zero:
                    add_shard(buf, acc, weights[r], r)
        return m, total

    return sum_shards


def twin(launch, dtype, n):
    """``(kind, kernel)``: the one-test twin of ``launch``'s combine (``kind`` "blocks",
    "slices" or "whole": rows that fill their slices), or ``None`` for the kernel for
    any N. The twin is built with the library's own factories, ``shard_sums``
    swapped for :func:`one_test_sums` while they run (their caches bypassed)."""
    from cupy_dcp.kernels import _blocks, _slices
    from cupy_dcp.kernels import combine as C
    from cupy_dcp.kernels._launch import SpecializedKernel

    kernel, _, _, args = launch
    pairs = np.dtype(args[0].dtype).itemsize == 4 and np.dtype(dtype).itemsize == 2
    codec = C.combine_codec(dtype, pairs)[0]
    if len(args) == 12:  # a block a row: d_count is its tenth argument
        d = args[9]
        kind, module = "blocks", _blocks
        factory = _blocks.blocks_kernel.__wrapped__
        factory_args = (codec, n, C.block_values(d), False, C.block_threads(d))
    elif len(args) == 10:
        d = args[2].shape[2]
        group, unroll, _ = C._combine_shape(d, args[2].shape[0] * args[2].shape[1], n)
        whole = len(C._sliced(d, group, n, unroll)) > 3
        kind, module = ("whole" if whole else "slices"), _slices
        factory = _slices.slices_kernel.__wrapped__
        factory_args = (codec, n, group, unroll, 0, whole)
    else:
        return None
    saved = module.shard_sums
    module.shard_sums = one_test_sums
    if module is _blocks:  # its row combiners are cached apart from its kernels
        _blocks._row_combiner.cache_clear()
    try:
        built = factory(*factory_args)
    finally:
        module.shard_sums = saved
        if module is _blocks:
            _blocks._row_combiner.cache_clear()
    return kind, SpecializedKernel(built, kernel.argtypes)


def received(xp, dtype, n, B, H, D):
    """A packed receive buffer ``[n, B, H/n, D + P]`` (as bits) of random partials with
    a token empty on shard 0 and a row empty on shard 1."""
    from cupy_dcp.layout import bits_dtype
    from cupy_dcp.reference import pack_reference

    rng = np.random.default_rng(B + n)
    xs = rng.standard_normal((n, B, H // n, D)).astype(np.float32)
    ls = rng.uniform(-5, 5, (n, B, H // n)).astype(np.float32)
    ls[0, 0, :] = -np.inf
    ls[1, -1, 0] = -np.inf
    host = np.stack([pack_reference(xs[r].astype(dtype), ls[r], 1)[0] for r in range(n)])
    return xp.asarray(host.view(bits_dtype(dtype)))


def cell_buffers(xp, dtype, n, B, H, D):
    """``(recv, out, out_lse)`` of a combine of the cell: :func:`received` and zeroed
    outputs ``[B, H/n, D]`` and ``[B, H/n]``."""
    return (received(xp, dtype, n, B, H, D), xp.zeros((B, H // n, D), dtype=dtype),
            xp.zeros((B, H // n), dtype=xp.float32))


def output_bits(xp, stream, launches, out, out_lse):
    """``{name: (output bytes, output LSE bits)}``: each of ``launches`` run once on
    ``stream`` into the zeroed ``out`` and ``out_lse``."""
    bits = {}
    for name, (kernel, grid, block, args) in launches.items():
        out[...] = 0
        out_lse[...] = 0
        kernel(grid, block, stream.ptr, args)
        bits[name] = (out.view(xp.uint8).copy(), out_lse.view(xp.uint32).copy())
    return bits


def same_bits(bits, first, second):
    """Whether :func:`output_bits`' ``first`` and ``second`` are the same bits."""
    return all(bool((a == b).all()) for a, b in zip(bits[first], bits[second]))


def geometric_mean(what, ratios):
    """A line: the geometric mean of ``ratios``, named ``what``, with their range."""
    mean = math.exp(sum(map(math.log, ratios)) / len(ratios))
    return (f"geometric mean {what}: {mean:.4f} over {len(ratios)} cells (min "
            f"{min(ratios):.3f}, max {max(ratios):.3f})")


def main():
    args, cells = arguments(__doc__.splitlines()[0], CELLS)
    import cupy

    from cupy_dcp._kernel_bench import _interleaved_us
    from cupy_dcp.kernels import combine as C
    from cupy_dcp.kernels._arrays import kernel_array
    from cupy_dcp.layout import as_dtype, bits_dtype

    stream = cupy.cuda.Stream(non_blocking=True)
    print(f"graph of {args.calls} calls, median of {args.reps} replays, median of "
          f"{args.rounds} rounds; us per call, all in the combine's grid", flush=True)
    print(f"{'cell':<28} {'kind':<6} {'empty':>6} {'words':>6} {'kernel':>6} {'twin':>6}"
          f"  twin/kernel kernel-empty twin-empty same", flush=True)
    ratios = {}
    with stream:
        for dtype_name, n, B, H, D in cells:
            label = f"{dtype_name} N={n} B={B} {H}x{D}"
            dtype = as_dtype(dtype_name)
            recv, out, out_lse = cell_buffers(cupy, dtype, n, B, H, D)
            launch = C.combine_launch(dtype, kernel_array(recv, bits_dtype(dtype)),
                                      kernel_array(out, C.combine_codec(dtype)[1]),
                                      kernel_array(out_lse, np.float32), True)
            kernel, grid, block, kargs = launch
            found = twin(launch, dtype, n)
            if found is None:
                print(f"{label:<28} the combine for any N: skipped", flush=True)
                continue
            kind, other = found
            made = {"kernel": launch, "twin": (other, grid, block, kargs)}
            same = same_bits(output_bits(cupy, stream, made, out, out_lse), "kernel", "twin")
            nread, nwritten = recv.nbytes, out.nbytes + out_lse.nbytes
            us = _interleaved_us(cupy, stream, {
                **word_floors(cupy, nread, nwritten, grid, block), **made},
                args.rounds, args.calls, args.reps)
            r = us["twin"] / us["kernel"]
            ratios.setdefault(kind, []).append(r)
            print(f"{label:<28} {kind:<6} {us['empty']:6.2f} {us['words']:6.2f} "
                  f"{us['kernel']:6.2f} {us['twin']:6.2f}  {r:11.3f} "
                  f"{us['kernel'] - us['empty']:12.2f} {us['twin'] - us['empty']:10.2f} {same}",
                  flush=True)
    for kind, rs in ratios.items():
        print(geometric_mean(kind, rs), flush=True)


if __name__ == "__main__":
    main()
