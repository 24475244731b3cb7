"""Run under ``mpiexec -n K`` with an empty ``CUPY_DCP_CACHE_DIR``: every rank compiles
and loads the host kernels at the same moment, then checks its results exactly
against the NumPy reference and reports its counts (``run_worker``, ``test_cache.py``)."""

import numpy as np
from mpi4py import MPI

import cupy_dcp
from _helpers import run_worker
from cupy_dcp.kernels import _cache


def main():
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    rng = np.random.default_rng(rank)
    n, b, h, d = 3, 2, 5, 7
    outputs = rng.standard_normal((n, b, h, d)).astype(np.float32)
    lses = (4 * rng.standard_normal((n, b, h))).astype(np.float32)
    comm.Barrier()  # all at once, into one empty folder
    for _ in range(2):  # the second round finds what the others stored meanwhile
        out, out_lse = np.empty((b, h, d)), np.empty((b, h))
        cupy_dcp.kernels.combine_host(outputs, lses, out, out_lse)
        want, want_lse = cupy_dcp.lse_weighted_combine(outputs.astype(np.float64), lses,
                                                       return_lse=True)
        assert np.allclose(out, want, rtol=1e-12, atol=1e-12), rank
        assert np.allclose(out_lse, want_lse, rtol=1e-12, atol=1e-12), rank
        bits = rng.integers(0, 1 << 16, (b, n * h, d), dtype=np.uint16)
        lse_bits = rng.integers(0, 1 << 32, (b, n * h), dtype=np.uint32)
        send = np.zeros((n, b, h, d + 2), np.uint16)
        cupy_dcp.kernels.pack_host(bits, lse_bits, send)
        for r in range(n):
            assert (send[r, :, :, :d] == bits[:, r * h:(r + 1) * h]).all(), rank
            assert (send[r, :, :, d] == (lse_bits[:, r * h:(r + 1) * h] & 0xFFFF)).all(), rank
    comm.Barrier()
    counts = _cache.stats()
    assert counts["rebuilt"] == 0, counts
    return {"compiled": counts["compiled"], "loaded": counts["loaded"], "exact": True}


if __name__ == "__main__":
    run_worker(main)
