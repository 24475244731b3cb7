"""Divergent ranks, failing ranks and stuck exchanges end in errors on every rank."""

import sys
from pathlib import Path

import pytest

from _helpers import mpiexec_env, run_bounded

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("scenario", ["diverge", "bad_rank", "timeout"])
def test_every_rank_raises_instead_of_hanging(mpiexec, scenario):
    cmd = mpiexec(2, sys.executable, str(HERE / "host_faults_worker.py"), scenario)
    proc = run_bounded(cmd, 180, cwd=HERE, env=mpiexec_env())
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert out.count(f"{scenario} OK") == 2, out[-4000:]
