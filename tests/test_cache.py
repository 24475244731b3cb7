"""The kernel cache (``cupy_dcp.kernels._cache``) on the CPU: host kernels across
processes, corrupt entries, unwritable folders, keys, ranks filling it at once,
CUDA PTX made without a GPU, and the CUDA simulator (which bypasses it).

Every process here gets a cache folder of its test (``CUPY_DCP_CACHE_DIR``)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _helpers import job_results, mpiexec_env, skip_without_toolchain

from cupy_dcp import _settings
from cupy_dcp.kernels import _cache

HERE = Path(__file__).resolve().parent

# One host combine and one host pack, checked against the NumPy reference; prints the
# cache's counts as JSON on its last line.
HOST_CALLS = """
import json, sys
import numpy as np
import cupy_dcp
from cupy_dcp.kernels import _cache

rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
n, b, h, d = 2, 3, 4, 8
outputs = rng.standard_normal((n, b, h, d)).astype(np.float32)
lses = rng.standard_normal((n, b, h)).astype(np.float32)
out, out_lse = np.empty((b, h, d)), np.empty((b, h))
cupy_dcp.kernels.combine_host(outputs, lses, out, out_lse)
want, want_lse = cupy_dcp.lse_weighted_combine(outputs.astype(np.float64), lses, return_lse=True)
assert np.allclose(out, want, rtol=1e-12, atol=1e-12), (out, want)
assert np.allclose(out_lse, want_lse, rtol=1e-12, atol=1e-12)
data = rng.integers(0, 1 << 16, (b, 2 * h, d), dtype=np.uint16)
lse_bits = rng.integers(0, 1 << 32, (b, 2 * h), dtype=np.uint32)
send = np.zeros((2, b, h, d + 2), np.uint16)
cupy_dcp.kernels.pack_host(data, lse_bits, send)
for r in range(2):
    assert (send[r, :, :, :d] == data[:, r * h:(r + 1) * h]).all()
    assert (send[r, :, :, d] == (lse_bits[:, r * h:(r + 1) * h] & 0xFFFF)).all()
    assert (send[r, :, :, d + 1] == (lse_bits[:, r * h:(r + 1) * h] >> 16)).all()
print(json.dumps(_cache.stats()))
"""


def _env(folder, **extra):
    env = dict(os.environ, CUPY_DCP_CACHE_DIR=str(folder), PYTHONWARNINGS="always")
    env.pop("CUPY_DCP_CACHE", None)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env.update(extra)
    return env


def run_host(folder, **extra):
    """Run the host calls in a fresh process: ``(counts, stderr)``."""
    proc = subprocess.run([sys.executable, "-c", HOST_CALLS], env=_env(folder, **extra),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def entries(folder):
    return sorted(Path(folder).glob("*.bin"))


def test_a_second_process_compiles_nothing(tmp_path):
    first, _ = run_host(tmp_path)
    assert first["compiled"] >= 2 and first["loaded"] == 0
    assert first["stored"] == first["compiled"]
    assert len(entries(tmp_path)) == first["stored"]
    second, err = run_host(tmp_path)
    assert second["compiled"] == 0, second
    assert second["loaded"] == first["compiled"]
    assert "CacheWarning" not in err


def test_a_corrupt_entry_is_rebuilt_with_a_warning(tmp_path):
    first, _ = run_host(tmp_path)
    files = entries(tmp_path)
    truncated, flipped = files[0], files[1]
    truncated.write_bytes(truncated.read_bytes()[:100])
    blob = bytearray(flipped.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    flipped.write_bytes(bytes(blob))
    second, err = run_host(tmp_path)
    assert second["rebuilt"] == 2 and second["compiled"] == 2, second
    assert "CacheWarning" in err and "corrupt; rebuilding it" in err
    third, err = run_host(tmp_path)
    assert third["compiled"] == 0 and third["rebuilt"] == 0, third
    assert third["loaded"] == first["compiled"]


def test_an_unwritable_folder_runs_without_the_cache(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    counts, err = run_host(blocker / "cache")  # cannot be made: its parent is a file
    assert counts["compiled"] >= 2 and counts["stored"] == 0
    assert counts["unstored"] == counts["compiled"], counts
    assert err.count("CacheWarning") == 1 and err.count("cannot be written") == 1, err
    if os.geteuid() != 0:  # root writes into read-only folders anyway
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o500)
        try:
            counts, err = run_host(folder)
        finally:
            folder.chmod(0o700)
        assert counts["stored"] == 0 and "cannot be written" in err


def test_host_kernels_with_addresses_in_their_code_are_counted_not_stored(tmp_path):
    """Under NUMBA_OPT=0 Numba bakes this process's addresses into a host kernel's
    code: it is compiled each time, and the counts say so (as they do for a kernel
    without a stable key), not silently."""
    counts, err = run_host(tmp_path, NUMBA_OPT="0")
    assert counts["compiled"] >= 2 and counts["stored"] == 0 and counts["unstored"] == 0
    assert counts["uncacheable"] == counts["compiled"], counts
    assert entries(tmp_path) == []


def test_caching_turned_off_writes_nothing(tmp_path):
    counts, _ = run_host(tmp_path, CUPY_DCP_CACHE="0")
    assert counts["compiled"] >= 2 and counts["stored"] == 0 and counts["loaded"] == 0
    assert entries(tmp_path) == []
    counts, _ = run_host(tmp_path, CUPY_DCP_CACHE_DIR="")
    assert counts["stored"] == 0 and entries(tmp_path) == []


def test_where_the_environment_puts_it():
    folder = _settings.kernel_cache_dir
    assert folder({"CUPY_DCP_CACHE_DIR": "/x/y"}) == "/x/y"
    assert folder({"CUPY_DCP_CACHE_DIR": ""}) is None
    assert folder({"CUPY_DCP_CACHE": "0", "CUPY_DCP_CACHE_DIR": "/x"}) is None
    assert folder({"XDG_CACHE_HOME": "/c"}) == os.path.join("/c", "cupy_dcp")
    home = os.path.join(os.path.expanduser("~"), ".cache", "cupy_dcp")
    for relative in ("c", "~/c", ""):  # not absolute: ignored, as the XDG specification asks
        assert folder({"XDG_CACHE_HOME": relative}) == home, relative
    assert folder({}) == os.path.join(os.path.expanduser("~"), ".cache", "cupy_dcp")
    assert folder({"CUPY_DCP_CACHE": "1", "CUPY_DCP_CACHE_DIR": "/x"}) == "/x"
    # ~ expanded, and a relative folder made absolute once (a later chdir keeps it)
    assert folder({"CUPY_DCP_CACHE_DIR": "~/k"}) == os.path.join(os.path.expanduser("~"), "k")
    assert folder({"CUPY_DCP_CACHE_DIR": "k"}) == os.path.join(os.getcwd(), "k")
    for word in ("false", "off", "no"):  # not a silent "on"
        with pytest.raises(ValueError, match=rf"^CUPY_DCP_CACHE must be 0 or 1 \(got '{word}'\)$"):
            folder({"CUPY_DCP_CACHE": word})


def test_entries_are_readable_as_the_umask_allows(own_cache):
    """Not mkstemp's owner-only mode: a cache filled by one user (an image's build)
    serves the others. The umask is the one at each write, not at the first."""
    before = os.umask(0o022)
    try:
        assert _cache._umask() == 0o022
        assert _adder(11)(1) == 12
        first = {oct(path.stat().st_mode & 0o777) for path in entries(own_cache)}
        os.umask(0o077)
        assert _cache._umask() == 0o077
        assert _adder(13)(1) == 14
        modes = {oct(path.stat().st_mode & 0o777) for path in entries(own_cache)}
    finally:
        os.umask(before)
    assert first == {oct(0o644)} and modes == {oct(0o644), oct(0o600)}


def test_numbas_code_switches_are_in_host_keys(own_cache, monkeypatch):
    """NUMBA_BOUNDSCHECK (and the like) change a host function's machine code: a run
    with them on must not load what a run without them stored."""
    from numba.core import config

    assert _adder(21)(1) == 22
    assert _cache.stats()["compiled"] == 1
    monkeypatch.setattr(config, "BOUNDSCHECK", 1)
    assert _adder(21)(1) == 22
    assert _cache.stats()["compiled"] == 2 and _cache.stats()["loaded"] == 0
    assert len(entries(own_cache)) == 2


def test_the_nvvm_release_is_in_cuda_keys():
    """One NVVM API version (2.0) spans many releases, whose code differs."""
    problem = _toolchain_problem()
    if problem:
        skip_without_toolchain(f"no NVVM here: {problem}")
    fields = _cache._nvvm_version()
    assert fields["nvvm"] == (2, 0)  # the API version: not enough
    release = fields["nvvm_release"]
    assert release is not None and release.split(",")[0].count(".") == 1, release


def test_the_linkers_releases_are_in_cubin_keys(tmp_path, monkeypatch):
    """One driver API version (13.0) spans many driver releases, and cuda.core links
    with nvJitLink where its library loads: what linked a cubin keys it, read without
    ever failing (``None`` for what is not there)."""
    from importlib import metadata

    from numba.cuda.cudadrv import driver

    def installed(dist):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    monkeypatch.setattr(driver, "get_version", lambda: (13, 0))
    fields = _cache._driver_fields()
    assert set(fields) == {"driver", "driver_release", "cuda-core", "cuda-bindings",
                           "nvjitlink"}, fields
    assert fields["driver"] == [13, 0]
    assert fields["cuda-core"] == installed("cuda-core")
    assert fields["cuda-bindings"] == installed("cuda-bindings")
    version = tmp_path / "version"
    for text, release in (
            ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu Oct  9 2025\n"
             "GCC version:  gcc version 12.3.0\n", "580.159.04"),
            ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release "
             "Build\n", "580.95.05"),
            ("no module here\n", None)):
        version.write_text(text)
        assert _cache._driver_release(str(version)) == release, text
    assert _cache._driver_release(str(tmp_path / "absent")) is None


@pytest.fixture
def own_cache(tmp_path):
    """This process's cache in ``tmp_path`` for one test, then back as it was."""
    before = _cache.cache_dir()
    _cache.set_cache_dir(tmp_path)
    _cache.reset_stats()
    yield tmp_path
    _cache.set_cache_dir(before)


def _adder(constant):
    @_cache.cached_njit()
    def add(x):
        return x + constant

    return add


def _adder_times(constant):  # another source, the same closure
    @_cache.cached_njit()
    def add(x):
        return x * constant

    return add


def test_changing_a_key_input_misses(own_cache):
    assert _adder(3)(1) == 4
    assert _cache.stats()["compiled"] == 1
    assert _adder(3)(2) == 5  # a new dispatcher, the same key: loaded
    assert _cache.stats() == dict(_cache.stats(), compiled=1, loaded=1)
    assert _adder(4)(1) == 5  # another closure constant: compiled, never the old one
    assert _adder_times(3)(2) == 6  # other code
    assert _adder(3)(1.5) == 4.5  # another signature
    assert _cache.stats()["compiled"] == 4 and _cache.stats()["loaded"] == 1
    assert len(entries(own_cache)) == 4


def test_fingerprints_follow_nested_functions_and_globals():
    def make(k):
        inner = _adder(k)

        def outer(x):
            return inner(x) + np.float64(2.0)

        return outer

    assert _cache.code_fingerprint(make(1)) == _cache.code_fingerprint(make(1))
    assert _cache.code_fingerprint(make(1)) != _cache.code_fingerprint(make(2))
    assert _cache.code_fingerprint(_adder(1)) != _cache.code_fingerprint(_adder_times(1))
    lone = object()

    def unstable(x):
        return lone

    with pytest.raises(_cache._Uncacheable, match="no stable description"):
        _cache.code_fingerprint(unstable)


real = object()  # a global of this name has no stable key; ``x.real`` names it too


def test_a_function_without_a_stable_key_is_compiled_not_cached(own_cache):
    @_cache.cached_njit()
    def real_part(x):
        return x.real  # Numba reads no global here, but the key cannot tell

    assert real_part(2.5) == 2.5
    assert real_part(3.5) == 3.5  # the same signature: compiled once in this process
    assert _cache.stats()["uncacheable"] == 1 and _cache.stats()["compiled"] == 1
    assert entries(own_cache) == []


WORKER = HERE / "cache_fill_worker.py"


def test_four_ranks_filling_one_empty_cache(tmp_path, mpiexec):
    cmd = mpiexec(4) + [sys.executable, str(WORKER)]
    proc = subprocess.run(cmd, env=mpiexec_env(**_env(tmp_path)), capture_output=True,
                          text=True, timeout=900)
    assert all(record["exact"] for record in job_results(proc, 4)), proc.stdout
    assert "corrupt" not in proc.stderr
    counts, _ = run_host(tmp_path)  # what they left is whole
    assert counts["compiled"] == 0 and counts["rebuilt"] == 0


def _toolchain_problem():
    sys.path.insert(0, str(HERE))
    try:
        from compile_kernels import toolchain_problem
    finally:
        sys.path.remove(str(HERE))
    return toolchain_problem()


PTX_FILL = """
import json, sys
from cupy_dcp.kernels._launch import choose_launcher
choose_launcher("numba")  # the wrappers compile nothing themselves
import numpy as np
from cupy_dcp.kernels import _cache, pack
kernel = pack.pack_kernel(np.dtype(np.uint32), int(sys.argv[1]))
made = _cache.cuda_ptx(kernel._dispatcher, kernel.argtypes, (9, 0))
print(json.dumps(dict(_cache.stats(), made=made)))
"""


def test_cuda_ptx_without_a_gpu_is_cached_by_kernel(tmp_path):
    problem = _toolchain_problem()
    if problem:
        skip_without_toolchain(f"no NVVM here: {problem}")

    def fill(group):
        proc = subprocess.run([sys.executable, "-c", PTX_FILL, str(group)], env=_env(tmp_path),
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    first = fill(8)
    assert first["made"] and first["compiled"] == 1 and first["stored"] == 1
    again = fill(8)
    assert not again["made"] and again["compiled"] == 0 and again["loaded"] == 1
    other = fill(32)  # another specialisation of the same factory: its own entry
    assert other["made"] and other["compiled"] == 1
    found = [_cache._parse(p.read_bytes()) for p in entries(tmp_path)]
    assert len(found) == 2
    for key, meta, ptx in found:
        assert json.loads(key)["kind"] == "ptx" and json.loads(key)["cc"] == [9, 0]
        assert f".entry {meta['entry_name']}(" in ptx.decode()


SIMULATED = """
import json
import numpy as np
from cupy_dcp.kernels import _cache, pack_send
data = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3)
lse = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
send = np.zeros((2, 2, 2, 4), np.float32)
pack_send(data, lse, send)
assert (send[1, :, :, :3] == data[:, 2:]).all()
assert (send[..., 3] == lse.reshape(2, 2, 2).transpose(1, 0, 2)).all()
print(json.dumps(_cache.stats()))
"""


def test_the_cuda_simulator_bypasses_the_cache(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SIMULATED],
                          env=_env(tmp_path, NUMBA_ENABLE_CUDASIM="1"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counts == dict(compiled=0, loaded=0, stored=0, unstored=0, rebuilt=0, uncacheable=0)
    assert entries(tmp_path) == []
