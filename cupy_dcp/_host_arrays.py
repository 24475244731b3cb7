"""Host arrays of any framework, seen as NumPy arrays without a copy.

The host path takes NumPy arrays and any array whose DLPack device is the CPU
(a PyTorch CPU tensor, a JAX array on the CPU). Such an array is read and
written in place through :func:`numpy.from_dlpack`. NumPy's DLPack has no
bfloat16, so a bfloat16 array is first handed over as uint16 and then viewed
as ``ml_dtypes.bfloat16``: the type code of the DLPack tensor this call was
given (its own export, which nobody else reads) is rewritten before NumPy
reads it.
"""

import ctypes

import numpy as np

from .layout import as_dtype, is_bfloat16

__all__ = ["host_view", "is_device_array", "is_host_array"]

KDL_CPU = 1  # DLPack's device type of host memory
_KDL_UINT, _KDL_BFLOAT = 1, 4  # DLPack's type codes
# where a DLTensor sits in the capsule's struct, by the capsule's name: first in
# DLManagedTensor; after the version, manager context, deleter and flags (8 bytes
# each) in DLManagedTensorVersioned
_TENSOR_AT = {b"dltensor": 0, b"dltensor_versioned": 32}
_DTYPE_AT = 20  # DLTensor.dtype: after the data pointer (8), device (8) and ndim (4)


def _dlpack_device_type(obj):
    """The DLPack device type ``obj`` reports (``KDL_CPU`` for host memory), or ``None``
    where it reports none (no ``__dlpack_device__``, a class, or an exporter that
    cannot say)."""
    if isinstance(obj, type) or not hasattr(obj, "__dlpack_device__"):
        return None
    try:
        return int(obj.__dlpack_device__()[0])
    except Exception:
        return None


def is_host_array(obj):
    """Whether ``obj`` is a NumPy array, or another array whose DLPack device is the CPU."""
    return isinstance(obj, np.ndarray) or _dlpack_device_type(obj) == KDL_CPU


def is_device_array(obj):
    """Whether ``obj`` is an array the device path takes: DLPack on a device other than
    the CPU, or ``__cuda_array_interface__``."""
    if isinstance(obj, (np.ndarray, type)):
        return False
    device = _dlpack_device_type(obj)
    if device is not None:
        return device != KDL_CPU
    try:
        obj.__cuda_array_interface__
    except Exception:  # absent (or refused for a dtype, with no DLPack to fall back on)
        return False
    return True


def host_view(obj, name="array"):
    """``obj`` as a NumPy array over the same memory: itself for a NumPy array (and
    for what is not a host array); a host DLPack array through
    :func:`numpy.from_dlpack`, bfloat16 included. ``TypeError`` where NumPy cannot
    take the array's dtype."""
    if isinstance(obj, np.ndarray) or not is_host_array(obj):
        return obj
    dtype = getattr(obj, "dtype", None)  # (a bare DLPack exporter need not have one)
    try:
        if dtype is not None and is_bfloat16(as_dtype(dtype)):
            return _bfloat16_view(obj)
        return np.from_dlpack(obj)
    except (BufferError, TypeError, ValueError, RuntimeError) as exc:
        # e.g. a dtype NumPy lacks, or PyTorch's refusal to export a tensor that
        # requires grad
        of = "" if dtype is None else f" of dtype {dtype}"
        raise TypeError(f"{name} cannot be read through DLPack ({type(obj).__name__}{of}: "
                        f"{exc})") from None


class _Export:
    """A DLPack exporter of one capsule already made (NumPy asks for it once)."""

    def __init__(self, capsule):
        self._capsule = capsule

    def __dlpack__(self, **_):
        return self._capsule

    def __dlpack_device__(self):
        return (KDL_CPU, 0)


def _bfloat16_view(obj):
    try:  # a versioned capsule carries its read-only flag (NumPy takes an old one as read-only)
        capsule = obj.__dlpack__(max_version=(1, 0))
    except TypeError:  # an exporter older than DLPack 1.0
        capsule = obj.__dlpack__()
    # prototypes of our own (setting those of ctypes.pythonapi would change them for all)
    get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(
        ("PyCapsule_GetName", ctypes.pythonapi))
    get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_GetPointer", ctypes.pythonapi))
    label = get_name(capsule)
    if label not in _TENSOR_AT:
        raise TypeError(f"its DLPack export is a capsule named {label!r}, not a tensor's")
    at = get_pointer(capsule, label) + _TENSOR_AT[label] + _DTYPE_AT
    code, bits = ctypes.c_uint8.from_address(at), ctypes.c_uint8.from_address(at + 1)
    if (code.value, bits.value) != (_KDL_BFLOAT, 16):
        raise TypeError(f"its DLPack export holds type code {code.value} of {bits.value} "
                        "bits, not bfloat16")
    code.value = _KDL_UINT
    return np.from_dlpack(_Export(capsule)).view(as_dtype("bfloat16"))
