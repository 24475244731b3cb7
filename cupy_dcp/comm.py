"""Communicator: an mpi4py group with an all-to-all of byte buffers.

Two transports: ``MPI.Alltoall`` for host buffers, and NCCL (CuPy's
``NcclCommunicator``, its unique id broadcast with mpi4py) for device buffers,
as grouped send/recv on the caller's stream. Nothing here knows about
attention: it moves bytes.
"""

import threading
import time

from mpi4py import MPI

from . import _nccl_end
from ._nccl_end import is_capturing
from ._staged import staged_allgather, staged_alltoall, staged_reduce_scatter

__all__ = ["Communicator", "as_communicator"]

_BACKENDS = ("auto", "mpi", "nccl")


class Communicator:
    """A group of ranks that exchange equal-sized chunks of a buffer.

    Build one with :meth:`from_mpi`; every rank of the MPI communicator must
    do so together.

    Attributes:
        rank: this process's rank in the group.
        world_size: the number of ranks N.
        backend: ``"auto"``, ``"mpi"`` or ``"nccl"`` as asked.
        mpi_comm: the mpi4py communicator messages travel on (with
            :meth:`from_mpi`, a duplicate owned by this object).
        timeout: seconds a host exchange or :meth:`synchronize` may take
            (``None``: no bound).
        last_operation: what the last device exchange was, for error messages.
        cached_plans: the plans the functional API made (one per stream and
            shape); they live until :meth:`free`.

    The NCCL id travels over MPI: the library opens no socket of its own.
    """

    def __init__(self, mpi_comm, backend="auto", device=None, owned=False, timeout=None):
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS} (got {backend!r})")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds or None (got {timeout!r})")
        self.mpi_comm = mpi_comm
        self._owned = owned
        self.timeout = timeout
        self.last_operation = None
        self.cached_plans = {}  # the functional API's plans; released by free()
        self._abandoned = []
        self.backend = backend
        self.rank = mpi_comm.Get_rank()
        self.world_size = mpi_comm.Get_size()
        self.device = device
        self._local_rank = None  # this rank's index within its node, once known
        self._nccl = None
        self._captured = False  # an NCCL call of ours went into a CUDA graph
        self._ending = threading.Lock()  # one of free(), abort(), __del__ ends it

    @classmethod
    def from_mpi(cls, comm=None, backend="auto", device=None, timeout=None):
        """Wrap an mpi4py communicator (``MPI.COMM_WORLD`` by default).

        Collective: every rank of ``comm`` must call it. The communicator is
        duplicated, so the library's messages never mix with the caller's.

        Args:
            comm: an mpi4py communicator.
            backend: ``"nccl"`` (device arrays over NCCL; the NCCL
                communicator is built now), ``"auto"`` (MPI for host arrays;
                NCCL built at the first device call, which every rank makes
                together) or ``"mpi"`` (MPI only: host arrays directly, device
                arrays staged through host memory, exact but slow and not
                capturable in a CUDA graph).
            device: the GPU of this rank; ``None`` picks its rank within the
                node modulo the visible GPUs. With ``"auto"`` or ``"nccl"``
                and a GPU present it becomes CuPy's current device now, so
                that arrays made next live where the plans run.
            timeout: seconds that a host exchange, or :meth:`synchronize`, may
                take before it raises instead of hanging; ``None`` waits for ever.

        Raises:
            RuntimeError: ``"nccl"`` without CuPy, a GPU or NCCL on some rank
                (every rank raises, naming the ranks and what they lack).
        """
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS} (got {backend!r})")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds or None (got {timeout!r})")
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Comm):
            raise TypeError(f"comm must be an mpi4py communicator (got {type(comm).__name__})")
        self = cls(comm.Dup(), backend, device, owned=True, timeout=timeout)
        self._local_rank = node_rank_and_size(self.mpi_comm)[0]  # collective: every rank
        if backend == "auto" and _cupy_problem() is None:
            # this rank's GPU is current from now on: arrays the caller makes next
            # land on the device its plans will run on
            self._pick_device()
        if backend == "nccl":
            try:
                self.nccl()
            except BaseException:
                self.free()
                raise
        return self

    def prepare_device(self):
        """Collective: make this group ready for device arrays.

        Builds the NCCL communicator, or, with ``backend="mpi"``, only selects
        this rank's GPU (exchanges are then staged through host memory with
        MPI: exact, slow, not capturable). Returns the device ordinal.
        """
        if self.backend == "mpi":
            return self.select_device()
        self.nccl()
        return self.device

    def select_device(self):
        """Collective: check that every rank has CuPy and a GPU, and select this rank's
        GPU (see :meth:`from_mpi`); no NCCL. Returns the device ordinal.

        Raises:
            RuntimeError: on every rank alike, naming the ranks and what they lack.
        """
        problem = _cupy_problem()
        problems = self.mpi_comm.allgather(problem)
        bad = {r: p for r, p in enumerate(problems) if p is not None}
        if bad:
            detail = "; ".join(f"rank {r}: {p}" for r, p in sorted(bad.items()))
            raise RuntimeError(f"device arrays need CuPy and a GPU ({detail})")
        return self._pick_device()

    def barrier(self, what="barrier", timeout=None):
        """Wait for every rank, within ``timeout`` seconds (``None``: :attr:`timeout`,
        when one is set); late, a ``RuntimeError`` naming ``what``."""
        self._wait(self.mpi_comm.Ibarrier(), what, None, None, timeout)

    def nccl(self):
        """The NCCL communicator of this group, built on first use (collective).

        Every rank checks that it has CuPy, a GPU and NCCL; if any lacks one,
        every rank raises the same ``RuntimeError`` (nobody is left waiting).
        Then rank 0 makes the unique id, MPI broadcasts it, and every rank
        joins on its GPU.
        """
        if self._nccl is not None:
            return self._nccl
        if self.backend == "mpi":
            raise RuntimeError("this communicator's backend is 'mpi': it has no NCCL communicator "
                               "(device arrays are staged through host memory)")
        problem = _nccl_problem()
        device = None
        if problem is None:
            device = self._pick_device()
        problems = self.mpi_comm.allgather(problem)
        bad = {r: p for r, p in enumerate(problems) if p is not None}
        if bad:
            detail = "; ".join(f"rank {r}: {p}" for r, p in sorted(bad.items()))
            raise RuntimeError(f"the NCCL backend is unavailable ({detail})")
        import cupy
        from cupy.cuda import nccl

        with cupy.cuda.Device(device):
            uid = nccl.get_unique_id() if self.rank == 0 else None
            uid = self.mpi_comm.bcast(uid, root=0)
            self._nccl = nccl.NcclCommunicator(self.world_size, uid, self.rank)
        self.device = device
        return self._nccl

    def _pick_device(self):
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
        if self.device is None:
            local_rank = self._local_rank
            if local_rank is None:
                local_rank = node_rank_and_size(self.mpi_comm)[0]
            self.device = local_rank % count
        cupy.cuda.Device(self.device).use()
        return self.device

    def alltoall_device(self, send_ptr, recv_ptr, chunk_bytes, stream_ptr):
        """Grouped NCCL send/recv: chunk ``r`` of ``send`` to rank ``r``, ``recv``'s from it.

        Chunks are ``chunk_bytes`` apart. This rank's own chunk is not moved:
        the caller writes it into ``recv`` directly. Enqueued on ``stream_ptr``.
        """
        self.last_operation = f"the all-to-all of {chunk_bytes} bytes per peer"
        if self.backend == "mpi":
            staged_alltoall(self, send_ptr, recv_ptr, chunk_bytes, stream_ptr)
            return
        from cupy.cuda import nccl

        comm = self._device_comm()
        uint8 = nccl.NCCL_UINT8
        nccl.groupStart()
        try:
            for peer in range(self.world_size):
                if peer != self.rank:
                    offset = peer * chunk_bytes
                    comm.send(send_ptr + offset, chunk_bytes, uint8, peer, stream_ptr)
                    comm.recv(recv_ptr + offset, chunk_bytes, uint8, peer, stream_ptr)
        finally:
            try:
                nccl.groupEnd()
            finally:
                self._note_capture(stream_ptr)

    def _note_capture(self, stream_ptr):
        """Remember that a CUDA graph captured an NCCL call of ours: NCCL's destroy and
        abort then wait for that graph's end (see :mod:`cupy_dcp._nccl_end`)."""
        if not self._captured and is_capturing(stream_ptr):
            self._captured = True

    def alltoall_host(self, send, recv):
        """Exchange chunk ``r`` of ``send`` with rank ``r``; chunk ``r`` of ``recv`` comes from it.

        Args:
            send: C-contiguous NumPy array whose first axis has N chunks.
            recv: C-contiguous NumPy array of the same shape and dtype.

        Raises:
            RuntimeError: with :attr:`timeout` set, when the exchange has not
                completed in time (a peer is missing or stuck). MPI cannot
                cancel a collective: the communicator is unusable afterwards,
                and the job should be aborted.
        """
        self._check_host()
        # Always the nonblocking form: MPI never matches a blocking collective with a
        # nonblocking one, so ranks with and without a timeout must issue the same call.
        request = self.mpi_comm.Ialltoall([send.view("u1"), MPI.BYTE], [recv.view("u1"), MPI.BYTE])
        self._wait(request, "all-to-all", send, recv)

    def allgather_host(self, send, recv):
        """All-gather host arrays: ``recv[r]`` (first axis N) receives rank r's ``send``."""
        self._check_host()
        request = self.mpi_comm.Iallgather([send.view("u1"), MPI.BYTE], [recv.view("u1"), MPI.BYTE])
        self._wait(request, "all-gather", send, recv)

    def reduce_scatter_host(self, send, recv):
        """Sum ``send`` (first axis N, float64) over the ranks; ``recv`` gets chunk ``rank``."""
        self._check_host()
        request = self.mpi_comm.Ireduce_scatter_block(send, recv, op=MPI.SUM)
        self._wait(request, "reduce-scatter", send, recv)

    def _check_host(self):
        if self.backend == "nccl":
            raise RuntimeError("this communicator's backend is 'nccl': host arrays need 'mpi' or 'auto'")

    def _wait(self, request, what, send, recv, timeout=None):
        """Complete a host collective, within ``timeout`` (or :attr:`timeout`) when set."""
        timeout = self.timeout if timeout is None else timeout
        if timeout is None:
            request.Wait()
            return
        deadline = time.monotonic() + timeout
        while not request.Test():
            if time.monotonic() > deadline:
                # MPI may still write into recv: the buffers must outlive the request
                self._abandoned.append((request, send, recv))
                size = "" if send is None else f" of {send.nbytes} bytes"
                raise RuntimeError(
                    f"MPI {what}{size} did not complete within "
                    f"{timeout} s on rank {self.rank} (a peer rank is missing or stuck); "
                    "the communicator is unusable: abort the job")
            time.sleep(50e-6)

    def agree(self, what, fields):
        """Collective check that every rank holds the same ``fields``.

        Args:
            what: names the operation in the error (e.g. ``"DcpA2APlan"``).
            fields: a dict of plain values (sizes, dtype names, flags), in
                the order they should be compared; a value that is an
                exception means this rank already failed its own checks.

        Raises:
            ValueError: on every rank alike, naming the first field the ranks
                disagree on and which ranks differ from rank 0, or the first
                rank whose own checks failed.
        """
        everyone = self.mpi_comm.allgather(fields)
        for rank, theirs in enumerate(everyone):
            for value in theirs.values():
                if isinstance(value, Exception):
                    if rank == self.rank:
                        raise value
                    raise ValueError(f"{what}: rank {rank} failed its checks: {value}")
        for key, value in everyone[0].items():
            values = [theirs.get(key) for theirs in everyone]
            differ = [r for r, v in enumerate(values) if v != value]
            if differ:
                got = ", ".join(f"rank {r}: {values[r]!r}" for r in differ)
                raise ValueError(f"{what}: ranks disagree on {key} (rank 0: {value!r}; {got})")

    def synchronize(self, stream=None, timeout=None):
        """Wait for the work enqueued on ``stream`` (exchanges included), with a bound.

        Args:
            stream: a CuPy stream or raw handle; ``None`` is CuPy's current stream.
            timeout: seconds; ``None`` uses :attr:`timeout`, and without one
                it waits as long as it takes.

        Raises:
            RuntimeError: NCCL reported an asynchronous error, or the stream
                had not drained in time; either way the NCCL communicator is
                aborted first, so that no rank stays blocked in it.
        """
        timeout = self.timeout if timeout is None else timeout
        if not drain(stream, timeout, self._check_nccl):
            self.abort()
            raise RuntimeError(
                f"rank {self.rank}: {self.last_operation or 'the work on the stream'} did not "
                f"complete within {timeout} s (a peer rank is missing or stuck); "
                "the NCCL communicator was aborted")
        self._check_nccl()

    def _check_nccl(self):
        if self._nccl is None:
            return
        try:
            self._nccl.check_async_error()
        except Exception as exc:  # cupy.cuda.nccl.NcclError
            self.abort()
            raise RuntimeError(f"rank {self.rank}: NCCL failed during "
                               f"{self.last_operation or 'an exchange'}: {exc}") from exc

    def abort(self):
        """Abort the NCCL communicator (its pending operations end); it cannot be used again.

        Where a CUDA graph captured one of its calls, NCCL finishes the abort only
        once that graph is destroyed: it then goes on in the background."""
        self._end_nccl("abort")

    def _end_nccl(self, how):
        """Take the NCCL communicator (once, whichever thread asks) and end it."""
        with self._ending:
            nccl_comm, self._nccl = self._nccl, None
        if nccl_comm is not None:
            self._end(nccl_comm, how, self._captured)

    # bound here, so that a finaliser that runs while the module is torn down has it
    _end = staticmethod(_nccl_end.end_nccl)
    _keep = staticmethod(_nccl_end.keep)

    def allgather_device(self, send_ptr, recv_ptr, count, stream_ptr):
        """NCCL all-gather of ``count`` float32 per rank, on ``stream_ptr``."""
        self.last_operation = f"the all-gather of {count} float32 per rank"
        if self.backend == "mpi":
            staged_allgather(self, send_ptr, recv_ptr, count, stream_ptr)
            return
        from cupy.cuda import nccl

        comm = self._device_comm()
        try:
            comm.allGather(send_ptr, recv_ptr, count, nccl.NCCL_FLOAT32, stream_ptr)
        finally:
            self._note_capture(stream_ptr)

    def reduce_scatter_device(self, send_ptr, recv_ptr, count, stream_ptr):
        """NCCL reduce-scatter (sum) of float32, ``count`` per rank, on ``stream_ptr``."""
        self.last_operation = f"the reduce-scatter of {count} float32 per rank"
        if self.backend == "mpi":
            staged_reduce_scatter(self, send_ptr, recv_ptr, count, stream_ptr)
            return
        from cupy.cuda import nccl

        comm = self._device_comm()
        try:
            comm.reduceScatter(send_ptr, recv_ptr, count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
                               stream_ptr)
        finally:
            self._note_capture(stream_ptr)

    def _device_comm(self):
        if self._nccl is None:
            raise RuntimeError(f"rank {self.rank}: the NCCL communicator is not built or was aborted")
        return self._nccl

    def free(self):
        """Release the cached plans, the NCCL communicator and the MPI duplicate this
        object owns (collective). Graphs that captured a call must not replay
        afterwards; where one did, NCCL destroys the communicator only once those
        graphs are destroyed, which then happens in the background (never a hang,
        whichever goes first)."""
        self.cached_plans.clear()
        self._end_nccl("destroy")
        if self._owned and self.mpi_comm != MPI.COMM_NULL:
            self.mpi_comm.Free()

    def __del__(self):
        # Dropped without free(): CuPy would destroy the NCCL communicator as it goes,
        # on this thread, and hang where a graph that captured it outlives it.
        nccl_comm = getattr(self, "_nccl", None)
        if nccl_comm is None:
            return
        self._nccl = None
        try:
            self._end(nccl_comm, "destroy", getattr(self, "_captured", True))
        except Exception:  # noqa: BLE001 - nothing may escape a finaliser
            try:
                self._keep(nccl_comm)  # never destroyed here, where it could hang
            except Exception:  # noqa: BLE001
                pass

    def __repr__(self):
        return f"Communicator(rank={self.rank}, world_size={self.world_size}, backend={self.backend!r})"


def node_rank_and_size(mpi_comm):
    """Collective: this rank's index among the ranks of ``mpi_comm`` on its node, and
    how many they are."""
    node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_rank(), node.Get_size()
    finally:
        node.Free()


def drain(stream, timeout, poll=None):
    """Wait until the work enqueued on ``stream`` (so far) is done, calling ``poll()``
    (which may raise) while it is not; ``False`` if ``timeout`` seconds (``None``:
    no bound) passed first."""
    import cupy

    from .kernels._arrays import cupy_stream, stream_ptr

    event = cupy.cuda.Event(block=False, disable_timing=True)
    event.record(cupy_stream(stream_ptr(stream)))
    deadline = None if timeout is None else time.monotonic() + timeout
    while not event.done:
        if poll is not None:
            poll()
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(20e-6)
    return True


def _cupy_problem():
    """What this process lacks for device arrays (CuPy, a GPU), or ``None``."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install cupy-cuda12x or cupy-cuda13x)"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver: CUDARuntimeError
        return f"no CUDA GPU ({exc})"
    if count == 0:
        return "no CUDA GPU is visible"
    return None


def _nccl_problem():
    """What this process lacks for NCCL, or ``None``."""
    problem = _cupy_problem()
    if problem is not None:
        return problem
    try:
        from cupy.cuda import nccl
    except ImportError:
        return "CuPy was built without NCCL"
    if not getattr(nccl, "available", True):
        return "CuPy was built without NCCL"
    return None


# The wrapper of a plain mpi4py communicator is cached on the communicator
# itself, as an MPI attribute: it goes away when the communicator is freed, so
# a later communicator that reuses the handle never finds a stale wrapper.
_KEYVAL = None


def _free_wrapper(comm, keyval, wrapper):
    try:
        wrapper.free()
    except Exception:  # at MPI_Finalize, CuPy or NCCL may already be gone
        pass


def as_communicator(comm):
    """Return ``comm`` as a :class:`Communicator`; a plain mpi4py communicator is wrapped once.

    Wrapping is collective (it duplicates ``comm``); the wrapper lives as long
    as ``comm`` does.
    """
    global _KEYVAL
    if isinstance(comm, Communicator):
        return comm
    if isinstance(comm, MPI.Comm):
        if _KEYVAL is None:
            _KEYVAL = MPI.Comm.Create_keyval(delete_fn=_free_wrapper)
        wrapped = comm.Get_attr(_KEYVAL)
        if wrapped is None:
            wrapped = Communicator.from_mpi(comm)
            comm.Set_attr(_KEYVAL, wrapped)
        return wrapped
    raise TypeError(
        f"comm must be a cupy_dcp.Communicator or an mpi4py communicator (got {type(comm).__name__})")
