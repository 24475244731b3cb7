"""The peer's combine algorithm, built in Numba and timed in our run beside ours.

    python benchmarks/peer_twin.py [--rounds 3] [--calls 20] [--reps 15] [--cells 0,2]

Issue 27 compares our combine with figures of vLLM's Triton combine from
another run on another day; torch and Triton cannot run on the GPU machine, so
that kernel cannot be timed beside ours. This times the next best thing: the
algorithm and launch shape of a Triton combine of the packed layout, written
here in Numba, in the same graph as our combine and its floors. It is a proxy
of that kernel, not the kernel: Triton's code generation is not NVVM's.

The twin (``peer``), as Triton lays such a kernel out: one block of four warps
per (token, head) row (grid ``(H/N, B)``); thread ``t`` owns the row's elements
``t, t + 128, ...`` (Triton cannot prove the rows 16-byte aligned, so one element
a load: 16-bit loads for 16-bit outputs); it loads every shard's elements and
LSE, cleans the LSEs (NaN and +inf as empty), takes their max, the sum of the
exponentials and the global LSE ``log(sum) + max``, weighs each shard by
``exp(lse - global)`` and stores the float32 sum rounded to the output dtype,
and its thread 0 the global LSE. Its math is compiled with ``fastmath`` (the
``ex2.approx`` and ``lg2.approx`` of Triton's ``tl.exp`` and ``tl.log``);
``peer_exact`` is the same kernel with libdevice's ``expf`` and ``logf``, and
``peer_words`` reads and writes 16-bit values as uint32 words of two (as ours
does), to separate the layout from the loads' width.

Columns: the empty and copy floors of ``_floors`` in our combine's grid, our
combine as the library launches it, the three twins, and the issue's vLLM
figure. Inputs are random (LSEs within 4 of each other); every twin's output is
checked against ours before it is timed (within 2 output ulps: the twins'
weights are not ours).
"""

import functools
import math

import numpy as np
from numba import cuda

from exact_cost import CELLS, arguments, floor_launches

THREADS = 128  # Triton's four warps a program
VARIANTS = ("peer", "peer_exact", "peer_words")


@functools.cache
def twin_kernel(codec, shards, per, fast):
    """The twin for ``codec`` (``_codecs``), exactly ``shards`` ranks and ``per``
    values a thread, its math compiled with ``fastmath`` where ``fast``:
    ``twin(flat_vals, flat_bits, out, out_lse, heads, width, chunk)``, launched on
    ``(H/N, B)`` blocks of :data:`THREADS`."""
    from cupy_dcp.kernels._codecs import PAIRS, RAW, codec_functions
    from cupy_dcp.kernels._slices import flat_lse_reader

    decode_lo, decode_hi, encode = codec_functions(codec)[2:]
    read_lse = flat_lse_reader(codec)
    raw, pairs = RAW[codec], codec in PAIRS
    u32, u64, f32 = np.uint32, np.uint64, np.float32
    zero, neg_inf, pos_inf = f32(0), f32(-math.inf), f32(math.inf)
    threads = u32(THREADS)
    held_count, acc_count = shards * per, 2 * per  # local arrays' sizes: constants

    @cuda.jit(device=True, inline="always", fastmath=fast)
    def exp(x):
        return math.exp(x)

    @cuda.jit(device=True, inline="always", fastmath=fast)
    def log(x):
        return math.log(x)

    @cuda.jit(fastmath=fast)
    def twin(flat_vals, flat_bits, out, out_lse, heads, width, chunk):
        h = u32(cuda.blockIdx.x)
        b = u32(cuda.blockIdx.y)
        t = u32(cuda.threadIdx.x)
        count = u32(out.shape[2])
        row = u64(u32(u32(b * u32(heads)) + h)) * u64(width)
        held = cuda.local.array(held_count, raw)
        lses = cuda.local.array(shards, np.float32)
        acc = cuda.local.array(acc_count, np.float32)
        for r in range(shards):
            at = row + u64(r) * u64(chunk)
            for k in range(per):
                e = u32(t + u32(k) * threads)
                if e < count:
                    held[r * per + k] = flat_vals[at + u64(e)]
        for r in range(shards):
            lses[r] = read_lse(flat_vals, flat_bits, row + u64(r) * u64(chunk) + u64(width))
        m = neg_inf
        for r in range(shards):
            x = lses[r]
            if x != x or x == pos_inf:
                x = neg_inf
            lses[r] = x
            m = max(m, x)
        if m == neg_inf:
            m = zero
        total = zero
        for r in range(shards):
            total += exp(lses[r] - m)
        whole = log(total) + m
        for k in range(acc_count):
            acc[k] = zero
        for r in range(shards):
            w = exp(lses[r] - whole)
            if w != w:
                w = zero
            for k in range(per):
                acc[k] += w * decode_lo(held[r * per + k])
                if pairs:
                    acc[per + k] += w * decode_hi(held[r * per + k])
        for k in range(per):
            e = u32(t + u32(k) * threads)
            if e < count:
                out[b, h, e] = encode(acc[k], acc[per + k])
        if t == u32(0):
            out_lse[b, h] = whole

    return twin


def _twin_launch(variant, dtype, recv_bits, out, out_lse):
    """``(kernel, grid, block, args)`` of twin ``variant`` over the received buffer seen as
    bits (``DeviceArray``), the output (its dtype's values) and the output LSE."""
    from numba import types

    from cupy_dcp.kernels._launch import SpecializedKernel, array_type
    from cupy_dcp.kernels.combine import combine_codec

    words = variant == "peer_words" and np.dtype(dtype).itemsize == 2
    codec, value = combine_codec(dtype, words)
    vals = recv_bits.as_words() if words else recv_bits.view(value)
    bits = recv_bits.as_words() if words else recv_bits
    dst = out.as_words() if words else out.view(value)
    n, tokens, heads, width = vals.shape
    per = -(-dst.shape[2] // THREADS)
    kernel = SpecializedKernel(
        twin_kernel(codec, n, per, variant != "peer_exact"),
        (array_type(value, 1, True), array_type(bits.dtype, 1, True),
         array_type(value, 3, False), array_type(np.float32, 2, False),
         types.int64, types.int64, types.int64))
    args = (vals.flat(), bits.flat(), dst, out_lse, heads, width, tokens * heads * width)
    return kernel, (heads, tokens, 1), (THREADS, 1, 1), args


def _inputs(cupy, cell, seed=7):
    """Random partials of ``cell``, packed as the pack does, as rank 0 receives them:
    ``(recv, partials, out, out_lse)``, the device buffers as bits (``partials`` the
    float32 values on the host)."""
    from cupy_dcp.layout import as_dtype, bits_dtype
    from cupy_dcp.reference import pack_reference

    dtype_name, n, B, H, D, _ = cell
    dtype, bits = as_dtype(dtype_name), bits_dtype(as_dtype(dtype_name))
    rng = np.random.default_rng(seed)
    outs = rng.standard_normal((n, B, H, D)).astype(dtype)
    lses = rng.uniform(-2, 2, (n, B, H)).astype(np.float32)
    recv = np.stack([pack_reference(outs[r], lses[r], n)[0] for r in range(n)]).view(bits)
    return (cupy.asarray(recv), outs.astype(np.float32), cupy.zeros((B, H // n, D), dtype=bits),
            cupy.zeros((B, H // n), dtype=np.float32))


def main():
    args, cells = arguments(__doc__.splitlines()[0], CELLS, "exact_cost.CELLS")

    import cupy
    from ml_dtypes import finfo

    from cupy_dcp._kernel_bench import _interleaved_us
    from cupy_dcp.kernels._arrays import kernel_array
    from cupy_dcp.kernels.combine import combine_codec, combine_launch
    from cupy_dcp.layout import as_dtype, bits_dtype

    stream = cupy.cuda.Stream(non_blocking=True)
    print(f"graph of {args.calls} calls, median of {args.reps} replays, median of "
          f"{args.rounds} rounds; us per call; empty and copy in our combine's grid; "
          f"vLLM from issue 27's table (another run)", flush=True)
    print(f"{'cell':<28} {'empty':>6} {'copy':>6} {'ours':>6} {'peer':>6} {'p_exact':>7} "
          f"{'p_words':>7} {'vLLM':>6}  ours/peer  max_off", flush=True)
    with stream:
        for cell in cells:
            dtype = as_dtype(cell[0])
            bits, value = bits_dtype(dtype), combine_codec(dtype)[1]
            recv, partials, out, out_lse = _inputs(cupy, cell)
            recv_bits = kernel_array(recv, bits)
            ours = combine_launch(dtype, recv_bits, kernel_array(out, value),
                                  kernel_array(out_lse, np.float32), True)
            ours[0](ours[1], ours[2], stream.ptr, ours[3])
            expect = cupy.asnumpy(out).view(dtype).astype(np.float32)
            # within 4 of the output's ulps and 1e-5 of the partials' scale: the twins'
            # weights are not ours (fast math), the sums are in the same precision
            unit = float(finfo(dtype).eps) * np.abs(expect) + 1e-5 * np.abs(partials).max()
            timed = {"ours": ours}
            worst = 0.0
            for variant in VARIANTS:
                mine = cupy.zeros_like(out)
                launch = _twin_launch(variant, dtype, recv_bits, kernel_array(mine, value),
                                      kernel_array(cupy.zeros_like(out_lse), np.float32))
                launch[0](launch[1], launch[2], stream.ptr, launch[3])
                got = cupy.asnumpy(mine).view(dtype).astype(np.float32)
                off = float(np.max(np.abs(got - expect) / unit))
                assert off <= 4, f"{variant} at {cell[:5]}: {off:.1f} units from ours"
                worst = max(worst, off)
                timed[variant] = launch
            timed.update(floor_launches(cupy, recv.nbytes, out.nbytes + out_lse.nbytes,
                                        ours[1], ours[2]))
            us = _interleaved_us(cupy, stream, timed, args.rounds, args.calls, args.reps)
            dtype_name, n, B, H, D, vllm = cell
            label = f"{dtype_name} N={n} B={B} {H}x{D}"
            print(f"{label:<28} {us['empty']:6.2f} {us['copy']:6.2f} {us['ours']:6.2f} "
                  f"{us['peer']:6.2f} {us['peer_exact']:7.2f} {us['peer_words']:7.2f} "
                  f"{vllm:6.2f}  {us['ours'] / us['peer']:9.3f} {worst:9.1f}", flush=True)
            stream.synchronize()


if __name__ == "__main__":
    main()
