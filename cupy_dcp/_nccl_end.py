"""Ending an NCCL communicator without hanging on the CUDA graphs that captured it.

NCCL's ``ncclCommDestroy`` and ``ncclCommAbort`` both wait until every CUDA
graph that captured an operation of the communicator has been destroyed:
such a graph holds a reference that only its destruction drops. A script
whose locals go when its function returns (Python picks the order) can drop
the communicator before the graph; on the thread that would destroy the
graph, the wait never ends. Two H200s showed it: the decode-loop example on
the NCCL path printed its result and then never exited.

So a communicator that may have been captured is ended on a daemon thread,
which returns once the graphs are gone (or never, if the process ends
first: its memory goes with the process). One never captured is ended on
the caller's thread, complete on return. While the interpreter shuts down
no thread may start (before Python 3.12 ``Thread.start`` then blocks for
ever): a captured communicator is kept, never ended, and goes with the
process.
"""

import ctypes
import sys
import threading

__all__ = ["end_nccl", "is_capturing"]


def is_capturing(stream_ptr):
    """Whether the CUDA stream ``stream_ptr`` may be capturing a graph now (an error
    of the query, such as an invalidated capture, counts as yes)."""
    from cupy.cuda import runtime

    try:
        return bool(runtime.streamIsCapturing(stream_ptr))
    except Exception:  # noqa: BLE001 - e.g. cudaErrorStreamCaptureInvalidated
        return True


def keep(obj):
    """Never deallocate ``obj`` (its finaliser could hang): it goes with the process."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def end_nccl(nccl_comm, how, captured):
    """Run ``nccl_comm.destroy()`` or ``.abort()`` (``how``); on a daemon thread where a
    graph may have captured the communicator (``captured``).

    Returns the thread, or ``None`` where the call ran here or, at interpreter
    shutdown, where the communicator is kept for the rest of the process
    rather than ended where it could hang.
    """
    end = getattr(nccl_comm, how)
    if not captured:
        end()
        return None
    if sys.is_finalizing():
        keep(nccl_comm)
        return None
    thread = threading.Thread(target=end, name=f"cupy_dcp: NCCL {how}", daemon=True)
    try:
        thread.start()
    except RuntimeError:  # "can't create new thread at interpreter shutdown"
        keep(nccl_comm)
        return None
    return thread
