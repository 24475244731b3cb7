"""The bare push: a direct call's packed rows exchanged in one kernel per call, and
nothing else. A baseline for the direct plan's measurements, not part of any plan
nor of the installed package.

Run, every rank on one node with peer access (as the direct plan needs)::

    mpirun -np 2 python -m mpi4py benchmarks/bare_push.py --tokens 1,32,128,512,2048 \
        --mode graph --strategies raw_alltoall,direct,bare_push --json h200x2_bare_push.json

It runs ``python -m cupy_dcp.bench`` (the same arguments) with one more strategy,
``bare_push``: at each token count, the bare push of the bytes a direct call of
that size moves, at the fastest of :data:`GRIDS`, timed beside the bench's own.

Every rank stores the bytes it owes each peer (as many as a direct call of the
same size pushes) into that peer's window, 16 bytes at a time; then each
block raises its flag at every peer (``st.release.sys``, after a barrier) and
waits for every peer's flag of the same block (``ld.acquire.sys``, bounded by
``timeout_ns``; a wait that runs out records ``TIMED_OUT`` for the peer in
``status``). Nothing is packed, unpacked or combined. Call ``e`` raises its
flags to ``e``; the epoch lives in ``state[0]`` and the last block to arrive
(``state[1]`` counts them) advances it, as in the direct kernel. What a
direct call of the same size costs beyond the bare push is what its packing,
its combine and their synchronisation add (a direct call of at most
``LL_MAX_ROWS`` rows per rank pair goes word by word instead: twice the
bytes, no flag). The windows, flags and status are borrowed from a direct plan
that is never called (this script reads its private fields: measurement
tooling, outside the package).
"""

import functools
import sys

import numpy as np
from numba import cuda, types

from cupy_dcp.kernels._launch import SpecializedKernel, array_type
from cupy_dcp.kernels._sync import sync_functions
from cupy_dcp.kernels.direct import CHECK_EVERY, TIMED_OUT

__all__ = ["bare_push_kernel", "bare_push_case", "main"]

GRIDS = (8, 16, 32, 64, 132, 264)  # blocks of 256 threads tried; the fastest is timed


@functools.cache
def _bare_push_kernel(n):
    s = sync_functions()
    load_acquire, store_release, store_pair, now_ns = (s["load_acquire"], s["store_release"],
                                                        s["store_pair"], s["now_ns"])
    u64 = np.uint64
    u_n, u_two = u64(n), u64(2)
    timed_out = np.int64(TIMED_OUT)

    @cuda.jit
    def bare_push(src, dsts, flags, state, status, self_rank, timeout_ns):
        me = u64(self_rank)
        epoch = state[0] + 1
        tid = u64(cuda.threadIdx.x)
        threads = u64(cuda.blockDim.x)
        block = u64(cuda.blockIdx.x)
        step = u64(cuda.gridDim.x) * threads * u_two
        words = u64(src.shape[1])
        max_tiles = (u64(flags[0].shape[0]) - u_n) // u_n
        for k in range(n):
            if u64(k) != me:
                dst = dsts[k]
                i = (block * threads + tid) * u_two
                while i < words:
                    store_pair(dst, i, src[k, i], src[k, i + u64(1)])
                    i += step
        cuda.syncthreads()  # the block's stores, before its flags' release
        if tid < u_n and tid != me:
            store_release(flags[tid], u_n + me * max_tiles + block, epoch)
            mine = flags[me]
            at = u_n + tid * max_tiles + block
            start = now_ns()
            spins = 1
            while load_acquire(mine, at) < epoch:
                if spins % CHECK_EVERY == 0 and now_ns() - start > timeout_ns:
                    status[tid] = timed_out
                    break
                spins += 1
        cuda.syncthreads()
        if tid == u64(0):  # every thread read the epoch; the last block advances it
            cuda.threadfence()
            if cuda.atomic.add(state, 1, 1) == cuda.gridDim.x - 1:
                state[1] = 0
                state[0] = epoch

    return bare_push


@functools.cache
def bare_push_kernel(n):
    """The bare push for ``n`` ranks. Arguments: ``src`` uint64 ``[n, words]`` (C, an
    even number of words: row ``k`` goes to rank ``k``), ``dsts``: per rank ``k``, the
    uint64 ``[words]`` region of rank ``k``'s window that this rank writes (C, 16-byte
    aligned), ``flags``: every rank's int64 flags (``n + n * max_tiles`` words; the
    grid may not exceed ``max_tiles``), ``state`` int64 ``[2]`` (zeroed before the
    first call), ``status`` int64 ``[n]``, ``self_rank``, ``timeout_ns``."""
    flag = array_type(np.int64, 1, True)
    argtypes = (array_type(np.uint64, 2, True),
                types.UniTuple(array_type(np.uint64, 1, True), n), types.UniTuple(flag, n),
                flag, flag, types.int64, types.int64)
    return SpecializedKernel(_bare_push_kernel(n), argtypes)


def bare_push_case(comm, args, B, dtype, stream):
    """``(fn, close)`` for ``cupy_dcp.bench.run``'s ``extra_cases``: a bare push of the
    packed rows a direct call of B tokens moves, on the windows of a direct plan of
    its own (never called: it only lends its IPC memory and flags), at the grid of
    :data:`GRIDS` that times fastest here; None where the direct plan cannot run."""
    import cupy

    from cupy_dcp import DcpDirectPlan, direct_problem, lse_pack_dim
    from cupy_dcp.bench import gpu_time
    from cupy_dcp.kernels._arrays import kernel_array
    from cupy_dcp.kernels._launch import DeviceArray
    from cupy_dcp.layout import bits_dtype

    if direct_problem(comm) is not None:
        return None
    n, H, D = comm.world_size, args.heads, args.head_dim
    # 64 tokens at least: a flag per block for most grids tried (those that fit are); a
    # wait that runs out voids the figures: a short bound
    lender = DcpDirectPlan(comm, max(B, 64), H, D, dtype, timeout=2.0)
    row_bytes = (D + lse_pack_dim(dtype)) * bits_dtype(dtype).itemsize
    words = 2 * -(-B * (H // n) * row_bytes // 16)  # a direct call's bytes, in pairs of words
    windows = lender._windows  # every rank's slots: this rank's share of slot 0 is ours
    if words * 8 > windows[0].strides[1]:
        raise RuntimeError("the bare push does not fit its lender's window")
    rng = np.random.default_rng(comm.rank)
    src = cupy.asarray(rng.integers(0, 2**63, (n, words), dtype=np.uint64))
    state = cupy.zeros(2, cupy.int64)
    dsts = tuple(DeviceArray(w.ptr + comm.rank * w.strides[1], (words,), (8,), np.uint64, lender)
                 for w in windows)
    kernel = bare_push_kernel(n)
    kernel_args = (kernel_array(src, np.uint64), dsts, lender._flags,
                   kernel_array(state, np.int64), lender._status_arr, comm.rank,
                   int(lender.timeout * 1e9))
    max_tiles = (lender._flags[0].shape[0] - n) // n

    def launcher(blocks):
        ready = kernel.prepare((blocks,), (256,), kernel_args)
        if ready is None:
            return lambda: kernel((blocks,), (256,), stream.ptr, kernel_args)
        return lambda: ready(stream.ptr)

    # made on the null stream, used on another: the source copied in and the epoch counter
    # zeroed before any call (a call that read a stale epoch would run ahead of its peer's)
    cupy.cuda.runtime.deviceSynchronize()
    world = comm.mpi_comm

    def check():
        """Raise on every rank if a wait ran out on any (a rank raising alone would
        leave the others waiting for it): that voids every figure."""
        try:
            lender.check()
            problem = None
        except RuntimeError as exc:
            problem = str(exc)
        problems = [p for p in world.allgather(problem) if p]
        if problems:
            raise RuntimeError(f"the bare push at B={B} gave up: {'; '.join(problems)}")

    grids = [g for g in GRIDS if g <= max_tiles]
    launcher(grids[0])()  # a first call, checked, before anything is timed
    stream.synchronize()
    check()
    times = [gpu_time(launcher(g), stream, 5, args.calls, True, world)[0] for g in grids]
    check()
    best = grids[int(np.argmin(times))]  # the same on every rank: the slowest rank's times
    if comm.rank == 0:
        print(f"  B={B:<5} bare_push grid {best} of {grids}", flush=True)

    def close():
        try:
            check()
        finally:
            lender.close()  # every rank: they all raised, or none did

    return launcher(best), close


def main(argv=None):
    from cupy_dcp import bench

    extra = {"bare_push": bare_push_case}
    return bench.run(bench.parse_args(argv, extra, prog="python -m mpi4py benchmarks/bare_push.py"),
                     extra)


if __name__ == "__main__":
    main(sys.argv[1:])
