"""Multi-rank GPU checks of DcpDirectPlan (CUDA IPC windows, no NCCL).

Run: mpirun -n 2 python tests/gpu_direct_worker.py MODE [COUNT]

Ranks may share one GPU (IPC works within a device) or each have their own.

- ``exact``: every dtype, both bases, return_lse, masks (empty shards),
  strided and head-major ``out=``, B changing between calls, the same
  shapes into two results in turn; every rank against the oracle of every
  rank's inputs. Reports the cases and repeated calls.
- ``race COUNT``: COUNT eager calls back to back, then COUNT replays of a
  captured call, the inputs changing every call (three input sets in turn:
  reading a slot of the previous call, or of the one before, gives another
  set's result); every result is compared on the GPU, bit for bit, with the
  result of its input set checked against the oracle; no host
  synchronisation inside the loops. Three times: a call small enough to go
  word by word, one in 128-byte lines, and one in tiles behind flags (with
  the lines path on, ``CUPY_DCP_LINES`` unset). Reports each path's counts.
- ``timeout``: rank 1 skips a call; rank 0's plan raises within the bound,
  naming rank 1; rank 1's next check raises naming rank 0.
- ``leak COUNT``: COUNT plans opened and closed; device memory and the
  plan's mappings come back.

Each rank reports by one JSON line (``run_worker``); any failure aborts the job.
"""

import sys
import time

import numpy as np
from mpi4py import MPI

import cupy_dcp
from cupy_dcp.plan import _repeat_key
from _helpers import run_worker
from gpu_reduce_worker import (call_kwargs, check_rank_result, expected, host, kernel_counts,
                               misaligned)
from host_reduce_worker import B, DTYPES, HN, rank_inputs


def exact(world, comm):
    import cupy
    rank, n = world.Get_rank(), world.Get_size()
    case = 0
    for dtype in DTYPES:
        for D, base_e in ((5, True), (72, False), (512, True)):
            with cupy_dcp.DcpDirectPlan(comm, B, HN * n, D, dtype, return_lse=True,
                                        is_lse_base_on_e=base_e) as plan:
                built = kernel_counts()  # a call builds no kernel: the plan built them all
                if D == 72 and np.dtype(dtype).itemsize == 2:
                    staged_capture_refused(world, plan, dtype, D)
                if D == 512:  # rows the kernel reads and writes in place (16-bit: words)
                    overlap_refused(world, plan, dtype, D)
                for masked, head_major, tokens in ((False, False, B), (True, True, B),
                                                   (True, False, B - 2), (False, True, 1)):
                    case += 1
                    where = (f"rank {rank} direct {dtype} D={D} base_e={base_e} "
                             f"masked={masked} head_major={head_major} B={tokens}")
                    x, lse = rank_inputs(rank, case, dtype, D, HN * n)
                    x, lse = x[:tokens], lse[:tokens]
                    kw = call_kwargs(rank, masked, head_major, tokens, D, dtype)
                    xd = cupy.asarray(x)
                    if case % 2:  # a strided input: [H, B, D] storage seen as [B, H, D]
                        xd = cupy.ascontiguousarray(xd.transpose(1, 0, 2)).transpose(1, 0, 2)
                    elif case % 4 == 2:  # rows that 16-bit kernels cannot see as words
                        xd = misaligned(xd)
                    got, got_lse = plan(xd, cupy.asarray(lse), **kw)
                    plan.synchronize()
                    assert kernel_counts() == built, where
                    if masked and tokens < B:
                        continue  # the mask names tokens past B: checked at full B only
                    ref, ref_lse, scale = expected(world, x, lse, base_e, masked)
                    check_rank_result(host(got, dtype), cupy.asnumpy(got_lse), ref, ref_lse,
                                      scale, where)
                # a plan keeps ready launches by the call's arrays: two results of one shape,
                # in turn, each rewritten by the next call but one, all exact
                x, lse = rank_inputs(rank, case + 100, dtype, D, HN * n)
                xd, ld = cupy.asarray(x), cupy.asarray(lse)
                ref, ref_lse, scale = expected(world, x, lse, base_e, False)
                outs = [cupy.full((B, HN, D), np.nan, dtype=dtype),
                        cupy.full((HN, B, D), np.nan, dtype=dtype).transpose(1, 0, 2),
                        misaligned(cupy.full((B, HN, D), np.nan, dtype=dtype))]
                for k in range(6):
                    outs[k % 3].fill(np.nan)
                    got, got_lse = plan(xd, ld, out=outs[k % 3])
                    plan.synchronize()
                    assert got is outs[k % 3] and kernel_counts() == built, (dtype, D, k)
                    check_rank_result(host(got, dtype), cupy.asnumpy(got_lse), ref, ref_lse,
                                      scale, f"rank {rank} direct {dtype} D={D} out {k % 3}, "
                                             f"call {k}")
                # remembered (replayed without their checks): the calls read in place; one
                # staged through the plan's buffers (16-bit words) is made again each time
                staged = np.dtype(dtype).itemsize == 2 and D % 2 == 0
                remembered = [_repeat_key(xd, ld, o, None, None, None) in plan._repeats
                              for o in outs]
                assert remembered == [True, True, not staged], (dtype, D, remembered)
    world.Barrier()
    from cupy_dcp.kernels import _cache

    counts = _cache.stats()  # this process's: kernels compiled here, and loaded from the cache
    return {"cases": case, "repeated_calls": 6 * len(DTYPES) * 3,
            "compiled": counts["compiled"], "loaded": counts["loaded"]}


def staged_capture_refused(world, plan, dtype, D):
    """A plan's first call with partials it must stage (16-bit rows that cannot be seen
    as words) allocates the buffer it stages them in: inside a capture it raises,
    clearly, before it launches anything, and the capture ends cleanly."""
    import cupy
    x, lse = rank_inputs(world.Get_rank(), 900, dtype, D, HN * world.Get_size())
    xd, ld = misaligned(cupy.asarray(x)), cupy.asarray(lse)
    cupy.cuda.Device().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    stream.begin_capture()
    try:
        plan(xd, ld, stream=stream)
        message = None
    except RuntimeError as exc:
        message = str(exc)
    stream.end_capture()
    assert message is not None and "before the capture" in message, message


def overlap_refused(world, plan, dtype, D):
    """A result in the partials' memory (``out`` a view of ``cp_attn_out``'s first
    heads, ``out_lse`` one of ``cp_attn_lse``'s) would be written while the kernel still
    pushes them: every rank raises ``ValueError`` before it launches anything, so no
    peer waits, and the plan's next calls are exact (the cases that follow)."""
    import cupy
    x, lse = rank_inputs(world.Get_rank(), 901, dtype, D, HN * world.Get_size())
    xd, ld = cupy.asarray(x), cupy.asarray(lse)
    for kw, names in ((dict(out=xd[:, :HN]), "out shares memory with cp_attn_out"),
                      (dict(out_lse=ld[:, :HN]), "out_lse shares memory with cp_attn_lse")):
        try:
            plan(xd, ld, **kw)
            message = None
        except ValueError as exc:
            message = str(exc)
        assert message is not None and names in message, message
    plan.synchronize()


_COUNT_DIFF = None


def _count_diff():
    """An elementwise kernel that adds the number of differing bit patterns to count[0]."""
    global _COUNT_DIFF
    if _COUNT_DIFF is None:
        import cupy
        _COUNT_DIFF = cupy.ElementwiseKernel(
            "T got, T want", "raw uint64 count",
            "if (got != want) atomicAdd(&count[0], 1ULL);", "cupy_dcp_count_diff")
    return _COUNT_DIFF


def race(world, comm, count):
    from cupy_dcp.kernels.direct import LINE_MAX_ROWS, LL_MAX_ROWS

    if count < 3:
        raise SystemExit("race needs COUNT >= 3 (its last phase runs calls three at a time)")
    # word by word, in lines, then in tiles (the path is checked and reported)
    return {"races": [_race(world, comm, count, tokens, path) for tokens, path in
                      ((B, "word by word"), (-(-LL_MAX_ROWS // HN) + B, "in lines"),
                       (-(-LINE_MAX_ROWS // HN) + B, "in tiles"))]}


def _path(plan, tokens):
    """How a call of ``tokens`` tokens of ``plan`` goes: as ``race`` names it."""
    from cupy_dcp.kernels.direct import Protocol

    protocol = plan._call_grid(tokens).protocol
    return {Protocol.WORDS: "word by word", Protocol.LINES: "in lines"}.get(protocol, "in tiles")


def _inputs(rank, seed, dtype, D, H, tokens):
    """``tokens`` tokens of rank inputs, from as many of ``rank_inputs``' sets as it takes."""
    sets = [rank_inputs(rank, seed * 1000 + k, dtype, D, H) for k in range(-(-tokens // B))]
    return (np.concatenate([s[0] for s in sets])[:tokens],
            np.concatenate([s[1] for s in sets])[:tokens])


def _race(world, comm, count, tokens, path):
    import cupy
    rank, n = world.Get_rank(), world.Get_size()
    dtype, D, H = DTYPES[1], 128, HN * n  # bfloat16
    plan = cupy_dcp.DcpDirectPlan(comm, tokens, H, D, dtype, return_lse=True)
    assert _path(plan, tokens) == path, (tokens, _path(plan, tokens), path)
    stream = cupy.cuda.Stream(non_blocking=True)
    sets, wants = [], []
    with stream:
        for k in range(3):
            x, lse = _inputs(rank, 500 + k, dtype, D, H, tokens)
            got, got_lse = plan(cupy.asarray(x), cupy.asarray(lse), stream=stream)
            plan.synchronize(stream)
            ref, ref_lse, scale = expected(world, x, lse, True, False)
            check_rank_result(host(got, dtype), cupy.asnumpy(got_lse), ref, ref_lse, scale,
                              f"rank {rank} race set {k}")
            sets.append((cupy.asarray(x), cupy.asarray(lse)))
            wants.append((got.view(cupy.uint16).copy(), got_lse.view(cupy.uint32).copy()))
        x_buf = cupy.empty_like(sets[0][0])
        lse_buf = cupy.empty_like(sets[0][1])
        diffs = cupy.zeros(1, dtype=cupy.uint64)
        count_diff = _count_diff()

        def step(i, run):
            k = i % 3
            x_buf[...] = sets[k][0]
            lse_buf[...] = sets[k][1]
            got, got_lse = run()
            count_diff(got.view(cupy.uint16), wants[k][0], diffs)
            count_diff(got_lse.view(cupy.uint32), wants[k][1], diffs)

        start = time.perf_counter()
        for i in range(count):
            step(i, lambda: plan(x_buf, lse_buf, stream=stream))
        plan.synchronize(stream)
        eager_s = time.perf_counter() - start
        eager_diffs = int(diffs.get()[0])

        world.Barrier()
        stream.begin_capture()
        got, got_lse = plan(x_buf, lse_buf, stream=stream)
        graph = stream.end_capture()
        diffs[...] = 0
        start = time.perf_counter()
        for i in range(count):
            step(i, lambda: (graph.launch(stream), (got, got_lse))[1])
        plan.synchronize(stream)
        graph_s = time.perf_counter() - start
        graph_diffs = int(diffs.get()[0])

        # calls straight after calls (no copy between: where a dependent launch starts
        # early), each on its own input set into its own result, three to a graph
        outs = [(cupy.empty_like(got), cupy.empty_like(got_lse)) for _ in range(3)]

        def three_calls():
            for k in range(3):
                plan(*sets[k], out=outs[k][0], out_lse=outs[k][1], stream=stream)
            for k in range(3):
                count_diff(outs[k][0].view(cupy.uint16), wants[k][0], diffs)
                count_diff(outs[k][1].view(cupy.uint32), wants[k][1], diffs)

        world.Barrier()
        stream.begin_capture()
        three_calls()
        graph = stream.end_capture()
        diffs[...] = 0
        for i in range(count // 3):
            graph.launch(stream)
        plan.synchronize(stream)
        row_diffs = int(diffs.get()[0])
    launches = "dependent" if plan._dependent else "ordinary"
    plan.close()
    assert eager_diffs == 0, f"rank {rank}: {eager_diffs} elements differ over {count} eager calls"
    assert graph_diffs == 0, f"rank {rank}: {graph_diffs} elements differ over {count} replays"
    assert row_diffs == 0, f"rank {rank}: {row_diffs} elements differ over back-to-back calls"
    # every result was bit-identical to its checked set
    return {"tokens": tokens, "path": path, "eager_calls": count, "eager_s": round(eager_s, 1),
            "graph_replays": count, "graph_s": round(graph_s, 1),
            "back_to_back_calls": 3 * (count // 3), "launches": launches}


def timeout(world, comm, bound=2.0):
    import cupy
    rank, n = world.Get_rank(), world.Get_size()
    dtype, D, H = DTYPES[0], 64, HN * n
    x, lse = rank_inputs(rank, 700, dtype, D, H)
    xd, ld = cupy.asarray(x), cupy.asarray(lse)
    plan = cupy_dcp.DcpDirectPlan(comm, B, H, D, dtype, timeout=bound)
    plan(xd, ld)
    plan.synchronize()  # call 1: everyone
    world.Barrier()
    result = {}
    if rank == 0:
        start = time.monotonic()
        got = plan(xd, ld)  # rank 1 skips this call
        try:
            plan.synchronize(timeout=bound + 30)
        except RuntimeError as exc:
            message = str(exc)
        else:
            raise AssertionError("rank 0: a missing peer did not raise")
        waited = time.monotonic() - start
        assert f"rank 1 did not arrive within {bound} s" in message, message
        assert bound * 0.9 <= waited <= bound + 10, waited
        assert bool(cupy.isnan(got.astype(cupy.float32)).all()), "rank 0: a failed call left data"
        try:
            plan(xd, ld)
        except RuntimeError as exc:
            assert "unusable" in str(exc), exc
        else:
            raise AssertionError("rank 0: a dead plan took another call")
        result = {"raised_after_s": round(waited, 2), "bound_s": bound, "message": message}
    world.Barrier()
    if rank == 1:  # now rank 1 makes that call: rank 0 has given up and told it
        got = plan(xd, ld)
        try:
            plan.synchronize()
        except RuntimeError as exc:
            assert "rank 0 failed first" in str(exc), exc
        else:
            raise AssertionError("rank 1: a failed peer did not raise")
        assert bool(cupy.isnan(got.astype(cupy.float32)).all()), "rank 1: a failed call left data"
        result = {"peer_failure_raised": True}
    plan.close()
    return result


def leak(world, comm, count):
    import cupy
    rank, n = world.Get_rank(), world.Get_size()
    dtype, D, H = DTYPES[1], 128, HN * n
    x, lse = rank_inputs(rank, 800, dtype, D, H)
    xd, ld = cupy.asarray(x), cupy.asarray(lse)

    def cycle():
        with cupy_dcp.DcpDirectPlan(comm, 64, H, D, dtype) as plan:
            plan(xd, ld)
            plan.synchronize()
        assert not plan._peers and plan._window is None and plan._status is None

    def free_memory():
        cupy.get_default_memory_pool().free_all_blocks()  # what the pool keeps is not a leak
        cupy.cuda.runtime.deviceSynchronize()
        world.Barrier()
        return cupy.cuda.runtime.memGetInfo()[0]

    cycle()  # compile and load everything once
    free = [free_memory()]
    start = time.perf_counter()
    for half in range(2):
        for _ in range(count // 2):
            cycle()
        free.append(free_memory())
    lost = free[0] - free[2]
    assert lost < 16 << 20, f"rank {rank}: {lost} bytes of device memory gone after {count} plans"
    return {"plans": count, "seconds": round(time.perf_counter() - start, 1),
            "free_mib": [round(f / 2**20, 1) for f in free]}


def main(mode, count):
    world = MPI.COMM_WORLD
    comm = cupy_dcp.Communicator.from_mpi(world, backend="mpi", timeout=120)
    comm.select_device()  # before any array is made: each rank's arrays on its own GPU
    return {"exact": lambda: exact(world, comm),
     "race": lambda: race(world, comm, count),
     "timeout": lambda: timeout(world, comm),
     "leak": lambda: leak(world, comm, count)}[mode]()


if __name__ == "__main__":
    run_worker(main, sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 100)
