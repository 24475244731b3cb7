"""GPU soak: CUDA-graph replays and eager calls of a plan, checked at intervals.

Run: mpirun -n 2 python tests/gpu_soak_worker.py [REPLAYS] [EAGER_CALLS] [nccl|mpi]

Every rank builds a ``DcpA2APlan`` (bf16, B=32, H=16*N, D=128) on its GPU,
captures one call in a CUDA graph and replays it REPLAYS times (default
100 000), then calls the plan eagerly EAGER_CALLS times (default 100 000);
inputs change every call (a scale written on the device), and every
``CHECK_EVERY``-th result is checked against the exact combine of every rank's
inputs. CuPy's memory pool in use and the process's open descriptors must stay
flat after warm-up. Each rank reports its counts and timings (``run_worker``); any
failure aborts the job. With ``mpi`` (the MPI transport, which ranks sharing one GPU can
use) there are no graph replays: that transport cannot be captured.
"""

import os
import sys
import time

import numpy as np
from mpi4py import MPI

import cupy_dcp
from _helpers import run_worker, ulp

CHECK_EVERY = 5000
B, HN, D = 32, 16, 128


def main(replays, eager_calls, backend):
    import cupy

    world = MPI.COMM_WORLD
    rank, n = world.rank, world.size
    comm = cupy_dcp.Communicator.from_mpi(world, backend=backend, timeout=120)
    dtype = cupy_dcp.layout.as_dtype("bfloat16")
    plan = cupy_dcp.DcpA2APlan(comm, B, HN * n, D, dtype, return_lse=True)
    rng = np.random.default_rng(rank)
    base_x = rng.standard_normal((B, HN * n, D)).astype(np.float32)
    base_lse = rng.uniform(-5, 5, (B, HN * n)).astype(np.float32)
    all_x, all_lse = np.stack(world.allgather(base_x)), np.stack(world.allgather(base_lse))
    x_buf = cupy.asarray(base_x).astype(dtype)
    lse_buf = cupy.asarray(base_lse)
    shift = cupy.zeros((), dtype=cupy.float32)  # LSE shift of this step, on the device
    stream = cupy.cuda.Stream(non_blocking=True)

    def step_inputs(step):
        # every rank's LSEs shift by a step-dependent amount, rank by rank differently,
        # so the weights (and so the result) change from call to call
        return np.float32(((step * 7 + rank * 3) % 11) - 5)

    def expected(step):
        shifts = np.array([((step * 7 + r * 3) % 11) - 5 for r in range(n)], dtype=np.float32)
        lses = all_lse + shifts[:, None, None]
        xs = all_x.astype(dtype)
        ref = cupy_dcp.lse_weighted_combine(xs, lses)[:, rank * HN:(rank + 1) * HN]
        mag = cupy_dcp.lse_weighted_combine(np.abs(xs.astype(np.float64)), lses)
        return ref, mag[:, rank * HN:(rank + 1) * HN]

    def check(step, got):
        ref, mag = expected(step)
        got = cupy.asnumpy(got.view(cupy.uint16)).view(dtype).astype(np.float64)
        tol = ulp(ref, dtype) + 16 * 2.0 ** -24 * mag
        bad = np.abs(got - ref) > tol
        assert not bad.any(), f"rank {rank} step {step}: {int(bad.sum())} outputs off"

    lse_in = cupy.asarray(base_lse)
    with stream:
        def write_inputs(step):
            shift.fill(step_inputs(step))
            cupy.add(lse_in, shift, out=lse_buf)

        write_inputs(0)
        plan(x_buf, lse_buf, stream=stream)
        stream.synchronize()
        world.Barrier()
        if replays:
            stream.begin_capture()
            out, _ = plan(x_buf, lse_buf, stream=stream)
            graph = stream.end_capture()
        pool = cupy.get_default_memory_pool()
        footprint = []  # the pool's used bytes and the open descriptors, at the first check

        def run(calls, what, call):
            """``calls`` calls with new inputs each, checked (and the footprint with
            them) every CHECK_EVERY; seconds taken."""
            t0 = time.perf_counter()
            for step in range(calls):
                write_inputs(step)
                got = call()
                if step % CHECK_EVERY == 0 or step == calls - 1:
                    plan.synchronize(stream, timeout=60)
                    check(step, got)
                    used = (pool.used_bytes(), len(os.listdir("/proc/self/fd")))
                    if not footprint:
                        footprint.append(used)
                    assert used == footprint[0], \
                        f"rank {rank} {what} {step}: footprint {used} != {footprint[0]}"
            return time.perf_counter() - t0

        graph_s = run(replays, "replay", lambda: (graph.launch(stream), out)[1])
        eager_s = run(eager_calls, "eager", lambda: plan(x_buf, lse_buf, stream=stream)[0])
        baseline = footprint[0]
    world.Barrier()
    return {"replays": replays, "replay_us": round(graph_s / max(replays, 1) * 1e6, 1),
            "eager_calls": eager_calls, "eager_us": round(eager_s / max(eager_calls, 1) * 1e6, 1),
            "pool_bytes": baseline[0], "descriptors": baseline[1]}


if __name__ == "__main__":
    counts = [int(a) for a in sys.argv[1:3]]
    counts += [100_000, 100_000][len(counts):]
    run_worker(main, *counts, sys.argv[3] if len(sys.argv) > 3 else "nccl")
