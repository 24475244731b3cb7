"""Multi-rank GPU tests: mpirun -n 2 over NCCL, from pytest.

``CUPY_DCP_JOB_TIMEOUT`` (seconds) caps each job below its own bound, so that a
job that hangs inside a time-limited session still ends with its output.
"""

import os
import sys
from pathlib import Path

import pytest

from _helpers import job_results, mpiexec_command, mpiexec_env, run_bounded
from gpu import pdl_expected, requires_gpu, requires_two_gpus

pytestmark = [pytest.mark.gpu]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _bounded_job(nprocs, argv, timeout, env=None):
    cmd = mpiexec_command(nprocs, sys.executable, "-m", "mpi4py", *argv)
    assert cmd is not None, "no mpiexec"
    timeout = min(timeout, float(os.environ.get("CUPY_DCP_JOB_TIMEOUT", timeout)))
    return run_bounded(cmd, timeout, cwd=HERE, env=mpiexec_env(**(env or {})))


def run_job(nprocs, *argv, timeout=600):
    """An example's job: its output, once it has exited 0."""
    proc = _bounded_job(nprocs, argv, timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return out


def run_worker_job(nprocs, worker, *argv, timeout=600, env=None):
    """A worker's job (``run_worker``): every rank's record, once it has exited 0;
    ``env``: variables to set in its environment."""
    return job_results(_bounded_job(nprocs, (str(HERE / worker), *argv), timeout, env),
                       nprocs)


@requires_two_gpus
def test_reduce_plans_and_graphs_on_two_gpus():
    for record in run_worker_job(2, "gpu_reduce_worker.py", "nccl"):
        assert record["backend"] == "nccl" and record["graphs"], record


@requires_gpu
def test_reduce_and_plans_over_the_mpi_transport():
    """Device arrays exchanged over MPI (staged through host memory): two ranks may
    share one GPU, so this runs the whole multi-rank device path on a single GPU."""
    for record in run_worker_job(2, "gpu_reduce_worker.py", "mpi"):
        assert record["backend"] == "mpi" and not record["graphs"], record


@requires_two_gpus
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_decode_attention_example_on_gpus(dtype):
    out = run_job(2, str(ROOT / "mpi_examples" / "decode_attention.py"), "--device", "gpu",
                  "--dtype", dtype, "--heads", "32", "--head-dim", "576")
    assert "[GPU]" in out and "OK:" in out, out[-3000:]


@requires_two_gpus
@pytest.mark.slow
def test_gpu_soak_of_graph_replays_and_eager_calls():
    for record in run_worker_job(2, "gpu_soak_worker.py", timeout=1800):
        assert record["replays"] == 100_000 and record["eager_calls"] == 100_000, record


# The direct path: two ranks may share one GPU (CUDA IPC works within a device), so
# these run on a single GPU too (where the two processes' kernels time-slice).
RACE_CALLS = 10_000


@requires_gpu
def test_direct_plan_exact():
    for record in run_worker_job(2, "gpu_direct_worker.py", "exact"):
        assert record["cases"] > 0 and record["repeated_calls"] > 0, record


@requires_gpu
def test_direct_plan_exact_from_a_warm_cache(tmp_path):
    """The same job twice on one empty kernel cache: the first fills it, the second
    compiles nothing (every kernel loaded) and is exact all the same."""
    env = {"CUPY_DCP_CACHE_DIR": str(tmp_path / "kernels")}
    cold = run_worker_job(2, "gpu_direct_worker.py", "exact", env=env)
    warm = run_worker_job(2, "gpu_direct_worker.py", "exact", env=env)
    assert sum(r["compiled"] for r in cold) > 0, cold
    for record in warm:
        assert record["cases"] > 0 and record["compiled"] == 0 and record["loaded"] > 0, record


@requires_gpu
def test_direct_plan_exact_on_four_ranks():
    """Four ranks (sharing the GPUs there are): every rank skips itself among three
    peers, and the combine pairs an odd number of shards."""
    for record in run_worker_job(4, "gpu_direct_worker.py", "exact"):
        assert record["cases"] > 0 and record["repeated_calls"] > 0, record


@requires_gpu
def test_direct_plan_race_eager_and_graph():
    records = run_worker_job(2, "gpu_direct_worker.py", "race", str(RACE_CALLS))
    # where each rank has a Hopper GPU of its own, the calls were dependent launches
    launches = "dependent" if pdl_expected(2) else "ordinary"
    for record in records:  # each rank: a call size word by word, one in lines, one in tiles
        races = record["races"]
        assert [r["path"] for r in races] == ["word by word", "in lines", "in tiles"], record
        for race in races:
            assert race["eager_calls"] == race["graph_replays"] == RACE_CALLS, record
            assert race["launches"] == launches, record
    print(records)


@requires_gpu
def test_direct_plan_missing_peer_times_out():
    first, second = run_worker_job(2, "gpu_direct_worker.py", "timeout")
    assert "rank 1 did not arrive" in first["message"], first
    assert second["peer_failure_raised"], second
    print(first, second)


@requires_gpu
def test_direct_plans_open_and_close_without_leaks():
    records = run_worker_job(2, "gpu_direct_worker.py", "leak", "1000")
    assert all(r["plans"] == 1000 for r in records), records
    print(records)


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
