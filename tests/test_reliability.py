"""Divergent ranks, failing ranks and stuck exchanges end in errors on every rank."""

import subprocess
import sys
from pathlib import Path

import pytest

from _helpers import mpiexec_env

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("scenario", ["diverge", "bad_rank", "timeout"])
def test_every_rank_raises_instead_of_hanging(mpiexec, scenario):
    cmd = mpiexec(2, sys.executable, str(HERE / "mpi_reliability_worker.py"), scenario)
    proc = subprocess.run(cmd, cwd=HERE, env=mpiexec_env(), capture_output=True, text=True,
                          timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert out.count(f"{scenario} OK") == 2, out[-4000:]
