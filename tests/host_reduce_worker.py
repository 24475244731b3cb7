"""Multi-rank check of dcp_a2a_lse_reduce against an all-gather of every rank's inputs.

Run: mpiexec -n 4 python tests/host_reduce_worker.py [a2a|ag_rs]

The optional argument picks the strategy: ``dcp_a2a_lse_reduce`` (default) or
``dcp_ag_rs_lse_reduce``.

Each rank draws its own inputs (seeded by rank), reduces them, gathers ALL
ranks' inputs with ``allgather`` and checks its head slice against
``lse_weighted_combine``. Any failure aborts the whole job; on success every
rank reports its number of cases (``run_worker``). With ``CUPY_DCP_WORKER_FAIL_RANK=k`` set,
rank k raises before the first reduce (to test that the job aborts, not hangs).
"""

import itertools
import os
import sys

import numpy as np
from mpi4py import MPI

import cupy_dcp
from _helpers import check_rank_result, random_rank_inputs, row_mask, row_scale, run_worker
from cupy_dcp.layout import BFLOAT16, bits_dtype

DTYPES = (np.dtype(np.float16), BFLOAT16, np.dtype(np.float32))
B, HN = 9, 3
STRATEGY = sys.argv[1] if len(sys.argv) > 1 and __name__ == "__main__" else "a2a"
REDUCE = {"a2a": cupy_dcp.dcp_a2a_lse_reduce, "ag_rs": cupy_dcp.dcp_ag_rs_lse_reduce}[STRATEGY]
# Tokens 0-1, 2, 3-5, 6 are four sequences; 7-8 are padding. Sequence 1 is
# empty on every rank, sequence 2 on the odd ranks only.
QUERY_START_LOC = np.array([0, 2, 3, 6, 7], dtype=np.int32)


def seq_lens_of(rank):
    return np.array([5, 0, 0 if rank % 2 else 4, 1 + rank], dtype=np.int64)


def rank_inputs(rank, case, dtype, D, H):
    """This rank's partials and LSEs; NaN LSE on rank 0 and +inf on rank 1 of row (0, 0)."""
    rng = np.random.default_rng([rank, case])
    regime = ("spread", "large", "mixed")[case % 3]
    x, lse = random_rank_inputs(rng, (B, H, D), dtype, regime, p_bad=0.1)
    if rank < 2:
        lse[0, 0] = (np.nan, np.inf)[rank]
        x[0, 0] = np.nan
    return x, lse


def gathered(world, x, lse, masked):
    """Every rank's inputs ``xs [N, B, H, D]``, ``lses [N, B, H]``; masked rows at -inf."""
    xs = np.stack(world.allgather(x))
    lses = np.stack(world.allgather(lse))
    if masked:
        for k in range(world.Get_size()):
            lses[k, row_mask(B, seq_lens_of(k), QUERY_START_LOC)] = -np.inf
    return xs, lses


def check_case(world, comm, case, dtype, base_e, return_lse, masked, strided_out):
    rank, n = world.Get_rank(), world.Get_size()
    D = (5, 72)[(case // 3) % 2]
    H = HN * n
    where = (f"rank {rank}/{n} case {case}: {dtype} base_e={base_e} return_lse={return_lse} "
             f"masked={masked} strided_out={strided_out}")
    x, lse = rank_inputs(rank, case, dtype, D, H)
    lse_arg = lse.astype(np.float64) if case % 5 == 0 else lse
    mask_args = {}
    if masked:
        mask_args = dict(seq_lens=seq_lens_of(rank), query_start_loc=QUERY_START_LOC)
    out = None
    if strided_out:
        out = np.full((HN, B, D), np.nan, dtype=dtype).transpose(1, 0, 2)
    x_before, lse_before = x.copy(), lse_arg.copy()

    result = REDUCE(x, lse_arg, comm, return_lse=return_lse,
                                         is_lse_base_on_e=base_e, out=out, **mask_args)

    got, got_lse = result if return_lse else (result, None)
    assert isinstance(result, tuple) == return_lse, where
    if out is not None:
        assert got is out, where
    assert got.dtype == dtype and got.shape == (B, HN, D), where
    bits = bits_dtype(dtype)
    np.testing.assert_array_equal(x.view(bits), x_before.view(bits), err_msg=where)
    np.testing.assert_array_equal(lse_arg, lse_before, err_msg=where)

    # a group of one too: masks and empty shards mean what they mean in a larger group
    xs, lses = gathered(world, x, lse, masked)
    with np.errstate(invalid="ignore"):
        ref, ref_lse = cupy_dcp.lse_weighted_combine(
            xs.astype(np.float64), lses, return_lse=True, is_lse_base_on_e=base_e)
    heads = slice(rank * HN, (rank + 1) * HN)
    check_rank_result(got, got_lse, ref[:, heads], ref_lse[:, heads],
                      row_scale(xs, lses)[:, heads], where)
    if masked:
        assert np.isneginf(ref_lse[2]).all() and np.isneginf(ref_lse[7:]).all(), where


def main():
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    if os.environ.get("CUPY_DCP_WORKER_FAIL_RANK") == str(rank):
        raise RuntimeError(f"rank {rank}: failure injected by CUPY_DCP_WORKER_FAIL_RANK")
    wrapped = cupy_dcp.Communicator.from_mpi()
    combos = itertools.product(DTYPES, (True, False), (True, False), (False, True), (False, True))
    case = -1
    for case, (dtype, base_e, return_lse, masked, strided_out) in enumerate(combos):
        comm = wrapped if case % 2 else world
        check_case(world, comm, case, dtype, base_e, return_lse, masked, strided_out)
    world.Barrier()
    wrapped.free()
    return {"strategy": STRATEGY, "cases": case + 1}


if __name__ == "__main__":
    run_worker(main)
