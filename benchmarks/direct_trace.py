"""Where a direct call's time goes: each block's milestones, read off the GPU's timer.

Run under mpirun, every rank on a GPU of its own::

    mpirun -np 2 python -m mpi4py benchmarks/direct_trace.py [B,B,...]

For each token count B it builds the direct plan's kernels with ``trace``
(``cupy_dcp.kernels.direct``: each block's first thread stores ``%globaltimer``
at the call's milestones into ``state``, which is enlarged to hold them),
replays a CUDA graph of :data:`CALLS` calls, and prints, per rank, the graph
time per call and, for the last two calls, each milestone's median and latest
time over the blocks, in µs from the call's first block entry:

- ``entry``: the block starts; ``awaited``: its programmatic-dependent wait is
  over; ``barrier``: the first barrier passed (tiles: the plan's state read);
- ``pushed``: its pushes issued (tiles: the last flag released);
- ``arrived``: the peers' data seen (after the barrier that follows the waits);
- ``weighed``: in lines only, the rows' weights worked out (after the barrier
  that follows them);
- ``end``: its combine stored.

The timer ticks in steps of about 0.26 µs on an H200. Measurement only: not
a benchmark (use ``python -m cupy_dcp.bench``), and the stamps' stores cost a
little time of their own. Measurement tooling outside the package: it swaps the
traced kernel into ``cupy_dcp.kernels.direct`` and an enlarged state into the
plan it builds, which no supported use of the library does.
"""

import functools
import sys

import numpy as np

CALLS = 20
MILESTONES = ("entry", "awaited", "barrier", "pushed", "arrived", "weighed", "end")


def summarise(stamps, grid):
    """Lines describing one call's milestones: ``stamps`` ``[blocks, TRACE_STAMPS]``
    (0 where a block noted none), of which the first ``grid`` rows are the call's."""
    used = stamps[:grid]
    used = used[used[:, 0] != 0].astype(np.float64)
    if not len(used):
        return "no block noted anything"
    start = used[:, 0].min()
    parts = []
    for k, name in enumerate(MILESTONES):
        noted = used[used[:, k] != 0, k]
        if len(noted):
            late = (noted - start) / 1e3
            parts.append(f"{name} {np.median(late):.2f}/{late.max():.2f}")
    return f"{len(used)} blocks; " + ", ".join(parts)


def main(argv=None):
    import cupy
    from mpi4py import MPI

    import cupy_dcp
    from cupy_dcp import bench
    from cupy_dcp.kernels import direct as kernels
    from cupy_dcp.kernels._arrays import kernel_array

    argv = sys.argv[1:] if argv is None else argv
    sizes = [int(b) for b in (argv[0] if argv else "1,2,4,8,32,128").split(",")]
    world = MPI.COMM_WORLD
    kernels.direct_kernel = functools.partial(kernels.direct_kernel, trace=True)
    comm = cupy_dcp.Communicator.from_mpi(world)
    dtype = cupy_dcp.layout.as_dtype("bfloat16")
    H, D = 128, 512
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        plan = cupy_dcp.DcpDirectPlan(comm, max(sizes), H, D, dtype)
        most = max(plan._max_blocks, plan._ll_max_blocks, plan._line_max_blocks)
        state = cupy.zeros(kernels.STATE_WORDS + 2 * most * kernels.TRACE_STAMPS, cupy.int64)
        cupy.cuda.runtime.deviceSynchronize()
        state[:kernels.STATE_WORDS] = plan._state
        cupy.cuda.runtime.deviceSynchronize()
        plan._state, plan._state_arr = state, kernel_array(state, np.int64, "state")
        plan._ready = {}  # the ready calls name the old state
        for B in sizes:
            rng = np.random.default_rng(world.rank + 7 * B)
            x = cupy.asarray(rng.standard_normal((B, H, D)).astype(np.float32)).astype(dtype)
            lse = cupy.asarray(rng.uniform(-5, 5, (B, H)).astype(np.float32))
            median, _ = bench.gpu_time(lambda: plan(x, lse, stream=stream), stream, 15, CALLS,
                                        True, world)
            stream.begin_capture()
            for _ in range(CALLS):
                plan(x, lse, stream=stream)
            graph = stream.end_capture()
            graph.launch(stream)
            stream.synchronize()
            state[kernels.STATE_WORDS:] = 0
            cupy.cuda.runtime.deviceSynchronize()
            world.Barrier()
            graph.launch(stream)
            stream.synchronize()
            plan.check()
            noted = cupy.asnumpy(state)
            epoch = int(noted[0])
            tile_rows, grid = plan._call_grid(B)[:2]
            calls = noted[kernels.STATE_WORDS:].reshape(2, most, kernels.TRACE_STAMPS)
            lines = [f"rank {world.rank} B={B}: graph replay {median:.2f} us per call, "
                     f"{grid} blocks of {tile_rows} rows"]
            for name, parity in (("call before last", (epoch - 1) & 1), ("last call", epoch & 1)):
                lines.append(f"  {name}: " + summarise(calls[parity], grid))
            for rank in range(world.size):
                if rank == world.rank:
                    print("\n".join(lines), flush=True)
                world.Barrier()
        plan.synchronize(stream)
        plan.close()


if __name__ == "__main__":
    main()
