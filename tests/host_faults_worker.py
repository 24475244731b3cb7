"""Divergent ranks and stuck exchanges on the host path: errors on every rank, no hang.

Run: mpiexec -n 2 python tests/host_faults_worker.py SCENARIO

- ``diverge``: rank 1 calls with one more token; with ``check_consistency``
  every rank raises the same ValueError naming the field and the rank.
- ``bad_rank``: rank 1 passes an integer LSE; it raises its TypeError, every
  other rank a TypeError naming rank 1.
- ``timeout``: rank 1 is late by 3 s; rank 0's exchange, bounded at 1 s, raises
  RuntimeError in time; rank 1 then joins the same call, which raises
  RuntimeError too (rank 0 gave up on it), so the job ends cleanly.
- ``timeout_large``: the same with messages of 256 KiB, which MPI sends only once
  the receiver takes them: rank 1 still raises at once, not after its own timeout.
- ``agrs_late_reduce``: rank 1 is late between AG+RS's all-gather and its
  reduce-scatter; rank 0's reduce-scatter raises in time, and rank 1's, which then
  completes, raises too (rank 0 gave up on it) instead of returning.
- ``list_rank``: rank 1 passes lists; both raise, and the next call is right.
- ``byte_order``: rank 1's float16 partials are big-endian: both raise a ValueError.
- ``allgather_sizes``: the ranks' all-gathers differ in size: a rank whose MPI
  detects it raises a RuntimeError saying so (not MPI's exception).
- ``warnings_as_errors``: under ``-W error``, rank 1 passes a float64 LSE beyond
  float32's range; it raises its ValueError (not a RuntimeWarning from a cast),
  rank 0 a ValueError naming rank 1.
- ``device_masks``: rank 1 passes host inputs with masks that are not NumPy arrays
  (device arrays, say); it raises a TypeError, rank 0 a TypeError naming rank 1.
- ``unexpected_error``: rank 1's checks raise something neither a ValueError nor a
  TypeError; it raises that, rank 0 a RuntimeError naming rank 1.
- ``cache_setting``: rank 1's ``CUPY_DCP_CACHE`` is neither 0 nor 1, which it reads
  only as its first kernel would compile: it raises its ValueError, rank 0 a
  ValueError naming rank 1 (not a timeout after waiting for rank 1's exchange).

The last four run without ``check_consistency``, on a communicator bounded at 20 s:
a rank left waiting would raise RuntimeError instead of the error checked.

Each rank reports its scenario and the message it checked (``run_worker``); anything
else aborts the job.
"""

import os
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
    elif scenario in ("timeout", "timeout_large"):
        # large: 256 KiB a message, which MPI sends only once its receiver takes it
        timeout = 1.0 if scenario == "timeout" else 4.0
        comm = cupy_dcp.Communicator.from_mpi(world, timeout=timeout)
        x, lse = inputs(3) if scenario == "timeout" else inputs(64, 8, 128)
        cupy_dcp.dcp_a2a_lse_reduce(x, lse, MPI.COMM_SELF)  # compiled before the clock starts
        if rank == 0:
            t0 = time.monotonic()
            msg = expect_raise(RuntimeError, lambda: cupy_dcp.dcp_a2a_lse_reduce(x, lse, comm))
            waited = time.monotonic() - t0
            assert f"did not complete within {timeout} s" in msg and waited < timeout + 1.5, \
                (msg, waited)
        else:
            time.sleep(timeout + 2.0)
            # rank 1 joins the same call late: it learns that rank 0 gave up on it, at
            # once (not after its own timeout, though its large message never leaves)
            t0 = time.monotonic()
            msg = expect_raise(RuntimeError, lambda: cupy_dcp.dcp_a2a_lse_reduce(x, lse, comm))
            waited = time.monotonic() - t0
            assert "rank 0 gave up waiting for rank 1" in msg and waited < timeout / 2, \
                (msg, waited)
    elif scenario == "agrs_late_reduce":
        # rank 1 is late between AG+RS's all-gather and its reduce-scatter: rank 0's
        # reduce-scatter times out, and rank 1, whose reduce-scatter then completes
        # against rank 0's posted one, raises too instead of returning a void result
        comm = cupy_dcp.Communicator.from_mpi(world, timeout=1.0)
        x, lse = inputs(3)
        cupy_dcp.dcp_ag_rs_lse_reduce(x, lse, MPI.COMM_SELF)  # compiled first
        if rank == 1:
            correct = cupy_dcp.reduce.agrs_correct_host

            def late(*args):
                time.sleep(3.0)
                return correct(*args)
            cupy_dcp.reduce.agrs_correct_host = late
        msg = expect_raise(RuntimeError, lambda: cupy_dcp.dcp_ag_rs_lse_reduce(x, lse, comm))
        expected = "MPI reduce-scatter of" if rank == 0 else "rank 0 gave up waiting for rank 1"
        assert expected in msg, msg
    elif scenario == "list_rank":
        # rank 1 passes lists: it still takes part in the exchange, so both ranks raise
        # and the next call pairs with the next call (it used to pair rank 0's first
        # call with rank 1's second, and return a wrong result)
        comm = cupy_dcp.Communicator.from_mpi(world, timeout=20.0)
        x, lse = inputs(3)
        bad = (x.tolist(), lse.tolist()) if rank == 1 else (x, lse)
        msg = expect_raise(TypeError, lambda: cupy_dcp.dcp_a2a_lse_reduce(*bad, comm))
        assert "cp_attn_out must be an array" in msg and (rank == 1 or "rank 1 failed" in msg), msg
        got = cupy_dcp.dcp_a2a_lse_reduce(x, lse, comm)
        assert got.shape == (3, 2, 8), got.shape
    elif scenario == "byte_order":
        # rank 1's partials are big-endian: the host path moves raw bytes, so the ranks
        # must agree on the byte order too (a ValueError on both, not wrong values)
        comm = cupy_dcp.Communicator.from_mpi(world, timeout=20.0)
        x, lse = inputs(3)
        x = x.astype(np.float16)
        if rank == 1:
            x = x.astype(">f2")
        msg = expect_raise(ValueError, lambda: cupy_dcp.dcp_a2a_lse_reduce(x, lse, comm))
        assert "ranks disagree on dtype (rank 0: 'float16'; rank 1: '>float16')" in msg, msg
    elif scenario == "allgather_sizes":
        # ranks that give an all-gather of other sizes (as a device AG+RS plan over the
        # MPI transport would, called with other token counts): where MPI detects it, a
        # RuntimeError that says so and an unusable communicator, not MPI's own exception
        comm = cupy_dcp.Communicator.from_mpi(world, backend="mpi", timeout=10.0)
        count = 2 if rank == 0 else 4
        send = np.full(count, rank, np.float32)
        recv = np.zeros((world.size, count), np.float32)
        try:
            comm.allgather_host(send, recv)
            msg = "returned"
        except RuntimeError as exc:
            msg = str(exc)
            assert "failed on rank" in msg and "the same sizes" in msg, msg
            try:
                comm.check_usable()
                raise AssertionError("the communicator is still usable")
            except RuntimeError as later:
                assert "unusable since an earlier failure" in str(later), later
        assert any(m != "returned" for m in world.allgather(msg)), msg
    elif scenario == "cache_setting":
        comm = cupy_dcp.Communicator.from_mpi(world, timeout=20.0)
        x, lse = inputs(3)
        if rank == 1:
            os.environ["CUPY_DCP_CACHE"] = "yes"
        msg = expect_raise(ValueError, lambda: cupy_dcp.dcp_a2a_lse_reduce(x, lse, comm))
        assert "CUPY_DCP_CACHE must be 0 or 1 (got 'yes')" in msg and \
            (rank == 1 or "rank 1 failed its checks" in msg), msg
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
