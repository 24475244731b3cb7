"""The combine a block a row (``kernels/_blocks.py``) beside its floors, at decode
sizes, on one GPU, in CUDA-graph replay.

    python benchmarks/combine_lean.py [--rounds 3] [--calls 20] [--reps 15] [--cells 0,2]

For each cell (dtype, N, B <= 32, H, D) that the library runs a block a row
(``combine.by_blocks``), in one graph and grid, interleaved:

- ``lib``: the combine as the library launches it (``combine_launch``), its output
  LSE from one more block a token;
- ``bare``: the library's kernel with the weights replaced by one FFMA on each
  loaded LSE (no max, no exponential, no sum, no reciprocal): the chain of
  loads, a dependent step and stores without the math, a floor for any kernel
  of this layout that weighs rows by their LSEs;
- ``fast``: the library's kernel with its weights' math compiled with ``fastmath``
  (``exact_cost``'s ``fast``: vLLM's precision, not the library's bound): what the
  exact math's latency costs;
- ``fast_lse``: the library's kernel with its output LSE's logarithm compiled with
  ``fastmath`` (its weights exact): what the LSE blocks' logarithm costs;
- ``no_lse``: ``lib`` without an output LSE (nor its blocks);
- ``empty`` and ``copy``: the launch and copy floors of ``_floors`` in ``lib``'s grid.

Inputs are random (values N(0, 1), LSEs spread over 8). The last columns are
each time over the empty kernel's (the issue's target: 0.7 us).

``results/h200_combine_lean_ab.log`` was made by this script as it was when it
was added: it also timed ``lean``, the kernel the library then ran, beside the
block a row it replaced (``lib`` there: the output written through its 3-d view
at 64-bit offsets), and checked their bits equal. Up to
``results/h100_combine_lean_lse_block.log`` its ``lib`` wrote the output LSE from
a warp more in each row's block, and it timed ``inline`` too (thread 0 of the row's
block wrote it after its stores); that log's ``blk`` is the LSE block.
"""

import numpy as np

from exact_cost import _weights, arguments, fast_math, floor_launches

CELLS = [(dt, n, B, H, D) for dt in ("bfloat16", "float16", "float32") for n in (2, 4, 8)
         for H, D in ((32, 128), (64, 128), (128, 512)) for B in (1, 8, 32)]


TWINS = ("bare", "fast", "fast_lse")


def _twin_kernel(variant, codec, n, per, threads):
    """The block a row's kernel (``_blocks.blocks_kernel``'s arguments), built uncached as
    the twin ``variant``: ``bare`` and ``fast`` take ``exact_cost``'s weights of that name
    (one FFMA a LSE; the weights' math at vLLM's precision); ``fast_lse`` keeps the exact
    weights and takes the output LSE's logarithm at vLLM's precision. The library's
    functions are its own again afterwards."""
    from cupy_dcp.kernels import _blocks

    saved = _blocks.held_weights, _blocks.device_functions, _blocks._row_combiner
    if variant == "fast_lse":
        functions = {**saved[1](), "global_lse": fast_math().global_lse}
        _blocks.device_functions = lambda: functions
    else:
        weights = _weights(variant)
        _blocks.held_weights = lambda: weights
    try:
        row = saved[2].__wrapped__(codec, n, per, threads, False)
        _blocks._row_combiner = lambda *a: row
        return _blocks.blocks_kernel.__wrapped__(codec, n, per, False, threads)
    finally:
        _blocks.held_weights, _blocks.device_functions, _blocks._row_combiner = saved


def cell_buffers(cupy, cell, rng, keys):
    """``(recv, outs, launch, row)`` of ``cell`` (dtype, N, B, H, D), or ``None`` where the
    library does not run it a block a row: the received buffer of N packed shards of
    random inputs (values N(0, 1), LSEs spread over 8) on the GPU; an output and an
    output LSE (as bits) for each of ``keys``; ``launch(key, with_lse=True)``, the
    library's ``combine_launch`` into ``key``'s, as ``(kernel, grid, block, args)``; and
    ``row``, the block a row's ``(codec, per, threads)`` (``_blocks.blocks_kernel``'s)."""
    from cupy_dcp.kernels import combine
    from cupy_dcp.kernels._arrays import kernel_array
    from cupy_dcp.layout import as_dtype, bits_dtype
    from cupy_dcp.reference import pack_reference

    dtype_name, n, B, H, D = cell
    dtype = as_dtype(dtype_name)
    hn = H // n
    el = D // 2 if dtype.itemsize == 2 else D
    if not combine.by_blocks(el, B, B * hn, combine.static_shards(n)):
        return None
    bits = bits_dtype(dtype)
    shards = [pack_reference(rng.standard_normal((B, hn, D)).astype(np.float32).astype(dtype),
                             rng.uniform(-4, 4, (B, hn)).astype(np.float32), 1)[0]
              for _ in range(n)]
    recv = cupy.asarray(np.stack(shards).view(bits))
    outs = {k: (cupy.zeros((B, hn, D), dtype=bits), cupy.zeros((B, hn), np.float32))
            for k in keys}
    value = combine.combine_codec(dtype)[1]

    def launch(key, with_lse=True):
        out, lse = outs[key]
        return combine.combine_launch(dtype, kernel_array(recv, bits), kernel_array(out, value),
                                      kernel_array(lse, np.float32) if with_lse else None, True)

    codec = "float32" if dtype.itemsize == 4 else combine.combine_codec(dtype, True)[0]
    return recv, outs, launch, (codec, combine.block_values(el), combine.block_threads(el))


def time_cell(cupy, stream, launches, recv, outs, args, same):
    """``(us, equal)``: each of ``launches`` (``{name: (kernel, grid, block, args)}``, one
    named ``lib``) run once on ``stream``, ``same()`` then (whether their outputs agree as
    the caller requires), and the microseconds a call of each and of the empty kernel and
    the copy of ``lib``'s bytes in its grid (``empty``, ``copy``), interleaved in CUDA
    graphs as ``args`` (rounds, calls, reps) say."""
    from cupy_dcp._kernel_bench import _interleaved_us

    for kernel, grid, block, kargs in launches.values():
        kernel(grid, block, stream.ptr, kargs)
    stream.synchronize()
    equal = same()
    _, grid, block, _ = launches["lib"]
    out, lse = outs["lib"]
    timed = {**launches, **floor_launches(cupy, recv.nbytes, out.nbytes + lse.nbytes,
                                          grid, block)}
    return _interleaved_us(cupy, stream, timed, args.rounds, args.calls, args.reps), equal


def _launches(cupy, cell, rng):
    """``({variant: (kernel, grid, block, args)}, (recv, outs))`` of ``cell``, or ``None``
    where the library does not run it a block a row."""
    from cupy_dcp.kernels._launch import SpecializedKernel

    made = cell_buffers(cupy, cell, rng, ("lib", "no_lse") + TWINS)
    if made is None:
        return None
    recv, outs, launch, (codec, per, threads) = made
    launches = {"lib": launch("lib"), "no_lse": launch("no_lse", False)}
    kernel, grid, block, _ = launches["lib"]
    n = cell[1]
    for variant in TWINS:
        twin = _twin_kernel(variant, codec, n, per, threads)
        launches[variant] = (SpecializedKernel(twin, kernel.argtypes), grid, block,
                             launch(variant)[3])
    return launches, (recv, outs)


def main():
    args, cells = arguments(__doc__.splitlines()[0], CELLS)

    import cupy

    rng = np.random.default_rng(0)
    stream = cupy.cuda.Stream(non_blocking=True)
    print(f"graph of {args.calls} calls, median of {args.reps} replays, median of "
          f"{args.rounds} rounds; us per call; empty and copy in the combine's grid",
          flush=True)
    print(f"{'cell':<28} {'empty':>6} {'copy':>6} {'bare':>6} {'fast':>6} {'f_lse':>6} "
          f"{'no_lse':>6} {'lib':>6}  over empty: copy  bare  fast f_lse no_lse  lib",
          flush=True)
    with stream:
        for cell in cells:
            made = _launches(cupy, cell, rng)
            if made is None:
                continue
            launches, (recv, outs) = made
            # the library's values whatever its output LSE: none, or at vLLM's precision
            us, same = time_cell(cupy, stream, launches, recv, outs, args, lambda: all(
                bool(cupy.array_equal(outs["lib"][0], outs[k][0]))
                for k in ("no_lse", "fast_lse")))
            dtype_name, n, B, H, D = cell
            label = f"{dtype_name} N={n} B={B} {H}x{D}"
            e = us["empty"]
            print(f"{label:<28} {e:6.2f} {us['copy']:6.2f} {us['bare']:6.2f} "
                  f"{us['fast']:6.2f} {us['fast_lse']:6.2f} {us['no_lse']:6.2f} "
                  f"{us['lib']:6.2f}  {us['copy'] - e:15.2f} {us['bare'] - e:5.2f} "
                  f"{us['fast'] - e:5.2f} {us['fast_lse'] - e:5.2f} {us['no_lse'] - e:6.2f} "
                  f"{us['lib'] - e:5.2f}{'' if same else '  DIFFERENT BITS'}", flush=True)
            assert same, cell


if __name__ == "__main__":
    main()
