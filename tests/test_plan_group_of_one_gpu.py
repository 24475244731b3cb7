"""Plans of one rank follow the rules of a larger group, as the functional API's group
of one does: masked tokens and empty rows (NaN or infinite LSE) give 0 and LSE -inf,
bit for bit the host combine's answer; the inputs are never written."""

import numpy as np
import pytest
from mpi4py import MPI

import cupy_dcp
from cupy_dcp.layout import BFLOAT16, bits_dtype
from gpu import requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]

PLANS = [cupy_dcp.DcpA2APlan, cupy_dcp.DcpAgRsPlan, cupy_dcp.DcpDirectPlan]


def _case(dtype):
    rng = np.random.default_rng(17)
    x = rng.standard_normal((9, 4, 6)).astype(np.float32).astype(dtype)
    x[0, 1, :3] = -0.0
    x[1, 2] = np.nan  # under a NaN LSE: must not leak
    lse = rng.uniform(-3, 3, (9, 4)).astype(np.float32)
    lse[1, 2], lse[4, 0], lse[6, 3] = np.nan, np.inf, -np.inf
    masks = dict(seq_lens=np.array([2, 0, 0, 3, 1], np.int32),
                 query_start_loc=np.array([1, 3, 5, 5, 7, 8], np.int64))
    return x, lse, masks


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16, np.float32], ids=str)
@pytest.mark.parametrize("plan_type", PLANS, ids=lambda p: p.__name__)
def test_a_plan_of_one_rank_is_the_host_combine(plan_type, dtype, masked):
    import cupy

    x, lse, masks = _case(dtype)
    masks = masks if masked else {}
    want, want_lse = cupy_dcp.dcp_a2a_lse_reduce(x, lse, MPI.COMM_SELF, return_lse=True, **masks)
    bits = bits_dtype(dtype)
    comm = cupy_dcp.Communicator.from_mpi(MPI.COMM_SELF, backend="mpi", timeout=30)
    with plan_type(comm, 12, 4, 6, dtype, return_lse=True) as plan:
        dx, dlse = cupy.asarray(x), cupy.asarray(lse)
        dmasks = {k: cupy.asarray(v) for k, v in masks.items()}
        for given in (False, True):
            out = cupy.full(x.shape, np.nan, dtype=dx.dtype) if given else None
            out_lse = cupy.full(lse.shape, np.nan, dtype=cupy.float32) if given else None
            got, got_lse = plan(dx, dlse, out=out, out_lse=out_lse, **dmasks)
            cupy.cuda.get_current_stream().synchronize()
            if given:
                assert got is out and got_lse is out_lse
            assert got is not dx
            np.testing.assert_array_equal(cupy.asnumpy(got).view(bits), want.view(bits))
            np.testing.assert_array_equal(cupy.asnumpy(got_lse), want_lse)
        np.testing.assert_array_equal(cupy.asnumpy(dx).view(bits), x.view(bits))
        np.testing.assert_array_equal(cupy.asnumpy(dlse), lse)
    comm.free()
    # the comparison covers empty rows: the host combine left them 0 with LSE -inf
    empty = ([0, 8], slice(None)) if masked else ([1, 4], [2, 0])
    assert (want[empty] == 0).all() and (want_lse[empty] == -np.inf).all()


@pytest.mark.parametrize("plan_type", PLANS, ids=lambda p: p.__name__)
def test_a_plan_of_one_rank_refuses_a_capture(plan_type):
    """Its call makes temporary CuPy arrays, whose memory the pool would hand out again
    while a replay still wrote it: a capture raises, and an eager call still works."""
    import cupy

    x, lse, _ = _case(np.float32)
    comm = cupy_dcp.Communicator.from_mpi(MPI.COMM_SELF, backend="mpi", timeout=30)
    with plan_type(comm, 12, 4, 6, np.float32) as plan:
        dx, dlse = cupy.asarray(x), cupy.asarray(lse)
        stream = cupy.cuda.Stream(non_blocking=True)
        plan(dx, dlse, stream=stream)  # warm
        stream.synchronize()
        stream.begin_capture()
        try:
            with pytest.raises(RuntimeError, match=r"of one rank cannot be captured in a CUDA "
                                                   r"graph"):
                plan(dx, dlse, stream=stream)
        finally:
            stream.end_capture()
        got = plan(dx, dlse, stream=stream)
        stream.synchronize()
        assert got.shape == x.shape
    comm.free()


@pytest.mark.parametrize("plan_type", PLANS, ids=lambda p: p.__name__)
def test_a_plan_of_one_rank_checks_its_arrays_as_a_group_does(plan_type):
    """Host arrays, and results that share memory with each other, are refused: the
    checks of a larger group's call."""
    import cupy

    x, lse, _ = _case(np.float32)
    comm = cupy_dcp.Communicator.from_mpi(MPI.COMM_SELF, backend="mpi", timeout=30)
    with plan_type(comm, 12, 4, 6, np.float32, return_lse=True) as plan:
        dx, dlse = cupy.asarray(x), cupy.asarray(lse)
        with pytest.raises(TypeError, match=r"^cp_attn_out must be a device array"):
            plan(x, dlse)
        store = cupy.zeros(x.size + lse.size, cupy.float32)
        out = store[:x.size].reshape(x.shape)
        with pytest.raises(ValueError, match=r"^out_lse shares memory with out"):
            plan(dx, dlse, out=out, out_lse=store[x.size - 4:x.size - 4 + lse.size].reshape(
                lse.shape))  # its first 4 values are out's last
        got, got_lse = plan(dx, dlse, out=out, out_lse=store[x.size:].reshape(lse.shape))
        assert got is out  # apart, in the same buffer: the call runs
    comm.free()


def test_mapped_words_dropped_unfreed_are_freed_at_the_next_safe_point():
    """An A2A plan's status words are page-locked: dropped without ``close()``, they are
    freed by the next creation (never in a finaliser, which may run in a capture)."""
    import gc

    import cupy

    from cupy_dcp import _divergence

    gc.collect()
    _divergence._free_orphans()
    words = _divergence.MappedWords(16, None)
    assert words.device == cupy.cuda.runtime.getDevice()
    del words
    gc.collect()
    assert len(_divergence._ORPHANS) == 1
    kept = _divergence.MappedWords(16, None)
    assert _divergence._ORPHANS == []
    kept.free()
    kept.free()  # idempotent
    assert kept.ptr == 0
