"""Runs the CUDA-kernel suite under the Numba CUDA simulator, in its own process.

The simulator replaces ``numba.cuda`` when NUMBA_ENABLE_CUDASIM=1 is set before
Numba is imported, so it cannot share a process with the rest of the suite.
"""

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


# A bound against a hang, not a benchmark: the suite took about 10 minutes on one
# 2-core CI machine and more than 15 on another of the same kind.
SIMULATOR_TIMEOUT = 3000  # seconds


def test_cuda_kernels_under_the_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "cudasim")],
        cwd=HERE, env=env, capture_output=True, text=True, timeout=SIMULATOR_TIMEOUT)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and " failed" not in proc.stdout, tail
