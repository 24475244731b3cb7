"""Runs the CUDA-kernel suite under the Numba CUDA simulator, in its own process.

The simulator replaces ``numba.cuda`` when NUMBA_ENABLE_CUDASIM=1 is set before
Numba is imported, so it cannot share a process with the rest of the suite. The
default run checks each kernel once (``tests/cudasim/conftest.py``'s ``QUICK``);
the rest of the suite, fuzzing included, runs under the ``slow`` marker.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


# A bound against a hang, not a benchmark: the whole suite took about 10 minutes on one
# 2-core CI machine and more than 15 on another of the same kind.
SIMULATOR_TIMEOUT = 3000  # seconds


def _simulator_suite(marker):
    """The simulator suite's tests of ``marker`` (a ``-m`` expression), in a process of
    their own: its output, once every one of them has passed."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marker,
         str(HERE / "cudasim")],
        cwd=HERE, env=env, capture_output=True, text=True, timeout=SIMULATOR_TIMEOUT)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and " failed" not in proc.stdout, tail
    return proc.stdout


def _quick():
    """``tests/cudasim/conftest.py``'s ``QUICK`` (that module imports nothing of Numba)."""
    spec = importlib.util.spec_from_file_location("cudasim_split", HERE / "cudasim" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.QUICK


def test_each_kernel_once_under_the_simulator():
    out = _simulator_suite("not slow")
    assert f"\n{len(_quick())} passed, " in out, out[-4000:]


@pytest.mark.slow
def test_every_kernel_check_under_the_simulator():
    _simulator_suite("slow")
