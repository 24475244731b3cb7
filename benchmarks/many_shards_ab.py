"""The combine for more than eight ranks: built for its N, beside the kernel for any N.

    python benchmarks/many_shards_ab.py [--rounds 3] [--calls 20] [--reps 15] [--cells 0,3]

One GPU, no mpirun; N ranks' buffers on it, as in ``python -m cupy_dcp.bench
--kernels``. Up to ``combine.MAX_STATIC_SHARDS`` ranks the library combines with
kernels built for their N (every shard's values and LSE loaded before any is
weighed); past it, with the kernel for any N, which walks a row's shards two at a
time, each pair's loads waiting on the previous pair's sums. ``MAX_STATIC_SHARDS``
was 8; this A/B raised it to 16 (cells 0 to 15: N = 12 and 16), then to 32 (cells 16
to 31: N = 24 and 32), and its cells 32 on, launches that streamed past 16, kept a lane
at ``SLICED_UNROLL`` values there (``combine.STREAM_LOADS``). At each cell it times, in the
library's launch shapes: ``any``, the launch made with ``MAX_STATIC_SHARDS``
below N (the kernel for any N), and ``own``, the launch made with it at N or more
(the same sums in the same order, so the same bits: checked here at every cell on
random partials with a token empty on one shard and a row empty on another), beside the empty kernel and a copy of the same
bytes in 4-byte words (``word_floor.py``) in ``own``'s grid; and where ``own``
streams (``combine.STREAM_UNROLL`` values a lane and shard, past ``LANE_LOADS``
loads a lane at these N), ``fewer``: the same with ``SLICED_UNROLL`` values a lane
(its bits checked too). Timed in a CUDA graph
of ``--calls`` calls, the median of ``--reps`` replays, interleaved over
``--rounds`` rounds; then the geometric mean of own / any.
"""

from exact_cost import arguments  # run as a script: benchmarks/ on the path
from one_test_ab import cell_buffers, geometric_mean, output_bits, same_bits
from word_floor import word_floors

# (dtype, N, B, H, D): heads a rank H/N of 2 to 8 at N = 12 and 16
CELLS = [
    ("bfloat16", 16, 1, 128, 512), ("bfloat16", 16, 8, 128, 512), ("bfloat16", 16, 32, 128, 512),
    ("bfloat16", 16, 128, 128, 512), ("bfloat16", 16, 512, 128, 512),
    ("bfloat16", 16, 1, 64, 128), ("bfloat16", 16, 32, 64, 128), ("bfloat16", 16, 512, 64, 128),
    ("bfloat16", 16, 2048, 64, 128), ("float16", 16, 32, 128, 512),
    ("float32", 16, 1, 128, 512), ("float32", 16, 32, 128, 512), ("float32", 16, 512, 32, 128),
    ("bfloat16", 12, 1, 96, 128), ("bfloat16", 12, 32, 96, 128), ("bfloat16", 12, 512, 96, 128),
    # past 16 (cells 16 on): heads a rank H/N of 1 to 4
    ("bfloat16", 32, 1, 128, 512), ("bfloat16", 32, 8, 128, 512), ("bfloat16", 32, 32, 128, 512),
    ("bfloat16", 32, 128, 128, 512), ("bfloat16", 32, 512, 128, 512),
    ("bfloat16", 32, 1, 64, 128), ("bfloat16", 32, 32, 64, 128), ("bfloat16", 32, 512, 64, 128),
    ("bfloat16", 32, 2048, 64, 128), ("float16", 32, 32, 128, 512),
    ("float32", 32, 1, 128, 512), ("float32", 32, 32, 128, 512), ("float32", 32, 512, 64, 128),
    ("bfloat16", 24, 1, 96, 128), ("bfloat16", 24, 32, 96, 128), ("bfloat16", 24, 512, 96, 128),
    # past 16, launches that stream (cells 32 on)
    ("bfloat16", 24, 2048, 96, 128), ("bfloat16", 24, 512, 96, 512), ("float32", 24, 512, 96, 128),
    ("float32", 24, 2048, 48, 128), ("bfloat16", 32, 2048, 128, 128), ("float32", 32, 2048, 64, 128),
]


def launches(cupy, dtype, n, recv, out, out_lse):
    """``{"any": launch, "own": launch[, "fewer": launch]}``: the library's combine
    launch with ``MAX_STATIC_SHARDS`` below ``n`` (the kernel for any N), at ``n`` or
    more (the kernel for its N) and, where that one streams, with ``STREAM_UNROLL``
    lowered to ``SLICED_UNROLL`` too."""
    import numpy as np

    from cupy_dcp.kernels import combine as C
    from cupy_dcp.kernels._arrays import kernel_array
    from cupy_dcp.layout import bits_dtype

    def launch():
        return C.combine_launch(dtype, kernel_array(recv, bits_dtype(dtype)),
                                kernel_array(out, C.combine_codec(dtype)[1]),
                                kernel_array(out_lse, np.float32), True)

    made = {}
    saved = C.MAX_STATIC_SHARDS, C.STREAM_UNROLL
    try:
        C.MAX_STATIC_SHARDS = 1
        made["any"] = launch()
        C.MAX_STATIC_SHARDS = max(saved[0], n)
        made["own"] = launch()
        C.STREAM_UNROLL = C.SLICED_UNROLL
        fewer = launch()
    finally:
        C.MAX_STATIC_SHARDS, C.STREAM_UNROLL = saved
    if fewer[0] is not made["own"][0] or tuple(fewer[1]) != tuple(made["own"][1]):
        made["fewer"] = fewer
    return made


def main():
    args, cells = arguments(__doc__.splitlines()[0], CELLS)
    import cupy

    from cupy_dcp._kernel_bench import _interleaved_us
    from cupy_dcp.layout import as_dtype

    stream = cupy.cuda.Stream(non_blocking=True)
    print(f"graph of {args.calls} calls, median of {args.reps} replays, median of "
          f"{args.rounds} rounds; us per call; floors in own's grid", flush=True)
    print(f"{'cell':<28} {'empty':>6} {'words':>6} {'any':>6} {'own':>6} {'fewer':>6}  "
          f"own/any any-empty own-empty own/words fewer/own same  grid of own", flush=True)
    ratios = []
    with stream:
        for dtype_name, n, B, H, D in cells:
            label = f"{dtype_name} N={n} B={B} {H}x{D}"
            dtype = as_dtype(dtype_name)
            recv, out, out_lse = cell_buffers(cupy, dtype, n, B, H, D)
            made = launches(cupy, dtype, n, recv, out, out_lse)
            bits = output_bits(cupy, stream, made, out, out_lse)
            same = all(same_bits(bits, "any", name) for name in made)
            _, grid, block, _ = made["own"]
            nread, nwritten = recv.nbytes, out.nbytes + out_lse.nbytes
            us = _interleaved_us(cupy, stream, {
                **word_floors(cupy, nread, nwritten, grid, block), **made},
                args.rounds, args.calls, args.reps)
            r = us["own"] / us["any"]
            ratios.append(r)
            fewer = (f"{us['fewer']:6.2f}", f"{us['fewer'] / us['own']:9.3f}") \
                if "fewer" in us else (f"{'-':>6}", f"{'-':>9}")
            print(f"{label:<28} {us['empty']:6.2f} {us['words']:6.2f} {us['any']:6.2f} "
                  f"{us['own']:6.2f} {fewer[0]}  {r:7.3f} {us['any'] - us['empty']:9.2f} "
                  f"{us['own'] - us['empty']:9.2f} {us['own'] / us['words']:9.3f} {fewer[1]} "
                  f"{same!s:>5}  {tuple(grid)}x{tuple(block)}", flush=True)
    if ratios:
        print(geometric_mean("own/any", ratios), flush=True)


if __name__ == "__main__":
    main()
