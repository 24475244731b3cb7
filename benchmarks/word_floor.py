"""The kernels beside a copy floor at the packed rows' granularity.

    python benchmarks/word_floor.py [--rounds 2] [--calls 20] [--reps 15] [--cells 0,2]
                                    [--kernels pack,combine] [--batches 512,2048]

Issue 27 asks for 85 % of the 16-byte-vector copy bandwidth at B >= 512 and,
at B <= 32, a combine and a pack within 0.7 us of the empty kernel. A
packed row holds ``D + P`` values, so three rows in four start off a 16-byte
boundary and the pack's stores and the combine's loads move 4-byte words
(``benchmarks/NOTES.md``, 2026-12-04). This asks how much of the gap to that
copy is the words' alone. For each cell (dtype, N, B, H, D) and kernel of the
kernel bench, in the kernel's grid and block, interleaved over ``--rounds``:

- ``kernel``: the kernel as the library launches it (``_kernel_bench``'s cases);
- ``empty``: the launch floor (``_floors.floor_empty``);
- ``quads``: the kernel bench's copy floor: the bytes the kernel reads and
  writes, moved in 16-byte quads, its N source rows in flight at once;
- ``words``: the same copy moved in 4-byte words (every load and store one
  word, coalesced across a warp, the same sources in flight): a copy with the
  packed rows' granularity and none of a kernel's work.

The table gives microseconds and the ratios kernel / quads, kernel / words and
words / quads, and each time as a percentage of the 16-byte vector copy's rate
measured in the same run (``pct``: the issue's 85 %).
"""

import functools

import numpy as np
from numba import cuda

from exact_cost import arguments, floor_launches

DTYPES = ("bfloat16", "float16", "float32")
BATCHES = (512, 2048)  # the default --batches: the 85 % cells
KERNELS = ("pack", "pack_masked", "combine", "agrs_correct", "agrs_finish")


def cells_of(batches):
    """The kernel bench's cells ``(dtype, N, B, H, D)`` of the token counts ``batches``
    (``--cells`` indexes this list)."""
    return [(dt, n, B, H, D) for dt in DTYPES for n in (2, 4, 8)
            for H, D in ((32, 128), (64, 128), (128, 512)) for B in batches]


@functools.cache
def word_copy(in_flight):
    """A :class:`SpecializedKernel` of ``floor_word_copy(src, dst)``: ``dst`` word ``w``
    is the XOR of ``src`` words ``w, w + W, w + 2W, ...`` (``W`` = dst's words), asked
    for ``in_flight`` at a time before any is used: ``_floors.floor_copy`` with 4-byte
    words in place of quads."""
    from cupy_dcp._floors import floor_argtypes
    from cupy_dcp.kernels._launch import SpecializedKernel

    u64, zero = np.uint64, np.uint32(0)
    flight = u64(in_flight)

    @cuda.jit
    def floor_word_copy(src, dst):
        threads = u64(cuda.blockDim.x) * u64(cuda.blockDim.y)
        w = (u64(cuda.blockIdx.x) * u64(cuda.blockDim.y) + u64(cuda.threadIdx.y)) \
            * u64(cuda.blockDim.x) + u64(cuda.threadIdx.x)
        stride = u64(cuda.gridDim.x) * threads
        read, written = u64(src.shape[0]), u64(dst.shape[0])
        held = cuda.local.array(in_flight, np.uint32)
        while w < written:
            value = zero
            s = w
            while s < read:
                for k in range(in_flight):
                    at = s + u64(k) * written
                    held[k] = zero
                    if k == 0 or at < read:
                        held[k] = src[at]
                for k in range(in_flight):
                    value ^= held[k]
                s += flight * written
            dst[w] = value
            w += stride

    return SpecializedKernel(floor_word_copy, floor_argtypes())



def word_launch(floors, read_bytes, written_bytes):
    """The words' copy of ``read_bytes`` read and ``written_bytes`` written, launched as
    ``floors["copy"]`` is (``exact_cost.floor_launches``: the same blocks and buffers)."""
    from cupy_dcp._floors import in_flight

    _, blocks, block, floor_args = floors["copy"]
    return word_copy(in_flight(read_bytes, written_bytes)), blocks, block, floor_args


def word_floors(cupy, read_bytes, written_bytes, grid, block, quads=False):
    """``{"empty": launch, "words": launch}`` (and ``"quads"``, the 16-byte copy, where
    ``quads``): the floors of a kernel launched on ``grid`` and ``block`` that reads
    ``read_bytes`` and writes ``written_bytes`` (``exact_cost.floor_launches``, then
    :func:`word_launch` on its blocks and buffers)."""
    floors = floor_launches(cupy, read_bytes, written_bytes, grid, block)
    made = {"empty": floors["empty"]}
    if quads:
        made["quads"] = floors["copy"]
    made["words"] = word_launch(floors, read_bytes, written_bytes)
    return made


def main():
    import argparse
    import sys

    from cupy_dcp.bench import _ints

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--kernels", default=",".join(KERNELS))
    extra.add_argument("--batches", type=_ints, default=list(BATCHES),
                       help="comma list of B (the cells' token counts)")
    known, rest = extra.parse_known_args()
    sys.argv = sys.argv[:1] + rest
    if not known.batches or min(known.batches) < 1:
        raise SystemExit("--batches must be a comma list of positive token counts")
    args, cells = arguments(__doc__.splitlines()[0], cells_of(known.batches))
    kernels = [k for k in known.kernels.split(",") if k]
    if not kernels or any(k not in KERNELS for k in kernels):
        raise SystemExit(f"--kernels must be a comma list of {', '.join(KERNELS)}")

    import cupy

    from cupy_dcp._kernel_bench import _case_kernels, _interleaved_us, copy_bandwidth

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        _, vector_gbs = copy_bandwidth(cupy, stream)
        print(f"16-byte vector copy {vector_gbs:.0f} GB/s (read + write); graph of "
              f"{args.calls} calls, median of {args.reps} replays, median of {args.rounds} "
              f"rounds; us per call, floors in the kernel's grid", flush=True)
        print(f"{'cell':<27} {'kernel':<12} {'empty':>6} {'quads':>7} {'words':>7} "
              f"{'kernel':>7}  k/quads k/words w/quads  pct: quads words kernel", flush=True)
        for cell in cells:
            for name, launch, nread, nwritten in _case_kernels(cupy, cell):
                if name not in kernels:
                    continue
                _, grid, block, _ = launch
                us = _interleaved_us(cupy, stream, {
                    "kernel": launch, **word_floors(cupy, nread, nwritten, grid, block, True)},
                    args.rounds, args.calls, args.reps)
                pct = {k: 100 * (nread + nwritten) / us[k] / 1e3 / vector_gbs
                       for k in ("quads", "words", "kernel")}
                dtype_name, n, B, H, D = cell
                label = f"{dtype_name} N={n} B={B} {H}x{D}"
                print(f"{label:<27} {name:<12} {us['empty']:6.2f} {us['quads']:7.2f} "
                      f"{us['words']:7.2f} {us['kernel']:7.2f}  {us['kernel'] / us['quads']:7.3f} "
                      f"{us['kernel'] / us['words']:7.3f} {us['words'] / us['quads']:7.3f}  "
                      f"{pct['quads']:10.1f} {pct['words']:5.1f} {pct['kernel']:6.1f}",
                      flush=True)


if __name__ == "__main__":
    main()
