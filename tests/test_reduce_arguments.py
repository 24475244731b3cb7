"""dcp_a2a_lse_reduce at its public boundary: bad inputs, untouched inputs, LSE conversion.

Validation runs before anything is exchanged, so a Communicator over
``COMM_SELF`` whose ``world_size`` is set by hand stands in for a group of N.
"""

import importlib.util
import warnings

import numpy as np
import pytest
from mpi4py import MPI

from cupy_dcp import Communicator, dcp_a2a_lse_reduce
from cupy_dcp.layout import BFLOAT16


def _fake_group(world_size):
    comm = Communicator(MPI.COMM_SELF)
    comm.world_size = world_size
    return comm


def _inputs(B=2, H=6, D=8, dtype=np.float16, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, H, D)).astype(dtype),
            rng.uniform(-5, 5, (B, H)).astype(np.float32))


class _DeviceLike:
    """A device array's face (shape, dtype, no NumPy conversion)."""

    def __init__(self, values):
        self.shape, self.dtype = values.shape, values.dtype

    def __array__(self, *args, **kwargs):
        raise TypeError("no implicit conversion to a NumPy array")


class _CudaLike(_DeviceLike):
    """A device array's face that ``is_device_array`` takes for one."""

    @property
    def __cuda_array_interface__(self):
        return dict(shape=self.shape, typestr=self.dtype.str, data=(0, False), version=3)


class _ForeignDtype:
    """An array whose dtype NumPy cannot name (another framework's)."""

    def __init__(self, shape):
        self.shape, self.dtype = shape, object()


X, LSE = _inputs()
I64 = np.int64
_BEYOND = LSE.astype(np.float64)
_BEYOND[1, 4] = -1e300

# id: (kwargs of dcp_a2a_lse_reduce, exception, message)
BAD = {
    "out-2d": (dict(cp_attn_out=X[0], cp_attn_lse=LSE), ValueError,
               r"^cp_attn_out must be \[B, H, D\] \(got shape \(6, 8\)\)$"),
    "out-4d": (dict(cp_attn_out=X[None], cp_attn_lse=LSE), ValueError,
               r"^cp_attn_out must be \[B, H, D\] \(got shape \(1, 2, 6, 8\)\)$"),
    "head-size-0": (dict(cp_attn_out=X[..., :0], cp_attn_lse=LSE), ValueError,
                    r"^cp_attn_out head size D must be >= 1 \(got 0\)$"),
    "lse-shape": (dict(cp_attn_out=X, cp_attn_lse=LSE[:, :3]), ValueError,
                  r"^cp_attn_lse must be \[B, H\] = \(2, 6\) \(got shape \(2, 3\)\)$"),
    "lse-transposed": (dict(cp_attn_out=X, cp_attn_lse=LSE.T), ValueError,
                       r"^cp_attn_lse must be \[B, H\] = \(2, 6\) \(got shape \(6, 2\)\)$"),
    "lse-int32": (dict(cp_attn_out=X, cp_attn_lse=LSE.astype(np.int32)), TypeError,
                  r"^cp_attn_lse must be a float array \(got dtype int32\)$"),
    "lse-complex": (dict(cp_attn_out=X, cp_attn_lse=LSE.astype(np.complex64)), TypeError,
                    r"^cp_attn_lse must be a float array \(got dtype complex64\)$"),
    "out-float64": (dict(cp_attn_out=X.astype(np.float64), cp_attn_lse=LSE), TypeError,
                    r"^cp_attn_out dtype must be float16, bfloat16 or float32 \(got float64\)$"),
    "out-int32": (dict(cp_attn_out=X.astype(np.int32), cp_attn_lse=LSE), TypeError,
                  r"^cp_attn_out dtype must be float16, bfloat16 or float32 \(got int32\)$"),
    "heads-not-divisible": (dict(cp_attn_out=X, cp_attn_lse=LSE, comm=_fake_group(4)), ValueError,
                            r"^num_heads must be divisible by world_size \(got H=6, N=4\)$"),
    "result-shape": (dict(cp_attn_out=X, cp_attn_lse=LSE, comm=_fake_group(3),
                          out=np.empty((2, 6, 8), np.float16)), ValueError,
                     r"^out must have shape \(2, 2, 8\) \(got \(2, 6, 8\)\)$"),
    "result-dtype": (dict(cp_attn_out=X, cp_attn_lse=LSE, out=np.empty((2, 3, 8), np.float32)),
                     TypeError, r"^out must have dtype float16 \(got float32\)$"),
    "result-bf16-for-fp16": (dict(cp_attn_out=X, cp_attn_lse=LSE,
                                  out=np.empty((2, 3, 8), BFLOAT16)),
                             TypeError, r"^out must have dtype float16 \(got bfloat16\)$"),
    "seq-lens-alone": (dict(cp_attn_out=X, cp_attn_lse=LSE, seq_lens=np.ones(2, I64)), ValueError,
                       r"^seq_lens and query_start_loc must be given together \(got only seq_lens\)$"),
    "query-start-loc-alone": (dict(cp_attn_out=X, cp_attn_lse=LSE,
                                   query_start_loc=np.arange(3, dtype=I64)), ValueError,
                              r"^seq_lens and query_start_loc must be given together "
                              r"\(got only query_start_loc\)$"),
    "query-start-loc-length": (dict(cp_attn_out=X, cp_attn_lse=LSE, seq_lens=np.ones(3, I64),
                                    query_start_loc=np.arange(3, dtype=I64)), ValueError,
                               r"^query_start_loc must have len\(seq_lens\) \+ 1 entries "
                               r"\(got 3 for 3 sequences\)$"),
    "seq-lens-float": (dict(cp_attn_out=X, cp_attn_lse=LSE, seq_lens=np.ones(2, np.float32),
                            query_start_loc=np.arange(3, dtype=I64)), TypeError,
                       r"^seq_lens must be a 1-D integer array \(got float32 of shape \(2,\)\)$"),
    "query-start-loc-2d": (dict(cp_attn_out=X, cp_attn_lse=LSE, seq_lens=np.ones(2, I64),
                                query_start_loc=np.arange(3, dtype=I64)[None]), TypeError,
                           r"^query_start_loc must be a 1-D integer array "
                           r"\(got int64 of shape \(1, 3\)\)$"),
    "result-byte-order": (dict(cp_attn_out=X.astype(">f2"), cp_attn_lse=LSE,
                               out=np.empty((2, 3, 8), np.float16)), TypeError,
                          r"^out must have dtype >f2 \(got float16\) \(the byte orders differ\)$"),
    "result-overlapping": (dict(cp_attn_out=X, cp_attn_lse=LSE,
                                out=np.lib.stride_tricks.as_strided(
                                    np.empty((2, 3, 8), np.float16), strides=(16, 8, 2))),
                           ValueError, r"^out must not have elements that share memory \(got "
                           r"shape \(2, 3, 8\), strides \(16, 8, 2\)\)"),
    "masks-not-host": (dict(cp_attn_out=X, cp_attn_lse=LSE, seq_lens=_DeviceLike(np.ones(2, I64)),
                            query_start_loc=_DeviceLike(np.arange(3, dtype=I64))), TypeError,
                       r"^host inputs take host seq_lens and query_start_loc "
                       r"\(got _DeviceLike and _DeviceLike\)$"),
    "out-not-host": (dict(cp_attn_out=X, cp_attn_lse=LSE,
                          out=_DeviceLike(np.empty((2, 3, 8), np.float16))), TypeError,
                     r"^host inputs take a host out \(got _DeviceLike\)$"),
    "out-masked-array": (dict(cp_attn_out=np.ma.masked_array(X), cp_attn_lse=LSE), TypeError,
                         r"^cp_attn_out must not be a masked array: its mask would be ignored"),
    "lse-masked-array": (dict(cp_attn_out=X, cp_attn_lse=np.ma.masked_array(LSE)), TypeError,
                         r"^cp_attn_lse must not be a masked array: its mask would be ignored"),
    "lse-beyond-float32": (dict(cp_attn_out=X, cp_attn_lse=_BEYOND), ValueError,
                           r"^cp_attn_lse must fit float32: -1e\+300 at \(1, 4\) is beyond"),
    "return-lse-str": (dict(cp_attn_out=X, cp_attn_lse=LSE, return_lse="False"), TypeError,
                       r"^return_lse must be True or False \(got 'False'\)$"),
    "check-consistency-str": (dict(cp_attn_out=X, cp_attn_lse=LSE, check_consistency="no"),
                              TypeError, r"^check_consistency must be True or False \(got 'no'\)$"),
    "result-foreign-dtype": (dict(cp_attn_out=X, cp_attn_lse=LSE, out=_ForeignDtype((2, 3, 8))),
                             TypeError, r"^out must have dtype float16 \(got <object object"),
    "comm-type": (dict(cp_attn_out=X, cp_attn_lse=LSE, comm="world"), TypeError,
                  r"^comm must be a cupy_dcp.Communicator or an mpi4py communicator \(got str\)$"),
}


def _bytes(a):
    return np.ascontiguousarray(a).view(np.uint8)


def _snapshot(kwargs):
    return {k: v.copy() for k, v in kwargs.items() if isinstance(v, np.ndarray)}


@pytest.mark.parametrize("kwargs, error, message", BAD.values(), ids=BAD.keys())
def test_bad_inputs_raise_and_leave_arrays_untouched(kwargs, error, message):
    kwargs = dict(kwargs)
    kwargs.setdefault("comm", _fake_group(2))
    before = _snapshot(kwargs)
    with pytest.raises(error, match=message), warnings.catch_warnings():
        warnings.simplefilter("error")  # the error itself, not a warning on the way
        dcp_a2a_lse_reduce(**kwargs)
    for name, value in before.items():
        np.testing.assert_array_equal(_bytes(kwargs[name]), _bytes(value), err_msg=name)


def test_backend_is_checked():
    with pytest.raises(ValueError, match=r"^backend must be one of \('auto', 'mpi', 'nccl'\) "
                                         r"\(got 'gloo'\)$"):
        Communicator.from_mpi(MPI.COMM_SELF, backend="gloo")
    with pytest.raises(TypeError, match=r"^comm must be an mpi4py communicator \(got list\)$"):
        Communicator.from_mpi([])


COMMS = {"mpi4py": lambda: MPI.COMM_SELF, "Communicator": lambda: Communicator.from_mpi(MPI.COMM_SELF)}


@pytest.mark.parametrize("make_comm", COMMS.values(), ids=COMMS.keys())
@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16, np.float32], ids=str)
def test_group_of_one_returns_its_inputs(make_comm, dtype):
    x, lse = _inputs(dtype=dtype)
    x_before, lse_before = x.copy(), lse.copy()
    result, global_lse = dcp_a2a_lse_reduce(x, lse, make_comm(), return_lse=True)
    assert result.dtype == dtype and global_lse.dtype == np.float32
    np.testing.assert_array_equal(result.view(np.uint8), x_before.view(np.uint8))
    np.testing.assert_array_equal(global_lse, lse_before)
    np.testing.assert_array_equal(x.view(np.uint8), x_before.view(np.uint8))
    np.testing.assert_array_equal(lse, lse_before)


def test_group_of_one_fills_a_strided_out():
    x, lse = _inputs(dtype=BFLOAT16)
    buf = np.zeros((6, 2, 8), dtype=BFLOAT16)
    out = buf.transpose(1, 0, 2)
    result = dcp_a2a_lse_reduce(x, lse, MPI.COMM_SELF, out=out)
    assert result is out
    np.testing.assert_array_equal(buf.transpose(1, 0, 2).view(np.uint16), x.view(np.uint16))


@pytest.mark.parametrize("lse_dtype", [np.float16, BFLOAT16, np.float64], ids=str)
def test_lse_is_converted_by_value(lse_dtype):
    x, _ = _inputs()
    lse = np.array([[1.5, -2.25, 3.0, 0.0, -0.5, 7.0], [-8.0, 0.125, -np.inf, np.inf, 2.0, 4.0]],
                   dtype=lse_dtype)
    _, global_lse = dcp_a2a_lse_reduce(x, lse, MPI.COMM_SELF, return_lse=True)
    assert global_lse.dtype == np.float32
    expected = lse.astype(np.float64).astype(np.float32)
    expected[expected == np.inf] = -np.inf  # +inf means "empty", as in a group of two
    np.testing.assert_array_equal(global_lse, expected)



def _nccl_group(world_size):
    comm = Communicator(MPI.COMM_SELF, backend="nccl")  # (NCCL itself is built by from_mpi)
    comm.world_size = world_size
    return comm


@pytest.mark.parametrize("x, lse, error, message", [
    (X, _CudaLike(LSE), TypeError, r"^cp_attn_out and cp_attn_lse must both be host \(NumPy, "
     r"or on the CPU by DLPack\) or both be device arrays \(got ndarray and _CudaLike\)$"),
    ([1.0], LSE, TypeError, r"^cp_attn_out must be an array \(NumPy, CuPy or any DLPack / CUDA "
     r"array\) \(got list\)$"),
    (X, LSE, RuntimeError, r"^this communicator's backend is 'nccl': host arrays need 'mpi' or "
     r"'auto'$"),
], ids=["mixed", "list", "host"])
def test_an_nccl_communicator_names_what_is_wrong_with_a_call_it_cannot_take(x, lse, error,
                                                                             message):
    with pytest.raises(error, match=message):
        dcp_a2a_lse_reduce(x, lse, _nccl_group(2))


def test_the_functional_plans_hold_every_sequence():
    """A call with more sequences than tokens (empty sequences) is valid: the plan the
    functional API makes for it must take that many sequences too."""
    from cupy_dcp.reduce import _plan_size

    assert _plan_size(3, None) == 4 and _plan_size(4, None) == 4 and _plan_size(0, None) == 1
    assert _plan_size(3, np.zeros(5, I64)) == 8
    assert _plan_size(9, np.zeros(2, I64)) == 16


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="checks the error raised where CuPy is missing")
@pytest.mark.parametrize("world_size, message", [
    (1, r"^a call on device arrays needs CuPy, which is not installed"),
    (2, r"^DcpA2APlan needs CuPy and a GPU: CuPy is not installed"),
], ids=["one", "two"])
def test_device_arrays_without_cupy_are_a_clear_error(world_size, message):
    """A rank without CuPy raises a RuntimeError (in a group, from the plan's creation,
    which its peers join: they raise too, instead of waiting)."""
    comm = Communicator(MPI.COMM_SELF)
    comm.world_size = world_size
    with pytest.raises(RuntimeError, match=message):
        dcp_a2a_lse_reduce(_CudaLike(X), _CudaLike(LSE), comm)
    with pytest.raises(RuntimeError, match=r"^rank 0: synchronize \(a wait on a GPU stream\) "
                                           r"needs CuPy"):
        Communicator.from_mpi(MPI.COMM_SELF, backend="mpi").synchronize()
