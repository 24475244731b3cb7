"""The kernel bench's launches under the Numba CUDA simulator, NumPy standing in for
CuPy: every kernel of a case launches with the arguments the bench builds, and the
bytes it is set beside are those of its buffers. Collected only with
NUMBA_ENABLE_CUDASIM=1 (see ``tests/conftest.py``)."""

import numpy as np
import pytest

from cupy_dcp import _kernel_bench
from cupy_dcp._kernel_table import KERNELS
from cupy_dcp.layout import as_dtype, lse_pack_dim


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_every_kernel_of_a_case_launches(dtype):
    n, B, H, D = 2, 3, 4, 8
    launches = _kernel_bench._case_kernels(np, (dtype, n, B, H, D))
    assert [name for name, *_ in launches] == list(KERNELS)
    size = as_dtype(dtype).itemsize
    width = D + lse_pack_dim(as_dtype(dtype))
    expected = {  # bytes read, bytes written
        "pack": (B * H * D * size + B * H * 4, B * H * width * size),
        "pack_masked": (B * H * D * size + B * H * 4 + B * 8 + (B + 1) * 8,
                        B * H * width * size),
        "combine": (B * H * width * size, B * (H // n) * D * size + B * (H // n) * 4),
        "agrs_correct": (B * H * D * size + n * B * H * 4, B * H * D * 4),
        "agrs_finish": (B * (H // n) * D * 4 + B * H * 4,
                        B * (H // n) * D * size + B * (H // n) * 4),
    }
    # the tile grid: H/N = 2 rows a token along x (one warp holds both: 4 lanes a row), the
    # ranks along y for the pack and the correction (one slice of a row for the others),
    # the B tokens along z
    grids = {"pack": (1, n, B), "pack_masked": (1, n, B), "combine": (1, 1, B),
             "agrs_correct": (1, n, B), "agrs_finish": (1, 1, B)}
    for name, (kernel, grid, block, args), nread, nwritten in launches:
        assert (nread, nwritten) == expected[name], name
        assert tuple(block) == (32, 1) and tuple(grid) == grids[name], (name, grid, block)
        assert _kernel_bench.floor_blocks(grid) == (int(np.prod(grid)),)
        kernel(grid, block, 0, args)  # raises where an argument is of the wrong kind
