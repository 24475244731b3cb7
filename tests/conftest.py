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
