"""dcp_a2a_lse_reduce across real ranks: ``mpiexec -n K python tests/host_reduce_worker.py``."""

import os
import sys

import pytest

from _helpers import mpiexec_env, run_bounded

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "host_reduce_worker.py")
TIMEOUT_S = 240


def _run(mpiexec, nprocs, *argv, **env):
    return run_bounded(mpiexec(nprocs, sys.executable, WORKER, *argv), TIMEOUT_S,
                       env=mpiexec_env(**env))


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_every_rank_matches_the_gathered_oracle(mpiexec, nprocs):
    proc = _run(mpiexec, nprocs)
    report = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, report
    lines = proc.stdout.splitlines()
    for rank in range(nprocs):
        assert f"rank {rank}/{nprocs} OK" in lines, report


@pytest.mark.parametrize("nprocs", [1, 3])
def test_ag_rs_matches_the_gathered_oracle(mpiexec, nprocs):
    proc = _run(mpiexec, nprocs, "ag_rs")
    report = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, report
    for rank in range(nprocs):
        assert f"rank {rank}/{nprocs} OK" in proc.stdout.splitlines(), report


def test_one_failing_rank_aborts_the_job(mpiexec):
    """Rank 1 raises while rank 0 waits in a collective: the job must end, non-zero."""
    proc = _run(mpiexec, 2, CUPY_DCP_WORKER_FAIL_RANK="1")
    assert proc.returncode != 0, proc.stdout
    assert "failure injected by CUPY_DCP_WORKER_FAIL_RANK" in proc.stderr
    assert " OK" not in proc.stdout
