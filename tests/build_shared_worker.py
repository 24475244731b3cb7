"""Run under ``mpiexec -n K`` with ``CUPY_DCP_CACHE_DIR`` set: :func:`build_shared`
runs each task first on one rank of the node (its share), then every task on
every rank; a task that raises on one rank raises on all (``test_compile.py``).
With ``mixed``, rank 0's cache is off: it takes part in the same rounds (a rank
that skipped them would leave the others waiting for ever).
Each rank reports through ``run_worker``."""

import sys

from mpi4py import MPI

from _helpers import run_worker
from cupy_dcp._compile import build_shared


def main(mixed=False):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    runs = []
    if mixed and rank == 0:  # this rank's cache is off, the others' on: the same rounds
        from cupy_dcp.kernels import _cache
        _cache.set_cache_dir(None)

    def task(i):
        def run():
            runs.append(i)
            return i * i
        return run

    count = 2 * size + 1
    results = build_shared(comm, [task(i) for i in range(count)])
    assert results == [i * i for i in range(count)], results
    first = runs[:len(runs) - count]
    assert first == list(range(rank, count, size)), (rank, first)  # its share, before the rest
    assert runs[len(first):] == list(range(count)), runs

    def failing():
        if rank == size - 1:
            raise ValueError("no NVVM on this rank")
        return 0

    try:
        build_shared(comm, [failing] * size)
    except RuntimeError as exc:
        assert f"rank {size - 1} failed to compile a kernel: ValueError: no NVVM" in str(exc), exc
    else:
        sys.exit(f"rank {rank}: a failing task did not raise")
    return {"tasks": count}


if __name__ == "__main__":
    run_worker(main, "mixed" in sys.argv[1:])
