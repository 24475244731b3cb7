"""The device path's record of divergent calls: the status words that the combine
kernel marks where a peer's trailer differs from rank 0's (the format is
``cupy_dcp.kernels._trailer``'s), in host-mapped memory, and the error they mean.
"""

import numpy as np

from .kernels import _trailer
from .kernels._launch import DeviceArray

__all__ = ["A2A_CODE", "MappedWords", "divergence_message"]

A2A_CODE = 1  # the strategy word of the packed all-to-all's trailer


def divergence_message(name, words):
    """The error of the first (peer, field) that the combine marked in ``words``
    (``_trailer``'s status), or ``None``: the same on every rank (each rank
    compared the same chunks)."""
    marks = words.reshape(-1, _trailer.WORDS, _trailer.STATUS_WORDS)
    flagged = np.argwhere(marks[:, :, 0] != 0)
    if flagged.size == 0:
        return None
    peer, field = (int(i) for i in flagged[0])
    first, theirs = (_value(field, int(v)) for v in marks[peer, field, 1:])
    if field == 0:
        return (f"{name}: rank {peer}'s chunk carried no signature in an earlier call (the ranks' "
                "calls differ in tokens, heads or head size, or a rank skipped a call): its "
                "result is void")
    return (f"{name}: ranks disagree on {_trailer.FIELDS[field]} (rank 0: {first!r}; "
            f"rank {peer}: {theirs!r}) in an earlier call: its result is void")


def _value(field, word):
    name = _trailer.FIELDS[field]
    if name == "dtype":
        codes = {code: dtype for dtype, code in _trailer.DTYPE_CODES.items()}
        return codes.get(word, word)
    if name == "is_lse_base_on_e":
        return bool(word)
    if name == "strategy":
        return "a2a" if word == A2A_CODE else word
    return word


_ORPHANS: "list[tuple[int, int]]" = []  # (device, pointer) of words dropped unfreed


def _free_host(device, ptr):
    """Free mapped words once every kernel of ``device`` that may write them is done."""
    import cupy

    with cupy.cuda.Device(device):
        cupy.cuda.runtime.deviceSynchronize()
    cupy.cuda.runtime.freeHost(ptr)


def _free_orphans():
    while True:
        try:
            device, ptr = _ORPHANS.pop()
        except IndexError:  # (none left, or another thread took the last)
            return
        _free_host(device, ptr)


class MappedWords:
    """``count`` int64 words of host-mapped, page-locked memory, zeroed: ``words``
    (the host's NumPy view) and ``array`` (the kernels' view), written by kernels on
    the device current at creation.

    :meth:`free` releases them. Words dropped unfreed (their plan dropped without
    ``close()``) are not freed in the finaliser, which may run inside a caller's
    CUDA graph capture, where a synchronisation is an error: they are freed by the
    next :meth:`free` or creation of mapped words."""

    _PORTABLE_MAPPED = 3  # cudaHostAllocPortable | cudaHostAllocMapped

    def __init__(self, count, owner):
        import ctypes

        import cupy

        _free_orphans()
        runtime = cupy.cuda.runtime
        self.device = runtime.getDevice()
        self.ptr = runtime.hostAlloc(8 * count, self._PORTABLE_MAPPED)
        self.words = np.ctypeslib.as_array((ctypes.c_int64 * count).from_address(self.ptr))
        self.words[:] = 0
        # unified addressing: the kernels see mapped memory at its host address
        self.array = DeviceArray(self.ptr, (count,), (8,), np.dtype(np.int64), owner)

    def free(self):
        """Free the memory once every kernel that may write it is done (a
        synchronisation of its device), and any mapped words dropped unfreed."""
        if self.ptr:
            ptr, self.ptr, self.words = self.ptr, 0, None
            _free_host(self.device, ptr)
        _free_orphans()

    def __del__(self):
        if getattr(self, "ptr", 0):
            try:
                _ORPHANS.append((self.device, self.ptr))
            except Exception:  # noqa: BLE001 - at interpreter exit (the process frees it)
                pass
            self.ptr = 0
