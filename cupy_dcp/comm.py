"""Communicator: an mpi4py group with an all-to-all of byte buffers.

Two transports: ``MPI.Alltoall`` for host buffers, and NCCL (CuPy's
``NcclCommunicator``, its unique id broadcast with mpi4py) for device buffers,
as grouped send/recv on the caller's stream. Nothing here knows about
attention: it moves bytes.
"""

from mpi4py import MPI

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
    """

    def __init__(self, mpi_comm, backend="auto", device=None, owned=False):
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS} (got {backend!r})")
        self.mpi_comm = mpi_comm
        self._owned = owned
        self.backend = backend
        self.rank = mpi_comm.Get_rank()
        self.world_size = mpi_comm.Get_size()
        self.device = device
        self._nccl = None

    @classmethod
    def from_mpi(cls, comm=None, backend="auto", device=None):
        """Wrap an mpi4py communicator (``MPI.COMM_WORLD`` by default).

        Collective: every rank of ``comm`` must call it. The communicator is
        duplicated, so the library's messages never mix with the caller's.

        Args:
            comm: an mpi4py communicator.
            backend: ``"mpi"`` (host arrays, ``MPI.Alltoall``), ``"nccl"``
                (device arrays; the NCCL communicator is built now) or
                ``"auto"`` (MPI for host arrays; NCCL built at the first
                device call, which every rank makes together).
            device: the GPU of this rank; ``None`` picks its rank within the
                node modulo the visible GPUs.

        Raises:
            RuntimeError: ``"nccl"`` without CuPy, a GPU or NCCL on some rank
                (every rank raises, naming the ranks and what they lack).
        """
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS} (got {backend!r})")
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Comm):
            raise TypeError(f"comm must be an mpi4py communicator (got {type(comm).__name__})")
        self = cls(comm.Dup(), backend, device, owned=True)
        if backend == "nccl":
            self.nccl()
        return self

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
            raise RuntimeError("this communicator's backend is 'mpi': device arrays need 'nccl' or 'auto'")
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
            node = self.mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
            local_rank = node.Get_rank()
            node.Free()
            self.device = local_rank % count
        cupy.cuda.Device(self.device).use()
        return self.device

    def alltoall_device(self, send_ptr, recv_ptr, chunk_bytes, stream_ptr):
        """Grouped NCCL send/recv: chunk ``r`` of ``send`` to rank ``r``, ``recv``'s from it.

        Chunks are ``chunk_bytes`` apart. This rank's own chunk is not moved:
        the caller writes it into ``recv`` directly. Enqueued on ``stream_ptr``.
        """
        from cupy.cuda import nccl

        comm = self._nccl
        uint8 = nccl.NCCL_UINT8
        nccl.groupStart()
        try:
            for peer in range(self.world_size):
                if peer != self.rank:
                    offset = peer * chunk_bytes
                    comm.send(send_ptr + offset, chunk_bytes, uint8, peer, stream_ptr)
                    comm.recv(recv_ptr + offset, chunk_bytes, uint8, peer, stream_ptr)
        finally:
            nccl.groupEnd()

    def alltoall_host(self, send, recv):
        """Exchange chunk ``r`` of ``send`` with rank ``r``; chunk ``r`` of ``recv`` comes from it.

        Args:
            send: C-contiguous NumPy array whose first axis has N chunks.
            recv: C-contiguous NumPy array of the same shape and dtype.
        """
        if self.backend == "nccl":
            raise RuntimeError("this communicator's backend is 'nccl': host arrays need 'mpi' or 'auto'")
        self.mpi_comm.Alltoall([send.view("u1"), MPI.BYTE], [recv.view("u1"), MPI.BYTE])

    def free(self):
        """Release the NCCL communicator and the MPI duplicate this object owns (collective)."""
        if self._nccl is not None:
            self._nccl.destroy()
            self._nccl = None
        if self._owned and self.mpi_comm != MPI.COMM_NULL:
            self.mpi_comm.Free()

    def __repr__(self):
        return f"Communicator(rank={self.rank}, world_size={self.world_size}, backend={self.backend!r})"


def _nccl_problem():
    """What this process lacks for NCCL, or ``None``."""
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
