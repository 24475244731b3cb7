"""``python -m cupy_dcp.warmup`` and ``python -m cupy_dcp.bench --startup`` on the CPU:
PTX for a named compute capability without a GPU, and start-up runs of the host path,
cold and warm (each in a kernel cache folder of its test)."""

import json
import os
import subprocess
import sys

import pytest
from _helpers import mpiexec_env, skip_without_toolchain

from gpu import gpu_count
from test_cache import _toolchain_problem, entries

WARMUP = [sys.executable, "-m", "cupy_dcp.warmup", "--dtype", "bfloat16", "--heads", "4",
          "--head-dim", "8", "--world-size", "2", "--max-tokens", "2"]


def warm(folder, *extra):
    return subprocess.run(WARMUP + list(extra), capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, CUPY_DCP_CACHE_DIR=str(folder)))


def test_warmup_fills_the_cache_for_a_named_capability(tmp_path):
    problem = _toolchain_problem()
    if problem:
        skip_without_toolchain(f"no NVVM here: {problem}")
    first = warm(tmp_path, "--cc", "9.0", "--plans", "a2a")
    assert first.returncode == 0, first.stderr[-3000:]
    # the pack of words, with a mask and without one, and as many by tokens (a block row
    # per token: signed by the rows' blocks, signed by a lead plane, and unsigned as
    # pack_send launches it); the combine of bfloat16 pairs for N = 2, one for each
    # number of values a lane it can move (8, 4, 2: combine_unroll), and with a block a
    # row, both the signed one (a plan's) and the one unpack_combine launches outside a
    # plan
    k = 13
    assert "sm_90 PTX" in first.stdout and f": {k} compiled, 0 already there, {k} stored" in \
        first.stdout, first.stdout
    assert len(entries(tmp_path)) == k
    again = warm(tmp_path, "--cc", "9.0", "--plans", "a2a")
    assert f": 0 compiled, {k} already there, 0 stored" in again.stdout, again.stdout
    other = warm(tmp_path, "--cc", "8.0", "--plans", "a2a")  # another target: its own entries
    assert f": {k} compiled, 0 already there, {k} stored" in other.stdout, other.stdout


@pytest.mark.parametrize("argv, message", [
    (["--cc", "nine"], "--cc must be MAJOR.MINOR, e.g. 9.0 (got 'nine')"),
    (["--cc", "1.0"], "--cc must be 7.5 or later, as NVVM compiles for (got 1.0)"),
    (["--plans", "a2a,bogus"], "--plans takes a2a, direct, agrs (got bogus)"),
    (["--plans", ","], "--plans takes a2a, direct, agrs (got none)"),
    (["--dtype", "int8", "--cc", "9.0"], "--dtype must be float16, bfloat16 or float32 "
                                         "(got 'int8')"),
    ([], "there is no CUDA GPU here: pass --cc MAJOR.MINOR"),  # (on a machine without one)
    (["--cc", "7.9"], "--cc must be a compute capability the CUDA toolkit knows: 7.5, 8.0"),
    (["--cc", "9.-1"], "--cc must be a compute capability the CUDA toolkit knows"),
    (["--cc", "9.0", "CUPY_DCP_CACHE=yes"], "CUPY_DCP_CACHE must be 0 or 1 (got 'yes')"),
    (["--cc", "9.0", "NUMBA_ENABLE_CUDASIM=1"], "the CUDA simulator is on"),
], ids=["cc", "old_cc", "plans", "no_plans", "dtype", "no_gpu", "unknown_cc", "negative_cc",
        "cache_switch", "simulator"])
def test_warmup_rejects_bad_arguments(tmp_path, argv, message):
    if not argv and gpu_count() > 0:
        pytest.skip("checks the message given where there is no GPU")
    if "toolkit knows" in message:
        from cupy_dcp.warmup import _known_capabilities

        if not _known_capabilities():
            skip_without_toolchain("NVRTC cannot list the compute capabilities here")
    env = dict(a.split("=", 1) for a in argv if "=" in a)
    argv = [a for a in argv if "=" not in a]
    proc = subprocess.run(WARMUP + argv, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, CUPY_DCP_CACHE_DIR=str(tmp_path), **env))
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, \
        proc.stderr


def test_warmup_that_stores_nothing_fails(tmp_path):
    """An image build must not pass with an empty cache: a folder that cannot be made
    (under a file) warns, and the run exits 1."""
    problem = _toolchain_problem()
    if problem:
        skip_without_toolchain(f"no NVVM here: {problem}")
    (tmp_path / "afile").write_text("")
    proc = warm(tmp_path / "afile" / "cache", "--cc", "9.0", "--plans", "agrs")
    assert proc.returncode == 1 and "were not stored" in proc.stderr, proc.stderr[-3000:]
    assert ", 0 stored" in proc.stdout, proc.stdout


STORE_FAILS = """
import errno, os, sys
from cupy_dcp import warmup
from cupy_dcp.kernels import _cache
replace, calls = os.replace, []
def full(src, dst):  # the disk fills after the first entry
    calls.append(dst)
    if len(calls) > 1:
        raise OSError(errno.ENOSPC, "No space left on device")
    replace(src, dst)
_cache.os.replace = full
sys.exit(warmup.main(sys.argv[1:]))
"""


def test_warmup_whose_folder_fills_fails(tmp_path):
    """A write that fails after others succeeded (a disk that fills) still fails the
    run: the kernels it did not store are counted, not inferred from the stores."""
    problem = _toolchain_problem()
    if problem:
        skip_without_toolchain(f"no NVVM here: {problem}")
    proc = subprocess.run([sys.executable, "-c", STORE_FAILS] + WARMUP[3:] +
                          ["--cc", "9.0", "--plans", "agrs"], capture_output=True, text=True,
                          timeout=900, env=dict(os.environ, CUPY_DCP_CACHE_DIR=str(tmp_path)))
    assert proc.returncode == 1 and "were not stored" in proc.stderr, proc.stderr[-3000:]
    assert ", 1 stored" in proc.stdout and len(entries(tmp_path)) == 1, proc.stdout


def test_warmup_with_the_cache_off_says_so(tmp_path):
    proc = subprocess.run(WARMUP + ["--cc", "9.0"], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, CUPY_DCP_CACHE="0"))
    assert proc.returncode == 1 and "the kernel cache is off" in proc.stderr


def test_startup_of_the_host_path_cold_then_warm(tmp_path):
    out = tmp_path / "startup.json"
    proc = subprocess.run(
        [sys.executable, "-m", "cupy_dcp.bench", "--startup", "--kinds", "host", "--ranks", "2",
         "--tokens", "2", "--heads", "4", "--head-dim", "8", "--json", str(out)],
        capture_output=True, text=True, timeout=900, env=mpiexec_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    cold, warm_run = json.loads(out.read_text())
    assert (cold["kind"], cold["cache"], warm_run["cache"]) == ("host", "cold", "warm")
    assert cold["compiled"] >= 2 and cold["loaded"] == 0  # both ranks' pack and combine
    assert warm_run["compiled"] == 0 and warm_run["loaded"] == cold["compiled"]
    assert cold["stored"] == cold["compiled"], cold  # every count is the ranks' sum
    for record in (cold, warm_run):
        steps = record["import"] + record["plan"] + record["first_call"]
        assert 0 < steps <= record["since_start"], record
        assert record["import"] > 0.005, record  # timed before cupy_dcp was imported
    assert "host         2 cold" in proc.stdout and "host         2 warm" in proc.stdout


@pytest.mark.parametrize("argv, message", [
    (["--tokenz", "4"], "unrecognized arguments: --tokenz 4"),
    (["--tokens", "0"], "--tokens must be >= 1 (got 0)"),
    (["--head-dim", "-1"], "--head-dim must be >= 1 (got -1)"),
    (["--json", "no-such-folder/s.json"], "--json: the folder of no-such-folder/s.json does "
                                          "not exist"),
], ids=["unknown", "tokens", "head_dim", "json"])
def test_startup_refuses_options_it_does_not_take(argv, message):
    proc = subprocess.run([sys.executable, "-m", "cupy_dcp.bench", "--startup", *argv],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_startup_gives_nccl_plans_no_more_ranks_than_gpus():
    from cupy_dcp._startup import ranks_of

    assert ranks_of("a2a", 2, 1) == 1 and ranks_of("agrs", 4, 2) == 2
    assert ranks_of("direct", 2, 1) == 2 and ranks_of("host", 4, 0) == 4
    assert ranks_of("a2a", 2, 0) == 1
