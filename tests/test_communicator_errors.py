"""The NCCL backend's errors where there is no GPU, and communicator arguments."""

import numpy as np
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
    (dict(device="banana"), TypeError, r"^device must be an integer \(got str 'banana'\)$"),
    (dict(device=True), TypeError, r"^device must be an integer \(got bool True\)$"),
    (dict(device=-3), ValueError, r"^device must be >= 0 \(got -3\)$"),
], ids=["backend", "timeout", "comm", "device-str", "device-bool", "device-negative"])
def test_bad_communicator_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        cupy_dcp.Communicator.from_mpi(**kwargs)


def test_an_mpi_communicator_has_no_nccl_communicator():
    comm = cupy_dcp.Communicator.from_mpi(MPI.COMM_SELF, backend="mpi")
    with pytest.raises(RuntimeError, match=r"backend is 'mpi': it has no NCCL communicator"):
        comm.nccl()
    comm.free()


@pytest.mark.skipif(gpu_count() > 0, reason="checks the error raised where there is no GPU")
@pytest.mark.parametrize("make", [
    lambda: cupy_dcp.DcpA2APlan(MPI.COMM_SELF, 4, 8, 16, "bfloat16"),
    lambda: cupy_dcp.DcpDirectPlan(MPI.COMM_SELF, 4, 8, 16, "bfloat16"),
    lambda: cupy_dcp.dcp_plan(MPI.COMM_SELF, 4, 8, 16, "float16"),
], ids=["a2a", "direct", "auto"])
def test_plans_without_a_gpu_are_a_clear_runtime_error(make):
    with pytest.raises(RuntimeError, match=r"Plan needs CuPy and a GPU: (CuPy is not installed|no CUDA GPU)"):
        make()


@pytest.mark.parametrize("kwargs, match", [
    (dict(strategy="nccl"), r"^strategy must be 'auto', 'direct' or 'a2a' \(got 'nccl'\)$"),
    (dict(strategy="direct", timeout=0), r"^timeout must be > 0 and <= 1e\+09 seconds \(got 0\)$"),
    (dict(strategy="direct", timeout=float("inf")), r"^timeout must be .* \(got inf\)$"),
    (dict(strategy="a2a", timeout=5), r"^timeout, pdl and protocols are the direct plan's; "
                                      r"strategy='a2a' takes none of them \(got timeout=5\)$"),
    (dict(strategy="a2a", pdl=False, protocols=("words",)),
     r"takes none of them \(got pdl=False, protocols=\('words',\)\)$"),
], ids=["strategy", "timeout", "infinite_timeout", "a2a_timeout", "a2a_options"])
def test_bad_plan_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cupy_dcp.dcp_plan(MPI.COMM_SELF, 4, 8, 16, "float32", **kwargs)


def test_a_bad_pdl_setting_is_a_plan_argument_error(monkeypatch):
    """Raised where bad arguments are (every rank raises together), not later."""
    monkeypatch.setenv("CUPY_DCP_PDL", "on")
    with pytest.raises(ValueError, match=r"^CUPY_DCP_PDL must be 0 or 1 \(got 'on'\)$"):
        cupy_dcp.dcp_plan(MPI.COMM_SELF, 4, 8, 16, "float32", strategy="direct")


def test_a_bad_lines_setting_is_a_plan_argument_error(monkeypatch):
    monkeypatch.setenv("CUPY_DCP_LINES", "yes")
    with pytest.raises(ValueError, match=r"^CUPY_DCP_LINES must be 0 or 1 \(got 'yes'\)$"):
        cupy_dcp.dcp_plan(MPI.COMM_SELF, 4, 8, 16, "float32", strategy="direct")


def test_plans_refuse_arrays_in_another_gpus_memory(monkeypatch):
    """The device check of plan calls (the pointer query itself needs a GPU): an address
    found in the plan's GPU's memory (or in none's) is not asked about again, one in
    another GPU's memory is refused every time."""
    from types import SimpleNamespace

    from cupy_dcp import plan as plan_module
    devices = {1: 1, 2: 0, 3: None}  # pointer -> the GPU that owns it (None: host, managed)
    asked = []
    monkeypatch.setattr(plan_module, "pointer_device", lambda p: asked.append(p) or devices[p])
    plan = object.__new__(plan_module.DcpA2APlan)
    plan.comm = SimpleNamespace(device=None)  # (a communicator over MPI picks none)
    plan._device = 0  # the GPU the plan was made on
    plan._on_device = set()
    for _ in range(2):
        plan._check_device(cp_attn_out=SimpleNamespace(ptr=2), cp_attn_lse=SimpleNamespace(ptr=3))
    assert asked == [2, 3]
    for _ in range(2):
        with pytest.raises(ValueError, match=r"^cp_attn_lse is in the memory of GPU 1, but this "
                                             r"plan runs on GPU 0 \(make that GPU current before "
                                             r"creating the rank's arrays: "
                                             r"cupy.cuda.Device\(0\).use\(\)\)$"):
            plan._check_device(cp_attn_out=SimpleNamespace(ptr=2),
                               cp_attn_lse=SimpleNamespace(ptr=1))
    assert asked == [2, 3, 1, 1]


def test_pointer_device_is_none_without_a_gpu_pointer():
    from cupy_dcp.kernels._arrays import pointer_device
    assert pointer_device(0) is None


def _bare_plan(return_lse):
    """A plan's argument checks without a GPU: the attributes they read."""
    from types import SimpleNamespace

    from cupy_dcp import plan as plan_module
    plan = object.__new__(plan_module.DcpA2APlan)
    plan._closed, plan._repeats = False, {}
    plan.comm = SimpleNamespace(world_size=2, device=0)
    plan.num_heads, plan.head_dim, plan.max_tokens, plan.local_heads = 4, 8, 3, 2
    plan.dtype, plan.return_lse = np.dtype(np.float32), return_lse
    return plan


def test_a_plan_refuses_an_out_lse_it_would_not_write():
    x, lse = np.zeros((3, 4, 8), np.float32), np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match=r"^out_lse is for a plan that returns the LSE "
                                         r"\(return_lse=True\); this one does not"):
        _bare_plan(False)(x, lse, out_lse=np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match=r"^out_lse must have shape \(3, 2\) \(got \(3, 4\)\)$"):
        _bare_plan(True)(x, lse, out_lse=np.zeros((3, 4), np.float32))


@pytest.mark.parametrize("timeout, error", [(-1, ValueError), ("5", TypeError)])
def test_a_direct_plans_synchronize_checks_its_timeout(timeout, error):
    """Refused before any wait (the base plans' go through Communicator.limit)."""
    plan = object.__new__(cupy_dcp.DcpDirectPlan)
    with pytest.raises(error, match=r"^timeout must be"):
        plan.synchronize(timeout=timeout)


def test_plan_sizes_are_checked_as_python_integers():
    """NumPy's int32 would wrap the product of max_tokens and num_heads past 2**31."""
    with pytest.raises(ValueError, match=r"^max_tokens \* num_heads must be below 2\*\*31 "
                                         r"\(got 1048576 \* 4096\)$"):
        cupy_dcp.DcpA2APlan(MPI.COMM_SELF, np.int32(2 ** 20), np.int32(2 ** 12), 8, "float16")


class _Plan:
    def __init__(self, fails=False):
        self.closed, self.fails = False, fails

    def close(self):
        self.closed = True
        if self.fails:
            raise RuntimeError("close failed")


def test_free_closes_the_cached_plans():
    """The functional API's plans (and the retired ones a graph may have captured) hold
    page-locked memory: ``free`` closes them, and frees the communicator even where a
    plan's close fails."""
    comm = cupy_dcp.Communicator.from_mpi(MPI.COMM_SELF, backend="mpi")
    current, retired = _Plan(), [_Plan(), _Plan()]
    comm.cached_plans.update({("stream", "a2a"): current, "retired": retired})
    comm.free()
    assert current.closed and all(plan.closed for plan in retired)
    assert comm.cached_plans == {}
    comm = cupy_dcp.Communicator.from_mpi(MPI.COMM_SELF, backend="mpi")
    comm.cached_plans[("stream", "a2a")] = _Plan(fails=True)
    with pytest.raises(RuntimeError, match="^close failed$"):
        comm.free()
    with pytest.raises(RuntimeError, match=r"was freed"):
        comm.check_usable()
