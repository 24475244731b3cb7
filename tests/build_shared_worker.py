"""Run under ``mpiexec -n K`` with ``CUPY_DCP_CACHE_DIR`` set: :func:`build_shared`
runs each task first on one rank of the node (its share), then every task on
every rank; a task that raises on one rank raises on all (``test_compile.py``).
Modes (the first argument, else ``plain``):

- ``plain``: over an mpi4py communicator.
- ``mixed``: rank 0's cache is off, the others' on: the same rounds (a rank that
  skipped them would leave the others waiting for ever).
- ``bounded``: over a :class:`Communicator` (bounded exchanges), the same checks;
  then the last rank skips a build: the others raise RuntimeError within the
  communicator's timeout instead of waiting for ever.

Each rank reports through ``run_worker``."""

import sys
import time

from mpi4py import MPI

import cupy_dcp
from _helpers import run_worker
from cupy_dcp._compile import build_shared


def main(mode="plain"):
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    comm = cupy_dcp.Communicator.from_mpi(world, backend="mpi", timeout=3.0) \
        if mode == "bounded" else world
    runs = []
    if mode == "mixed" and rank == 0:
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
    record = {"tasks": count}
    if mode == "bounded":
        if rank == size - 1:
            time.sleep(5.0)  # never builds: the others give up at 3 s
        else:
            start = time.monotonic()
            try:
                build_shared(comm, [task(0)])
            except RuntimeError as exc:
                assert "did not complete within 3.0 s" in str(exc), exc
            else:
                sys.exit(f"rank {rank}: a missing rank did not raise")
            record["waited"] = time.monotonic() - start
        world.Barrier()
    return record


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:2])
