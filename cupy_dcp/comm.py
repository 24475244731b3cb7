"""Communicator: an mpi4py group with an all-to-all of byte buffers.

The MPI transport exchanges host buffers with one ``MPI.Alltoall``. Nothing
here knows about attention: it moves bytes.
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
        mpi_comm: the mpi4py communicator (a duplicate, owned by this object).
    """

    def __init__(self, mpi_comm, backend="auto"):
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS} (got {backend!r})")
        self.mpi_comm = mpi_comm
        self.backend = backend
        self.rank = mpi_comm.Get_rank()
        self.world_size = mpi_comm.Get_size()

    @classmethod
    def from_mpi(cls, comm=None, backend="auto"):
        """Wrap an mpi4py communicator (``MPI.COMM_WORLD`` by default).

        Collective: every rank of ``comm`` must call it. The communicator is
        duplicated, so the library's messages never mix with the caller's.
        """
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS} (got {backend!r})")
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Comm):
            raise TypeError(f"comm must be an mpi4py communicator (got {type(comm).__name__})")
        return cls(comm.Dup(), backend)

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
        """Release the duplicated MPI communicator (collective)."""
        if self.mpi_comm != MPI.COMM_NULL:
            self.mpi_comm.Free()

    def __repr__(self):
        return f"Communicator(rank={self.rank}, world_size={self.world_size}, backend={self.backend!r})"


_WRAPPED = {}


def as_communicator(comm):
    """Return ``comm`` as a :class:`Communicator`; a plain mpi4py communicator is wrapped once."""
    if isinstance(comm, Communicator):
        return comm
    if isinstance(comm, MPI.Comm):
        key = MPI.Comm.py2f(comm)
        wrapped = _WRAPPED.get(key)
        if wrapped is None:
            wrapped = _WRAPPED[key] = Communicator.from_mpi(comm)
        return wrapped
    raise TypeError(
        f"comm must be a cupy_dcp.Communicator or an mpi4py communicator (got {type(comm).__name__})")
