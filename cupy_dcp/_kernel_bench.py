"""``python -m cupy_dcp.bench --kernels``: the pack, combine and AG+RS kernels alone, on one GPU.

The kernels see only buffer shapes, so N ranks' buffers ``[N, B, H/N, D+P]``
are timed on one GPU for every N of ``--world-size``, dtype of ``--dtype``
(a comma list), shape of ``--shapes`` and B of ``--tokens``: the pack (without
and with a ``seq_lens``/``query_start_loc`` mask), the combine, ``agrs_correct``
and ``agrs_finish``. Each kernel is captured ``--calls`` times in a CUDA graph
(so launch overhead is not timed) and replayed ``--reps`` times; beside it,
timed alike in its grid and block, the empty kernel (the launch floor) and a
copy of the bytes it reads and writes (the copy floor: ``_floors``). Its
bytes read and written per call over the median time give GB/s, also set
beside the device-to-device copy bandwidth measured in the same run.
``--json PATH`` writes every row (``_kernel_table``).

The direct path's kernel is timed the same way with N = 2 ranks simulated in
one process on one GPU: both ranks' calls at once on two streams, both
ranks' push phase alone, and the combine phase as both ranks' push then both
ranks' combine (the data is then there before any combine polls) less the
push, per rank. The windows are local memory here,
so this is the kernel's own cost (flags, waits, combine) and not the NVLink
transfer of a real two-GPU call. ``--no-direct`` leaves it out.
"""

import sys

import numpy as np

from . import _settings
from .layout import as_dtype, bits_dtype, lse_pack_dim
from .kernels._launch import choose_launcher
from .kernels._arrays import dummy_index, kernel_array
from .kernels.combine import combine_codec, combine_launch
from .kernels._rows import WARP
from .kernels.direct import (COMBINE, PUSH, STATE_WORDS, WARPS, Protocol, call_kernels,
                             direct_launch, window_layout)
from .kernels.pack import pack_launch
from .kernels.agrs import correct_launch, finish_launch
from ._floors import copy_kernel, empty_kernel, in_flight, quad_words
from ._kernel_table import dtype_list, kernel_cases, kernel_row, kernel_table, write_rows


def _graph_us(cupy, stream, fn, calls, reps):
    fn()
    stream.synchronize()
    stream.begin_capture()
    for _ in range(calls):
        fn()
    graph = stream.end_capture()
    graph.launch(stream)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    samples = []
    for _ in range(reps):
        start.record(stream)
        graph.launch(stream)
        stop.record(stream)
        stop.synchronize()
        samples.append(cupy.cuda.get_elapsed_time(start, stop) * 1e3 / calls)
    return float(np.median(samples))


def _interleaved_us(cupy, stream, launches, rounds, calls, reps):
    """``{key: us}`` of ``launches`` (``{key: (kernel, grid, block, args)}``), each timed
    by :func:`_graph_us` once a round, in order, over ``rounds`` rounds: the median of
    the rounds (so that a drift of the GPU's clocks falls on every key alike)."""
    samples = {key: [] for key in launches}
    for _ in range(rounds):
        for key, (kernel, grid, block, args) in launches.items():
            samples[key].append(_graph_us(
                cupy, stream, lambda: kernel(grid, block, stream.ptr, args), calls, reps))
    return {key: float(np.median(s)) for key, s in samples.items()}


def _host_launch_us(fn, stream, launches=2000):
    """Host microseconds per launch (no synchronisation inside the loop)."""
    import time
    fn()
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(launches):
        fn()
    elapsed = time.perf_counter() - t0
    stream.synchronize()
    return elapsed / launches * 1e6


_VECTOR_COPY = r"""
extern "C" __global__ void copy16(const uint4* __restrict__ src, uint4* __restrict__ dst, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
"""


def _launcher_costs(kernel, grid, block, stream, args):
    """Host microseconds per pack launch through each launcher that works here, as
    ``call/ready``: a call (its arguments flattened each time) and a ready launch
    (:meth:`SpecializedKernel.prepare`: only the stream is set; ``-`` where the
    launcher prepares none); ``driver dependent`` launches as a programmatic
    dependent."""
    from .kernels._launch import LAUNCHERS, SpecializedKernel
    costs = []
    for launcher, dependent in [(name, False) for name in LAUNCHERS] + [("driver", True)]:
        label = f"{launcher} dependent" if dependent else launcher
        try:
            k = SpecializedKernel(kernel._dispatcher, kernel.argtypes, launcher=launcher,
                                  dependent=dependent)
            call_us = _host_launch_us(lambda: k(grid, block, stream.ptr, args), stream)
            ready = k.prepare(grid, block, args)
            ready_us = "-" if ready is None else \
                f"{_host_launch_us(lambda: ready(stream.ptr), stream):.1f}"
            costs.append(f"{label} {call_us:.1f}/{ready_us}")
        except Exception as exc:  # a launcher whose package is missing here
            costs.append(f"{label} n/a ({type(exc).__name__})")
    print("host us per launch (call/ready): " + ", ".join(costs), flush=True)


def copy_bandwidth(cupy, stream, nbytes=1 << 30):
    """Device-to-device copy GB/s (read + write) of an ``nbytes`` buffer: the better of
    ``cudaMemcpyAsync`` and a 16-byte-vector copy kernel (the GPU's attainable copy rate)."""
    src = cupy.ones(nbytes // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    memcpy_us = _graph_us(cupy, stream,
                          lambda: dst.data.copy_from_device_async(src.data, nbytes, stream), 5, 10)
    kernel = cupy.RawKernel(_VECTOR_COPY, "copy16")
    blocks = cupy.cuda.Device().attributes["MultiProcessorCount"] * 8
    vector_us = _graph_us(cupy, stream,
                          lambda: kernel((blocks,), (256,), (src, dst, np.int64(nbytes // 16))), 5, 10)
    return 2 * nbytes / memcpy_us / 1e3, 2 * nbytes / vector_us / 1e3


def run_kernels(args):
    import cupy
    from mpi4py import MPI

    if MPI.COMM_WORLD.rank != 0:
        return
    launcher = choose_launcher(_settings.launcher())  # CUPY_DCP_LAUNCHER picks the launcher
    stream = cupy.cuda.Stream(non_blocking=True)
    rows, direct = [], []
    with stream:
        memcpy, vector = copy_bandwidth(cupy, stream)
        copy = max(memcpy, vector)
        print(f"device-to-device copy (read + write): cudaMemcpyAsync {memcpy:.0f} GB/s, "
              f"16-byte vector kernel {vector:.0f} GB/s; pct_device_copy is of {copy:.0f} GB/s",
              flush=True)
        print(f"graph of {args.calls} calls, median of {args.reps} replays; per kernel: us "
              f"(+us over the empty kernel, x the copy of its bytes in its grid)", flush=True)
        device = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()

        def meta():
            return dict(device=device, launcher=launcher, calls=args.calls, reps=args.reps,
                        memcpy_gbs=round(memcpy, 1), vector_copy_gbs=round(vector, 1),
                        direct=direct)

        dtypes = dtype_list(args.dtype)
        try:
            for dtype_name in dtypes:
                for n in args.world_size:
                    group = []
                    for case in kernel_cases([dtype_name], [n], args.shapes, args.tokens):
                        group += _case_rows(cupy, stream, args, case, copy,
                                            first=not rows and not group)
                    rows += group
                    print(kernel_table(group), flush=True)
            if not args.no_direct:
                direct = _direct_rows(cupy, stream, args, dtypes[0])
        except BaseException:
            if args.json_path and rows:  # the rows timed, kept apart from a whole run's
                write_rows(args.json_path + ".partial", rows, meta())
                print(f"the run failed: the {len(rows)} rows it had are in "
                      f"{args.json_path}.partial", file=sys.stderr, flush=True)
            raise
    if args.json_path:
        write_rows(args.json_path, rows, meta())
        print(f"{len(rows)} rows written to {args.json_path}", flush=True)


def _case_kernels(cupy, case):
    """``[(name, (kernel, grid, block, args), bytes read, bytes written)]`` of every
    kernel of :data:`KERNELS` in ``case``, on zeroed buffers (the arrays stay alive
    in the launches' arguments)."""
    dtype_name, n, B, H, D = case
    dtype = as_dtype(dtype_name)
    bits = bits_dtype(dtype)
    value = combine_codec(dtype)[1]
    f32 = cupy.float32
    x = cupy.zeros((B, H, D), dtype=dtype)
    lse = cupy.zeros((B, H), dtype=f32)
    send = cupy.zeros((n, B, H // n, D + lse_pack_dim(dtype)), dtype=bits)
    recv = cupy.zeros_like(send)
    out = cupy.zeros((B, H // n, D), dtype=dtype)
    out_lse = cupy.zeros((B, H // n), dtype=f32)
    # decode: a token per sequence, every fourth sequence with no KV here
    seq_lens = cupy.asarray(np.where(np.arange(B) % 4 == 0, 0, 7).astype(np.int64))
    starts = cupy.arange(B + 1, dtype=cupy.int64)
    lses = cupy.zeros((n, B, H), dtype=f32)
    corrected = cupy.zeros((n, B, H // n, D), dtype=f32)
    summed = cupy.zeros((B, H // n, D), dtype=f32)

    def pack(masked):
        index = (kernel_array(seq_lens, np.int64), kernel_array(starts, np.int64), B) \
            if masked else (dummy_index(), dummy_index(), -1)
        return pack_launch(kernel_array(x, bits), kernel_array(lse, np.uint32), *index,
                           kernel_array(send, bits), kernel_array(recv, bits), 0)

    pack_read = x.nbytes + lse.nbytes
    return [
        ("pack", pack(False), pack_read, send.nbytes),
        ("pack_masked", pack(True), pack_read + seq_lens.nbytes + starts.nbytes, send.nbytes),
        ("combine", combine_launch(dtype, kernel_array(recv, bits), kernel_array(out, value),
                                   kernel_array(out_lse, np.float32), True),
         recv.nbytes, out.nbytes + out_lse.nbytes),
        ("agrs_correct", correct_launch(dtype, kernel_array(x, value),
                                        kernel_array(lses, np.float32), 0, True,
                                        kernel_array(corrected, np.float32)),
         x.nbytes + lses.nbytes, corrected.nbytes),
        ("agrs_finish", finish_launch(dtype, kernel_array(summed, np.float32),
                                      kernel_array(lses, np.float32), 0, True,
                                      kernel_array(out, value), kernel_array(out_lse, np.float32)),
         summed.nbytes + lses.nbytes // n, out.nbytes + out_lse.nbytes),
    ]


def floor_blocks(grid):
    """The 1-D grid of the floor kernels set beside a kernel launched on ``grid``: as
    many blocks, along x."""
    return (int(np.prod(grid)),)


def _case_rows(cupy, stream, args, case, device_copy_gbs, first=False):
    """The rows of ``case``: each kernel, then the empty and the copy kernel in its grid
    and block over buffers of its bytes, timed alike (:func:`_graph_us`)."""
    empty = empty_kernel()
    rows = []
    for name, (kernel, grid, block, kargs), nread, nwritten in _case_kernels(cupy, case):
        if name not in args.only:
            continue
        def timed(k, a, grid=grid):
            return _graph_us(cupy, stream, lambda: k(grid, block, stream.ptr, a),
                             args.calls, args.reps)

        # the floors index blocks along x only: a kernel's 2-D grid (rows split over y)
        # is the same blocks along x, so that the copy moves its bytes once
        floor_grid = floor_blocks(grid)

        src = cupy.zeros(quad_words(nread), dtype=cupy.uint32)
        dst = cupy.empty(quad_words(nwritten), dtype=cupy.uint32)
        floor_args = (kernel_array(src, np.uint32), kernel_array(dst, np.uint32))
        copier = copy_kernel(in_flight(nread, nwritten))  # N source rows: N in flight
        us, empty_us, copy_us = timed(kernel, kargs), timed(empty, floor_args, floor_grid), \
            timed(copier, floor_args, floor_grid)
        host_us = None
        if name == "pack":  # its host cost per launch, and each launcher's in the first case
            host_us = _host_launch_us(lambda: kernel(grid, block, stream.ptr, kargs), stream)
            if first:
                _launcher_costs(kernel, grid, block, stream, kargs)
        rows.append(kernel_row(case, name, us, empty_us, copy_us, nread, nwritten,
                               device_copy_gbs, grid, block, host_us))
    return rows


def _direct_rows(cupy, stream, args, dtype_name):
    """The direct path's lines (2 ranks on this GPU, ``--heads`` x ``--head-dim``), and
    their records."""
    print("direct path, 2 ranks on this one GPU (local windows): us per rank per call", flush=True)
    dtype = as_dtype(dtype_name)
    records = []
    for B in args.tokens:
        direct_us, (push_us, comb_us), pack_combine_us, host_us = _direct_round(
            cupy, stream, args, dtype, B)
        print(f"{B:>6} {args.heads:>4} {args.head_dim:>4} direct call {direct_us:8.2f} us "
              f"(push alone {push_us:.2f}, combine alone {comb_us:.2f}; pack + combine "
              f"{pack_combine_us:.2f} us; host {host_us:.1f} us per launch)", flush=True)
        records.append(dict(dtype=dtype_name, world_size=2, tokens=B, heads=args.heads,
                            head_dim=args.head_dim, direct_us=round(direct_us, 3),
                            push_us=round(push_us, 3), combine_us=round(comb_us, 3),
                            pack_combine_us=round(pack_combine_us, 3), host_us=round(host_us, 2)))
    return records


def _direct_round(cupy, stream, args, dtype, B, n=2):
    """Per-rank µs of a direct call (every rank's kernel at once, on its own stream),
    of its push and combine phases alone, of pack + combine, and the host µs of one
    launch, for ``n`` ranks simulated on one GPU."""
    H, D = args.heads, args.head_dim
    bits = bits_dtype(dtype)
    width = D + lse_pack_dim(dtype)
    layout = window_layout(n, B, H // n, width, bits.itemsize)  # the plan's, in parts
    windows = [cupy.zeros(layout.padded_slots_shape, dtype=bits)[..., :width] for _ in range(n)]
    flags = [cupy.zeros(layout.flag_words, dtype=cupy.int64) for _ in range(n)]
    states = [cupy.zeros(STATE_WORDS, dtype=cupy.int64) for _ in range(n)]
    statuses = [cupy.zeros(n, dtype=cupy.int64) for _ in range(n)]
    x = cupy.zeros((B, H, D), dtype=dtype)
    lse = cupy.zeros((B, H), dtype=cupy.float32)
    outs = [cupy.zeros((B, H // n, D), dtype=dtype) for _ in range(n)]
    window_arrs = tuple(kernel_array(w, bits) for w in windows)
    flag_arrs = tuple(kernel_array(f, np.int64) for f in flags)
    ll_arrs = tuple(kernel_array(cupy.zeros(layout.ll_shape, dtype=cupy.uint64), np.uint64)
                    for _ in range(n))
    streams = [stream] + [cupy.cuda.Stream(non_blocking=True) for _ in range(n - 1)]

    def launch(r, phases=PUSH | COMBINE):
        return direct_launch(dtype, kernel_array(x, bits), kernel_array(lse, np.float32),
                             dummy_index(), dummy_index(), -1, window_arrs, flag_arrs, ll_arrs,
                             kernel_array(states[r], np.int64),
                             kernel_array(statuses[r], np.int64), kernel_array(outs[r], bits),
                             None, True, r, 10**9, resident[0] // n, phases,
                             ll_max_blocks=resident[1] // n)

    # every rank's blocks resident at once, in tiles and word by word (each its kernel)
    resident = [min(k.resident_blocks(WARP * WARPS) for k in call_kernels(dtype, n, bits, D,
                                                                          protocol=protocol))
                for protocol in (Protocol.TILES, Protocol.WORDS)]
    calls = [launch(r) for r in range(n)]
    forks = [cupy.cuda.Event(disable_timing=True) for _ in range(n)]

    def round_():  # every rank's call at once: the ranks wait for each other
        forks[0].record(stream)
        for s in streams[1:]:
            s.wait_event(forks[0])
        for (kernel, grid, block, kargs), s in zip(calls, streams):
            kernel(grid, block, s.ptr, kargs)
        for e, s in zip(forks[1:], streams[1:]):
            e.record(s)
            stream.wait_event(e)

    direct_us = _graph_us(cupy, stream, round_, args.calls, args.reps) / n
    # The phases: pushes alone repeat (they never wait, and leave the epoch as it is);
    # a combine alone cannot (it advances the epoch, and a word-by-word one consumes its
    # words), so it is timed as every rank's push, then every rank's combine, less the pushes.
    pushes = [launch(r, PUSH) for r in range(n)]
    in_series = pushes + [launch(r, COMBINE) for r in range(n)]

    def run_phases(steps):
        for kernel, grid, block, kargs in steps:
            kernel(grid, block, stream.ptr, kargs)

    push_us = _graph_us(cupy, stream, lambda: run_phases(pushes), args.calls, args.reps) / n
    series_us = _graph_us(cupy, stream, lambda: run_phases(in_series), args.calls, args.reps) / n
    parts = [push_us, series_us - push_us]
    send = cupy.zeros(layout.slots_shape[1:], dtype=bits)  # [N, B, H/N, width]
    recv = cupy.zeros_like(send)
    value = combine_codec(dtype)[1]
    pk = pack_launch(kernel_array(x, bits), kernel_array(lse, np.uint32), dummy_index(),
                     dummy_index(), -1, kernel_array(send, bits), kernel_array(recv, bits), 0)
    ck = combine_launch(dtype, kernel_array(recv, bits), kernel_array(outs[0], value), None, True)

    def pack_combine():
        for kernel, grid, block, kargs in (pk, ck):
            kernel(grid, block, stream.ptr, kargs)

    pack_combine_us = _graph_us(cupy, stream, pack_combine, args.calls, args.reps)
    kernel, grid, block, kargs = launch(0, PUSH)  # the same launch, but it never waits
    host_us = _host_launch_us(lambda: kernel(grid, block, stream.ptr, kargs), stream,
                              launches=500)
    if int(statuses[0].any()) or int(statuses[1].any()):
        raise RuntimeError("a direct call timed out in the kernel benchmark")
    return direct_us, parts, pack_combine_us, host_us
