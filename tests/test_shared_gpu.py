"""Two ranks on one GPU: ``"auto"`` exchanges device arrays through host memory with MPI
(and says so), an explicit ``"nccl"`` names the ranks that share the GPU."""

import sys
import textwrap
from pathlib import Path

import pytest

from _helpers import mpiexec_command, mpiexec_env, run_bounded
from gpu import requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]

ROOT = Path(__file__).resolve().parent.parent

NCCL_SCRIPT = textwrap.dedent("""
    from mpi4py import MPI

    import cupy_dcp

    try:
        cupy_dcp.Communicator.from_mpi(backend="nccl")
    except RuntimeError as exc:
        message = str(exc)
        assert message.startswith("the NCCL backend needs a GPU of its own for every rank: "
                                  "ranks 0, 1 share GPU "), message
        assert message.endswith("(use backend='auto' or 'mpi', DcpDirectPlan, or one rank "
                                "per GPU)"), message
        print("rank", MPI.COMM_WORLD.rank, "refused:", message, flush=True)
    else:
        raise AssertionError("NCCL was built for two ranks on one GPU")
""")


def run_on_one_gpu(*argv):
    cmd = mpiexec_command(2, sys.executable, "-m", "mpi4py", *argv)
    proc = run_bounded(cmd, 300, cwd=ROOT, env=mpiexec_env(CUDA_VISIBLE_DEVICES="0"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return out


def test_explicit_nccl_names_the_ranks_that_share_the_gpu(tmp_path):
    script = tmp_path / "nccl_on_one_gpu.py"
    script.write_text(NCCL_SCRIPT)
    out = run_on_one_gpu(str(script))
    assert out.count("refused: the NCCL backend needs a GPU of its own") == 2, out[-3000:]


def test_the_decode_example_runs_on_one_shared_gpu():
    out = run_on_one_gpu(str(ROOT / "mpi_examples" / "decode_attention.py"), "--device", "gpu",
                         "--iters", "3")
    assert out.count("[GPU]") == 2 and "OK: every rank within" in out, out[-3000:]
    assert "NCCL cannot run two ranks on one GPU, so device arrays go through host memory" in out, \
        out[-3000:]
