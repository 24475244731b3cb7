"""Divergent calls on the host path, caught by default from the signature each chunk
carries (and by ``check_consistency``): the same ValueError on every rank, inputs
untouched, the communicator usable afterwards (see ``mpi_fault_worker.py``)."""

import sys
from pathlib import Path

from _helpers import job_results, mpiexec_env, run_bounded

HERE = Path(__file__).resolve().parent
DIVERGENCE = ["tokens_a2a", "tokens_ag_rs", "tokens_a2a_checked", "dtype_a2a", "dtype_ag_rs",
              "dtype_checked", "strategy", "strategy_checked", "base", "call_number",
              "check_consistency"]


def run_worker(mpiexec, nprocs, scenarios):
    """Run the scenarios in one job; every rank must report each of them (its
    records, by rank: each scenario's message)."""
    cmd = mpiexec(nprocs, sys.executable, str(HERE / "mpi_fault_worker.py"), *scenarios)
    records = job_results(run_bounded(cmd, 300, cwd=HERE, env=mpiexec_env()), nprocs)
    for record in records:
        assert list(record["messages"]) == list(scenarios), record
    return records


def test_divergent_calls_raise_the_same_error_on_every_rank(mpiexec):
    run_worker(mpiexec, 2, DIVERGENCE)


def test_a_divergent_third_rank_is_named(mpiexec):
    records = run_worker(mpiexec, 3, ["tokens_a2a", "dtype_ag_rs", "strategy"])
    for record in records:
        assert record["messages"]["tokens_a2a"].startswith(
            "dcp_a2a_lse_reduce: ranks disagree on tokens (rank 0: 3; rank 2: 4)"), record
