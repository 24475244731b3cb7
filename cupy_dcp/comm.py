"""Communicator: an mpi4py group with an all-to-all of byte buffers.

Two transports: ``MPI.Alltoall`` for host buffers, and NCCL (CuPy's
``NcclCommunicator``, its unique id broadcast with mpi4py) for device buffers,
as grouped send/recv on the caller's stream. Nothing here knows about
attention: it moves bytes.

Under faults: every host wait is bounded (:data:`DEFAULT_TIMEOUT`, ten minutes,
unless the communicator's ``timeout`` says otherwise); a rank that fails its
own checks before a collective tells the others, which raise the same
exception type; a freed communicator raises ``RuntimeError`` instead of
reaching MPI.
"""

import math
import numbers
import pickle
import threading
import time
import warnings

import numpy as np
from mpi4py import MPI

from . import _nccl_end, _signed
from ._checks import check_count
from ._nccl_end import is_capturing
from ._staged import staged_allgather, staged_alltoall, staged_reduce_scatter

__all__ = ["DEFAULT_TIMEOUT", "Communicator", "as_communicator", "check_device",
           "check_timeout", "require_cupy"]

_BACKENDS = ("auto", "mpi", "nccl")

DEFAULT_TIMEOUT = 600.0
"""Seconds a host wait may take when the communicator sets no ``timeout``
(torch.distributed's watchdog also waits ten minutes)."""


def check_timeout(timeout, name="timeout"):
    """``timeout`` as float seconds (``None`` stays ``None``): ``TypeError`` unless a
    real number, ``ValueError`` unless > 0 (``math.inf``: no bound)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds or None "
                        f"(got {type(timeout).__name__} {timeout!r})")
    if not timeout > 0:  # NaN too
        raise ValueError(f"{name} must be > 0 seconds or None (got {timeout!r})")
    return float(timeout)


def check_device(device):
    """``device`` as a GPU ordinal (``None`` stays ``None``): ``TypeError`` unless an
    integer (not a bool), ``ValueError`` if negative (``_checks.check_count``)."""
    return None if device is None else check_count(device, "device", 0)


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
        timeout: seconds a host wait (an exchange, :meth:`agree`, a plan's
            construction) or :meth:`synchronize` may take; ``None`` means
            :data:`DEFAULT_TIMEOUT` (600 s), ``math.inf`` no bound.
        last_operation: what the last device exchange was, for error messages.
        cached_plans: the plans the functional API made (one per stream and
            shape); they live until :meth:`free`.

    The NCCL id travels over MPI: the library opens no socket of its own.
    """

    def __init__(self, mpi_comm, backend="auto", device=None, owned=False, timeout=None):
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS} (got {backend!r})")
        timeout = check_timeout(timeout)
        device = check_device(device)
        _check_not_null(mpi_comm)
        self.mpi_comm = mpi_comm
        self._owned = owned
        self.timeout = timeout
        self.last_operation = None
        self.cached_plans = {}  # the functional API's plans; released by free()
        self._abandoned = []
        self._freed = False
        self._broken = None  # why the communicator is unusable, once it is
        self._staged = False  # device arrays go through host memory (ranks share a GPU)
        self._calls = 0  # the host calls made so far (part of each call's signature)
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
            device: the GPU of this rank (an ordinal: ``TypeError``,
                ``ValueError`` otherwise); ``None`` picks its rank within the
                node modulo the visible GPUs. With ``"auto"`` or ``"nccl"``
                and a GPU present it becomes CuPy's current device now, so
                that arrays made next live where the plans run.
            timeout: seconds that a host wait, or :meth:`synchronize`, may
                take before it raises instead of hanging; ``None`` is
                :data:`DEFAULT_TIMEOUT` (600 s), ``math.inf`` waits for ever.

        With ``"auto"``, ranks that share a GPU exchange device arrays through
        host memory with MPI (NCCL refuses two ranks on one GPU): a
        ``RuntimeWarning`` says so once.

        Raises:
            RuntimeError: ``"nccl"`` without CuPy, a GPU or NCCL on some rank,
                or with ranks that share a GPU (every rank raises, naming the
                ranks and what they lack or share).
            ValueError: ``comm`` is ``MPI.COMM_NULL`` (or a freed communicator).
        """
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS} (got {backend!r})")
        timeout = check_timeout(timeout)
        device = check_device(device)
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Comm):
            raise TypeError(f"comm must be an mpi4py communicator (got {type(comm).__name__})")
        _check_not_null(comm)
        dup, request = comm.Idup()
        limit = DEFAULT_TIMEOUT if timeout is None else timeout
        if not _complete(request, limit):
            _ABANDONED.append((dup, request))  # MPI may still complete it
            raise RuntimeError(f"Communicator.from_mpi did not complete within {limit} s on rank "
                               f"{comm.Get_rank()}: not every rank of the communicator called "
                               "it (a peer rank is missing or stuck)")
        self = cls(dup, backend, device, owned=True, timeout=timeout)
        # this rank's index among the ranks of its node (bounded, unlike MPI's Split_type:
        # a peer whose duplicate timed out never comes)
        names = self.allgather_object("finding the ranks' nodes", MPI.Get_processor_name())
        self._local_rank = names[:self.rank].count(names[self.rank])
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

        Builds the NCCL communicator, or, with ``backend="mpi"`` (or ``"auto"``
        where ranks share a GPU), only selects this rank's GPU (exchanges are
        then staged through host memory with MPI: exact, slow, not
        capturable). Returns the device ordinal.
        """
        if self.backend == "mpi" or self._staged:
            return self.select_device()
        if self.backend == "auto" and self._nccl is None:
            shared = self._shared_gpus()
            if shared:
                self._staged = True
                warnings.warn(f"cupy_dcp: {shared}: NCCL cannot run two ranks on one GPU, so "
                              "device arrays go through host memory with MPI (exact, slow, not "
                              "capturable in a CUDA graph; DcpDirectPlan runs on a shared GPU)",
                              RuntimeWarning, stacklevel=3)
                return self.device
        self.nccl()
        return self.device

    def _shared_gpus(self):
        """Collective: which ranks share a GPU (``"ranks 0, 1 share GPU <pci> of
        <host>"``, ``""`` where none do). Selects this rank's GPU; raises like
        :meth:`select_device` where a rank has none."""
        self.select_device()
        everyone = self.allgather_object("finding the ranks' GPUs", _gpu_address(self.device))
        return _describe_sharing(everyone)

    def select_device(self):
        """Collective: check that every rank has CuPy and a GPU, and select this rank's
        GPU (see :meth:`from_mpi`); no NCCL. Returns the device ordinal.

        Raises:
            RuntimeError: on every rank alike, naming the ranks and what they lack.
        """
        problem = _cupy_problem()
        problems = self.allgather_object("checking the ranks' GPUs", problem)
        bad = {r: p for r, p in enumerate(problems) if p is not None}
        if bad:
            detail = "; ".join(f"rank {r}: {p}" for r, p in sorted(bad.items()))
            raise RuntimeError(f"device arrays need CuPy and a GPU ({detail})")
        return self._pick_device()

    def barrier(self, what="barrier", timeout=None):
        """Wait for every rank, within ``timeout`` seconds (``None``: :attr:`timeout`,
        when one is set); late, a ``RuntimeError`` naming ``what``."""
        self.check_usable()
        limit = self.limit(timeout)  # (a bad timeout raises before anything is posted)
        self._wait(self.mpi_comm.Ibarrier(), what, None, None, limit)

    def nccl(self):
        """The NCCL communicator of this group, built on first use (collective).

        Every rank checks that it has CuPy, a GPU and NCCL, and that no other
        rank shares its GPU; where any fails, every rank raises the same
        ``RuntimeError`` naming the ranks (nobody is left waiting). Then rank 0
        makes the unique id, MPI broadcasts it, and every rank joins on its GPU.
        """
        if self._nccl is not None:
            return self._nccl
        if self.backend == "mpi":
            raise RuntimeError("this communicator's backend is 'mpi': it has no NCCL communicator "
                               "(device arrays are staged through host memory)")
        self.check_usable()
        problem = _nccl_problem()
        device = address = None
        if problem is None:
            device = self._pick_device()
            address = _gpu_address(device)
        everyone = self.allgather_object("checking the NCCL backend", (problem, address))
        bad = {r: p for r, (p, _) in enumerate(everyone) if p is not None}
        if bad:
            detail = "; ".join(f"rank {r}: {p}" for r, p in sorted(bad.items()))
            raise RuntimeError(f"the NCCL backend is unavailable ({detail})")
        shared = _describe_sharing([a for _, a in everyone])
        if shared:
            raise RuntimeError(f"the NCCL backend needs a GPU of its own for every rank: {shared} "
                               "(use backend='auto' or 'mpi', DcpDirectPlan, or one rank per GPU)")
        import cupy
        from cupy.cuda import nccl

        with cupy.cuda.Device(device):
            uid = nccl.get_unique_id() if self.rank == 0 else None
            uid = self.allgather_object("sharing the NCCL id", uid)[0]
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
        if self.backend == "mpi" or self._staged:
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
        limit = self.limit()
        # Always the nonblocking form: MPI never matches a blocking collective with a
        # nonblocking one, so ranks with and without a timeout must issue the same call.
        request = self.mpi_comm.Ialltoall([send.view("u1"), MPI.BYTE], [recv.view("u1"), MPI.BYTE])
        self._wait(request, "all-to-all", send, recv, limit)

    def allgather_host(self, send, recv):
        """All-gather host arrays: ``recv[r]`` (first axis N) receives rank r's ``send``."""
        self._check_host()
        limit = self.limit()
        request = self.mpi_comm.Iallgather([send.view("u1"), MPI.BYTE], [recv.view("u1"), MPI.BYTE])
        self._wait(request, "all-gather", send, recv, limit)

    def reduce_scatter_host(self, send, recv):
        """Sum ``send`` (first axis N, float64) over the ranks; ``recv`` gets chunk ``rank``."""
        self._check_host()
        limit = self.limit()
        request = self.mpi_comm.Ireduce_scatter_block(send, recv, op=MPI.SUM)
        self._wait(request, "reduce-scatter", send, recv, limit)

    def _check_host(self):
        self.check_usable()
        if self.backend == "nccl":
            raise RuntimeError("this communicator's backend is 'nccl': host arrays need 'mpi' or 'auto'")

    def check_usable(self):
        """Raise ``RuntimeError`` if this communicator was freed, or is unusable since
        a host wait timed out (MPI cannot cancel what was pending)."""
        if self._freed or self.mpi_comm == MPI.COMM_NULL:
            raise RuntimeError(f"this Communicator (rank {self.rank} of {self.world_size}) was "
                               "freed: build a new one with Communicator.from_mpi")
        if self._broken is not None:
            raise RuntimeError(f"this Communicator is unusable since an earlier failure "
                               f"({self._broken})")

    def limit(self, timeout=None):
        """The seconds a host wait may take: ``timeout``, else :attr:`timeout`, else
        :data:`DEFAULT_TIMEOUT` (``math.inf``: no bound). ``TypeError`` or
        ``ValueError`` (:func:`check_timeout`) for a bad one."""
        if timeout is not None:
            return check_timeout(timeout)
        timeout = check_timeout(self.timeout, "this Communicator's timeout")
        return DEFAULT_TIMEOUT if timeout is None else timeout

    def next_call(self):
        """Number this rank's next host call, for its signature. (MPI delivers each
        peer's messages in order, so a rank that skipped a call pairs its next one
        with its peers' current one, under the same number: that shows only where
        the two calls differ in another field of the signature.)"""
        self._calls += 1
        return self._calls

    def exchange_signed(self, send, recv, signature, what, timeout=None):
        """Signed all-to-all of host rows: row ``r`` of ``send`` to rank ``r``.

        Args:
            send: ``[N, M]`` uint8 (or ``[1, M]``: the same row to every rank);
                the last ``TRAILER_BYTES`` of each row are written here with
                ``signature``.
            recv: ``[N, M]`` uint8 that receives the peers' rows (this rank's
                own row is not touched).
            signature: an ordered dict of ints and short strings (at most 8
                ASCII characters) that every rank of the call must share.
            what: names the operation in errors.

        Returns:
            The bodies (rows less their trailer) received, ``None`` at this
            rank's place.

        Raises:
            ValueError: the ranks' signatures differ (the same error on every
                rank, naming the first field that differs and the ranks).
            ValueError, TypeError, RuntimeError: a rank failed its own checks
                (:meth:`fail_together`): its error's type, on every rank.
            RuntimeError: not complete within :meth:`limit` seconds.
        """
        self._check_host()
        _signed.write_trailer(send, _signed.DATA, signature)
        got = _signed.exchange(self, send, recv, what, self.limit(timeout))
        size, own = send.shape[1], send[0, -_signed.TRAILER_BYTES:].tobytes()
        if all(m is None or (m.nbytes == size and m[-_signed.TRAILER_BYTES:].tobytes() == own)
               for m in got):  # every peer signed as this rank did
            return [None if m is None else m[:-_signed.TRAILER_BYTES] for m in got]
        return _signed.verdict(what, self.rank, _signed.DATA, signature, got)

    def fail_together(self, what, error, timeout=None):
        """This rank failed its own checks before a collective: take part in the
        collective's messages in its place (so that no peer waits) and raise.

        Every rank raises the type of the lowest failing rank's error: that rank
        ``error`` itself, the others ``"{what}: rank r failed its checks: ..."``.
        Where the message cannot go out (a freed communicator, a broken MPI),
        ``error`` is raised alone.
        """
        try:
            self.check_usable()
            got = _signed.exchange(self, _signed.failure_message(error), None, what,
                                   self.limit(timeout))
        except (RuntimeError, MPI.Exception):
            raise error from None
        _signed.verdict(what, self.rank, _signed.FAILED, {}, got, own_error=error)
        raise error

    def allgather_object(self, what, value, timeout=None, step=None):
        """Collective, bounded by :meth:`limit`: every rank's ``value`` (picklable), in
        rank order. ``what`` names the step in errors; a rank at another ``step``
        (by default ``what``) makes every rank raise the same ``ValueError``."""
        self.check_usable()
        step = what if step is None else step
        body = pickle.dumps((step, value))
        send = np.zeros((1, len(body) + _signed.TRAILER_BYTES), dtype=np.uint8)
        send[0, :len(body)] = np.frombuffer(body, dtype=np.uint8)
        _signed.write_trailer(send, _signed.AGREE, {})
        got = _signed.exchange(self, send, None, what, self.limit(timeout))
        everyone = _signed.verdict(what, self.rank, _signed.AGREE, {}, got)
        everyone[self.rank] = (step, value)
        _signed.first_difference(what, "the step", [w for w, _ in everyone])
        return [v for _, v in everyone]

    def _wait(self, request, what, send, recv, limit):
        """Complete a host collective within ``limit`` seconds (:meth:`limit`'s). Late,
        tell the peers (each raises at its next check instead of waiting its own
        timeout); finished, raise if a peer gave up on this rank meanwhile."""
        size = "" if send is None else f" of {send.nbytes} bytes"
        try:
            done = _complete(request, limit, self)
        except MPI.Exception as exc:  # e.g. ranks that gave collectives of other sizes
            self._abandoned.append((request, send, recv))
            self._broken = (f"MPI {what}{size} failed on rank {self.rank} ({exc}; do the "
                            "ranks' calls have the same sizes?); the communicator is "
                            "unusable: abort the job")
            raise RuntimeError(self._broken) from None
        if not done:
            # MPI may still write into recv: the buffers must outlive the request
            self._abandoned.append((request, send, recv))
            _signed.give_up_on_all(self)
            self._broken = (f"MPI {what}{size} did not complete within "
                            f"{limit} s on rank {self.rank} (a peer rank is missing or "
                            "stuck); the communicator is unusable: abort the job")
            raise RuntimeError(self._broken)
        _signed.check_notices(self)

    def agree(self, what, fields, timeout=None):
        """Collective check that every rank holds the same ``fields``, bounded by
        :meth:`limit` seconds.

        Args:
            what: names the operation in the error (e.g. ``"DcpA2APlan"``).
            fields: a dict of plain values (sizes, dtype names, flags), in
                the order they should be compared; a value that is an
                exception means this rank already failed its own checks.

        Raises:
            ValueError: on every rank alike, naming the first field the ranks
                disagree on and which ranks differ from rank 0.
            ValueError, TypeError, RuntimeError: a rank failed its own checks:
                the lowest such rank's error type on every rank (that rank
                raises its own error, the others name it).
            RuntimeError: a rank did not arrive in time.
        """
        errors = [v for v in fields.values() if isinstance(v, Exception)]
        if errors:
            self.fail_together(what, errors[0], timeout)
        everyone = self.allgather_object(what, fields, timeout, step="agree")
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
            timeout: seconds; ``None`` uses :attr:`timeout`, else
                :data:`DEFAULT_TIMEOUT` (600 s); ``math.inf``: no bound.

        Raises:
            RuntimeError: NCCL reported an asynchronous error, or the stream
                had not drained in time; either way the NCCL communicator is
                aborted first, so that no rank stays blocked in it.
        """
        timeout = self.limit(timeout)
        require_cupy(f"rank {self.rank}: synchronize (a wait on a GPU stream)")
        if not drain(stream, None if timeout == math.inf else timeout, self._check_nccl):
            self.abort()
            raise RuntimeError(
                f"rank {self.rank}: {self.last_operation or 'the work on the stream'} did not "
                f"complete within {timeout} s (a peer rank is missing or stuck, or the ranks "
                "called with different sizes, dtypes or strategies, which NCCL cannot tell "
                "apart: check_consistency=True checks them before the exchange); "
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
        if self.backend == "mpi" or self._staged:
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
        if self.backend == "mpi" or self._staged:
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
        plans, self.cached_plans = self.cached_plans, {}
        try:
            for key, plan in plans.items():  # the current plans, and the list of retired ones
                for each in plan if key == "retired" else (plan,):
                    each.close()
        finally:
            self._free_own()

    def _free_own(self):
        self._end_nccl("destroy")
        self._freed = True
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


_ABANDONED = []  # duplicates whose creation timed out: MPI may still complete them


def _complete(request, limit, comm=None):
    """Wait for ``request`` at most ``limit`` seconds (``inf``: for ever); whether it
    completed. With ``comm``, a peer's notice that it gave up on this rank
    (:func:`_signed.check_notices`) raises ``RuntimeError`` meanwhile."""
    start = time.monotonic()
    while not request.Test():
        now = time.monotonic()
        if now > start + limit:
            return False
        if now > start + _signed.SPIN_S:
            if comm is not None:
                _signed.check_notices(comm, request)
            time.sleep(50e-6)
    return True


def _check_not_null(comm):
    if comm == MPI.COMM_NULL:
        raise ValueError("comm must be a live mpi4py communicator (got MPI.COMM_NULL: a null "
                         "or freed communicator)")


def _gpu_address(device):
    """This rank's GPU as ``"<host> <pci address>"``: one name per physical GPU."""
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(device)
    return (f"{MPI.Get_processor_name()} {props['pciDomainID']:04x}:"
            f"{props['pciBusID']:02x}:{props['pciDeviceID']:02x}")


def _describe_sharing(addresses):
    """``"ranks 0, 1 share GPU <address>; ..."`` for the GPUs (``addresses``, one per
    rank) that several ranks use, ``""`` where none is shared."""
    ranks = {}
    for rank, address in enumerate(addresses):
        ranks.setdefault(address, []).append(rank)
    shared = [(a, r) for a, r in ranks.items() if len(r) > 1]
    return "; ".join(f"ranks {', '.join(map(str, r))} share GPU {a}" for a, r in shared)


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


def require_cupy(what):
    """CuPy, imported; ``RuntimeError`` naming ``what`` needs it where it is missing."""
    try:
        import cupy
    except ImportError:
        raise RuntimeError(f"{what} needs CuPy, which is not installed "
                           "(pip install cupy-cuda12x or cupy-cuda13x)") from None
    return cupy


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
    as ``comm`` does. A freed :class:`Communicator` is a ``RuntimeError``,
    ``MPI.COMM_NULL`` a ``ValueError``.
    """
    global _KEYVAL
    if isinstance(comm, Communicator):
        comm.check_usable()
        return comm
    if isinstance(comm, MPI.Comm):
        _check_not_null(comm)
        if _KEYVAL is None:
            _KEYVAL = MPI.Comm.Create_keyval(delete_fn=_free_wrapper)
        wrapped = comm.Get_attr(_KEYVAL)
        if wrapped is None:
            wrapped = Communicator.from_mpi(comm)
            comm.Set_attr(_KEYVAL, wrapped)
        return wrapped
    raise TypeError(
        f"comm must be a cupy_dcp.Communicator or an mpi4py communicator (got {type(comm).__name__})")
