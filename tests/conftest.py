"""Shared fixtures; the helpers themselves live in ``_helpers.py``."""

import os

import pytest

from _helpers import mpiexec_command

# The CUDA-simulator suite needs NUMBA_ENABLE_CUDASIM=1 before Numba is
# imported; test_simulator.py runs it in its own process with that set.
collect_ignore = [] if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" else ["cudasim"]


@pytest.fixture
def mpiexec():
    """Build ``mpiexec -n K ...`` command lines; fails when no mpiexec is installed."""
    if mpiexec_command(1) is None:
        pytest.fail("no mpiexec next to sys.executable nor on PATH: install the 'mpi' extra")
    return mpiexec_command


@pytest.fixture(autouse=True, scope="session")
def kernel_cache_dir(tmp_path_factory):
    """The suite's kernel cache: a folder of this run (shared by its subprocesses,
    which inherit the variable), never the user's; a cache folder given in the
    environment is kept."""
    if "CUPY_DCP_CACHE_DIR" not in os.environ and os.environ.get("CUPY_DCP_CACHE") != "0":
        os.environ["CUPY_DCP_CACHE_DIR"] = str(tmp_path_factory.mktemp("kernel-cache"))
    from cupy_dcp import _settings
    from cupy_dcp.kernels import _cache

    _cache.set_cache_dir(_settings.kernel_cache_dir())
    return _cache.cache_dir()
