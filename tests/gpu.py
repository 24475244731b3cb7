"""GPU availability for the ``gpu``-marked tests: skip cleanly where there is none."""

import pytest


def gpu_count():
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver, no device
        return 0


requires_gpu = pytest.mark.skipif(gpu_count() < 1, reason="needs CuPy and a CUDA GPU")
requires_two_gpus = pytest.mark.skipif(gpu_count() < 2, reason="needs CuPy and two CUDA GPUs")
