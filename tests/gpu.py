"""GPU availability for the ``gpu``-marked tests: skip cleanly where there is none."""

import pytest


def gpu_count():
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver, no device
        return 0


def pdl_expected(ranks):
    """Whether a direct plan of ``ranks`` ranks launches as programmatic dependents
    here: a GPU for each rank, all Hopper or later, a CUDA 12.3 or later driver,
    ``CUPY_DCP_PDL`` not 0."""
    from cupy_dcp import _settings

    if gpu_count() < ranks or _settings.pdl() is False:
        return False
    import cupy
    runtime = cupy.cuda.runtime
    return (runtime.driverGetVersion() >= 12030
            and all(int(cupy.cuda.Device(d).compute_capability) >= 90 for d in range(ranks)))


requires_gpu = pytest.mark.skipif(gpu_count() < 1, reason="needs CuPy and a CUDA GPU")
requires_two_gpus = pytest.mark.skipif(gpu_count() < 2, reason="needs CuPy and two CUDA GPUs")
