"""Ending the NCCL communicator: never on the caller's thread where a CUDA graph that
captured it may outlive it (NCCL's destroy and abort wait for such graphs)."""

import gc
import threading

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
