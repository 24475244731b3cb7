"""The kernel bench's floor kernels under the Numba CUDA simulator: the copy kernel
reads every source word and writes every destination word, the empty one writes
nothing. Collected only with NUMBA_ENABLE_CUDASIM=1 (see ``tests/conftest.py``)."""

import numpy as np
import pytest

from cupy_dcp._floors import copy_kernel, empty_kernel, quad_words
from cupy_dcp.kernels._arrays import kernel_array

GRID, BLOCK = (3,), (8, 2)  # 48 threads: fewer than the quads, so each loops


def expected_copy(src, write_words):
    """dst quad q: the XOR of src quads q, q + Q, ... (Q = dst's quads); zeros past src."""
    quads = src.reshape(-1, 4)
    out = np.zeros((write_words // 4, 4), dtype=np.uint32)
    for q in range(out.shape[0]):
        for s in range(q, quads.shape[0], out.shape[0]):
            out[q] ^= quads[s]
    return out.reshape(-1)


@pytest.mark.parametrize("read_bytes, written_bytes", [(4096, 4096), (7 * 1000, 2000),
                                                       (40_000, 1000), (1000, 3000), (12, 2)],
                         ids=["same", "reads-more", "reads-past-in-flight", "writes-more",
                              "tiny"])
@pytest.mark.parametrize("quads", [1, 2, 4, 8], ids=lambda q: f"{q}-in-flight")
def test_copy_floor_reads_and_writes_every_word(read_bytes, written_bytes, quads):
    rng = np.random.default_rng(read_bytes + written_bytes)
    src = rng.integers(0, 2**32, quad_words(read_bytes), dtype=np.uint32)
    dst = np.full(quad_words(written_bytes), 0xDEADBEEF, dtype=np.uint32)
    copy_kernel(quads)(GRID, BLOCK, 0, (kernel_array(src, np.uint32),
                                        kernel_array(dst, np.uint32)))
    np.testing.assert_array_equal(dst, expected_copy(src, dst.size))
    if src.size <= dst.size:  # one source quad per destination quad: a plain copy
        np.testing.assert_array_equal(dst[:src.size], src)


def test_empty_floor_writes_nothing():
    src = np.arange(64, dtype=np.uint32)
    dst = np.full(64, 7, dtype=np.uint32)
    empty_kernel()(GRID, BLOCK, 0, (kernel_array(src, np.uint32), kernel_array(dst, np.uint32)))
    assert (dst == 7).all()
