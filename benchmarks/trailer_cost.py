"""What the packed all-to-all's signature trailer costs: pack + combine of one rank, in
a CUDA graph, with and without the trailer, in one run on one GPU.

    python benchmarks/trailer_cost.py [--ranks 2] [--tokens 1 32 512] [--heads 32]
                                      [--head-dim 128] [--dtype bfloat16]

Each row is one B and the kernels timed: microseconds per call (a pack and a
combine, as ``DcpA2APlan`` launches them, no exchange: the receive buffer is the
send buffer; then each alone) without the trailer, with it, and the difference;
all are measured in alternating rounds (medians of ``--rounds`` rounds of
``--calls`` calls per graph replay), so that clock drift falls on each alike. The combine's status (device memory here, host-mapped
in a plan: it is written only where a chunk differs) must stay clear, since every
chunk carries the same signature; the run fails otherwise.
"""

import argparse

import numpy as np


def _graph(cupy, stream, launches, calls):
    with stream:
        for kernel, grid, block, args in launches:  # loaded and warm before the capture
            kernel(grid, block, stream.ptr, args)
        stream.synchronize()
        stream.begin_capture()
        for _ in range(calls):
            for kernel, grid, block, args in launches:
                kernel(grid, block, stream.ptr, args)
        return stream.end_capture()


def _us(cupy, stream, graph, calls):
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    graph.launch(stream)
    stop.record(stream)
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) * 1e3 / calls


def _launches(cupy, dtype, n, tokens, heads, head_dim, signed):
    from cupy_dcp.kernels import _trailer
    from cupy_dcp.kernels._arrays import dummy_index, kernel_array
    from cupy_dcp.kernels.combine import combine_codec, combine_launch
    from cupy_dcp.kernels.pack import pack_launch
    from cupy_dcp.layout import bits_dtype, lse_pack_dim

    bits, hn = bits_dtype(dtype), heads // n
    width = head_dim + lse_pack_dim(dtype)
    k = _trailer.trailer_rows(hn, width, bits.itemsize) if signed else 0
    x = cupy.zeros((tokens, heads, head_dim), dtype=dtype)
    lse = cupy.zeros((tokens, heads), dtype=cupy.float32)
    send = cupy.zeros((n, tokens + k, hn, width), dtype=bits)
    out = cupy.zeros((tokens, hn, head_dim), dtype=dtype)
    out_lse = cupy.zeros((tokens, hn), dtype=cupy.float32)
    status = cupy.zeros(n * _trailer.WORDS * _trailer.STATUS_WORDS, cupy.int64)
    keep = [x, lse, send, out, out_lse, status]
    pack_signed = combine_signed = None
    if signed:
        signature = cupy.asarray(np.array([_trailer.MAGIC, 0, heads, head_dim,
                                           _trailer.DTYPE_CODES[np.dtype(dtype).name], 1, 1, 0],
                                          np.int64))
        state = cupy.zeros(2, cupy.int64)
        pack_signed = (kernel_array(signature, np.int64), kernel_array(state, np.int64))
        combine_signed = (kernel_array(status, np.int64), pack_signed[1])
        keep += [signature, state]
    value = combine_codec(dtype)[1]
    launches = [
        pack_launch(kernel_array(x, bits), kernel_array(lse, np.uint32), dummy_index(),
                    dummy_index(), -1, kernel_array(send, bits), kernel_array(send, bits), 0,
                    signed=pack_signed),
        combine_launch(dtype, kernel_array(send, bits), kernel_array(out, value),
                       kernel_array(out_lse, np.float32), True, signed=combine_signed)]
    return launches, status, keep


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 32, 512])
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args(argv)

    import cupy

    from cupy_dcp.layout import as_dtype

    dtype = as_dtype(args.dtype)
    stream = cupy.cuda.Stream(non_blocking=True)
    print(f"N={args.ranks} H={args.heads} D={args.head_dim} {dtype}: us per pack + combine "
          f"in a CUDA graph", flush=True)
    print(f"{'B':>6} {'kernels':>14} {'plain us':>9} {'signed us':>10} {'trailer us':>11}",
          flush=True)
    for tokens in args.tokens:
        runs = {}
        for signed in (False, True):
            launches, status, keep = _launches(cupy, dtype, args.ranks, tokens, args.heads,
                                               args.head_dim, signed)
            for part, chosen in (("pack + combine", launches), ("pack", launches[:1]),
                                 ("combine", launches[1:])):
                runs[part, signed] = (_graph(cupy, stream, chosen, args.calls), status, keep)
        samples = {key: [] for key in runs}
        for _ in range(args.rounds):
            for key in runs:
                samples[key].append(_us(cupy, stream, runs[key][0], args.calls))
        for part in ("pack + combine", "pack", "combine"):
            if bool(runs[part, True][1].any()):
                raise SystemExit(f"B={tokens}: the combine marked a difference: "
                                 f"{runs[part, True][1]}")
            plain, signed = (float(np.median(samples[part, s])) for s in (False, True))
            print(f"{tokens:>6} {part:>14} {plain:>9.2f} {signed:>10.2f} "
                  f"{signed - plain:>+11.2f}", flush=True)

if __name__ == "__main__":
    main()
