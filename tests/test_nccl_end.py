"""Ending the NCCL communicator: never on the caller's thread where a CUDA graph that
captured it may outlive it (NCCL's destroy and abort wait for such graphs)."""

import gc
import subprocess
import sys
import textwrap
import threading
import types

import pytest
from mpi4py import MPI

import cupy_dcp
from cupy_dcp import comm as comm_module


class StandInNccl:
    """Records which thread ends it; ``release`` plays the last graph's destruction."""

    def __init__(self):
        self.release = threading.Event()
        self.ended = threading.Event()
        self.how = self.thread = None

    def _end(self, how):
        self.how, self.thread = how, threading.current_thread()
        assert self.release.wait(10), "the stand-in's graph was never released"
        self.ended.set()

    def destroy(self):
        self._end("destroy")

    def abort(self):
        self._end("abort")


def communicator(captured, monkeypatch):
    comm = cupy_dcp.Communicator.from_mpi(MPI.COMM_SELF, backend="auto")
    nccl = StandInNccl()
    comm._nccl = nccl
    if captured:  # as the first NCCL call enqueued into a capturing stream leaves it
        monkeypatch.setattr(comm_module, "is_capturing", lambda stream_ptr: True)
        comm._note_capture(0)
    return comm, nccl


@pytest.mark.parametrize("end", ["free", "abort", "drop"])
def test_a_captured_communicator_ends_in_the_background(end, monkeypatch):
    comm, nccl = communicator(True, monkeypatch)
    assert comm._captured
    how = "abort" if end == "abort" else "destroy"
    if end == "drop":  # the script's locals go, the graph still alive
        del comm
        gc.collect()
    else:
        getattr(comm, end)()  # returns although the "graph" still holds the communicator
        assert comm._nccl is None
    assert not nccl.ended.is_set()
    nccl.release.set()  # the graph goes: NCCL's wait ends
    assert nccl.ended.wait(10)
    assert nccl.how == how and nccl.thread is not threading.main_thread()
    assert nccl.thread.daemon


@pytest.mark.parametrize("end", ["free", "abort", "drop"])
def test_an_uncaptured_communicator_ends_on_the_callers_thread(end, monkeypatch):
    monkeypatch.setattr(comm_module, "is_capturing", lambda stream_ptr: False)
    comm, nccl = communicator(False, monkeypatch)
    comm._note_capture(0)  # an eager call
    assert not comm._captured
    nccl.release.set()
    if end == "drop":
        del comm
        gc.collect()
    else:
        getattr(comm, end)()
    assert nccl.ended.is_set(), "ended before the call returned"
    assert nccl.how == ("abort" if end == "abort" else "destroy")
    assert nccl.thread is threading.current_thread()


def test_a_communicator_is_ended_once(monkeypatch):
    comm, nccl = communicator(True, monkeypatch)
    nccl.release.set()
    comm.free()
    assert nccl.ended.wait(10)
    nccl.ended.clear()
    comm.abort()
    del comm
    gc.collect()
    assert not nccl.ended.wait(0.2)


class RecordingNccl(StandInNccl):
    """A stand-in that also takes NCCL calls (and records them)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __getattr__(self, name):  # send, recv, allGather, reduceScatter
        return lambda *args: self.calls.append(name)


def stand_in_cupy(monkeypatch, name, module):
    """``from cupy.cuda import <name>`` gives ``module`` (CuPy may be absent)."""
    cuda = types.ModuleType("cupy.cuda")
    setattr(cuda, name, module)
    cupy = types.ModuleType("cupy")
    cupy.cuda = cuda
    for key, value in (("cupy", cupy), ("cupy.cuda", cuda), (f"cupy.cuda.{name}", module)):
        monkeypatch.setitem(sys.modules, key, value)


@pytest.fixture
def stand_in_cupy_nccl(monkeypatch):
    nccl = types.ModuleType("cupy.cuda.nccl")
    nccl.groupStart = nccl.groupEnd = lambda: None
    nccl.NCCL_UINT8, nccl.NCCL_FLOAT32, nccl.NCCL_SUM = 0, 7, 0
    stand_in_cupy(monkeypatch, "nccl", nccl)


@pytest.mark.parametrize("call, names", [
    (lambda c: c.alltoall_device(0, 0, 8, 5), ["send", "recv"]),
    (lambda c: c.allgather_device(0, 0, 8, 5), ["allGather"]),
    (lambda c: c.reduce_scatter_device(0, 0, 8, 5), ["reduceScatter"]),
], ids=["alltoall", "allgather", "reduce_scatter"])
@pytest.mark.parametrize("capturing", [True, False])
def test_every_nccl_call_notes_a_capture(call, names, capturing, stand_in_cupy_nccl, monkeypatch):
    asked = []

    def query(stream_ptr):
        asked.append(stream_ptr)
        return capturing

    monkeypatch.setattr(comm_module, "is_capturing", query)
    comm = cupy_dcp.Communicator.from_mpi(MPI.COMM_SELF)
    comm.world_size = 2  # one peer to send to (NCCL never learns otherwise)
    nccl = comm._nccl = RecordingNccl()
    nccl.release.set()
    call(comm)
    assert nccl.calls == names and asked == [5]
    assert comm._captured is capturing
    comm.free()
    assert nccl.ended.wait(10)


def test_a_failed_capture_query_counts_as_captured(monkeypatch):
    def failing(stream_ptr):
        raise RuntimeError("cudaErrorStreamCaptureInvalidated")

    stand_in_cupy(monkeypatch, "runtime", types.SimpleNamespace(streamIsCapturing=failing))
    from cupy_dcp._nccl_end import is_capturing

    assert is_capturing(5) is True


EXIT_SCRIPT = """
import threading
from mpi4py import MPI
import cupy_dcp
from cupy_dcp import comm as comm_module

class GraphNeverGoes:  # NCCL's destroy, waiting for a graph that outlives the process
    def destroy(self):
        threading.Event().wait()
    abort = destroy

comm_module.is_capturing = lambda stream_ptr: True
COMM = cupy_dcp.Communicator.from_mpi(MPI.COMM_SELF)
COMM._nccl = GraphNeverGoes()
COMM._note_capture(0)
if {free}:
    COMM.free()
print("done", flush=True)
"""


@pytest.mark.parametrize("free", [False, True], ids=["kept to the end", "freed"])
def test_a_process_with_a_captured_communicator_exits(free):
    """Kept in a global, it meets its end while the interpreter shuts down, when no
    thread may start (Python 3.11 would block in Thread.start for ever)."""
    script = textwrap.dedent(EXIT_SCRIPT.format(free=free))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stdout + proc.stderr
