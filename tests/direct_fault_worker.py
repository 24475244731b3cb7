"""The direct plan's set-up under faults: bounded steps and checked arguments, the same
error on every rank.

Run: mpiexec -n N python tests/direct_fault_worker.py SCENARIO [SCENARIO ...]

Every rank prints ``rank {r} {scenario} OK: {message}``; anything else aborts the job
(see ``mpi_fault_worker.py``, whose helpers this uses).
"""

import sys
import time

from _helpers import run_worker
from mpi_fault_worker import HN, N, RANK, WORLD, D, expect_raise, fresh

import cupy_dcp


def late_survey():
    """Rank 1 asks whether the direct path can run 3 s late against a 1 s timeout:
    rank 0 raises in time (MPI's Split_type would have waited for ever), rank 1 on
    arrival."""
    comm = fresh()
    comm.timeout = 1.0
    WORLD.Barrier()
    call = lambda: cupy_dcp.direct_problem(comm)  # noqa: E731
    if RANK == 0:
        start = time.monotonic()
        msg = expect_raise(RuntimeError, "MPI finding the ranks' nodes did not complete within "
                           "1.0 s on rank 0 (no message from rank 1: a peer rank is missing or "
                           "stuck); the communicator is unusable: abort the job", call)
        waited = time.monotonic() - start
        assert waited < 2.5, waited
    else:
        time.sleep(3.0)
        # rank 0's notice that it gave up reaches rank 1 in the first step, or, where MPI
        # had not delivered it yet, rank 1 waits out its own timeout in the second
        gave_up = ("rank 0 gave up waiting for rank 1 (it arrived after the timeout): this "
                   "call's result is void and the communicator is unusable: abort the job")
        timed_out = ("MPI checking the ranks' GPUs did not complete within 1.0 s on rank 1 (no "
                     "message from rank 0: a peer rank is missing or stuck); the communicator "
                     "is unusable: abort the job")
        start = time.monotonic()
        try:
            call()
        except RuntimeError as exc:
            msg = str(exc)
            assert type(exc) is RuntimeError and msg in (gave_up, timed_out), msg
        else:
            raise AssertionError("rank 1: no RuntimeError on arrival")
        waited = time.monotonic() - start
        assert waited < 2.5, waited
    return msg


def survey_without_a_gpu():
    """Where no rank has a GPU, every rank gets the same answer from the bounded steps,
    and the communicator stays usable."""
    comm = fresh()
    problem = cupy_dcp.direct_problem(comm)
    assert problem == "a rank lacks CuPy or a GPU", problem
    comm.barrier("after the survey")
    return problem


def timeout_not_a_number():
    """Rank 0 passes ``timeout=True``: a TypeError on every rank, naming rank 0."""
    comm = fresh()
    own = "timeout must be a number of seconds or None (got bool True)"
    message = own if RANK == 0 else f"DcpDirectPlan: rank 0 failed its checks: {own}"
    return expect_raise(TypeError, message, lambda: cupy_dcp.DcpDirectPlan(
        comm, 4, HN * N, D, "float16", timeout=True if RANK == 0 else 5.0))


SCENARIOS = {
    "late_survey": late_survey,
    "survey_without_a_gpu": survey_without_a_gpu,
    "timeout_not_a_number": timeout_not_a_number,
}


def main(*scenarios):
    WORLD.Barrier()
    checked = {}
    for scenario in scenarios:
        checked[scenario] = SCENARIOS[scenario]()  # the message every rank raised
        WORLD.Barrier()
    return {"checked": checked}


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])
