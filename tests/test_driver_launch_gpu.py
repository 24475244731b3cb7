"""Each launcher on a real GPU: the driver's (cuda.bindings' ``cuLaunchKernelEx``),
ordinary and as a programmatic dependent, cuda.core's and CuPy's, launched as a call
and as a ready launch, eagerly and captured in a CUDA graph, write what the
reference packs."""

import numpy as np
import pytest

from gpu import requires_gpu
from kernel_checks import make_inputs

pytestmark = [pytest.mark.gpu, requires_gpu]


@pytest.mark.parametrize("launcher, dependent", [("driver", False), ("driver", True),
                                                 ("core", False), ("cupy", False)],
                         ids=["driver", "driver_dependent", "core", "cupy"])
@pytest.mark.parametrize("ready", [False, True], ids=["call", "ready"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_a_pack_launch_writes_the_reference(launcher, dependent, ready, graph):
    import cupy

    from cupy_dcp.kernels._arrays import dummy_index, kernel_array
    from cupy_dcp.kernels._launch import SpecializedKernel
    from cupy_dcp.kernels.pack import pack_launch
    from cupy_dcp.layout import lse_pack_dim
    from cupy_dcp.reference import pack_reference

    dtype, n, b, h, d = np.dtype(np.float16), 2, 8, 16, 128
    xs, ls = make_inputs(np.random.default_rng(d), 1, b, h, d, dtype)
    x, lse = cupy.asarray(xs[0]), cupy.asarray(ls[0].astype(np.float32))
    send = cupy.zeros((n, b, h // n, d + lse_pack_dim(dtype)), dtype=np.uint16)
    numba_made, grid, block, args = pack_launch(
        kernel_array(x, np.uint16), kernel_array(lse, np.uint32), dummy_index(), dummy_index(),
        -1, kernel_array(send, np.uint16), kernel_array(send, np.uint16), -1)
    kernel = SpecializedKernel(numba_made._dispatcher, numba_made.argtypes, launcher=launcher,
                               dependent=dependent)
    assert kernel.launcher == launcher
    stream = cupy.cuda.Stream(non_blocking=True)
    launch = kernel.prepare(grid, block, args) if ready else None

    def run():
        if ready:
            launch(stream.ptr)
        else:
            kernel(grid, block, stream.ptr, args)

    if graph:
        stream.begin_capture()
        run()
        stream.end_capture().launch(stream)
    else:
        run()
    stream.synchronize()
    expect = pack_reference(xs[0], ls[0].astype(np.float32), n)
    np.testing.assert_array_equal(cupy.asnumpy(send), expect.view(np.uint16))


def test_a_kernels_residency_is_counted_once_a_block(monkeypatch):
    """Each count loads the kernel's module and unloads it. A direct plan counts its
    kernels' residency, and counting again for every plan lost device memory plan after
    plan (the direct plans' open-and-close test: 160 KiB a plan on an H100)."""
    from cupy_dcp.kernels import _launch
    from cupy_dcp.kernels._launch import SpecializedKernel
    from cupy_dcp.kernels.pack import pack_kernel

    made = pack_kernel(np.uint16)
    kernel = SpecializedKernel(made._dispatcher, made.argtypes, launcher="driver")
    kernel._compiled = False  # counted from its cubin, as a kernel from the disk cache is
    counted = []
    count = _launch._resident_blocks
    monkeypatch.setattr(_launch, "_resident_blocks",
                        lambda *a: counted.append(a[2]) or count(*a))
    first = [kernel.resident_blocks(threads) for threads in (128, 256, 128, 256, 128)]
    assert counted == [128, 256], counted
    assert first[0] == first[2] == first[4] and first[1] == first[3] and first[0] >= first[1] > 0
