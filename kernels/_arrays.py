"""Turn caller arrays into Numba device arrays (zero-copy views) and pick streams.

Arrays arrive as CuPy arrays, Numba device arrays or anything with
``__cuda_array_interface__`` (CAI) or DLPack; DLPack-only objects go through
CuPy. Views are made with ``sync=False``: stream ordering is the caller's
business (the kernels run on the stream they are given), and a synchronising
conversion would break CUDA-graph capture. Under the CUDA simulator, NumPy
arrays stand for device arrays.
"""

import numpy as np
from numba import config, cuda

from ._format import c_strides, check_not_overlapping
from ._launch import DeviceArray

__all__ = ["as_cupy", "cupy_stream", "cupy_view", "dummy_index", "kernel_array", "output_array",
           "pointer_device", "stream_ptr"]


_CUPY = []  # CuPy, or None where it cannot be imported: looked up once


def _cupy():
    if not _CUPY:
        try:
            import cupy
        except ImportError:
            cupy = None
        _CUPY.append(cupy)
    return _CUPY[0]


def _cai(obj):
    """``(CAI dict, owner)``: the owner keeps the memory alive (``obj``, or the CuPy
    array that DLPack handed over, which holds the exporter's capsule)."""
    cupy = _cupy()
    if cupy is not None and isinstance(obj, cupy.ndarray):
        # CuPy may not export a CAI for dtypes it holds through ml_dtypes (bfloat16).
        return {"shape": obj.shape, "strides": obj.strides, "data": (obj.data.ptr, False),
                "typestr": "|u1", "version": 3}, obj
    try:
        desc = obj.__cuda_array_interface__
    except (AttributeError, TypeError, ValueError, RuntimeError):
        desc = None  # absent, or refused for this dtype (torch's bfloat16): try DLPack
    if desc is not None:
        return dict(desc), obj
    if hasattr(obj, "__dlpack__"):
        if cupy is None:
            raise RuntimeError("arrays handed over by DLPack need CuPy (pip install cupy-cuda12x)")
        return _cai(cupy.from_dlpack(obj))
    raise TypeError(f"expected a CUDA array (CAI or DLPack) (got {type(obj).__name__})")


def as_cupy(obj):
    """``obj`` as a CuPy array without a copy (CAI first, then DLPack)."""
    import cupy
    if isinstance(obj, cupy.ndarray):
        return obj
    try:
        obj.__cuda_array_interface__
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return cupy.from_dlpack(obj)
    return cupy.asarray(obj)


def cupy_view(arr):
    """A CuPy array over the memory of the :class:`DeviceArray` ``arr`` (its shape,
    strides and dtype), made from its address alone: no interface is read, so
    nothing synchronises (``as_cupy`` reads the CAI, whose stream CuPy waits for)."""
    import cupy

    itemsize = arr.dtype.itemsize
    low = sum(min(0, (n - 1) * s) for n, s in zip(arr.shape, arr.strides))
    high = sum(max(0, (n - 1) * s) for n, s in zip(arr.shape, arr.strides)) + itemsize
    memory = cupy.cuda.UnownedMemory(arr.ptr + low, high - low, arr.owner)
    return cupy.ndarray(arr.shape, arr.dtype, cupy.cuda.MemoryPointer(memory, -low),
                        arr.strides)


def cupy_stream(ptr):
    """A CuPy stream object over the raw handle ``ptr`` (not owned)."""
    import warnings

    import cupy
    with warnings.catch_warnings():  # CuPy 14 prefers Stream.from_external; older ones lack it
        warnings.simplefilter("ignore", DeprecationWarning)
        return cupy.cuda.ExternalStream(ptr)


def output_array(obj, dtype, name="array"):
    """:func:`kernel_array` of an array a kernel writes: ``ValueError`` where elements
    of it share memory (``_format.check_not_overlapping``)."""
    arr = kernel_array(obj, dtype, name)
    check_not_overlapping(arr.shape, arr.strides, arr.dtype.itemsize, name)
    return arr


def kernel_array(obj, dtype, name="array"):
    """A zero-copy :class:`DeviceArray` over ``obj`` with elements seen as ``dtype``, which
    must have the size of ``obj``'s elements (``TypeError`` otherwise, where ``obj``
    tells its dtype's size)."""
    dtype = np.dtype(dtype)
    size = getattr(getattr(obj, "dtype", None), "itemsize", None)
    if isinstance(size, int) and size != dtype.itemsize:
        raise TypeError(f"{name} must have {dtype.itemsize}-byte elements, as {dtype} "
                        f"(got {obj.dtype})")
    if config.ENABLE_CUDASIM:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        host = obj._ary if isinstance(obj, FakeCUDAArray) else np.asarray(obj)
        host = host.view(dtype)  # written in place, strides kept
        return DeviceArray(host.ctypes.data, host.shape, host.strides, dtype, host)
    if isinstance(obj, np.ndarray):
        raise TypeError(f"{name} must be a device array (got numpy.ndarray)")
    cupy = _cupy()
    if cupy is not None and type(obj) is cupy.ndarray:  # the usual case: no interface dict
        return DeviceArray(obj.data.ptr, obj.shape, obj.strides, dtype, obj)
    desc, owner = _cai(obj)
    shape = tuple(int(s) for s in desc["shape"])
    strides = desc.get("strides")
    if strides is None:  # C-contiguous, by the CAI's convention
        strides = c_strides(shape, dtype.itemsize)
    return DeviceArray(int(desc["data"][0]), shape, tuple(int(s) for s in strides), dtype, owner)


def stream_ptr(stream):
    """The raw ``cudaStream_t`` of ``stream``.

    ``None`` means CuPy's current stream (the legacy default stream without
    CuPy). Accepts a CuPy stream, a Numba stream, an object with
    ``__cuda_stream__`` or the handle as an int.
    """
    if config.ENABLE_CUDASIM:
        return 0
    if stream is None:
        cupy = _cupy()
        return cupy.cuda.get_current_stream().ptr if cupy is not None else 0
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "ptr"):
        return int(stream.ptr)
    if hasattr(stream, "handle"):  # Numba stream
        handle = stream.handle
        return int(getattr(handle, "value", handle) or 0)
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    raise TypeError(f"stream must be a CUDA stream or its handle (got {type(stream).__name__})")


_MEMORY_TYPE_DEVICE = 2  # cudaMemoryTypeDevice


def pointer_device(ptr):
    """The ordinal of the GPU whose own memory holds ``ptr``; ``None`` for host,
    managed or unknown memory (and under the simulator)."""
    if not ptr or config.ENABLE_CUDASIM:
        return None
    cupy = _cupy()
    if cupy is None:
        return None
    try:
        attrs = cupy.cuda.runtime.pointerGetAttributes(ptr)
    except Exception:  # not a CUDA pointer
        return None
    if getattr(attrs, "type", None) != _MEMORY_TYPE_DEVICE:
        return None
    return int(attrs.device)


_DUMMY = {}


def dummy_index():
    """A one-element int64 device array for kernels called without a mask."""
    key = "sim" if config.ENABLE_CUDASIM else cuda.get_current_device().id
    if key not in _DUMMY:
        host = np.zeros(1, dtype=np.int64)
        owner = host if config.ENABLE_CUDASIM else cuda.to_device(host)
        _DUMMY[key] = kernel_array(owner, np.int64)
    return _DUMMY[key]
