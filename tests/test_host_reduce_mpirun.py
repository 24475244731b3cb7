"""dcp_a2a_lse_reduce across real ranks: ``mpiexec -n K python tests/host_reduce_worker.py``."""

import os
import sys

import pytest

from _helpers import job_results, mpiexec_env, run_bounded, worker_results

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "host_reduce_worker.py")
TIMEOUT_S = 240
CASES = 48  # the worker's dtypes x bases x return_lse x masks x out layouts


def _run(mpiexec, nprocs, *argv, **env):
    return run_bounded(mpiexec(nprocs, sys.executable, WORKER, *argv), TIMEOUT_S,
                       env=mpiexec_env(**env))


# three and four ranks (the costliest jobs) run with -m slow
@pytest.mark.parametrize("nprocs", [1, 2, pytest.param(3, marks=pytest.mark.slow),
                                    pytest.param(4, marks=pytest.mark.slow)])
def test_every_rank_matches_the_gathered_oracle(mpiexec, nprocs):
    for record in job_results(_run(mpiexec, nprocs), nprocs):
        assert record["strategy"] == "a2a" and record["cases"] == CASES, record


@pytest.mark.parametrize("nprocs", [1, 3])
def test_ag_rs_matches_the_gathered_oracle(mpiexec, nprocs):
    for record in job_results(_run(mpiexec, nprocs, "ag_rs"), nprocs):
        assert record["strategy"] == "ag_rs" and record["cases"] == CASES, record


def test_one_failing_rank_aborts_the_job(mpiexec):
    """Rank 1 raises while rank 0 waits in a collective: the job must end, non-zero."""
    proc = _run(mpiexec, 2, CUPY_DCP_WORKER_FAIL_RANK="1")
    assert proc.returncode != 0, proc.stdout
    assert "failure injected by CUPY_DCP_WORKER_FAIL_RANK" in proc.stderr
    assert not worker_results(proc.stdout), proc.stdout
