"""A decode loop: one step's DCP combine captured in a CUDA graph, replayed every step.

    mpirun -n 2 python -m mpi4py mpi_examples/decode_loop.py

Each rank builds a plan once (collective; ``--strategy``: ``a2a`` is pack,
NCCL all-to-all, combine; ``direct`` pushes head slices straight into the
peers' memory, no NCCL, on one node with peer access; ``auto`` picks direct
where it can run), writes each step's partial attention output and LSE into
static input buffers, and replays the captured graph: no host work per step.
Every step's result is checked against the exact combine of all ranks'
inputs (gathered with MPI); a mismatch exits non-zero. Prints microseconds
per step for graph replay and for eager calls.

Without a GPU (or with ``--device cpu``) the same loop runs eagerly on NumPy
arrays over MPI: there are no graphs on the host.
"""

import argparse
import sys
import time

import numpy as np
from mpi4py import MPI

import cupy_dcp


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=32, help="decode tokens B per step")
    p.add_argument("--heads", type=int, default=32, help="query heads H (a multiple of N)")
    p.add_argument("--head-dim", type=int, default=128, help="head size D")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--steps", type=int, default=50, help="decode steps, each checked")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "gpu"])
    p.add_argument("--strategy", default="auto", choices=["auto", "a2a", "direct"],
                   help="GPU plan (see above)")
    args = p.parse_args()
    for name in ("tokens", "heads", "head_dim", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(args, name)})")
    ranks = MPI.COMM_WORLD.Get_size()
    if args.heads % ranks:
        p.error(f"--heads must be a multiple of the ranks (got {args.heads} heads for {ranks})")
    return args


def gpu_available(device):
    if device == "cpu":
        return False
    try:
        import cupy
        ok = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver or no GPU
        ok = False
    if device == "gpu" and not ok:
        raise RuntimeError("--device gpu needs CuPy and a CUDA GPU")
    return ok


def step_inputs(step, rank, shape, dtype):
    """This rank's partials and LSEs of one step; some rows empty (LSE -inf, NaN partials)."""
    rng = np.random.default_rng([step, rank])
    x = rng.standard_normal(shape).astype(np.float32)
    lse = rng.uniform(-8, 8, shape[:2]).astype(np.float32)
    empty = rng.random(shape[:2]) < 0.05
    lse[empty] = -np.inf
    x[empty] = np.nan
    return x.astype(dtype), lse


def check(world, step, x, lse, got, dtype, hn):
    """Every rank's slice against the oracle of the gathered inputs: the worst error
    relative to max(|exact|, 1), and the tolerance (one ulp of the dtype)."""
    xs, lses = np.stack(world.allgather(x)), np.stack(world.allgather(lse))
    with np.errstate(invalid="ignore"):
        ref = cupy_dcp.lse_weighted_combine(xs, lses)[:, world.rank * hn:(world.rank + 1) * hn]
    err = np.abs(got.astype(np.float64) - ref) / np.maximum(np.abs(ref), 1.0)
    tol = {"float32": 1e-6, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[np.dtype(dtype).name]
    return float(err.max()), tol


def main():
    args = parse_args()
    world = MPI.COMM_WORLD
    rank, n = world.rank, world.size
    dtype = cupy_dcp.layout.as_dtype(args.dtype)
    B, H, D = args.tokens, args.heads, args.head_dim
    hn = H // n
    gpu = gpu_available(args.device)
    comm = cupy_dcp.Communicator.from_mpi(world, backend="auto" if gpu else "mpi")
    worst, tol = 0.0, None

    if gpu:
        import cupy

        plan = cupy_dcp.dcp_plan(comm, B, H, D, dtype, strategy=args.strategy)
        x_buf = cupy.zeros((B, H, D), dtype=dtype)  # static inputs the graph reads
        lse_buf = cupy.zeros((B, H), dtype=cupy.float32)
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            plan(x_buf, lse_buf, stream=stream)  # NCCL connects lazily: once eagerly
            plan.synchronize(stream)
            world.Barrier()
            stream.begin_capture()
            result = plan(x_buf, lse_buf, stream=stream)
            graph = stream.end_capture()
            for step in range(args.steps):
                x, lse = step_inputs(step, rank, (B, H, D), dtype)
                x_buf.set(x)
                lse_buf.set(lse)
                graph.launch(stream)
                err, tol = check(world, step, x, lse, cupy.asnumpy(result), dtype, hn)
                worst = max(worst, err)
            timings = {}
            for mode in ("graph", "eager"):
                calls = 200
                world.Barrier()
                start, stop = cupy.cuda.Event(), cupy.cuda.Event()
                start.record(stream)
                for _ in range(calls):
                    graph.launch(stream) if mode == "graph" else plan(x_buf, lse_buf, stream=stream)
                stop.record(stream)
                stop.synchronize()
                timings[mode] = cupy.cuda.get_elapsed_time(start, stop) * 1e3 / calls
            plan.synchronize(stream)  # raises if a direct plan's peer went missing
        plan.close()
        where = cupy.cuda.runtime.getDeviceProperties(comm.device)["name"].decode()
        summary = (f"{type(plan).__name__}: graph replay {timings['graph']:.1f} us, "
                   f"eager {timings['eager']:.1f} us per step")
    else:
        t0 = time.perf_counter()
        for step in range(args.steps):
            x, lse = step_inputs(step, rank, (B, H, D), dtype)
            got = cupy_dcp.dcp_a2a_lse_reduce(x, lse, comm)
            err, tol = check(world, step, x, lse, got, dtype, hn)
            worst = max(worst, err)
        where = "CPU (eager; no graphs on the host)"
        summary = f"{(time.perf_counter() - t0) / args.steps * 1e6:.0f} us per step, checks included"

    worst = world.allreduce(worst, op=MPI.MAX)
    print(f"rank {rank}/{n} on {where}: B={B} H={H} D={D} {args.dtype}, {args.steps} steps, "
          f"{summary}", flush=True)
    if worst > tol:
        if rank == 0:
            print(f"FAILED: max error {worst:.2e} > {tol:.0e}", file=sys.stderr, flush=True)
        sys.exit(1)
    if rank == 0:
        print(f"OK: every step of every rank within {tol:.1e} (relative) of the exact combine "
              f"(max error {worst:.2e})", flush=True)


if __name__ == "__main__":
    main()
