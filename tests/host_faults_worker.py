"""Divergent ranks and stuck exchanges on the host path: errors on every rank, no hang.

Run: mpiexec -n 2 python tests/host_faults_worker.py SCENARIO

- ``diverge``: rank 1 calls with one more token; with ``check_consistency``
  every rank raises the same ValueError naming the field and the rank.
- ``bad_rank``: rank 1 passes an integer LSE; it raises its TypeError, every
  other rank a TypeError naming rank 1.
- ``timeout``: rank 1 is late by 3 s; rank 0's exchange, bounded at 1 s, raises
  RuntimeError in time; rank 1 then joins the same call, which raises
  RuntimeError too (rank 0 gave up on it), so the job ends cleanly.
- ``warnings_as_errors``: under ``-W error``, rank 1 passes a float64 LSE beyond
  float32's range; it raises its ValueError (not a RuntimeWarning from a cast),
  rank 0 a ValueError naming rank 1.
- ``device_masks``: rank 1 passes host inputs with masks that are not NumPy arrays
  (device arrays, say); it raises a TypeError, rank 0 a TypeError naming rank 1.
- ``unexpected_error``: rank 1's checks raise something neither a ValueError nor a
  TypeError; it raises that, rank 0 a RuntimeError naming rank 1.

The last three run without ``check_consistency``, on a communicator bounded at 20 s:
a rank left waiting would raise RuntimeError instead of the error checked.

Each rank reports its scenario and the message it checked (``run_worker``); anything
else aborts the job.
"""

import sys
import time
import warnings

import numpy as np
from mpi4py import MPI

import cupy_dcp
from _helpers import run_worker


def inputs(tokens, heads=4, head_dim=8):
    rng = np.random.default_rng(MPI.COMM_WORLD.rank)
    return (rng.standard_normal((tokens, heads, head_dim)).astype(np.float32),
            rng.standard_normal((tokens, heads)).astype(np.float32))


class DeviceLike:
    """A device array's face (shape, dtype, no NumPy conversion), for the host path."""

    def __init__(self, values):
        self.shape, self.dtype = values.shape, values.dtype

    def __array__(self, *args, **kwargs):
        raise TypeError("no implicit conversion to a NumPy array")


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
    elif scenario in ("warnings_as_errors", "device_masks", "unexpected_error"):
        comm = cupy_dcp.Communicator.from_mpi(world, timeout=20.0)
        x, lse = inputs(3)
        masks = dict(seq_lens=np.array([2, 1]), query_start_loc=np.array([0, 2, 3]))
        kind = {"warnings_as_errors": ValueError, "device_masks": TypeError,
                "unexpected_error": ArithmeticError if rank == 1 else RuntimeError}[scenario]
        if rank == 1 and scenario == "warnings_as_errors":
            lse = lse.astype(np.float64)
            lse[1, 2] = 1e300
        if rank == 1 and scenario == "device_masks":
            masks = {k: DeviceLike(v) for k, v in masks.items()}
        if rank == 1 and scenario == "unexpected_error":
            def fail(*args):
                raise ArithmeticError("an unexpected failure")
            cupy_dcp.reduce._check_call = fail
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            msg = expect_raise(kind, lambda: cupy_dcp.dcp_a2a_lse_reduce(x, lse, comm, **masks))
        expected = {"warnings_as_errors": "cp_attn_lse must fit float32: 1e+300 at (1, 2)",
                    "device_masks": "host inputs take host seq_lens and "
                                    "query_start_loc (got DeviceLike and DeviceLike)",
                    "unexpected_error": "an unexpected failure"}[scenario]
        assert expected in msg and (rank == 1 or "rank 1 failed its checks" in msg), msg
    else:
        raise ValueError(f"unknown scenario {scenario!r}")
    world.Barrier()
    return {"scenario": scenario, "message": msg}


if __name__ == "__main__":
    run_worker(main, sys.argv[1])
