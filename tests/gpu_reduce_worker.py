"""Multi-rank GPU check of dcp_a2a_lse_reduce and DcpA2APlan (NCCL), against the oracle.

Run: mpirun -n 2 python tests/gpu_reduce_worker.py

Every rank uses its own GPU, draws its own inputs, and checks its head slice
against ``lse_weighted_combine`` of ALL ranks' inputs (gathered with MPI):
the functional API over every dtype, base, return_lse, mask and ``out=``
layout; a plan called three times with changing inputs; and a plan call
captured in a CUDA graph and replayed three times with changing inputs. Any
failure aborts the job; on success each rank prints ``rank {r}/{n} GPU OK``.
"""

import itertools
import sys
import traceback

import numpy as np
from mpi4py import MPI

import cupy_dcp
from _helpers import check_rank_result, row_mask, row_scale
from mpi_reduce_worker import B, DTYPES, HN, QUERY_START_LOC, rank_inputs, seq_lens_of


def expected(world, x, lse, base_e, masked):
    rank, n = world.Get_rank(), world.Get_size()
    xs = np.stack(world.allgather(x))
    lses = np.stack(world.allgather(lse))
    if masked:
        for k in range(n):
            lses[k, row_mask(B, seq_lens_of(k), QUERY_START_LOC)] = -np.inf
    with np.errstate(invalid="ignore"):
        ref, ref_lse = cupy_dcp.lse_weighted_combine(
            xs.astype(np.float64), lses, return_lse=True, is_lse_base_on_e=base_e)
    heads = slice(rank * HN, (rank + 1) * HN)
    return ref[:, heads], ref_lse[:, heads], row_scale(xs, lses)[:, heads]


def host(a, dtype):
    import cupy
    return cupy.asnumpy(a.view(np.uint16) if dtype.itemsize == 2 else a).view(dtype)


def functional_cases(world, comm):
    import cupy
    rank = world.Get_rank()
    combos = itertools.product(DTYPES, (True, False), (True, False), (False, True), (False, True))
    for case, (dtype, base_e, return_lse, masked, head_major) in enumerate(combos):
        D = (5, 72, 576)[case % 3]
        where = f"rank {rank} functional case {case} {dtype} D={D}"
        x, lse = rank_inputs(rank, case, dtype, D, HN * world.Get_size())
        dx, dl = cupy.asarray(x), cupy.asarray(lse)
        kw = {}
        if masked:
            kw = dict(seq_lens=cupy.asarray(seq_lens_of(rank)),
                      query_start_loc=cupy.asarray(QUERY_START_LOC))
        if head_major:
            kw["out"] = cupy.full((HN, B, D), np.nan, dtype=dtype).transpose(1, 0, 2)
        res = cupy_dcp.dcp_a2a_lse_reduce(dx, dl, comm, return_lse=return_lse,
                                          is_lse_base_on_e=base_e, **kw)
        got, got_lse = res if return_lse else (res, None)
        if head_major:
            assert got is kw["out"], where
        assert isinstance(got, cupy.ndarray) and got.shape == (B, HN, D), where
        ref, ref_lse, scale = expected(world, x, lse, base_e, masked)
        check_rank_result(host(got, dtype), None if got_lse is None else cupy.asnumpy(got_lse),
                          ref, ref_lse, scale, where)


def plan_cases(world, comm):
    import cupy
    rank, n = world.Get_rank(), world.Get_size()
    for dtype in DTYPES:
        D = 128
        plan = cupy_dcp.DcpA2APlan(comm, B, HN * n, D, dtype, return_lse=True)
        for call in range(3):  # buffer reuse with changing inputs and sizes
            tokens = B - call
            x, lse = rank_inputs(rank, 100 + call, dtype, D, HN * n)
            x, lse = x[:tokens], lse[:tokens]
            got, got_lse = plan(cupy.asarray(x), cupy.asarray(lse))
            ref, ref_lse, scale = expected(world, x, lse, True, False)
            check_rank_result(host(got, dtype), cupy.asnumpy(got_lse), ref, ref_lse, scale,
                              f"rank {rank} plan {dtype} call {call}")


def graph_cases(world, comm):
    import cupy
    rank, n = world.Get_rank(), world.Get_size()
    for dtype in DTYPES:
        D = 512
        plan = cupy_dcp.DcpA2APlan(comm, B, HN * n, D, dtype, return_lse=True)
        stream = cupy.cuda.Stream(non_blocking=True)
        x_buf = cupy.zeros((B, HN * n, D), dtype=dtype)
        lse_buf = cupy.zeros((B, HN * n), dtype=cupy.float32)
        with stream:
            plan(x_buf, lse_buf, stream=stream)  # NCCL connects peers lazily: once eagerly
            stream.synchronize()
            world.Barrier()
            stream.begin_capture()
            got, got_lse = plan(x_buf, lse_buf, stream=stream)
            graph = stream.end_capture()
        for replay in range(3):
            x, lse = rank_inputs(rank, 200 + replay, dtype, D, HN * n)
            x_buf[...] = cupy.asarray(x)
            lse_buf[...] = cupy.asarray(lse)
            cupy.cuda.get_current_stream().synchronize()
            graph.launch(stream)
            stream.synchronize()
            ref, ref_lse, scale = expected(world, x, lse, True, False)
            check_rank_result(host(got, dtype), cupy.asnumpy(got_lse), ref, ref_lse, scale,
                              f"rank {rank} graph {dtype} replay {replay}")


def main():
    world = MPI.COMM_WORLD
    comm = cupy_dcp.Communicator.from_mpi(world, backend="nccl")
    functional_cases(world, comm)
    plan_cases(world, comm)
    graph_cases(world, comm)
    world.Barrier()
    print(f"rank {world.Get_rank()}/{world.Get_size()} GPU OK", flush=True)


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
