"""The GPU communicator and plans on one GPU (a group of one): bootstrap, identity, sync."""

import numpy as np
import pytest
from mpi4py import MPI

import cupy_dcp
from gpu import requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]


@pytest.fixture(scope="module")
def comm():
    c = cupy_dcp.Communicator.from_mpi(MPI.COMM_SELF, backend="nccl", timeout=30)
    yield c
    c.free()


def test_nccl_bootstrap_picks_a_device(comm):
    import cupy
    assert comm.world_size == 1 and comm.rank == 0
    assert comm.device == 0 and cupy.cuda.Device().id == 0
    assert comm.nccl().size() == 1


def test_synchronize_returns_once_the_stream_drains(comm):
    import cupy
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        cupy.ones(1 << 20).sum()
    comm.synchronize(stream, timeout=10)
    assert stream.done


@pytest.mark.parametrize("plan_type", [cupy_dcp.DcpA2APlan, cupy_dcp.DcpAgRsPlan])
def test_a_group_of_one_keeps_the_rows_that_are_not_empty(comm, plan_type):
    import cupy
    plan = plan_type(comm, 8, 4, 16, "bfloat16", return_lse=True)
    x = cupy.asarray(np.random.default_rng(0).standard_normal((5, 4, 16))).astype(plan.dtype)
    lse = cupy.zeros((5, 4), dtype=cupy.float16)
    got, got_lse = plan(x, lse)
    assert got is not x and bool((got.view(cupy.uint16) == x.view(cupy.uint16)).all())
    assert got_lse.dtype == cupy.float32 and got_lse.shape == (5, 4)
    assert bool((got_lse == 0).all())
    out = cupy.empty_like(x)
    got = cupy_dcp.dcp_a2a_lse_reduce(x, lse, comm, out=out)
    assert got is out and bool((out.view(cupy.uint16) == x.view(cupy.uint16)).all())


def test_plan_rejects_calls_it_was_not_built_for(comm):
    import cupy
    plan = cupy_dcp.DcpA2APlan(comm, 4, 4, 16, np.float16)
    with pytest.raises(ValueError, match=r"at most 4 tokens \(got B=5\)"):
        plan(cupy.zeros((5, 4, 16), cupy.float16), cupy.zeros((5, 4), cupy.float32))
    with pytest.raises(ValueError, match=r"this plan is for \[B, 4, 16\] float16"):
        plan(cupy.zeros((2, 4, 8), cupy.float16), cupy.zeros((2, 4), cupy.float32))
