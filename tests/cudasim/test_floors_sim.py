"""The kernel bench's floor kernels under the Numba CUDA simulator: the copy kernel
reads every source word and writes every destination word, the empty one writes
nothing. Collected only with NUMBA_ENABLE_CUDASIM=1 (see ``tests/conftest.py``)."""

import numpy as np
import pytest

from cupy_dcp._floors import empty_kernel
from cupy_dcp.kernels._arrays import kernel_array
from kernel_checks import check_copy_floor

GRID, BLOCK = (3,), (8, 2)  # 48 threads: fewer than the quads, so each loops


@pytest.mark.parametrize("read_bytes, written_bytes", [(4096, 4096), (7 * 1000, 2000),
                                                       (40_000, 1000), (1000, 3000), (12, 2)],
                         ids=["same", "reads-more", "reads-past-in-flight", "writes-more",
                              "tiny"])
@pytest.mark.parametrize("quads", [1, 2, 4, 8], ids=lambda q: f"{q}-in-flight")
def test_copy_floor_reads_and_writes_every_word(read_bytes, written_bytes, quads):
    # the simulator's device arrays are NumPy's: np.asarray both ways keeps the very array
    check_copy_floor(np.asarray, np.asarray, read_bytes, written_bytes, quads, GRID, BLOCK)


def test_empty_floor_writes_nothing():
    src = np.arange(64, dtype=np.uint32)
    dst = np.full(64, 7, dtype=np.uint32)
    empty_kernel()(GRID, BLOCK, 0, (kernel_array(src, np.uint32), kernel_array(dst, np.uint32)))
    assert (dst == 7).all()
