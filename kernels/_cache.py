"""Compiled kernels kept on disk, so that a process compiles only what no process did.

What is kept: for a CUDA kernel specialised to one signature, its cubin and
entry name (or, where it was built without a GPU, its PTX, linked into a
cubin by the first process that loads it on a GPU); for a host ``njit``
function, Numba's own serialised compile result (:func:`cached_njit`).

Where: the folder :func:`cache_dir` names, by default
``$XDG_CACHE_HOME/cupy_dcp`` (else ``~/.cache/cupy_dcp``).
``CUPY_DCP_CACHE_DIR=path`` moves it; ``CUPY_DCP_CACHE=0``, or
``CUPY_DCP_CACHE_DIR`` set to the empty string, turns the cache off
(``cupy_dcp._settings.kernel_cache_dir`` reads them, once, on first use:
this package reads no environment). :func:`set_cache_dir` overrides them for
the process (``None``: off).

The key of an entry is everything that changes the machine code: the
kernel's code and specialisation (:func:`code_fingerprint`: the Python
function's module, qualified name and code, the values its closure captured
and the globals it names, recursively through the device functions and
constants they reach), a digest of every source file of this package, the
argument types, the target (compute capability; the host CPU for ``njit``),
the compile options (for ``njit``, also Numba's switches that change machine
code: ``NUMBA_BOUNDSCHECK``, ``NUMBA_OPT``, ...), and the versions of Python,
NumPy, Numba, llvmlite, numba-cuda, NVVM (its API and IR versions and its
release, read off the PTX it writes), what linked a cubin (the CUDA driver's API
version and release, nvJitLink, cuda-core and cuda-bindings: :func:`_linker_versions`),
and this package. A kernel
whose captured values have no stable description (an object known only by
its address) is never cached: it compiles every time.

Safety: an entry is written to a temporary file in the same folder, then
renamed over its name (``os.replace``), so readers on several ranks never see
half a file. Entries get the permissions the process's umask (at the write) gives new files
(a cache filled by one user, an image's build say, is readable by others). Each entry carries its whole key and a SHA-256 of its contents:
a corrupt or truncated entry, or one of another key, is ignored (with a
:class:`CacheWarning` for a corrupt one) and rebuilt. Nothing is evicted: an
entry whose key no longer arises is never read again (delete the folder to
reclaim its space). A folder that cannot be
made or written (read-only, full) turns writing off for the process, with one
warning; nothing raises. Under the CUDA simulator nothing is cached.

:func:`stats` counts, per process, the kernels compiled and those loaded,
for tests and start-up measurements.
"""

import contextlib
import functools
import hashlib
import json
import os
import pathlib
import sys
import tempfile
import threading
import types as pytypes
import warnings

__all__ = ["CacheWarning", "cache_dir", "cached_njit", "code_fingerprint", "cuda_image",
           "cuda_ptx", "on_link", "reset_stats", "set_cache_dir", "stats", "use_default"]

_FORMAT = 1  # of an entry file; part of every key
_MAGIC = b"cupy_dcp kernel cache\n"
_PACKAGE = __name__.rpartition(".")[0]  # this kernels package
# functions of these are named, not read: their versions are in every key
_LIBRARIES = frozenset({"numba", "numba_cuda", "numpy", "llvmlite", "cuda", "builtins", "math"})


class CacheWarning(UserWarning):
    """The kernel cache could not be used as asked (it then compiles)."""


_UNSET = object()
_state = {"dir": _UNSET, "writable": True, "default": None}
_lock = threading.Lock()
_counts = {"compiled": 0, "loaded": 0, "stored": 0, "unstored": 0, "rebuilt": 0,
           "uncacheable": 0}
_warned = set()


def use_default(provider):
    """Take the folder from ``provider()`` (a path, or ``None`` for no cache) on first
    use, unless :func:`set_cache_dir` names one; without a provider there is no
    cache. (cupy_dcp gives its settings' ``kernel_cache_dir``.)"""
    with _lock:
        _state["default"] = provider


def set_cache_dir(path):
    """Use the folder ``path`` for the cache from now on (``None``: no cache)."""
    with _lock:
        _state["dir"] = None if path is None else pathlib.Path(path)
        _state["writable"] = True


def cache_dir():
    """The cache folder in use (a ``pathlib.Path``), or ``None`` when caching is off."""
    with _lock:
        if _state["dir"] is _UNSET:
            provider = _state["default"]
            path = None if provider is None else provider()
            _state["dir"] = None if path is None else pathlib.Path(path)
        return _state["dir"]


def stats():
    """This process's counts: ``compiled`` (kernels compiled here), ``loaded`` (from
    the cache), ``stored``, ``unstored`` (entries not written: the folder could not
    be, or no longer is, written), ``rebuilt`` (corrupt entries replaced) and
    ``uncacheable`` (kernels with no stable key)."""
    with _lock:
        return dict(_counts)


def reset_stats():
    """Zero :func:`stats`."""
    with _lock:
        for name in _counts:
            _counts[name] = 0


def _count(name):
    with _lock:
        _counts[name] += 1


def _warn_once(what, message):
    with _lock:
        if what in _warned:
            return
        _warned.add(what)
    warnings.warn(f"cupy_dcp: {message}", CacheWarning, stacklevel=3)


# --- the key -----------------------------------------------------------------------------

class _Uncacheable(Exception):
    """A value reached by a kernel has no description that is the same in every process."""


def code_fingerprint(func):
    """A SHA-256 hex digest of what a Numba dispatcher (or Python function) compiles
    to: its code, options, captured values and named globals, recursively."""
    hasher = hashlib.sha256()
    _Fingerprint(hasher.update).value(func)
    return hasher.hexdigest()


class _Fingerprint:
    """Feeds a stable description of values to ``write`` (bytes), recursively."""

    def __init__(self, write):
        import numpy

        self._np = numpy
        self._write = write
        self._seen = {}

    def _put(self, *parts):
        for part in parts:
            text = part if isinstance(part, bytes) else str(part).encode()
            self._write(len(text).to_bytes(8, "little") + text)

    def value(self, v):
        np = self._np
        if v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
            self._put("const", type(v).__name__, repr(v))
        elif isinstance(v, (np.generic, np.ndarray)):
            arr = np.asarray(v)
            self._put("numpy", arr.dtype.str, arr.shape, np.ascontiguousarray(arr).tobytes())
        elif isinstance(v, np.dtype):
            self._put("dtype", v.str, v.name)
        elif isinstance(v, (tuple, list, frozenset, set)):
            items = sorted(v, key=repr) if isinstance(v, (set, frozenset)) else v
            self._put(type(v).__name__, len(items))
            for item in items:
                self.value(item)
        elif isinstance(v, dict):
            self._put("dict", len(v))
            for k in sorted(v, key=repr):
                self.value(k)
                self.value(v[k])
        elif isinstance(v, pytypes.ModuleType):
            self._put("module", v.__name__)
        elif hasattr(v, "py_func") and hasattr(v, "targetoptions"):  # a Numba dispatcher
            self._once(v, lambda: self._dispatcher(v))
        elif (isinstance(v, pytypes.FunctionType)
              and str(v.__module__).partition(".")[0] not in _LIBRARIES):
            self._once(v, lambda: self._function(v))
        elif isinstance(v, (pytypes.FunctionType, pytypes.BuiltinFunctionType, type)):
            # a library's (its version is in the key), a builtin or a class
            self._put("external", getattr(v, "__module__", ""), getattr(v, "__qualname__", ""))
        elif type(v).__module__.partition(".")[0] == "numba":  # Numba types and the like
            self._put("numba", type(v).__qualname__, str(v))
        else:
            text = repr(v)
            if " at 0x" in text:
                raise _Uncacheable(f"{type(v).__qualname__} has no stable description")
            self._put("object", type(v).__module__, type(v).__qualname__, text)

    def _once(self, v, describe):
        key = id(v)
        if key in self._seen:  # a cycle, or a function reached twice: named again only
            self._put("again", self._seen[key])
            return
        self._seen[key] = len(self._seen)
        describe()

    def _dispatcher(self, d):
        self._put("dispatcher", type(d).__qualname__)
        self.value({k: v for k, v in d.targetoptions.items()})
        self._function(d.py_func)

    def _function(self, f):
        self._put("function", f.__module__, f.__qualname__)
        self._code(f.__code__, f.__globals__)
        self.value(f.__defaults__)
        self.value(f.__kwdefaults__)
        cells = f.__closure__ or ()
        self._put("closure", len(cells))
        for cell in cells:
            try:
                contents = cell.cell_contents
            except ValueError:  # a cell not filled yet
                self._put("empty cell")
                continue
            self.value(contents)

    def _code(self, code, namespace):
        self._put("code", code.co_code, code.co_names, code.co_varnames, code.co_freevars,
                  code.co_cellvars, code.co_flags, code.co_argcount, code.co_kwonlyargcount)
        for const in code.co_consts:
            if isinstance(const, pytypes.CodeType):
                self._code(const, namespace)
            else:
                self.value(const)
        for name in code.co_names:  # the globals it may read (attribute names are skipped)
            if name in namespace:
                self._put("global", name)
                self.value(namespace[name])


@functools.cache
def _sources_digest():
    """SHA-256 of every source file of this package: a belt to the fingerprints."""
    root = pathlib.Path(__file__).resolve().parent
    hasher = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        hasher.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return hasher.hexdigest()


@functools.cache
def _versions():
    import numba
    import numpy

    import llvmlite

    found = {"python": sys.version, "numpy": numpy.__version__, "numba": numba.__version__,
             "llvmlite": llvmlite.__version__}
    try:
        from importlib.metadata import PackageNotFoundError, version
        for dist in ("numba-cuda", "cupy_dcp"):
            try:
                found[dist] = version(dist)
            except PackageNotFoundError:
                found[dist] = None
    except ImportError:
        pass
    return found


@functools.cache
def _nvvm_version():
    """NVVM's API and IR versions, which one API version spans many releases of,
    and its release (``"13.5, V13.5.37"``), read from the PTX header of an empty
    module it compiles once (``None`` where that fails)."""
    from numba.cuda.cudadrv import nvvm as nvvm_module

    nvvm = nvvm_module.NVVM()
    return {"nvvm": nvvm.get_version(), "nvvm_ir": nvvm.get_ir_version(),
            "nvvm_release": _nvvm_release(nvvm_module)}


def _nvvm_release(nvvm_module):
    try:
        from llvmlite import ir

        module = ir.Module()
        module.triple = "nvptx64-nvidia-cuda"
        module.data_layout = nvvm_module._datalayout  # (numba-cuda's: its version is keyed)
        function = ir.Function(module, ir.FunctionType(ir.VoidType(), []), "cupy_dcp_probe")
        ir.IRBuilder(function.append_basic_block()).ret_void()
        nvvm_module.add_ir_version(module)
        ptx = nvvm_module.compile_ir(str(module), arch="compute_75")
        text = ptx.decode("ascii", "replace") if isinstance(ptx, bytes) else str(ptx)
    except Exception:  # an NVVM or numba-cuda that does not take this: its versions stand
        return None
    for line in text.splitlines():
        if line.startswith("// Cuda compilation tools, release "):
            return line[len("// Cuda compilation tools, release "):].strip()
    return None


def _key(kind, func, extra):
    """The whole key of an entry, as text (stored in the entry: compared on load)."""
    fields = {"format": _FORMAT, "kind": kind, "code": code_fingerprint(func),
              "sources": _sources_digest(), "versions": _versions()}
    fields.update(extra)
    return json.dumps(fields, sort_keys=True, default=str)


# --- entries on disk ---------------------------------------------------------------------

def _entry_path(folder, key):
    return folder / f"{hashlib.sha256(key.encode()).hexdigest()}.bin"


def _load(key):
    """``(meta, payload)`` of the entry of ``key``, or ``None``."""
    folder = cache_dir()
    if folder is None:
        return None
    path = _entry_path(folder, key)
    try:
        blob = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):  # no entry, or no folder yet (the
        return None  # write that would make it warns, once)
    except OSError as exc:
        _warn_once(("read", folder), f"the kernel cache folder {folder} cannot be read ({exc}); "
                                     "compiling without it")
        return None
    entry = _parse(blob)
    if entry is None:
        _count("rebuilt")
        warnings.warn(f"cupy_dcp: the kernel cache entry {path} is corrupt; rebuilding it",
                      CacheWarning, stacklevel=3)
        return None
    stored_key, meta, payload = entry
    if stored_key != key:  # the digest of the key collided, or an entry of an old format
        return None
    return meta, payload


def _parse(blob):
    """``(key, meta, payload)`` of an entry file's bytes, or ``None`` where they are
    not a whole, intact entry."""
    head = len(_MAGIC) + 32
    if len(blob) < head + 8 or not blob.startswith(_MAGIC):
        return None
    digest, body = blob[len(_MAGIC):head], blob[head:]
    if hashlib.sha256(body).digest() != digest:
        return None
    try:
        size = int.from_bytes(body[:8], "little")
        header = json.loads(body[8:8 + size].decode())
        return header["key"], header["meta"], body[8 + size:]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None


def _store(key, meta, payload):
    """Write the entry of ``key`` atomically; on failure, warn once and stop writing."""
    folder = cache_dir()
    if folder is None:
        return
    if not _state["writable"]:
        _count("unstored")
        return
    header = json.dumps({"key": key, "meta": meta}).encode()
    body = len(header).to_bytes(8, "little") + header + bytes(payload)
    blob = _MAGIC + hashlib.sha256(body).digest() + body
    temp = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=folder, prefix=".entry-", suffix=".tmp")
        with os.fdopen(handle, "wb") as f:
            f.write(blob)
        os.chmod(temp, 0o666 & ~_umask())  # mkstemp's file is its owner's alone
        os.replace(temp, _entry_path(folder, key))
        temp = None
        _count("stored")
    except OSError as exc:
        _state["writable"] = False
        _count("unstored")
        _warn_once(("write", folder), f"the kernel cache folder {folder} cannot be written "
                                      f"({exc}); compiling without caching")
    finally:
        if temp is not None:
            with contextlib.suppress(OSError):
                os.unlink(temp)


def _umask():
    """This process's umask at the time of a write: read from ``/proc`` where it is,
    else :func:`_umask_set_once`."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return _umask_set_once()


@functools.cache
def _umask_set_once():
    """The umask where ``/proc`` does not tell it: set and restored, once a process
    (doing so again would race with threads creating files)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _simulated():
    from numba import config

    return bool(config.ENABLE_CUDASIM)


# --- CUDA kernels ------------------------------------------------------------------------

def _cuda_fields(dispatcher, argtypes, cc):
    return {"argtypes": [str(t) for t in argtypes], "cc": list(cc),
            "options": {k: v for k, v in dispatcher.targetoptions.items()},
            **_nvvm_version()}


def _driver_fields():
    """What links a cubin from PTX here: the driver's CUDA API version, and
    :func:`_linker_versions`."""
    from numba.cuda.cudadrv import driver

    return {"driver": list(driver.get_version()), **_linker_versions()}


@functools.cache
def _linker_versions():
    """The linkers' releases, which one driver API version spans many of: the
    driver's own (:func:`_driver_release`), and nvJitLink's with the cuda-core and
    cuda-bindings that call it (cuda.core's ``Linker``, which numba-cuda links
    through, takes nvJitLink where its library loads, else the driver's).
    ``None`` for what cannot be read: a key never fails for want of one."""
    from importlib import metadata

    fields = {"driver_release": _driver_release()}
    for dist in ("cuda-core", "cuda-bindings"):
        try:
            fields[dist] = metadata.version(dist)
        except Exception:  # not installed, or unreadable metadata
            fields[dist] = None
    try:
        from cuda.bindings import nvjitlink

        fields["nvjitlink"] = list(nvjitlink.version())
    except Exception:  # no nvJitLink library here: the driver links
        fields["nvjitlink"] = None
    return fields


def _driver_release(path="/proc/driver/nvidia/version"):
    """The NVIDIA kernel module's release (``"580.159.04"``) from ``path``, or
    ``None`` where it cannot be read."""
    try:
        with open(path) as f:
            text = f.read(4096)
    except (OSError, UnicodeDecodeError):
        return None
    import re

    found = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
    return found.group(1) if found else None


def cuda_image(dispatcher, argtypes, cc):
    """``(cubin, entry_name, compiled)`` of a CUDA kernel for ``argtypes`` on compute
    capability ``cc``: from the cache where an entry holds it (a cubin, or PTX
    linked here), else compiled by ``dispatcher`` (``compiled`` is then ``True``:
    the dispatcher holds the overload) and stored. Needs a GPU."""
    argtypes = tuple(argtypes)
    cc = tuple(cc)
    keys = None
    if cache_dir() is not None and not _simulated():
        try:
            base = _cuda_fields(dispatcher, argtypes, cc)
            keys = (_key("cubin", dispatcher, {**base, **_driver_fields()}),
                    _key("ptx", dispatcher, base))
        except _Uncacheable:
            _count("uncacheable")
    if keys is not None:
        found = _load(keys[0])
        if found is not None:
            _count("loaded")
            return found[1], found[0]["entry_name"], False
        found = _load(keys[1])
        if found is not None:  # built without a GPU: link it here, once
            _linking()
            try:
                cubin = _link_ptx(found[1], cc, dispatcher.targetoptions)
            except Exception as exc:  # e.g. a driver older than the PTX: compile instead
                warnings.warn(f"cupy_dcp: a cached kernel's PTX did not link ({exc}); "
                              "compiling it", CacheWarning, stacklevel=2)
            else:
                _store(keys[0], found[0], cubin)
                _count("loaded")
                return cubin, found[0]["entry_name"], False
    dispatcher.compile(argtypes)
    compiled = dispatcher.overloads[argtypes]
    _linking()
    cubin = compiled.library.get_cubin(cc=cc)
    cubin = bytes(getattr(cubin, "code", cubin))
    _count("compiled")
    if keys is not None:
        _store(keys[0], {"entry_name": compiled.entry_name}, cubin)
    return cubin, compiled.entry_name, True


_thread = threading.local()


@contextlib.contextmanager
def on_link(callback):
    """Within this block, this thread calls ``callback()`` when a kernel it builds is
    about to be linked into a cubin (the CUDA driver's work, which leaves Python to
    other threads): ``cupy_dcp._compile`` then lets the next build start."""
    _thread.on_link = callback
    try:
        yield
    finally:
        _thread.on_link = None


def _linking():
    callback = getattr(_thread, "on_link", None)
    if callback is not None:
        callback()


def _link_ptx(ptx, cc, options):
    """The cubin of ``ptx`` for ``cc``, linked as Numba links a kernel's PTX."""
    from numba.cuda.cudadrv import driver

    # numba-cuda's own linker, as CUDACodeLibrary.get_cubin makes it (private: the
    # version of numba-cuda is in every key); older releases named it Linker.new
    make = getattr(driver, "_Linker", None) or driver.Linker.new
    linker = make(max_registers=options.get("max_registers") or None,
                  lineinfo=bool(options.get("lineinfo")), cc=cc)
    linker.add_ptx(bytes(ptx))
    cubin = linker.complete()
    return bytes(getattr(cubin, "code", cubin))


def cuda_ptx(dispatcher, argtypes, cc):
    """Fill the cache with a CUDA kernel's PTX for compute capability ``cc``, without a
    GPU (the first process to load it on a GPU links it). Returns ``True`` if it
    compiled, ``False`` if the cache already held it (or cannot hold it)."""
    argtypes = tuple(argtypes)
    cc = tuple(cc)
    try:
        key = _key("ptx", dispatcher, _cuda_fields(dispatcher, argtypes, cc))
    except _Uncacheable:
        _count("uncacheable")
        return False
    if _load(key) is not None:
        _count("loaded")
        return False
    from numba.cuda.dispatcher import _Kernel

    with _compute_capability(cc):  # the compile a GPU's dispatcher makes, less loading
        kernel = _Kernel(dispatcher.py_func, argtypes, **dispatcher.targetoptions)
        library = kernel._codelibrary
        ptx = library.get_asm_str(cc=cc)
    _count("compiled")
    if library._linking_files or library.needs_cudadevrt:  # PTX alone would not link
        _count("uncacheable")
        return True
    _store(key, {"entry_name": kernel.entry_name}, ptx.encode())
    return True


@contextlib.contextmanager
def _compute_capability(cc):
    """Numba compiles kernels and device functions for the current GPU's capability:
    here, for ``cc``, with no GPU (Numba's private hooks for it: numba-cuda's
    version is in every key)."""
    import numba.cuda.dispatcher as dispatch
    from numba.cuda.codegen import CUDACodeLibrary

    class _Device:
        compute_capability = cc

    saved_device, saved_cc = dispatch.get_current_device, CUDACodeLibrary._ensure_cc
    dispatch.get_current_device = lambda: _Device()
    CUDACodeLibrary._ensure_cc = lambda self, wanted: cc if wanted is None else wanted
    try:
        yield
    finally:
        dispatch.get_current_device, CUDACodeLibrary._ensure_cc = saved_device, saved_cc


# --- host (njit) functions ---------------------------------------------------------------

def cached_njit(**options):
    """``numba.njit(**options)`` whose compile results are kept in this cache (Numba's
    own ``cache=True`` keys closures by pickling what they captured, puts functions
    of one name and line but other options in one slot, and raises on a corrupt
    file)."""
    from numba import njit

    def decorate(func):
        dispatcher = njit(cache=False, **options)(func)
        dispatcher._cache = _HostCache(dispatcher)  # the slot Numba's cache=True fills
        return dispatcher

    return decorate


def _njit_config():
    """Numba's process-wide switches that change a host function's machine code (set by
    ``NUMBA_*`` variables): part of every ``njit`` key."""
    from numba.core import config

    return {name: str(getattr(config, name, None))
            for name in ("BOUNDSCHECK", "OPT", "DEBUGINFO_DEFAULT", "LOOP_VECTORIZE",
                         "SLP_VECTORIZE", "ENABLE_AVX")}


class _HostCache:
    """Numba's cache interface (``load_overload``, ``save_overload``) over this cache."""

    def __init__(self, dispatcher):
        self._dispatcher = dispatcher
        self._code = _UNSET

    @property
    def cache_path(self):
        return str(cache_dir())

    def _entry_key(self, sig, codegen):
        if self._code is _UNSET:
            try:
                self._code = code_fingerprint(self._dispatcher)
            except _Uncacheable:
                _count("uncacheable")
                self._code = None
        if self._code is None or cache_dir() is None:
            return None
        return _key("njit", self._dispatcher, {"sig": str(sig),
                                               "target": list(codegen.magic_tuple()),
                                               "config": _njit_config()})

    def load_overload(self, sig, target_context):
        target_context.refresh()
        key = self._entry_key(sig, target_context.codegen())
        found = None if key is None else _load(key)
        if found is None:
            return None
        import pickle

        from numba.core.compiler import CompileResult

        try:
            result = CompileResult._rebuild(target_context, *pickle.loads(found[1]))
        except Exception as exc:  # an intact file that Numba cannot rebuild: compile anew
            warnings.warn(f"cupy_dcp: a cached host kernel could not be rebuilt ({exc}); "
                          "compiling it", CacheWarning, stacklevel=2)
            return None
        _count("loaded")
        return result

    def save_overload(self, sig, result):
        _count("compiled")  # Numba saves right after each compile
        if result.lifted or result.library.has_dynamic_globals:
            _count("uncacheable")  # (addresses baked into the code: NUMBA_OPT=0, say)
            return
        key = self._entry_key(sig, result.codegen)
        if key is None:
            return
        from numba.core.serialize import dumps

        _store(key, {}, dumps(result._reduce()))

    def enable(self):
        pass

    def disable(self):
        pass

    def flush(self):
        pass
