"""The direct plan's set-up: every collective step bounded by the communicator's timeout,
its ``timeout`` checked like the communicator's (see ``direct_fault_worker.py``)."""

import math
import sys
from pathlib import Path
from types import SimpleNamespace

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


@pytest.mark.parametrize("comm_timeout, plan_timeout, expected", [
    (None, None, 30.0),
    (12, None, 12.0),
    (math.inf, None, 1e9),
    (2e9, None, 1e9),
    (math.inf, 7, 7.0),
], ids=["default", "the_communicators", "unbounded", "past_the_clock", "the_plans_own"])
def test_the_direct_plans_timeout_defaults_to_the_communicators(comm_timeout, plan_timeout,
                                                                 expected):
    """A communicator without a bound (``math.inf``) gives the kernels their longest
    wait, not a ``ValueError`` for an argument the caller never passed."""
    comm = cupy_dcp.Communicator(MPI.COMM_SELF, timeout=comm_timeout)
    settings = cupy_dcp.DcpDirectPlan._own_settings(None, comm, plan_timeout, None, None)
    assert settings["timeout"] == expected


@pytest.mark.parametrize("comm_timeout, timeout, expected", [
    (None, None, 600.0 + 30.0),
    (12, None, 12.0 + 30.0),
    (math.inf, None, None),
    (None, 5, 5),
], ids=["default", "the_communicators", "unbounded", "given"])
def test_the_direct_plans_synchronize_is_bounded_by_default(monkeypatch, comm_timeout, timeout,
                                                             expected):
    """Without a ``timeout``, the host waits the communicator's bound (600 s where it sets
    none) plus the kernels' own; ``math.inf`` is no bound (``drain``'s ``None``)."""
    waits = []
    monkeypatch.setattr(cupy_dcp.comm, "drain", lambda stream, limit: waits.append(limit) or True)
    checks = []
    plan = SimpleNamespace(comm=cupy_dcp.Communicator(MPI.COMM_SELF, timeout=comm_timeout),
                           timeout=30.0, check=lambda: checks.append(True))
    cupy_dcp.DcpDirectPlan.synchronize(plan, None, timeout)
    assert waits == [expected] and checks == [True]
