"""Divergent calls of the packed all-to-all on the GPU, caught by default from the trailer
each chunk carries: two ranks sharing one GPU over the MPI transport (see
``gpu_divergence_worker.py``); the same ValueError on every rank, inputs untouched."""

import sys
from pathlib import Path

import pytest

from _helpers import mpiexec_env, run_bounded
from gpu import requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("scenario", ["dtype", "base", "tokens"])
def test_a_divergent_call_raises_the_same_error_on_both_ranks(mpiexec, scenario):
    cmd = mpiexec(2, sys.executable, str(HERE / "gpu_divergence_worker.py"), scenario)
    proc = run_bounded(cmd, 300, cwd=HERE, env=mpiexec_env(CUDA_VISIBLE_DEVICES="0"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    for rank in range(2):
        assert f"rank {rank} {scenario} OK: " in proc.stdout, (rank, out[-6000:])
