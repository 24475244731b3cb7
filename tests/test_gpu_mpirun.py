"""Multi-rank GPU tests: mpirun -n 2 over NCCL, from pytest.

``CUPY_DCP_JOB_TIMEOUT`` (seconds) caps each job below its own bound, so that a
job that hangs inside a time-limited session still ends with its output.
"""

import os
import sys
from pathlib import Path

import pytest

from _helpers import mpiexec_command, mpiexec_env, run_bounded
from gpu import pdl_expected, requires_gpu, requires_two_gpus

pytestmark = [pytest.mark.gpu]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def run_job(nprocs, *argv, timeout=600):
    cmd = mpiexec_command(nprocs, sys.executable, "-m", "mpi4py", *argv)
    assert cmd is not None, "no mpiexec"
    timeout = min(timeout, float(os.environ.get("CUPY_DCP_JOB_TIMEOUT", timeout)))
    proc = run_bounded(cmd, timeout, cwd=HERE, env=mpiexec_env())
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return out


@requires_two_gpus
def test_reduce_plans_and_graphs_on_two_gpus():
    out = run_job(2, str(HERE / "gpu_reduce_worker.py"), "nccl")
    assert out.count("GPU OK") == 2, out[-3000:]


@requires_gpu
def test_reduce_and_plans_over_the_mpi_transport():
    """Device arrays exchanged over MPI (staged through host memory): two ranks may
    share one GPU, so this runs the whole multi-rank device path on a single GPU."""
    out = run_job(2, str(HERE / "gpu_reduce_worker.py"), "mpi")
    assert out.count("GPU OK") == 2, out[-3000:]


@requires_two_gpus
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_decode_attention_example_on_gpus(dtype):
    out = run_job(2, str(ROOT / "mpi_examples" / "decode_attention.py"), "--device", "gpu",
                  "--dtype", dtype, "--heads", "32", "--head-dim", "576")
    assert "[GPU]" in out and "OK:" in out, out[-3000:]


@requires_two_gpus
@pytest.mark.slow
def test_gpu_soak_of_graph_replays_and_eager_calls():
    out = run_job(2, str(HERE / "gpu_soak_worker.py"), timeout=1800)
    assert out.count("GPU soak OK") == 2, out[-3000:]


# The direct path: two ranks may share one GPU (CUDA IPC works within a device), so
# these run on a single GPU too (where the two processes' kernels time-slice).
RACE_CALLS = 10_000


@requires_gpu
def test_direct_plan_exact():
    out = run_job(2, str(HERE / "gpu_direct_worker.py"), "exact")
    assert "direct exact OK" in out, out[-3000:]


@requires_gpu
def test_direct_plan_exact_on_four_ranks():
    """Four ranks (sharing the GPUs there are): every rank skips itself among three
    peers, and the combine pairs an odd number of shards."""
    out = run_job(4, str(HERE / "gpu_direct_worker.py"), "exact")
    assert "direct exact OK" in out and "on 4 ranks" in out, out[-3000:]


@requires_gpu
def test_direct_plan_race_eager_and_graph():
    out = run_job(2, str(HERE / "gpu_direct_worker.py"), "race", str(RACE_CALLS))
    # two ranks, each a call size word by word, one in lines and one in tiles
    assert out.count("direct race OK (B=") == 6, out[-3000:]
    for path in ("word by word", "in lines", "in tiles"):
        assert out.count(f", {path}): {RACE_CALLS} eager calls") == 2, out[-3000:]
    # where each rank has a Hopper GPU of its own, the calls were dependent launches
    launches = "dependent launches" if pdl_expected(2) else "ordinary launches"
    assert out.count(launches) == 6, out[-3000:]
    print(out)


@requires_gpu
def test_direct_plan_missing_peer_times_out():
    out = run_job(2, str(HERE / "gpu_direct_worker.py"), "timeout")
    assert "rank 0 direct timeout OK" in out and "rank 1 direct timeout OK" in out, out[-3000:]
    print(out)


@requires_gpu
def test_direct_plans_open_and_close_without_leaks():
    out = run_job(2, str(HERE / "gpu_direct_worker.py"), "leak", "1000")
    assert out.count("direct leak OK: 1000 plans") == 2, out[-3000:]
    print(out)


@requires_gpu
def test_decode_loop_example_on_the_direct_path():
    """The decode loop with a direct plan: graph replay, every step checked (two ranks
    may share one GPU)."""
    out = run_job(2, str(ROOT / "mpi_examples" / "decode_loop.py"), "--device", "gpu",
                  "--strategy", "direct", "--steps", "20")
    assert "DcpDirectPlan: graph replay" in out and "OK: every step" in out, out[-3000:]
    print(out)


@requires_two_gpus
def test_decode_loop_example_on_the_nccl_path():
    out = run_job(2, str(ROOT / "mpi_examples" / "decode_loop.py"), "--device", "gpu",
                  "--strategy", "a2a", "--steps", "20")
    assert "DcpA2APlan: graph replay" in out and "OK: every step" in out, out[-3000:]
