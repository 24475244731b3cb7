"""The direct plan's set-up: every collective step bounded by the communicator's timeout,
its ``timeout`` checked like the communicator's (see ``direct_fault_worker.py``)."""

import sys
from pathlib import Path

import pytest
from mpi4py import MPI

import cupy_dcp
from _helpers import job_results, mpiexec_env, run_bounded
from gpu import gpu_count

HERE = Path(__file__).resolve().parent


def run_worker(mpiexec, nprocs, scenarios):
    cmd = mpiexec(nprocs, sys.executable, str(HERE / "direct_fault_worker.py"), *scenarios)
    for record in job_results(run_bounded(cmd, 300, cwd=HERE, env=mpiexec_env()), nprocs):
        assert sorted(record["checked"]) == sorted(scenarios), record


def test_a_late_rank_ends_the_survey_in_errors_on_both_sides(mpiexec):
    run_worker(mpiexec, 2, ["late_survey"])


def test_a_timeout_that_is_not_a_number_fails_every_rank_alike(mpiexec):
    run_worker(mpiexec, 2, ["timeout_not_a_number"])


@pytest.mark.skipif(gpu_count() > 0, reason="checks the answer where there is no GPU")
def test_the_survey_answers_alike_without_a_gpu(mpiexec):
    run_worker(mpiexec, 2, ["survey_without_a_gpu"])


@pytest.mark.parametrize("timeout, error, match", [
    ("5", TypeError, r"^timeout must be a number of seconds or None \(got str '5'\)$"),
    (True, TypeError, r"^timeout must be a number of seconds or None \(got bool True\)$"),
    (float("nan"), ValueError, r"^timeout must be > 0 and <= 1e\+09 seconds \(got nan\)$"),
    (-1, ValueError, r"^timeout must be > 0 and <= 1e\+09 seconds \(got -1\)$"),
    (float("inf"), ValueError, r"^timeout must be > 0 and <= 1e\+09 seconds \(got inf\)$"),
], ids=["str", "bool", "nan", "negative", "inf"])
def test_the_direct_plans_timeout_is_checked(timeout, error, match):
    with pytest.raises(error, match=match):
        cupy_dcp.DcpDirectPlan(MPI.COMM_SELF, 4, 8, 16, "float32", timeout=timeout)
    with pytest.raises(error, match=match):
        cupy_dcp.dcp_plan(MPI.COMM_SELF, 4, 8, 16, "float32", strategy="direct", timeout=timeout)
