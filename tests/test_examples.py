"""Every mpirun example runs as its header says (on the CPU here) and reports success."""

import sys
from pathlib import Path

import pytest

from _helpers import mpiexec_env, run_bounded

EXAMPLES = Path(__file__).resolve().parent.parent / "mpi_examples"


@pytest.mark.parametrize("script, nprocs, argv, expect", [
    ("decode_attention.py", 4, ["--device", "cpu"], "OK: every rank"),
    pytest.param("decode_attention.py", 2,
                 ["--device", "cpu", "--dtype", "bfloat16", "--head-dim", "72"], "OK: every rank",
                 marks=pytest.mark.slow),  # the first case's script again, with -m slow
    ("decode_loop.py", 2, ["--device", "cpu", "--steps", "5", "--tokens", "8"],
     "OK: every step"),
])
def test_example_runs_and_checks_itself(mpiexec, script, nprocs, argv, expect):
    cmd = mpiexec(nprocs, sys.executable, "-m", "mpi4py", str(EXAMPLES / script), *argv)
    proc = run_bounded(cmd, 300, env=mpiexec_env())
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert expect in proc.stdout, out[-4000:]


def test_bench_runs_on_host_arrays(mpiexec, tmp_path):
    """The benchmark's host mode: every strategy timed, JSON records complete."""
    import json
    out_json = tmp_path / "bench.json"
    cmd = mpiexec(2, sys.executable, "-m", "mpi4py", "-m", "cupy_dcp.bench", "--device", "cpu",
                  "--tokens", "1,8", "--heads", "8", "--head-dim", "16", "--reps", "3",
                  "--calls", "3", "--json", str(out_json), "--profile", "4")
    proc = run_bounded(cmd, 300, env=mpiexec_env())
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    records = json.loads(out_json.read_text())
    strategies = {r["strategy"] for r in records}
    assert strategies == {"raw_alltoall", "cupy_dcp_a2a", "ag_rs"}, strategies
    keys = {"strategy", "mode", "world_size", "tokens", "heads", "head_dim", "dtype", "median_us",
            "p90_us"}
    for r in records:
        assert keys <= set(r) and r["median_us"] > 0 and r["p90_us"] >= r["median_us"], r
        assert r["world_size"] == 2 and r["mode"] == "eager"
    assert {r["tokens"] for r in records} == {1, 8}
    # --profile: one profile per eager timing, naming the library's own functions
    assert proc.stdout.count("host profile of 4 calls") == 6, proc.stdout[-3000:]
    assert "reduce.py" in proc.stdout
