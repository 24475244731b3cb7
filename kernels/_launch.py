"""Launches of Numba kernels from their cubin, each kernel specialised once.

Each kernel is compiled once for one signature; its cubin (Numba's own
compilation, kept on disk by ``_cache`` so that a later process loads it
instead) is loaded and launched by the process's launcher (one of
:data:`LAUNCHERS`, chosen once: :func:`choose_launcher`). The arguments follow
Numba's kernel ABI: every array becomes ``meminfo, parent, nitems, itemsize,
data, shape..., strides...`` (all 64-bit; strides in bytes), and every scalar
argument of our kernels is an int64, so the parameters are one int64 block.

A launch touches no stream but the one it is given, so it can be captured in a
CUDA graph. The driver launcher calls the driver's ``cuLaunchKernelEx`` through
``ctypes``, from a configuration and a parameter block it owns (``cuda.bindings``
loads the modules: its launch wrapper costs more host time than the launch). A
kernel made ``dependent`` is launched as a programmatic dependent (through the
driver launcher, with programmatic stream serialisation): it may start while the
kernel before it on the stream ends, and must wait for it
(``griddepcontrol.wait``) before it loads anything.

Under the CUDA simulator the Numba dispatcher launches (same kernels, same
arguments).
"""

import ctypes
import functools
import sys
import threading

import numpy as np
from numba import config, cuda, from_dtype
from numba.core import types

from . import _cache

__all__ = ["DeviceArray", "LAUNCHERS", "SpecializedKernel", "choose_launcher"]


_WORD = np.dtype(np.uint32)


class DeviceArray:
    """A device array seen as ``dtype``: pointer, shape, byte strides and owner."""

    __slots__ = ("ptr", "shape", "strides", "dtype", "owner")

    def __init__(self, ptr, shape, strides, dtype, owner):
        self.ptr, self.shape, self.strides = ptr, tuple(shape), tuple(strides)
        self.dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        self.owner = owner

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

    def extent(self):
        """``(first, end)``: the bytes from this array's lowest element to past its
        highest, any strides (negative ones too); ``(ptr, ptr)`` where it is empty."""
        if not self.size:
            return self.ptr, self.ptr
        low = high = self.ptr
        for count, stride in zip(self.shape, self.strides):
            reach = (count - 1) * stride
            if reach < 0:
                low += reach
            else:
                high += reach
        return low, high + self.dtype.itemsize

    def flat(self):
        """This C-contiguous array seen as one axis of all its elements."""
        return DeviceArray(self.ptr, (self.size,), (self.dtype.itemsize,), self.dtype, self.owner)

    def as_words(self):
        """This 16-bit array seen as uint32 words of two elements, or ``None``.

        Possible when the last axis is contiguous with an even extent and every
        row starts 4-byte aligned: kernels then move twice the bytes per access.
        """
        shape, strides = self.shape, self.strides
        if self.dtype.itemsize != 2 or not shape or shape[-1] % 2 or self.ptr % 4:
            return None
        if strides[-1] != 2 and shape[-1] > 1:
            return None
        for stride in strides[:-1]:
            if stride % 4:
                return None
        return DeviceArray(self.ptr, shape[:-1] + (shape[-1] // 2,), strides[:-1] + (4,),
                           _WORD, self.owner)

    def span(self):
        """This array's elements as one axis from its first, or :meth:`nothing`.

        The 1-D view starting at this array's pointer that reaches every element,
        where the last axis is unit-stride and every other stride is a
        non-negative multiple of the element size, below 2**32 elements (axes of
        extent 1 impose nothing): a kernel then finds element ``(i, j, ..., k)``
        at ``i * s_0 + j * s_1 + ... + k`` (``s`` the strides in elements).
        Otherwise, or when the array is empty, no elements."""
        item, span = self.dtype.itemsize, 1
        if self.size == 0:
            return self.nothing()
        last = len(self.shape) - 1
        for axis, (extent, stride) in enumerate(zip(self.shape, self.strides)):
            if extent <= 1:
                continue
            if stride < 0 or stride % item or stride // item >= 2 ** 32 or \
                    (axis == last and stride != item):
                return self.nothing()
            span += (extent - 1) * (stride // item)
        return DeviceArray(self.ptr, (span,), (item,), self.dtype, self.owner)

    def element_strides(self):
        """The strides of the first two axes in elements (0 along an axis of one): the
        ``s_0, s_1`` at which a kernel finds ``(i, j, k)`` in :meth:`span`."""
        item = self.dtype.itemsize
        return tuple(stride // item if extent > 1 else 0
                     for extent, stride in zip(self.shape[:2], self.strides[:2]))

    def nothing(self):
        """A 1-D view of no elements at this array's pointer."""
        return DeviceArray(self.ptr, (0,), (self.dtype.itemsize,), self.dtype, self.owner)

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
            flat = root.ravel(order="K").view(np.uint8)  # (a view in C or F order)
            view = np.ndarray(self.shape, self.dtype, buffer=flat,
                              offset=self.ptr - flat.ctypes.data, strides=self.strides)
            return FakeCUDAArray(view)
        desc = {"shape": self.shape, "strides": self.strides, "typestr": self.dtype.str,
                "data": (self.ptr, False), "version": 3}
        return cuda.from_cuda_array_interface(desc, owner=self.owner, sync=False)


LAUNCHERS = ("driver", "core", "cupy", "numba")
_CHOSEN = []  # this process's launcher, once chosen


def choose_launcher(launcher=None):
    """This process's launcher, chosen once; every kernel made without a launcher of
    its own takes it.

    ``"driver"`` launches through the driver's ``cuLaunchKernelEx`` (called
    through ``ctypes``; ``cuda.bindings`` loads the modules), ``"core"`` through
    ``cuda.core``, ``"cupy"`` through CuPy's driver module and ``"numba"`` through
    Numba's own launcher. ``launcher`` is one of :data:`LAUNCHERS`, or ``None``: the
    first of them that can run here (that is their order by host cost per launch).
    Under the CUDA simulator it is always ``"numba"``.

    Raises:
        ValueError: ``launcher`` is not one of :data:`LAUNCHERS`.
        RuntimeError: another launcher was chosen before (kernels made since use it).
    """
    if launcher is not None and launcher not in LAUNCHERS:
        raise ValueError(f"launcher must be one of {LAUNCHERS} or None (got {launcher!r})")
    if config.ENABLE_CUDASIM:
        launcher = "numba"
    if not _CHOSEN:
        _CHOSEN.append(launcher or _first_available())
    elif launcher not in (None, _CHOSEN[0]):
        raise RuntimeError(f"this process launches kernels through {_CHOSEN[0]!r}, chosen "
                           f"before (got launcher {launcher!r})")
    return _CHOSEN[0]


def _first_available():
    for launcher, module in (("driver", "cuda.bindings.driver"), ("core", "cuda.core"),
                             ("cupy", "cupy")):
        try:
            __import__(module)
            if launcher == "driver":
                _launch_entry()
            return launcher
        except (ImportError, OSError, AttributeError):  # no package, or no libcuda entry
            pass
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
        launcher: one of :data:`LAUNCHERS`; ``None`` is the process's
            (:func:`choose_launcher`).
        dependent: launch it as a programmatic dependent of the kernel before it
            (through the driver: the other launchers cannot; Numba's ignores it).
    """

    def __init__(self, dispatcher, argtypes, launcher=None, dependent=False):
        if launcher is not None and launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {LAUNCHERS} or None (got {launcher!r})")
        self.launcher = launcher or choose_launcher()
        self.dependent = bool(dependent)
        if self.dependent and self.launcher != "numba":
            self.launcher = "driver"
        self.argtypes = tuple(argtypes)
        self._dispatcher = dispatcher
        self._resident = {}  # (device ordinal, block): resident_blocks
        if self.launcher == "numba":
            return
        cc = cuda.get_current_device().compute_capability
        cubin, name, self._compiled = _cache.cuda_image(dispatcher, self.argtypes, cc)
        self._image, self._entry = cubin, name
        if self.launcher == "driver":
            self._cubin, self._name = cubin, name.encode()
            self._driver_setup(sum(map(_abi_words, self.argtypes)))
        elif self.launcher == "core":
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
        self._cuda = _driver()
        self._functions = {}  # a module is loaded once per CUDA context
        self._driver = _DriverLaunch(self, count)

    def resident_blocks(self, block):
        """How many blocks of shape ``block`` the current GPU holds at once (on all
        its SMs), by the CUDA occupancy calculator for this kernel's registers."""
        if self.launcher == "numba" or self._compiled:  # Numba holds the compiled overload
            self._dispatcher.compile(self.argtypes)  # once: the numba launcher compiles lazily
            return self._dispatcher.overloads[self.argtypes].max_cooperative_grid_blocks(block)
        # counted once a GPU and block: each count loads the module and unloads it, and
        # with a count for every plan (a direct plan counts its kernels) the GPU's free
        # memory fell by 160 KiB a plan on an H100 (one load of the pack alone kept none)
        key = (cuda.get_current_device().id, block)
        found = self._resident.get(key)
        if found is None:
            found = self._resident[key] = _resident_blocks(self._image, self._entry, block)
        return found

    def __call__(self, grid, block, stream_ptr, args):
        """Launch on ``stream_ptr`` with ``args``: DeviceArrays and ints, in signature order."""
        if self.launcher == "numba":
            self._launch_numba(grid, block, stream_ptr, args)
            return
        self.launch_flat(grid, block, stream_ptr, flatten(args))

    def prepare(self, grid, block, args):
        """This launch made ready once: ``launch(stream_ptr)`` then only launches.
        The result holds the arguments as ints, none of their owners; ``None``
        under the Numba launcher (its arguments must keep their owners)."""
        if self.launcher == "numba":
            return None
        flat = flatten(args)
        if self.launcher == "driver":  # its own parameter block and configuration, filled once
            return _DriverLaunch(self, len(flat), flat, _dims(grid, block))
        return lambda stream_ptr: self.launch_flat(grid, block, stream_ptr, flat)

    def launch_flat(self, grid, block, stream_ptr, flat):
        """Launch with arguments already flattened to the ABI."""
        if self.launcher == "driver":
            self._driver(stream_ptr, _dims(grid, block), flat)
        elif self.launcher == "core":
            key = (grid, block)
            config = self._configs.get(key)
            if config is None:
                config = self._configs[key] = self._config(grid=grid, block=block)
            stream = self._streams.get(stream_ptr)
            if stream is None:
                stream = self._streams[stream_ptr] = _core_stream(stream_ptr)
            self._launch(stream, config, self._function, *flat)
        elif self.launcher == "cupy":
            self._function(grid, block, tuple(flat), stream=_StreamHandle(stream_ptr))
        else:
            raise RuntimeError("flat launches need the cuda.core or CuPy launcher")

    def _function_in_current_context(self):
        """The driver's handle of this kernel in the current CUDA context (its module is
        loaded once per context)."""
        driver = self._cuda
        err, context = driver.cuCtxGetCurrent()
        if err:
            _check(driver, err, "cuCtxGetCurrent")
        key = int(context)
        function = self._functions.get(key)
        if function is None:
            if not key:
                raise RuntimeError("no CUDA context is current: select a device first "
                                   "(cupy.cuda.Device(i).use())")
            err, module = driver.cuModuleLoadData(self._cubin)
            _check(driver, err, "cuModuleLoadData")
            err, function = driver.cuModuleGetFunction(module, self._name)
            _check(driver, err, "cuModuleGetFunction")
            self._functions[key] = function
        return function

    def _launch_numba(self, grid, block, stream_ptr, args):
        views = [_numba_arg(a) for a in args]
        if config.ENABLE_CUDASIM:
            stream = 0
        else:
            stream = cuda.external_stream(stream_ptr) if stream_ptr else cuda.default_stream()
        self._dispatcher[grid, block, stream](*views)


# CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuda.h's CUlaunchAttributeID)
_PROGRAMMATIC_SERIALIZATION = 6


class _LaunchAttribute(ctypes.Structure):
    """cuda.h's ``CUlaunchAttribute``: the id, padding to 8 bytes, then a 64-byte value
    union (its first member, an int, is ``programmaticStreamSerializationAllowed``)."""

    _fields_ = [("id", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("value", ctypes.c_uint64 * 8)]


class _LaunchConfig(ctypes.Structure):
    """cuda.h's ``CUlaunchConfig``: grid, block, dynamic shared memory, the stream, and
    the attributes with their count."""

    _fields_ = [("gridDimX", ctypes.c_uint32), ("gridDimY", ctypes.c_uint32),
                ("gridDimZ", ctypes.c_uint32), ("blockDimX", ctypes.c_uint32),
                ("blockDimY", ctypes.c_uint32), ("blockDimZ", ctypes.c_uint32),
                ("sharedMemBytes", ctypes.c_uint32), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint32)]


@functools.cache
def _launch_entry():
    """The driver's ``cuLaunchKernelEx(config, function, kernelParams, extra)`` as a
    ``ctypes`` function returning the ``CUresult`` (``OSError`` without a driver
    library). It declares no argument types, so that a launch converts nothing: every
    argument is passed as a ``ctypes.c_void_p`` (or ``None``)."""
    library = ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")
    entry = library.cuLaunchKernelEx
    entry.restype = ctypes.c_int
    return entry


_STREAMS_KEPT = 16  # a ready launch's configurations, one per stream it was launched on


class _DriverLaunch:
    """Launches of one kernel through ``cuLaunchKernelEx`` from one parameter block
    and one launch configuration: a kernel's own, refilled at every launch, or a
    ready launch's, filled once (``flat`` and ``dims``: then ``launch(stream_ptr)``
    takes the configuration made for that stream, and the driver's arguments with
    it, made at the stream's first launch: the call converts and locks nothing).
    The driver copies the parameters and the configuration before a launch returns."""

    def __init__(self, kernel, count, flat=None, dims=None):
        self._kernel = kernel
        self._launch = None  # the driver's entry, found at the first launch
        self._params = np.zeros(count, dtype=np.int64)
        if flat is not None:
            self._params[:] = flat
        # kernelParams: the address of an array of pointers, one to each parameter
        self._pointers = np.arange(self._params.ctypes.data,
                                   self._params.ctypes.data + 8 * count, 8, dtype=np.uint64)
        self._pointers_ptr = int(self._pointers.ctypes.data)
        self._lock = threading.Lock()  # the block and the configuration are shared
        # a ready launch keeps the kernel of the context of its first launch (a plan's
        # device, current at every call); another looks the context up at each launch
        self._ready = flat is not None
        self._function = None
        self._streams = {}  # a ready launch's: stream -> (its configuration, the arguments)
        self._config = _LaunchConfig()
        self._config_ptr = ctypes.addressof(self._config)
        if kernel.dependent:
            self._attribute = _LaunchAttribute(_PROGRAMMATIC_SERIALIZATION)
            self._attribute.value[0] = 1  # programmaticStreamSerializationAllowed
            self._config.attrs = ctypes.addressof(self._attribute)
            self._config.numAttrs = 1
        if dims is not None:
            self._set_dims(dims)

    def _set_dims(self, dims):
        config = self._config
        (config.gridDimX, config.gridDimY, config.gridDimZ, config.blockDimX,
         config.blockDimY, config.blockDimZ) = dims

    def __call__(self, stream_ptr, dims=None, flat=None):
        """Launch on ``stream_ptr``, after setting the grid and block ``dims``
        (:func:`_dims`) and filling the parameters with ``flat`` where given (not for
        a ready launch)."""
        if self._ready:
            made = self._streams.get(stream_ptr)
            if made is None:
                made = self._for_stream(stream_ptr)
            err = self._launch(*made[1])
        else:
            void = ctypes.c_void_p
            function = void(int(self._kernel._function_in_current_context()))
            with self._lock:
                if self._launch is None:
                    self._launch = _launch_entry()
                if flat is not None:
                    self._params[:] = flat
                if dims is not None:
                    self._set_dims(dims)
                self._config.hStream = stream_ptr
                err = self._launch(void(self._config_ptr), function, void(self._pointers_ptr),
                                   None)
        if err:
            _check(_driver(), err, "cuLaunchKernelEx")

    def _for_stream(self, stream_ptr):
        """A ready launch's configuration for ``stream_ptr`` and the driver's arguments
        with it, made once (the kernel is the current context's, at the first)."""
        with self._lock:
            if self._function is None:
                self._launch = _launch_entry()
                self._function = int(self._kernel._function_in_current_context())
            config = _LaunchConfig.from_buffer_copy(self._config)
            config.hStream = stream_ptr
            void = ctypes.c_void_p
            made = (config, (void(ctypes.addressof(config)), void(self._function),
                             void(self._pointers_ptr), None))
            if len(self._streams) >= _STREAMS_KEPT:
                self._streams.clear()
            self._streams[stream_ptr] = made
        return made


def _resident_blocks(cubin, name, block):
    """:meth:`SpecializedKernel.resident_blocks` of a kernel loaded from ``cubin`` (by
    the driver's occupancy calculator, as Numba's ``max_cooperative_grid_blocks``)."""
    cuda.current_context()  # the device's primary context, current: Numba's and CuPy's
    driver = _driver()
    threads = int(np.prod(block)) if isinstance(block, tuple) else int(block)
    err, module = driver.cuModuleLoadData(bytes(cubin))
    _check(driver, err, "cuModuleLoadData")
    try:
        err, function = driver.cuModuleGetFunction(
            module, name.encode() if isinstance(name, str) else name)
        _check(driver, err, "cuModuleGetFunction")
        err, per_sm = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(function, threads, 0)
        _check(driver, err, "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        err, device = driver.cuCtxGetDevice()
        _check(driver, err, "cuCtxGetDevice")
        err, sms = driver.cuDeviceGetAttribute(
            driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device)
        _check(driver, err, "cuDeviceGetAttribute")
    finally:
        driver.cuModuleUnload(module)
    return int(per_sm) * int(sms)


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


def _driver():
    """``cuda.bindings.driver``, imported when a driver launch is first set up."""
    from cuda.bindings import driver
    return driver


def _check(driver, err, what):
    """Raise ``RuntimeError`` for a driver call that did not return ``CUDA_SUCCESS``."""
    if err:
        err = driver.CUresult(err)  # the ctypes entry returns a plain int
        _, text = driver.cuGetErrorString(err)
        raise RuntimeError(f"{what} failed: {(text or b'?').decode()} (CUresult {int(err)})")


def _core_stream(ptr):
    """A cuda.core Stream over the foreign handle ``ptr`` (not owned)."""
    from cuda.core import Stream
    if hasattr(Stream, "from_handle"):
        return Stream.from_handle(ptr)
    return _StreamHandle(ptr)


def array_type(dtype, ndim, contiguous):
    """The Numba array type of ``ndim`` dims of ``dtype``: C-contiguous or any layout."""
    return types.Array(from_dtype(np.dtype(dtype)), ndim, "C" if contiguous else "A")
