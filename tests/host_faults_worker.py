"""Divergent ranks and stuck exchanges on the host path: errors on every rank, no hang.

Run: mpiexec -n 2 python tests/host_faults_worker.py SCENARIO

- ``diverge``: rank 1 calls with one more token; with ``check_consistency``
  every rank raises the same ValueError naming the field and the rank.
- ``bad_rank``: rank 1 passes an integer LSE; it raises its TypeError, every
  other rank a TypeError naming rank 1.
- ``timeout``: rank 1 is late by 3 s; rank 0's exchange, bounded at 1 s, raises
  RuntimeError in time; rank 1 then joins the same call, which raises
  RuntimeError too (rank 0 gave up on it), so the job ends cleanly.

Each rank reports its scenario and the message it checked (``run_worker``); anything
else aborts the job.
"""

import sys
import time

import numpy as np
from mpi4py import MPI

import cupy_dcp
from _helpers import run_worker


def inputs(tokens, heads=4, head_dim=8):
    rng = np.random.default_rng(MPI.COMM_WORLD.rank)
    return (rng.standard_normal((tokens, heads, head_dim)).astype(np.float32),
            rng.standard_normal((tokens, heads)).astype(np.float32))


def expect_raise(kind, call):
    try:
        call()
    except kind as exc:
        return str(exc)
    raise AssertionError(f"expected {kind.__name__}")


def main(scenario):
    world = MPI.COMM_WORLD
    rank = world.rank
    if scenario == "diverge":
        x, lse = inputs(3 + (rank == 1))
        msg = expect_raise(ValueError, lambda: cupy_dcp.dcp_a2a_lse_reduce(
            x, lse, world, check_consistency=True))
        assert "ranks disagree on tokens" in msg and "rank 1: 4" in msg, msg
    elif scenario == "bad_rank":
        x, lse = inputs(3)
        if rank == 1:
            lse = lse.astype(np.int32)
        msg = expect_raise(TypeError, lambda: cupy_dcp.dcp_a2a_lse_reduce(
            x, lse, world, check_consistency=True))
        assert rank == 1 or "rank 1 failed its checks" in msg, msg
    elif scenario == "timeout":
        comm = cupy_dcp.Communicator.from_mpi(world, timeout=1.0)
        x, lse = inputs(3)
        cupy_dcp.dcp_a2a_lse_reduce(x, lse, MPI.COMM_SELF)  # compiled before the clock starts
        if rank == 0:
            t0 = time.monotonic()
            msg = expect_raise(RuntimeError, lambda: cupy_dcp.dcp_a2a_lse_reduce(x, lse, comm))
            waited = time.monotonic() - t0
            assert "did not complete within 1.0 s" in msg and waited < 2.5, (msg, waited)
        else:
            time.sleep(3.0)
            # rank 1 joins the same call late: its exchange completes, and it learns that
            # rank 0 gave up on it
            msg = expect_raise(RuntimeError, lambda: cupy_dcp.dcp_a2a_lse_reduce(x, lse, comm))
            assert "rank 0 gave up waiting for rank 1" in msg, msg
    else:
        raise ValueError(f"unknown scenario {scenario!r}")
    world.Barrier()
    return {"scenario": scenario, "message": msg}


if __name__ == "__main__":
    run_worker(main, sys.argv[1])
