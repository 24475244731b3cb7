"""Multi-rank GPU tests: mpirun -n 2 over NCCL, from pytest."""

import subprocess
import sys
from pathlib import Path

import pytest

from _helpers import mpiexec_command, mpiexec_env
from gpu import requires_two_gpus

pytestmark = [pytest.mark.gpu, requires_two_gpus]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def run_job(nprocs, *argv, timeout=600):
    cmd = mpiexec_command(nprocs, sys.executable, "-m", "mpi4py", *argv)
    assert cmd is not None, "no mpiexec"
    proc = subprocess.run(cmd, cwd=HERE, env=mpiexec_env(), capture_output=True, text=True,
                          timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return out


def test_reduce_plans_and_graphs_on_two_gpus():
    out = run_job(2, str(HERE / "gpu_reduce_worker.py"))
    assert out.count("GPU OK") == 2, out[-3000:]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_decode_attention_example_on_gpus(dtype):
    out = run_job(2, str(ROOT / "mpi_examples" / "decode_attention.py"), "--device", "gpu",
                  "--dtype", dtype, "--heads", "32", "--head-dim", "576")
    assert "[GPU]" in out and "OK:" in out, out[-3000:]
