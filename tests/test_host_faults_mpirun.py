"""Divergent ranks, failing ranks and stuck exchanges end in errors on every rank."""

import sys
from pathlib import Path

import pytest

from _helpers import job_results, mpiexec_env, run_bounded

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("scenario", ["diverge", "bad_rank", "timeout", "timeout_large",
                                      "agrs_late_reduce", "allgather_sizes", "list_rank",
                                      "byte_order", "warnings_as_errors",
                                      "device_masks", "unexpected_error", "cache_setting"])
def test_every_rank_raises_instead_of_hanging(mpiexec, scenario):
    cmd = mpiexec(2, sys.executable, str(HERE / "host_faults_worker.py"), scenario)
    for record in job_results(run_bounded(cmd, 180, cwd=HERE, env=mpiexec_env()), 2):
        assert record["scenario"] == scenario, record
