"""The NCCL backend's errors where there is no GPU, and communicator arguments."""

import pytest
from mpi4py import MPI

import cupy_dcp
from gpu import gpu_count


@pytest.mark.skipif(gpu_count() > 0, reason="checks the error raised where there is no GPU")
def test_nccl_without_a_gpu_is_a_clear_runtime_error():
    with pytest.raises(RuntimeError, match=r"^the NCCL backend is unavailable \(rank 0: "
                                           r"(CuPy is not installed|no CUDA GPU)"):
        cupy_dcp.Communicator.from_mpi(MPI.COMM_SELF, backend="nccl")


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(backend="gloo"), ValueError, r"^backend must be one of \('auto', 'mpi', 'nccl'\) \(got 'gloo'\)$"),
    (dict(timeout=0), ValueError, r"^timeout must be > 0 seconds or None \(got 0\)$"),
    (dict(comm="world"), TypeError, r"^comm must be an mpi4py communicator \(got str\)$"),
], ids=["backend", "timeout", "comm"])
def test_bad_communicator_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        cupy_dcp.Communicator.from_mpi(**kwargs)


def test_an_mpi_communicator_has_no_nccl_communicator():
    comm = cupy_dcp.Communicator.from_mpi(MPI.COMM_SELF, backend="mpi")
    with pytest.raises(RuntimeError, match=r"backend is 'mpi': it has no NCCL communicator"):
        comm.nccl()
    comm.free()
