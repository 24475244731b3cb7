"""Soak of the host path: ``mpiexec -n 2 python tests/host_soak_worker.py`` for a bounded time.

``CUPY_DCP_SOAK_SECONDS`` (default 45) sets how long the worker keeps calling
``dcp_a2a_lse_reduce``; it checks results, resident memory and open file
descriptors as it goes, and aborts the job on the first failure.
"""

import os
import sys

import pytest

from _helpers import job_results, mpiexec_env, run_bounded

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "host_soak_worker.py")
NPROCS = 2


@pytest.mark.slow
def test_host_reduce_soak_stays_correct_and_flat(mpiexec):
    seconds = float(os.environ.get("CUPY_DCP_SOAK_SECONDS", "45"))
    proc = run_bounded(mpiexec(NPROCS, sys.executable, WORKER), seconds + 240,
                       env=mpiexec_env(CUPY_DCP_SOAK_SECONDS=str(seconds)))
    records = job_results(proc, NPROCS)
    calls = [r["calls"] for r in records]
    assert len(set(calls)) == 1 and calls[0] >= 300, records  # the worker's MIN_CALLS
