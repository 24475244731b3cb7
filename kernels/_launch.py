"""Cheap launches of Numba kernels: specialise once, launch the cubin.

A lazily typed Numba launch costs 50-500 us of host time. Here each kernel is
compiled once for one signature; its cubin (Numba's own compilation, kept
on disk by ``_cache`` so that a later process loads it instead) is loaded
and launched through ``cuda.core`` (else the driver's ``cuLaunchKernel``
through ``ctypes``, else CuPy's driver module; see :func:`launcher_kind`).
The arguments follow Numba's kernel ABI: every array becomes ``meminfo, parent,
nitems, itemsize, data, shape..., strides...`` (all 64-bit; strides in
bytes), and every scalar argument of our kernels is an int64, so the
parameters are one int64 block.
The launch touches no stream but the one it is given, so it can be captured
in a CUDA graph. A kernel made ``dependent`` is launched as a programmatic
dependent (``cuLaunchKernelEx`` with programmatic stream serialisation,
through ctypes): it may start while the kernel before it on the stream ends,
and must wait for it (``griddepcontrol.wait``) before it loads anything.

Under the CUDA simulator, and with ``CUPY_DCP_LAUNCHER=numba``, the Numba
dispatcher launches instead (same kernels, same arguments).
"""

import ctypes
import os
import threading

import numpy as np
from numba import config, cuda, from_dtype
from numba.core import types

from . import _cache

__all__ = ["DeviceArray", "SpecializedKernel", "launcher_kind"]


class DeviceArray:
    """A device array seen as ``dtype``: pointer, shape, byte strides and owner."""

    __slots__ = ("ptr", "shape", "strides", "dtype", "owner")

    def __init__(self, ptr, shape, strides, dtype, owner):
        self.ptr, self.shape, self.strides = ptr, tuple(shape), tuple(strides)
        self.dtype, self.owner = np.dtype(dtype), owner

    def is_c_contiguous(self):
        """Do the strides describe a C-contiguous array (size-1 axes excepted)?"""
        step = self.dtype.itemsize
        for extent, stride in zip(reversed(self.shape), reversed(self.strides)):
            if extent > 1 and stride != step:
                return False
            step *= extent
        return True

    def require_c_contiguous(self, name):
        """Raise unless C-contiguous: kernels compiled for C arrays ignore strides."""
        if not self.is_c_contiguous():
            raise ValueError(f"{name} must be C-contiguous (got strides {self.strides} "
                             f"for shape {self.shape} of {self.dtype})")
        return self

    def view(self, dtype):
        """The same memory seen as ``dtype`` of the same size (bits as values, or back)."""
        return DeviceArray(self.ptr, self.shape, self.strides, dtype, self.owner)

    @property
    def size(self):
        n = 1
        for extent in self.shape:
            n *= extent
        return n

    def as_words(self):
        """This 16-bit array seen as uint32 words of two elements, or ``None``.

        Possible when the last axis is contiguous with an even extent and every
        row starts 4-byte aligned: kernels then move twice the bytes per access.
        """
        if self.dtype.itemsize != 2 or not self.shape or self.shape[-1] % 2:
            return None
        if self.strides[-1] != 2 and self.shape[-1] > 1:
            return None
        if self.ptr % 4 or any(s % 4 for s in self.strides[:-1]):
            return None
        return DeviceArray(self.ptr, self.shape[:-1] + (self.shape[-1] // 2,),
                           self.strides[:-1] + (4,), np.uint32, self.owner)

    def rows_aligned(self, alignment):
        """Does every row (the last axis) start on an ``alignment``-byte boundary and
        run contiguously? (Axes of extent 1 impose nothing.)"""
        if not self.shape:
            return False
        if self.shape[-1] > 1 and self.strides[-1] != self.dtype.itemsize:
            return False
        return self.ptr % alignment == 0 and all(
            stride % alignment == 0
            for extent, stride in zip(self.shape[:-1], self.strides[:-1]) if extent > 1)

    def abi(self):
        """The Numba kernel ABI of this array: a tuple of ints."""
        return (0, 0, self.size, self.dtype.itemsize, self.ptr) + self.shape + self.strides

    def numba_view(self):
        """A Numba device array over the same memory (no copy, no sync)."""
        if config.ENABLE_CUDASIM:  # ptr is a host address inside the owner's buffer
            from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
            root = self.owner
            while isinstance(root.base, np.ndarray):
                root = root.base
            flat = root.reshape(-1).view(np.uint8)
            view = np.ndarray(self.shape, self.dtype, buffer=flat,
                              offset=self.ptr - flat.ctypes.data, strides=self.strides)
            return FakeCUDAArray(view)
        desc = {"shape": self.shape, "strides": self.strides, "typestr": self.dtype.str,
                "data": (self.ptr, False), "version": 3}
        return cuda.from_cuda_array_interface(desc, owner=self.owner, sync=False)


_KINDS = ("core", "driver", "cupy", "numba")


def launcher_kind():
    """How kernels are launched: ``"core"`` (cuda.core), ``"driver"`` (the driver's
    ``cuLaunchKernel`` through ctypes), ``"cupy"`` (CuPy's driver module) or
    ``"numba"`` (Numba's own launcher); ``CUPY_DCP_LAUNCHER`` picks one.

    The order is by measurement (host microseconds per launch of the pack
    kernel on an H200 node, three runs): cuda.core 11-18, ctypes 15-23,
    CuPy 30-40, Numba 300-550.
    """
    if config.ENABLE_CUDASIM:
        return "numba"
    forced = os.environ.get("CUPY_DCP_LAUNCHER")
    if forced:
        if forced not in _KINDS:
            raise ValueError(f"CUPY_DCP_LAUNCHER must be one of {_KINDS} (got {forced!r})")
        return forced
    try:
        import cuda.core  # noqa: F401
        return "core"
    except ImportError:
        pass
    if _libcuda() is not None:
        return "driver"
    try:
        import cupy  # noqa: F401
        return "cupy"
    except ImportError:
        return "numba"


class _StreamHandle:
    """A raw ``cudaStream_t`` seen through the ``__cuda_stream__`` protocol (and ``.ptr``)."""

    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr

    def __cuda_stream__(self):
        return (0, self.ptr)


class SpecializedKernel:
    """One Numba kernel compiled for one signature, launched from its cubin.

    Args:
        dispatcher: a ``numba.cuda.jit`` kernel.
        argtypes: the Numba types of its arguments (arrays and int64 scalars).
        kind: the launcher (:func:`launcher_kind` by default).
        dependent: launch it as a programmatic dependent of the kernel before it
            (through the driver: the other launchers cannot; Numba's ignores it).
    """

    def __init__(self, dispatcher, argtypes, kind=None, dependent=False):
        self.kind = kind or launcher_kind()
        self.dependent = bool(dependent)
        if self.dependent and self.kind != "numba":
            self.kind = "driver"
        self.argtypes = tuple(argtypes)
        self._dispatcher = dispatcher
        if self.kind == "numba":
            return
        cc = cuda.get_current_device().compute_capability
        cubin, name, self._compiled = _cache.cuda_image(dispatcher, self.argtypes, cc)
        self._image, self._entry = cubin, name
        if self.kind == "driver":
            if _libcuda() is None:
                raise RuntimeError("the CUDA driver library (libcuda) cannot be loaded")
            self._cubin, self._name = cubin, name.encode()
            self._driver_setup(sum(map(_abi_words, self.argtypes)))
        elif self.kind == "core":
            from cuda.core import LaunchConfig, ObjectCode, launch
            self._function = ObjectCode.from_cubin(cubin).get_kernel(name)
            self._config = LaunchConfig
            self._launch = launch
            self._configs = {}
            self._streams = {}
        else:
            import cupy
            module = cupy.cuda.function.Module()
            module.load(cubin)
            self._module = module
            self._function = module.get_function(name)

    def _driver_setup(self, count):
        """The driver launcher's state: the CUDA function of each context, and one
        reused launch state for launches not made ready."""
        self._functions = {}  # a module is loaded once per CUDA context
        self._driver = _DriverLaunch(self, count)

    def resident_blocks(self, block):
        """How many blocks of shape ``block`` the current GPU holds at once (on all
        its SMs), by the CUDA occupancy calculator for this kernel's registers."""
        if self.kind == "numba" or self._compiled:  # Numba holds the compiled overload
            self._dispatcher.compile(self.argtypes)  # once: the numba launcher compiles lazily
            return self._dispatcher.overloads[self.argtypes].max_cooperative_grid_blocks(block)
        return _resident_blocks(self._image, self._entry, block)

    def __call__(self, grid, block, stream_ptr, args):
        """Launch on ``stream_ptr`` with ``args``: DeviceArrays and ints, in signature order."""
        if self.kind == "numba":
            self._launch_numba(grid, block, stream_ptr, args)
            return
        self.launch_flat(grid, block, stream_ptr, flatten(args))

    def prepare(self, grid, block, args):
        """This launch made ready once: ``launch(stream_ptr)`` then only launches.
        The result holds the arguments as ints, none of their owners; ``None``
        under the Numba launcher (its arguments must keep their owners)."""
        if self.kind == "numba":
            return None
        flat = flatten(args)
        if self.kind == "driver":  # its own parameter block, filled once
            launch, dims = _DriverLaunch(self, len(flat), flat), _dims(grid, block)
            return lambda stream_ptr: launch(stream_ptr, dims)
        return lambda stream_ptr: self.launch_flat(grid, block, stream_ptr, flat)

    def launch_flat(self, grid, block, stream_ptr, flat):
        """Launch with arguments already flattened to the ABI."""
        if self.kind == "driver":
            self._driver(stream_ptr, _dims(grid, block), flat)
        elif self.kind == "core":
            key = (grid, block)
            config = self._configs.get(key)
            if config is None:
                config = self._configs[key] = self._config(grid=grid, block=block)
            stream = self._streams.get(stream_ptr)
            if stream is None:
                stream = self._streams[stream_ptr] = _core_stream(stream_ptr)
            self._launch(stream, config, self._function, *flat)
        elif self.kind == "cupy":
            self._function(grid, block, tuple(flat), stream=_StreamHandle(stream_ptr))
        else:
            raise RuntimeError("flat launches need the cuda.core or CuPy launcher")

    def _function_in_current_context(self, lib):
        context = ctypes.c_void_p()
        lib.check(lib.cuCtxGetCurrent(ctypes.byref(context)), "cuCtxGetCurrent")
        function = self._functions.get(context.value)
        if function is None:
            if not context.value:
                raise RuntimeError("no CUDA context is current: select a device first "
                                   "(cupy.cuda.Device(i).use())")
            module, handle = ctypes.c_void_p(), ctypes.c_void_p()
            lib.check(lib.cuModuleLoadData(ctypes.byref(module), self._cubin), "cuModuleLoadData")
            lib.check(lib.cuModuleGetFunction(ctypes.byref(handle), module, self._name),
                      "cuModuleGetFunction")
            function = self._functions[context.value] = handle.value
        return function

    def _launch_numba(self, grid, block, stream_ptr, args):
        views = [_numba_arg(a) for a in args]
        if config.ENABLE_CUDASIM:
            stream = 0
        else:
            stream = cuda.external_stream(stream_ptr) if stream_ptr else cuda.default_stream()
        self._dispatcher[grid, block, stream](*views)


class _DriverLaunch:
    """Launches of one kernel through the driver from one parameter block (and, for
    a dependent kernel, one launch configuration): a kernel's own, refilled at
    every launch, or a ready launch's, filled once (``flat``). The driver copies
    both before a launch returns."""

    def __init__(self, kernel, count, flat=None):
        self._kernel = kernel
        self._params = np.zeros(count, dtype=np.int64)
        if flat is not None:
            self._params[:] = flat
        self._pointers = np.arange(self._params.ctypes.data,
                                   self._params.ctypes.data + 8 * count, 8, dtype=np.uint64)
        self._pointers_ptr = int(self._pointers.ctypes.data)
        self._lock = threading.Lock()
        self._config = None
        if kernel.dependent:
            self._attribute = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION, allowed=1)
            self._config = _LaunchConfig(attrs=ctypes.addressof(self._attribute), numAttrs=1)

    def __call__(self, stream_ptr, dims, flat=None):
        """Launch on ``stream_ptr`` with grid and block ``dims`` (:func:`_dims`), after
        filling the parameters with ``flat`` where given."""
        lib = _libcuda()
        function = self._kernel._function_in_current_context(lib)
        with self._lock:
            if flat is not None:
                self._params[:] = flat
            config = self._config
            if config is None:
                err = lib.cuLaunchKernel(function, *dims, 0, stream_ptr, self._pointers_ptr,
                                         None)
            else:
                (config.gridDimX, config.gridDimY, config.gridDimZ, config.blockDimX,
                 config.blockDimY, config.blockDimZ) = dims
                config.hStream = stream_ptr
                err = lib.cuLaunchKernelEx(ctypes.byref(config), function, self._pointers_ptr,
                                           None)
        if err:
            lib.check(err, "cuLaunchKernel" if config is None else "cuLaunchKernelEx")


def _resident_blocks(cubin, name, block):
    """:meth:`SpecializedKernel.resident_blocks` of a kernel loaded from ``cubin`` (by
    the driver's occupancy calculator, as Numba's ``max_cooperative_grid_blocks``)."""
    ctx = cuda.current_context()
    module = ctx.create_module_image(cubin)
    try:
        function = module.get_function(name)
        threads = int(np.prod(block)) if isinstance(block, tuple) else int(block)
        per_sm = ctx.get_active_blocks_per_multiprocessor(function, threads, 0)
    finally:
        ctx.unload_module(module)
    return per_sm * ctx.device.MULTIPROCESSOR_COUNT


def _dims(grid, block):
    """Grid and block as the six unsigned ints a launch takes."""
    return (tuple(grid) + (1, 1))[:3] + (tuple(block) + (1, 1))[:3]


def flatten(args):
    """Kernel arguments (DeviceArrays, ints, and tuples of them) as the ABI's int list."""
    flat = []
    for arg in args:
        if isinstance(arg, DeviceArray):
            flat.extend(arg.abi())
        elif isinstance(arg, tuple):  # a tuple argument is its members, one after another
            flat.extend(flatten(arg))
        else:
            flat.append(arg)
    return flat


def _abi_words(argtype):
    """How many 64-bit parameters a kernel argument of ``argtype`` takes."""
    if isinstance(argtype, types.Array):
        return 5 + 2 * argtype.ndim
    if isinstance(argtype, types.BaseTuple):
        return sum(map(_abi_words, argtype.types))
    return 1


def _numba_arg(arg):
    if isinstance(arg, DeviceArray):
        return arg.numba_view()
    if isinstance(arg, tuple):
        return tuple(_numba_arg(a) for a in arg)
    return arg


_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


class _LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute``: an id, then a 64-byte union at offset 8 whose first
    member here is ``programmaticStreamSerializationAllowed``."""

    _fields_ = [("id", ctypes.c_int), ("_pad", ctypes.c_char * 4), ("allowed", ctypes.c_uint),
                ("_rest", ctypes.c_char * 60)]


class _LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig``: grid, block, dynamic shared memory, stream, attributes."""

    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint)]


class _Libcuda:
    """The few CUDA driver entry points the launcher calls, through ctypes."""

    def __init__(self, lib):
        c = ctypes
        self._lib = lib
        self.cuLaunchKernel = lib.cuLaunchKernel
        self.cuLaunchKernel.argtypes = [c.c_void_p] + [c.c_uint] * 7 + [c.c_void_p] * 3
        self.cuLaunchKernel.restype = c.c_int
        self.cuLaunchKernelEx = getattr(lib, "cuLaunchKernelEx", None)  # CUDA 12.0 and later
        if self.cuLaunchKernelEx is not None:
            self.cuLaunchKernelEx.argtypes = [c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p]
            self.cuLaunchKernelEx.restype = c.c_int
        self.cuModuleLoadData = lib.cuModuleLoadData
        self.cuModuleLoadData.argtypes = [c.POINTER(c.c_void_p), c.c_char_p]
        self.cuModuleGetFunction = lib.cuModuleGetFunction
        self.cuModuleGetFunction.argtypes = [c.POINTER(c.c_void_p), c.c_void_p, c.c_char_p]
        self.cuCtxGetCurrent = lib.cuCtxGetCurrent
        self.cuCtxGetCurrent.argtypes = [c.POINTER(c.c_void_p)]
        self._error_string = lib.cuGetErrorString
        self._error_string.argtypes = [c.c_int, c.POINTER(c.c_char_p)]

    def check(self, err, what):
        if err:
            text = ctypes.c_char_p()
            self._error_string(err, ctypes.byref(text))
            raise RuntimeError(f"{what} failed: {(text.value or b'?').decode()} (CUresult {err})")


_LIBCUDA = []


def _libcuda():
    """The CUDA driver through ctypes, or ``None`` where it cannot be loaded."""
    if not _LIBCUDA:
        try:
            _LIBCUDA.append(_Libcuda(ctypes.CDLL("libcuda.so.1")))
        except (OSError, AttributeError):
            _LIBCUDA.append(None)
    return _LIBCUDA[0]


def _core_stream(ptr):
    """A cuda.core Stream over the foreign handle ``ptr`` (not owned)."""
    from cuda.core import Stream
    if hasattr(Stream, "from_handle"):
        return Stream.from_handle(ptr)
    return _StreamHandle(ptr)


def array_type(dtype, ndim, contiguous):
    """The Numba array type of ``ndim`` dims of ``dtype``: C-contiguous or any layout."""
    return types.Array(from_dtype(np.dtype(dtype)), ndim, "C" if contiguous else "A")
