"""Divergent calls on the host path, caught by default from the signature each chunk
carries (and by ``check_consistency``): the same ValueError on every rank, inputs
untouched, the communicator usable afterwards (see ``mpi_fault_worker.py``)."""

import sys
from pathlib import Path

from _helpers import mpiexec_env, run_bounded

HERE = Path(__file__).resolve().parent
DIVERGENCE = ["tokens_a2a", "tokens_ag_rs", "tokens_a2a_checked", "dtype_a2a", "dtype_ag_rs",
              "dtype_checked", "strategy", "strategy_checked", "base", "call_number",
              "check_consistency"]


def run_worker(mpiexec, nprocs, scenarios):
    """Run the scenarios in one job; every rank must report each of them OK."""
    cmd = mpiexec(nprocs, sys.executable, str(HERE / "mpi_fault_worker.py"), *scenarios)
    proc = run_bounded(cmd, 300, cwd=HERE, env=mpiexec_env())
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    for scenario in scenarios:
        for rank in range(nprocs):
            assert f"rank {rank} {scenario} OK: " in proc.stdout, (scenario, rank, out[-6000:])
    return proc.stdout


def test_divergent_calls_raise_the_same_error_on_every_rank(mpiexec):
    run_worker(mpiexec, 2, DIVERGENCE)


def test_a_divergent_third_rank_is_named(mpiexec):
    stdout = run_worker(mpiexec, 3, ["tokens_a2a", "dtype_ag_rs", "strategy"])
    for rank in range(3):
        assert (f"rank {rank} tokens_a2a OK: dcp_a2a_lse_reduce: ranks disagree on tokens "
                "(rank 0: 3; rank 2: 4)") in stdout, stdout
