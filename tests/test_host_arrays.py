"""Host arrays of other frameworks on the host path (``cupy_dcp._host_arrays``):
read and written in place through DLPack, bfloat16 included.

``_Exporter`` stands for a framework's CPU array (PyTorch's, JAX's): it hands out
NumPy's own DLPack capsule, with the type code a framework gives bfloat16
(which NumPy's DLPack cannot carry). The PyTorch test runs where torch is
installed."""

import ctypes

import numpy as np
import pytest
from mpi4py import MPI

import cupy_dcp
from cupy_dcp._host_arrays import host_view, is_host_array
from cupy_dcp.layout import as_dtype

BF16 = as_dtype("bfloat16")
_TENSOR_AT = {b"dltensor": 0, b"dltensor_versioned": 32}  # DLPack's structs
_GET_NAME = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(
    ("PyCapsule_GetName", ctypes.pythonapi))
_GET_POINTER = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


class _Exporter:
    """A CPU array of another framework: shape, dtype, DLPack and nothing else (no
    ``__array__``). ``code``: the DLPack type code its capsules carry (4: bfloat16);
    ``device``: the DLPack device it reports; ``versioned``: whether it knows
    DLPack 1.0's ``max_version``."""

    def __init__(self, values, code=None, device=1, versioned=True):
        self._values, self._code, self._device = values, code, device
        self._versioned = versioned
        self.shape, self.dtype = values.shape, values.dtype

    def __dlpack__(self, stream=None, max_version=None, **kwargs):
        if max_version is not None and not self._versioned:
            raise TypeError("max_version is not known here")
        bits = self._values.view(np.uint16) if self.dtype == BF16 else self._values
        capsule = bits.__dlpack__(max_version=max_version) if max_version else \
            bits.__dlpack__()
        if self._code is not None:
            name = _GET_NAME(capsule)
            ctypes.c_uint8.from_address(_GET_POINTER(capsule, name) + _TENSOR_AT[name] + 20) \
                .value = self._code
        return capsule

    def __dlpack_device__(self):
        return (self._device, 0)


def _bf16(values):
    return _Exporter(np.asarray(values, np.float32).astype(BF16), code=4)


@pytest.mark.parametrize("versioned", [True, False], ids=["dlpack1", "legacy"])
def test_a_bfloat16_host_array_is_viewed_in_place(versioned):
    values = np.arange(6, dtype=np.float32).reshape(2, 3).astype(BF16)
    exporter = _Exporter(values, code=4, versioned=versioned)
    view = host_view(exporter, "x")
    assert view.dtype == BF16 and view.shape == (2, 3)
    assert view.ctypes.data == values.ctypes.data  # the same memory, no copy
    np.testing.assert_array_equal(view.astype(np.float32), values.astype(np.float32))
    if versioned:  # writable (an old capsule comes in read-only)
        view[1, 2] = 7.5
        assert float(values[1, 2]) == 7.5
    assert not view.flags.writeable or versioned


def test_host_arrays_are_told_from_device_ones():
    host = _Exporter(np.zeros(3, np.float16))
    device = _Exporter(np.zeros(3, np.float16), device=2)  # kDLCUDA
    assert is_host_array(np.zeros(1)) and is_host_array(host)
    assert not is_host_array(device) and not is_host_array(_Exporter) and not is_host_array(3)
    assert host_view(device) is device  # left for the device path
    view = host_view(host)
    assert isinstance(view, np.ndarray) and view.dtype == np.float16


def test_a_capsule_that_is_not_bfloat16_is_refused():
    fake = _Exporter(np.zeros(3, np.float32).astype(BF16), code=1)  # says uint16 inside
    with pytest.raises(TypeError, match=r"^x cannot be read through DLPack \(_Exporter of dtype "
                                        r"bfloat16: its DLPack export holds type code 1 of 16 "
                                        r"bits, not bfloat16\)$"):
        host_view(fake, "x")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_the_host_path_takes_other_frameworks_arrays(dtype):
    """The same bits as from NumPy arrays; ``out`` written in place and returned as
    given; masks too (a group of one runs the host path's combine)."""
    rng = np.random.default_rng(3)
    dt = as_dtype(dtype)
    x = rng.standard_normal((5, 4, 9)).astype(np.float32).astype(dt)
    lse = rng.standard_normal((5, 4)).astype(np.float32)
    lse[1, 2] = np.inf  # an empty row
    seq_lens, qsl = np.array([3, 0], np.int64), np.array([0, 2, 4], np.int64)

    def wrap(a):
        return _Exporter(a, code=4 if a.dtype == BF16 else None)

    comm = cupy_dcp.Communicator.from_mpi(MPI.COMM_SELF, backend="mpi")
    try:
        want, want_lse = cupy_dcp.dcp_a2a_lse_reduce(x, lse, comm, return_lse=True,
                                                     seq_lens=seq_lens, query_start_loc=qsl)
        out_values = np.full((5, 4, 9), np.nan, np.float32).astype(dt)
        out = wrap(out_values)
        got, got_lse = cupy_dcp.dcp_a2a_lse_reduce(wrap(x), wrap(lse), comm, return_lse=True,
                                                   out=out, seq_lens=wrap(seq_lens),
                                                   query_start_loc=wrap(qsl))
    finally:
        comm.free()
    assert got is out
    np.testing.assert_array_equal(out_values.view(np.uint8), want.view(np.uint8))
    np.testing.assert_array_equal(got_lse, want_lse)
    assert np.isneginf(want_lse[1, 2]) and np.isneginf(want_lse[4]).all()  # empty, padding


class _Bare:
    """DLPack alone: no ``shape`` nor ``dtype`` (the protocol asks for neither)."""

    def __init__(self, values):
        self._values = values

    def __dlpack__(self, **kwargs):
        return self._values.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._values.__dlpack_device__()


def test_a_bare_dlpack_exporter_is_read_through_dlpack():
    """It was an AttributeError (its dtype was asked for); it gives NumPy's bits."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 6)).astype(np.float16)
    lse = rng.standard_normal((3, 4)).astype(np.float32)
    comm = cupy_dcp.Communicator.from_mpi(MPI.COMM_SELF, backend="mpi")
    try:
        want = cupy_dcp.dcp_a2a_lse_reduce(x, lse, comm)
        got = cupy_dcp.dcp_a2a_lse_reduce(_Bare(x), _Bare(lse), comm)
    finally:
        comm.free()
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    assert host_view(_Bare(x), "x").dtype == np.float16


def test_mixed_host_and_device_arrays_are_refused():
    comm = cupy_dcp.Communicator.from_mpi(MPI.COMM_SELF, backend="mpi")
    try:
        with pytest.raises(TypeError, match=r"^cp_attn_out and cp_attn_lse must both be host "
                                            r"\(NumPy, or on the CPU by DLPack\) or both be "
                                            r"device arrays \(got ndarray and _Exporter\)$"):
            cupy_dcp.dcp_a2a_lse_reduce(_bf16(np.zeros((2, 2, 4))),
                                        _Exporter(np.zeros((2, 2), np.float32), device=2), comm)
    finally:
        comm.free()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_torch_cpu_tensors_on_the_host_path(dtype):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 4, 8)).astype(np.float32)
    lse = rng.standard_normal((3, 4)).astype(np.float32)
    tdt = getattr(torch, dtype)
    tx = torch.from_numpy(x).to(tdt)
    bits = tx.view(torch.int16).numpy() if dtype != "float32" else tx.numpy()
    comm = cupy_dcp.Communicator.from_mpi(MPI.COMM_SELF, backend="mpi")
    try:
        want = cupy_dcp.dcp_a2a_lse_reduce(bits.view(as_dtype(dtype)), lse, comm)
        out = torch.empty(3, 4, 8, dtype=tdt)
        got = cupy_dcp.dcp_a2a_lse_reduce(tx, torch.from_numpy(lse), comm, out=out)
        with pytest.raises(TypeError, match=r"^cp_attn_out cannot be read through DLPack "
                                            r"\(Tensor of dtype"):
            cupy_dcp.dcp_a2a_lse_reduce(tx.clone().requires_grad_(True),  # not exported
                                        torch.from_numpy(lse), comm)
    finally:
        comm.free()
    assert got is out
    out_bits = out.view(torch.int16).numpy() if dtype != "float32" else out.numpy()
    np.testing.assert_array_equal(out_bits.view(np.uint8), want.view(np.uint8))


def test_the_reference_takes_other_frameworks_arrays():
    rng = np.random.default_rng(5)
    outputs = rng.standard_normal((2, 3, 4, 5)).astype(np.float32).astype(BF16)
    lses = rng.standard_normal((2, 3, 4)).astype(np.float32)
    want = cupy_dcp.lse_weighted_combine(outputs, lses, return_lse=True)
    got = cupy_dcp.lse_weighted_combine(_Exporter(outputs, code=4), _Exporter(lses),
                                        return_lse=True)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)
    send = cupy_dcp.pack_reference(_Exporter(outputs[0], code=4), _Exporter(lses[0]), 2)
    np.testing.assert_array_equal(send.view(np.uint16),
                                  cupy_dcp.pack_reference(outputs[0], lses[0], 2).view(np.uint16))
