"""A group of one on the GPU (functional API) gives the host path's bits: masks, NaN,
+inf and -inf LSEs are empty rows there too."""

import numpy as np
import pytest
from mpi4py import MPI

import cupy_dcp
from cupy_dcp.layout import BFLOAT16, bits_dtype
from gpu import requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]


@pytest.mark.parametrize("strategy", ["a2a", "ag_rs"])
@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16, np.float32], ids=str)
def test_a_device_group_of_one_matches_the_host(dtype, strategy):
    import cupy

    reduce = {"a2a": cupy_dcp.dcp_a2a_lse_reduce, "ag_rs": cupy_dcp.dcp_ag_rs_lse_reduce}[strategy]
    rng = np.random.default_rng(11)
    x = rng.standard_normal((9, 4, 6)).astype(np.float32).astype(dtype)
    x[0, 1, :3] = -0.0
    lse = rng.uniform(-3, 3, (9, 4)).astype(np.float32)
    lse[1, 2], lse[4, 0], lse[6, 3] = np.nan, np.inf, -np.inf
    masks = dict(seq_lens=np.array([2, 0, 0, 3, 1], np.int32),
                 query_start_loc=np.array([1, 3, 5, 5, 7, 8], np.int64))
    want, want_lse = reduce(x, lse, MPI.COMM_SELF, return_lse=True, **masks)
    out = cupy.full((9, 4, 6), np.nan, dtype=x.dtype)
    got, got_lse = reduce(cupy.asarray(x), cupy.asarray(lse), MPI.COMM_SELF, return_lse=True,
                          out=out, **{k: cupy.asarray(v) for k, v in masks.items()})
    assert got is out
    bits = bits_dtype(dtype)
    np.testing.assert_array_equal(cupy.asnumpy(got).view(bits), want.view(bits))
    np.testing.assert_array_equal(cupy.asnumpy(got_lse), want_lse)
