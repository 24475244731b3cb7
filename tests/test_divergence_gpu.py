"""Divergent calls of the packed all-to-all on the GPU, caught by default from the trailer
each chunk carries: two ranks sharing one GPU over the MPI transport (see
``gpu_divergence_worker.py``); the same ValueError on every rank, inputs untouched."""

import sys
from pathlib import Path

import pytest

from _helpers import job_results, mpiexec_env, run_bounded
from gpu import requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("scenario", ["dtype", "base", "tokens"])
def test_a_divergent_call_raises_the_same_error_on_both_ranks(mpiexec, scenario):
    cmd = mpiexec(2, sys.executable, str(HERE / "gpu_divergence_worker.py"), scenario)
    proc = run_bounded(cmd, 300, cwd=HERE, env=mpiexec_env(CUDA_VISIBLE_DEVICES="0"))
    records = job_results(proc, 2)
    assert [sorted(r["checked"]) for r in records] == [[scenario]] * 2, records
    assert records[0]["checked"] == records[1]["checked"], records  # the same error on both
