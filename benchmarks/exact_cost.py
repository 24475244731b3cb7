"""What the combine's exact weights cost at decode sizes, against vLLM's precision.

    python benchmarks/exact_cost.py [--rounds 3] [--calls 20] [--reps 15] [--cells 0,2]

One GPU; N ranks' buffers on it, as in ``python -m cupy_dcp.bench --kernels``.
At the issue-27 cells where the combine runs in a few microseconds, the
kernels in the library's launch shape, timed in a CUDA graph (``--calls``
launches, the median of ``--reps`` replays), interleaved over ``--rounds``
rounds, the median of the rounds reported:

- ``exact``: the combine that splits rows over warps (``_slices``) as the
  library builds it (``_math``: libdevice ``expf`` with its range reduction,
  an IEEE reciprocal of the sum); where the library runs a block a row
  instead (``combine.by_blocks``), ``peer_twin.py`` times that one;
- ``fast``: the same kernel with its weights' functions compiled with
  ``fastmath`` (``ex2.approx`` of the scaled difference, ``div.approx``), the
  precision of a Triton kernel's ``tl.exp`` and division; its error grows
  with the LSE spread, past the library's bound (1 output ulp plus 16 float32
  ulps of the weighted magnitudes): an experiment, never built by the library;
- ``bare``: the weights replaced by one multiply-add on each LSE (no max, no
  exponential, no sum): the load, weigh, store chain without its math;
- ``no_lse``: ``exact`` without ``out_lse`` (no global LSE computed or stored);
- ``empty`` and ``copy``: the launch and copy floors of ``_floors`` in the
  combine's grid.

The variants are built by swapping ``_slices.held_weights`` while the launch
is made; each has its own kernel-cache key (the weights' code and options are
part of it). The buffers are zeros: every shard gets the same weight, so every
FMA runs. The vLLM column is the issue's table (another run, not this one).
"""

import argparse
import contextlib
from types import SimpleNamespace

import numpy as np

# (dtype, N, B, H, D, vLLM's combine in us from issue 27's table)
CELLS = [
    ("bfloat16", 2, 1, 128, 512, 1.55), ("bfloat16", 2, 8, 128, 512, 1.96),
    ("bfloat16", 2, 32, 128, 512, 2.96), ("bfloat16", 2, 1, 32, 128, 1.54),
    ("bfloat16", 2, 32, 32, 128, 1.88), ("bfloat16", 4, 1, 128, 512, 1.70),
    ("bfloat16", 8, 1, 128, 512, 2.56), ("bfloat16", 8, 32, 128, 512, 3.20),
    ("bfloat16", 8, 32, 32, 128, 1.92), ("float16", 8, 32, 128, 512, 3.20),
    ("float32", 2, 32, 128, 512, 3.19), ("float32", 8, 32, 128, 512, 3.52),
]
VARIANTS = ("exact", "fast", "bare")


def fast_math():
    """``_math.build_math``'s row math compiled with ``fastmath``: vLLM's precision."""
    from numba import cuda

    from cupy_dcp.kernels import _math

    return _math.build_math(np.float32, cuda.jit(device=True, fastmath=True))


def _weights(variant):
    """The ``held_weights`` device function of ``variant`` (``_math.build_held_weights``'s
    signature); ``None`` for the library's own."""
    from numba import cuda

    from cupy_dcp.kernels import _device, _math

    if variant == "exact":
        return None
    if variant == "fast":
        fast = fast_math()
        funcs = SimpleNamespace(**{**_device.device_functions(), "lse_exp": fast.lse_exp,
                                   "inverse_total": fast.inverse_total})
        return _math.build_held_weights(funcs, cuda.jit(device=True, inline="always",
                                                        fastmath=True))
    zero, half, one = np.float32(0), np.float32(0.5), np.float32(1)

    @_device.inline_device
    def bare_weights(lses, weights, count, base_e):
        for r in range(count):
            weights[r] = lses[r] * zero + half  # one FFMA on the loaded LSE: it stays live
        return zero, one

    return bare_weights


@contextlib.contextmanager
def _built_with(weights):
    """Combines launched inside split rows over warps (``_slices``, never a block a row:
    every variant is the same kernel but for its weights) and, where ``weights`` (a
    ``held_weights`` twin), use it, built uncached."""
    from cupy_dcp.kernels import _slices, combine

    saved = (_slices.held_weights, combine.slices_kernel, combine.combine_kernel,
             combine.by_blocks)
    combine.by_blocks = lambda *shape: False
    if weights is not None:
        _slices.held_weights = lambda: weights
        combine.slices_kernel = _slices.slices_kernel.__wrapped__
        combine.combine_kernel = combine.combine_kernel.__wrapped__
    try:
        yield
    finally:
        (_slices.held_weights, combine.slices_kernel, combine.combine_kernel,
         combine.by_blocks) = saved


def _launches(cupy, cell):
    """``({variant: (kernel, grid, block, args)}, arrays)`` of the combines of ``cell``."""
    from cupy_dcp.kernels._arrays import kernel_array
    from cupy_dcp.kernels.combine import combine_codec, combine_launch
    from cupy_dcp.layout import as_dtype, bits_dtype, lse_pack_dim

    dtype_name, n, B, H, D, _ = cell
    dtype = as_dtype(dtype_name)
    bits, value = bits_dtype(dtype), combine_codec(dtype)[1]
    recv = cupy.zeros((n, B, H // n, D + lse_pack_dim(dtype)), dtype=bits)
    out = cupy.zeros((B, H // n, D), dtype=dtype)
    out_lse = cupy.zeros((B, H // n), dtype=cupy.float32)
    launches = {}
    for variant in VARIANTS:
        with _built_with(_weights(variant)):
            launches[variant] = combine_launch(dtype, kernel_array(recv, bits),
                                               kernel_array(out, value),
                                               kernel_array(out_lse, np.float32), True)
    with _built_with(None):
        launches["no_lse"] = combine_launch(dtype, kernel_array(recv, bits),
                                            kernel_array(out, value), None, True)
    return launches, (recv, out, out_lse)


def arguments(description, cells, what="CELLS"):
    """``(args, cells)``: this script's command line (rounds, calls, reps and the indices
    into ``cells``, named ``what`` in the help) and the cells it picks."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--cells", default=None,
                        help=f"comma list of indices into {what} (default: every cell)")
    args = parser.parse_args()
    return args, cells if args.cells is None else [cells[int(i)] for i in args.cells.split(",")]


def floor_launches(cupy, read_bytes, written_bytes, grid, block):
    """``{"empty": launch, "copy": launch}``: the launch and copy floors of ``_floors`` in
    a combine's ``grid`` and ``block``, over buffers of the bytes it reads and writes."""
    from cupy_dcp._floors import copy_kernel, empty_kernel, in_flight, quad_words
    from cupy_dcp._kernel_bench import floor_blocks
    from cupy_dcp.kernels._arrays import kernel_array

    src = cupy.zeros(quad_words(read_bytes), dtype=cupy.uint32)
    dst = cupy.empty(quad_words(written_bytes), dtype=cupy.uint32)
    floor_args = (kernel_array(src, np.uint32), kernel_array(dst, np.uint32))
    return {"empty": (empty_kernel(), floor_blocks(grid), block, floor_args),
            "copy": (copy_kernel(in_flight(read_bytes, written_bytes)), floor_blocks(grid),
                     block, floor_args)}


def main():
    args, cells = arguments(__doc__.splitlines()[0], CELLS)

    import cupy

    from cupy_dcp._kernel_bench import _interleaved_us

    stream = cupy.cuda.Stream(non_blocking=True)
    print(f"graph of {args.calls} calls, median of {args.reps} replays, median of "
          f"{args.rounds} rounds; us per call; empty and copy in the combine's grid; "
          f"vLLM from issue 27's table", flush=True)
    print(f"{'cell':<28} {'empty':>6} {'copy':>6} {'bare':>6} {'fast':>6} {'exact':>6} "
          f"{'no_lse':>6} {'vLLM':>6}  exact-fast  fast-bare", flush=True)
    with stream:
        for cell in cells:
            launches, (recv, out, out_lse) = _launches(cupy, cell)
            _, grid, block, _ = launches["exact"]
            timed = {**launches, **floor_launches(cupy, recv.nbytes,
                                                  out.nbytes + out_lse.nbytes, grid, block)}
            us = _interleaved_us(cupy, stream, timed, args.rounds, args.calls, args.reps)
            dtype_name, n, B, H, D, vllm = cell
            label = f"{dtype_name} N={n} B={B} {H}x{D}"
            print(f"{label:<28} {us['empty']:6.2f} {us['copy']:6.2f} {us['bare']:6.2f} "
                  f"{us['fast']:6.2f} {us['exact']:6.2f} {us['no_lse']:6.2f} {vllm:6.2f}  "
                  f"{us['exact'] - us['fast']:+10.2f} {us['fast'] - us['bare']:+10.2f}",
                  flush=True)
            stream.synchronize()


if __name__ == "__main__":
    main()
