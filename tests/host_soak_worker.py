"""Soak of the host path: dcp_a2a_lse_reduce on NumPy arrays, over and over.

Run: mpiexec -n 2 python tests/host_soak_worker.py

Every rank calls ``dcp_a2a_lse_reduce`` with new inputs on every call (small
shapes: B=4, H=4*N, D=64), cycling through the dtypes, both LSE bases,
``return_lse``, ``seq_lens`` masks, ``out=`` and three communicators (the raw
``MPI.COMM_WORLD``, a ``Communicator`` and one with a timeout), for
``CUPY_DCP_SOAK_SECONDS`` seconds (default 45) and at least ``MIN_CALLS``
calls. Every ``CHECK_EVERY``-th call is checked against ``lse_weighted_combine``
over an ``allgather`` of every rank's inputs, and the resident memory and the
number of open file descriptors are compared with their values after warm-up.
Any failure aborts the whole job; on success every rank reports its calls, checks,
resident memory and descriptors (``run_worker``).
"""

import gc
import itertools
import os
import time

import numpy as np
from mpi4py import MPI

import cupy_dcp
from _helpers import (check_rank_result, random_rank_inputs, row_mask, row_scale,
                      run_worker)
from cupy_dcp.layout import BFLOAT16

DTYPES = (np.dtype(np.float16), BFLOAT16, np.dtype(np.float32))
B, HN, D = 4, 4, 64
CHECK_EVERY = 50
WARMUP_CALLS = 200  # every combination of the cycle below several times over
MIN_CALLS = WARMUP_CALLS + 2 * CHECK_EVERY
RSS_SLACK_BYTES = 20 << 20
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
# Tokens 0-1 and 2 are two sequences, token 3 is padding.
QUERY_START_LOC = np.array([0, 2, 3], dtype=np.int32)
# dtype, base_e, return_lse, masked, out given, communicator
CYCLE = list(itertools.product(DTYPES, (True, False), (True, False), (False, True), (False, True),
                               ("world", "wrapped", "timeout")))


def resident_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE_BYTES


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def footprint():
    gc.collect()
    return resident_bytes(), open_fds()


def check_footprint(rank, baseline, calls):
    """Resident memory within the slack of, and open descriptors equal to, the baseline."""
    rss, fds = footprint()
    assert rss - baseline[0] < RSS_SLACK_BYTES, (
        f"rank {rank}: resident memory grew by {(rss - baseline[0]) / 2**20:.1f} MiB "
        f"between call {WARMUP_CALLS} and call {calls}")
    assert fds == baseline[1], (
        f"rank {rank}: open file descriptors went from {baseline[1]} to {fds} "
        f"between call {WARMUP_CALLS} and call {calls}")
    return rss, fds


def seq_lens_of(rank, call):
    """Sequence 1 is empty on some ranks, changing from call to call."""
    return np.array([1 + rank, (rank + call) % 2], dtype=np.int64)


def one_call(world, comms, call, check):
    rank, n = world.Get_rank(), world.Get_size()
    H = HN * n
    dtype, base_e, return_lse, masked, give_out, comm = CYCLE[call % len(CYCLE)]
    comm = comms[comm]
    rng = np.random.default_rng([rank, call])
    x, lse = random_rank_inputs(rng, (B, H, D), dtype, ("spread", "large", "mixed")[call % 3])
    mask_args = {}
    if masked:
        mask_args = dict(seq_lens=seq_lens_of(rank, call), query_start_loc=QUERY_START_LOC)
    out = np.empty((B, HN, D), dtype=dtype) if give_out else None

    result = cupy_dcp.dcp_a2a_lse_reduce(x, lse, comm, return_lse=return_lse,
                                         is_lse_base_on_e=base_e, out=out, **mask_args)

    got, got_lse = result if return_lse else (result, None)
    where = f"rank {rank}/{n} call {call}: {dtype} base_e={base_e} masked={masked}"
    assert got.shape == (B, HN, D) and got.dtype == dtype, where
    assert out is None or got is out, where
    if not check or n == 1:
        return
    xs = np.stack(world.allgather(x))
    lses = np.stack(world.allgather(lse))
    if masked:
        for k in range(n):
            lses[k, row_mask(B, seq_lens_of(k, call), QUERY_START_LOC)] = -np.inf
    with np.errstate(invalid="ignore"):  # widening a signalling-NaN LSE
        ref, ref_lse = cupy_dcp.lse_weighted_combine(
            xs.astype(np.float64), lses, return_lse=True, is_lse_base_on_e=base_e)
        scale = row_scale(xs, lses)
    heads = slice(rank * HN, (rank + 1) * HN)
    check_rank_result(got, got_lse, ref[:, heads], ref_lse[:, heads], scale[:, heads], where)


def main():
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    seconds = float(os.environ.get("CUPY_DCP_SOAK_SECONDS", "45"))
    comms = {"world": world, "wrapped": cupy_dcp.Communicator.from_mpi(),
             "timeout": cupy_dcp.Communicator.from_mpi(timeout=60.0)}
    start = time.monotonic()
    calls = checks = 0
    baseline = None
    while True:
        # rank 0's clock decides for everyone, so that every rank makes the same calls
        done = calls >= MIN_CALLS and time.monotonic() - start >= seconds
        if world.bcast(done, root=0):
            break
        check = calls % CHECK_EVERY == 0
        one_call(world, comms, calls, check)
        calls += 1
        checks += check
        if calls == WARMUP_CALLS:
            baseline = footprint()
        elif baseline is not None and calls % CHECK_EVERY == 0:
            check_footprint(rank, baseline, calls)
    elapsed = time.monotonic() - start
    rss, fds = check_footprint(rank, baseline, calls)
    world.Barrier()
    comms["wrapped"].free()
    comms["timeout"].free()
    return {"calls": calls, "seconds": round(elapsed, 1), "checked": checks,
            "rss_mib": [round(baseline[0] / 2**20, 1), round(rss / 2**20, 1)],
            "fds": [baseline[1], fds]}


if __name__ == "__main__":
    run_worker(main)
