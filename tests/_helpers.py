"""Shared test helpers: tolerances against the float64 oracle, row masks, mpiexec.

Imported by the pytest modules and by ``host_reduce_worker.py`` (which runs
outside pytest, so nothing here imports pytest).
"""

import os
import re
import shutil
import signal
import subprocess
import sys

import ml_dtypes
import numpy as np

__all__ = ["run_bounded", "run_worker", "worker_results", "job_results", "assert_lse_close", "assert_output_close", "check_rank_result", "mpiexec_command", "mpiexec_env",
           "random_rank_inputs", "row_mask", "row_scale", "ulp", "host_bf16_rounding",
           "device_array"]

LSE_RTOL = 1e-5
LSE_ATOL = 1e-6
FP32_RTOL = 1e-5


def ulp(ref, dtype):
    """Spacing of ``dtype`` at each ``|ref|`` (float64), subnormals included."""
    info = ml_dtypes.finfo(dtype)
    mag = np.abs(np.asarray(ref, dtype=np.float64))
    with np.errstate(divide="ignore"):
        exponent = np.floor(np.log2(mag))
    exponent = np.where(np.isfinite(exponent), exponent, info.minexp)
    exponent = np.maximum(exponent, info.minexp)
    return np.ldexp(1.0, (exponent - info.nmant).astype(np.int64))


def host_bf16_rounding():
    """The kernels' ``f32_to_bf16_bits`` (``build_bits``) compiled for the host, over
    an array of float32 bit patterns: their bfloat16 bits (uint16)."""
    import numba

    from cupy_dcp.kernels._math import build_bits

    f32_to_bf16_bits = build_bits(numba.njit).f32_to_bf16_bits

    @numba.njit
    def rounded(bits):
        out = np.empty(bits.size, np.uint16)
        for i in range(bits.size):
            out[i] = f32_to_bf16_bits(bits[i])
        return out

    return rounded


def assert_output_close(got, ref, scale, where=""):
    """``got [B, H, D]`` (output dtype) against the float64 oracle ``ref``.

    float32: ``rtol 1e-5`` plus ``atol 1e-5 * scale`` (``scale [B, H, 1]``,
    the largest magnitude of the row's finite partials). float16/bfloat16:
    within one ulp of the output dtype at the reference value.
    """
    dtype = np.dtype(got.dtype)
    got64 = got.astype(np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, f"{where}: shape {got.shape} != {ref.shape}"
    assert np.all(np.isfinite(got64)), f"{where}: non-finite output {got64[~np.isfinite(got64)]}"
    if dtype == np.float32:
        tol = FP32_RTOL * np.abs(ref) + FP32_RTOL * scale
    else:
        tol = ulp(ref, dtype)
    err = np.abs(got64 - ref)
    bad = err > tol
    assert not bad.any(), (
        f"{where}: {int(bad.sum())} of {bad.size} {dtype} outputs off; worst at "
        f"{tuple(int(i) for i in np.unravel_index(np.argmax(err - tol), err.shape))}: "
        f"got {got64[bad][:4]}, "
        f"want {ref[bad][:4]}")


def assert_lse_close(got, ref, where=""):
    """Global LSE: -inf exactly where the oracle's is, else within 1e-5 relative."""
    got = np.asarray(got)
    assert got.dtype == np.float32, f"{where}: LSE dtype {got.dtype}"
    ref = np.asarray(ref, dtype=np.float64)
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref), err_msg=where)
    finite = ~np.isneginf(ref)
    np.testing.assert_allclose(got[finite], ref[finite], rtol=LSE_RTOL, atol=LSE_ATOL,
                               err_msg=where)


def row_scale(outputs, lses):
    """``[B, H, 1]``: the largest |partial| over the shards that carry weight."""
    lses = np.asarray(lses, dtype=np.float64)
    live = np.isfinite(lses)[..., None]
    mags = np.where(live, np.abs(np.asarray(outputs, dtype=np.float64)), 0.0)
    return mags.max(axis=(0, 3))[..., None]


def row_mask(num_tokens, seq_lens, query_start_loc):
    """``[B]`` bool, True for tokens with no KV: empty sequences and padding."""
    mask = np.ones(num_tokens, dtype=bool)
    for s, length in enumerate(seq_lens):
        mask[query_start_loc[s]:query_start_loc[s + 1]] = length == 0
    return mask


def _find_mpiexec():
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return local if os.access(local, os.X_OK) else shutil.which("mpiexec")


def mpiexec_command(nprocs, *argv):
    """``mpiexec -n nprocs --oversubscribe argv...``; None when there is no mpiexec."""
    mpiexec = _find_mpiexec()
    if mpiexec is None:
        return None
    return [mpiexec, "--oversubscribe", "-n", str(nprocs), *argv]


def mpiexec_env(**extra):
    """The environment for mpiexec: root allowed, one Numba thread per rank."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1",
               XLA_PYTHON_CLIENT_PREALLOCATE="false")  # ranks may share a GPU with JAX
    env.update(extra)
    return env


def check_rank_result(out, lse, ref, ref_lse, scale, where=""):
    """One rank's combine against the float64 oracle ``ref [B, H/N, D]``, ``ref_lse [B, H/N]``.

    Rows where every shard is empty must be exactly 0; ``lse`` may be None
    when the call did not ask for it.
    """
    assert_output_close(out, ref, scale, where)
    empty = np.isneginf(ref_lse)
    np.testing.assert_array_equal(out[empty].astype(np.float32), 0.0, err_msg=where)
    if lse is not None:
        assert_lse_close(lse, ref_lse, where)


def random_rank_inputs(rng, shape, dtype, regime="spread", p_bad=0.1):
    """One rank's ``x [B, H, D]`` of ``dtype`` and float32 ``lse [B, H]``.

    ``regime``: ``"spread"`` LSEs uniform in [-80, 80] (weights spread e^160),
    ``"large"`` near 3000, ``"mixed"`` either per entry. A fraction ``p_bad``
    of LSEs become NaN (random payload), +inf or -inf, and half of those
    empty rows get NaN or inf partials, which must not leak into the result.
    """
    B, H, D = shape
    x = rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3)
    x = x.astype(np.float32).astype(dtype)
    spread = rng.uniform(-80.0, 80.0, (B, H))
    large = 3000.0 + rng.uniform(-3.0, 3.0, (B, H))
    pick = {"spread": np.ones((B, H), bool), "large": np.zeros((B, H), bool),
            "mixed": rng.random((B, H)) < 0.5}[regime]
    lse = np.where(pick, spread, large).astype(np.float32)
    bad = rng.random((B, H)) < p_bad
    kind = rng.integers(0, 3, (B, H))
    nan_bits = (rng.integers(1, 1 << 22, (B, H), dtype=np.uint32) | np.uint32(0x7F800000)
                | (rng.integers(0, 2, (B, H), dtype=np.uint32) << np.uint32(31)))
    lse = np.where(bad & (kind == 0), nan_bits.view(np.float32), lse)
    lse[bad & (kind == 1)] = np.inf
    lse[bad & (kind == 2)] = -np.inf
    poison = bad & (rng.random((B, H)) < 0.5)
    x[poison] = np.where(rng.random() < 0.5, np.nan, np.inf)
    return x, lse


RESULT_TAG = "cupy_dcp worker result: "


def run_worker(main, *args):
    """Run an mpirun worker's ``main(*args)`` on this rank and report by exit code and
    one JSON line: ``main`` returns a dict of what it checked (JSON-serialisable, or
    None), printed as ``RESULT_TAG`` + ``{"rank": r, "size": n, **result}``. Any
    exception prints its traceback and aborts the whole job (non-zero exit), so that
    no rank is left waiting in a collective and no rank reports."""
    import json

    from mpi4py import MPI
    try:
        result = main(*args)
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
    world = MPI.COMM_WORLD
    record = {"rank": world.Get_rank(), "size": world.Get_size(), **(result or {})}
    print(RESULT_TAG + json.dumps(record, default=str), flush=True)


_TERMINAL_CODES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def worker_results(stdout):
    """The records that ``run_worker`` printed in a job's ``stdout``, in order. A
    rank's other output may leave a terminal's colour codes around a record's line
    (Numba's coloured warnings end with a reset code): they are not part of it."""
    import json

    decoder = json.JSONDecoder()
    records = []
    for line in _TERMINAL_CODES.sub("", stdout).splitlines():
        at = line.find(RESULT_TAG)
        if at >= 0:
            records.append(decoder.raw_decode(line, at + len(RESULT_TAG))[0])
    return records


def job_results(proc, nprocs):
    """A finished worker job's records, indexed by rank: the job must have exited 0
    and every one of its ``nprocs`` ranks must have reported once (else an
    ``AssertionError`` carrying the job's output)."""
    report = f"exit {proc.returncode}\nstdout:\n{proc.stdout[-6000:]}\nstderr:\n{proc.stderr[-6000:]}"
    assert proc.returncode == 0, report
    records = worker_results(proc.stdout)
    assert sorted(r["rank"] for r in records) == list(range(nprocs)), report
    assert all(r["size"] == nprocs for r in records), report
    return sorted(records, key=lambda r: r["rank"])


def run_bounded(cmd, timeout, cwd=None, env=None):
    """Run ``cmd`` (an mpiexec line) to its end, output captured as text: a
    ``subprocess.CompletedProcess``. Past ``timeout`` seconds the job's whole
    process group is stopped (SIGTERM, then SIGKILL), so no rank lives on
    holding a GPU, and an ``AssertionError`` carries the output it had written."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                stdout, stderr = proc.communicate(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        out = (stdout or "") + (stderr or "")
        raise AssertionError(f"{' '.join(map(str, cmd))} did not end within {timeout} s; "
                             f"the output it had written:\n{out[-6000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def skip_without_toolchain(reason):
    """Skip a test that needs NVVM and the pinned toolchain where they are missing, or
    fail it where ``CUPY_DCP_TOOLCHAIN=1`` says they must be there (CI sets it once it
    has installed them: a broken install or a pin bump must not pass as a skip)."""
    import pytest

    if os.environ.get("CUPY_DCP_TOOLCHAIN") == "1":
        pytest.fail(f"CUPY_DCP_TOOLCHAIN=1, yet: {reason}")
    pytest.skip(reason)


def device_array(shape, dtype=np.uint16, ptr=1 << 20, strides=None):
    """A ``DeviceArray`` of ``shape`` at address ``ptr`` (C-contiguous unless ``strides``,
    in bytes), never touched: for launches and checks that are made, not run."""
    from cupy_dcp.kernels._launch import DeviceArray
    from cupy_dcp.layout import c_strides

    dtype = np.dtype(dtype)
    return DeviceArray(ptr, tuple(shape), strides or c_strides(shape, dtype.itemsize), dtype,
                       None)
