"""Host microseconds an eager ``DcpDirectPlan`` call takes to return (no synchronisation),
beside the floor of one ready kernel launch measured in the same run.

    mpirun -n 2 python -m mpi4py benchmarks/eager_host.py [--tokens 1 8 32] [--heads 32]
                                                          [--head-dim 128] [--profile 500]

The ranks may share one GPU (the direct path's windows are CUDA IPC memory). For each
B, every rank makes ``--burst`` calls back to back, timing only the loop (the calls
return before their kernels end), then synchronises; the figure is the median over
``--reps`` bursts of the slowest rank's microseconds per call. The floor: one ready
launch of the empty kernel (``cupy_dcp._floors``) through the same launcher, timed
alike. ``--profile K``: cProfile of K more calls on rank 0 (sorted by own time).
``--parts``: rank 0 also times, alone and without a profiler, each piece of a call's
host path on the last B's arrays (microseconds each, the median of bursts).
``--split``: every rank times, for the last B, the call with its launches left out
(the host work around them) and the call's ready launches alone (what the launcher
and the driver take), each as a burst like the calls'.
"""

import argparse
import time

import numpy as np
from mpi4py import MPI


def _burst_us(fn, burst, reps, sync, world):
    fn()
    sync()
    samples = []
    for _ in range(reps):
        world.Barrier()
        t0 = time.perf_counter()
        for _ in range(burst):
            fn()
        samples.append((time.perf_counter() - t0) * 1e6 / burst)
        sync()
    slowest = np.empty(len(samples))
    world.Allreduce(np.asarray(samples, dtype=np.float64), slowest, op=MPI.MAX)
    return float(np.median(slowest))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--burst", type=int, default=50)
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--profile", type=int, default=0)
    p.add_argument("--parts", action="store_true")
    p.add_argument("--split", action="store_true")
    args = p.parse_args()

    import cupy

    import cupy_dcp
    from cupy_dcp import _floors
    from cupy_dcp.kernels._arrays import kernel_array
    from cupy_dcp.layout import as_dtype

    world = MPI.COMM_WORLD
    comm = cupy_dcp.Communicator.from_mpi(world, backend="mpi")
    comm.select_device()
    dtype = as_dtype(args.dtype)
    stream = cupy.cuda.Stream(non_blocking=True)
    empty = _floors.empty_kernel()
    buf = cupy.zeros(4, cupy.uint32)
    floor_args = (kernel_array(buf, np.uint32),) * 2
    ready = empty.prepare((1,), (32,), floor_args)
    if ready is None:  # the Numba launcher prepares nothing
        launch = lambda: empty((1,), (32,), stream.ptr, floor_args)  # noqa: E731
    else:
        launch = lambda: ready(stream.ptr)  # noqa: E731
    floor = _burst_us(launch, args.burst, args.reps, stream.synchronize, world)
    rank = world.Get_rank()
    if rank == 0:
        print(f"eager DcpDirectPlan calls, {world.Get_size()} ranks, H={args.heads} "
              f"D={args.head_dim} {dtype.name}: host us per call to return "
              f"(one ready empty-kernel launch: {floor:.1f} us, launcher {empty.launcher})",
              flush=True)
    with cupy_dcp.DcpDirectPlan(comm, max(args.tokens), args.heads, args.head_dim, dtype) as plan:
        for tokens in args.tokens:
            rng = np.random.default_rng(rank)
            x = cupy.asarray(rng.standard_normal((tokens, args.heads, args.head_dim),
                                                 dtype=np.float32)).astype(dtype)
            lse = cupy.asarray(rng.uniform(-5, 5, (tokens, args.heads)).astype(np.float32))
            cupy.cuda.Device().synchronize()
            call = lambda: plan(x, lse, stream=stream)  # noqa: E731
            us = _burst_us(call, args.burst, args.reps, lambda: plan.synchronize(stream), world)
            if rank == 0:
                print(f"B={tokens:<5} {us:7.1f} us  ({us / floor:.1f}x the launch)", flush=True)
        if args.split:
            _split(plan, call, stream, args.burst, args.reps, world)
        if args.profile:
            _profile(plan, x, lse, stream, args.profile, world)
        if args.parts and rank == 0:
            _parts(plan, x, lse, stream, args.burst, args.reps)
        world.Barrier()


def _split(plan, call, stream, burst, reps, world):
    """A call's host work without its launches, and its launches alone (every rank)."""
    steps = list(plan._ready.values())[-1]  # the last call made ready: the last B's
    kept, repeats = plan._ready, plan._repeats  # the calls made ready, and remembered
    nothing = [lambda ptr: None]
    plan._ready = dict.fromkeys(kept, nothing)
    plan._repeats = {key: (nothing,) + repeat[1:] for key, repeat in repeats.items()}
    around = _burst_us(call, burst, reps, stream.synchronize, world)
    plan._ready, plan._repeats = kept, repeats

    def launches():
        for step in steps:
            step(stream.ptr)

    alone = _burst_us(launches, burst, reps, lambda: plan.synchronize(stream), world)
    if world.Get_rank() == 0:
        print(f"split, us per call: host work without the launches {around:.1f}, "
              f"the {len(steps)} ready launch(es) alone {alone:.1f}", flush=True)


def _parts(plan, x, lse, stream, burst, reps):
    """Each piece of an eager call's host path, timed alone on the call's arrays."""
    import cupy

    from cupy_dcp import _checks
    from cupy_dcp.kernels._arrays import kernel_array, pointer_device, stream_ptr

    B = x.shape[0]
    bits = kernel_array(x, plan.bits)

    def device():
        with cupy.cuda.Device(plan.comm.device):
            pass

    parts = {  # a call's launch itself: the ready empty-kernel launch above
        "check_inputs": lambda: _checks.check_inputs(x, lse, plan.comm.world_size),
        "result views": lambda: plan._result_views(B),
        "with Device": device,
        "stream_ptr": lambda: stream_ptr(stream),
        "kernel_array": lambda: kernel_array(x, plan.bits, "cp_attn_out"),
        "pointer_device": lambda: pointer_device(bits.ptr),
        "as_words": lambda: bits.as_words(),
        "check (status)": plan.check,
    }
    print(f"host path pieces alone, B={B} (us each):", flush=True)
    for name, fn in parts.items():
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(burst):
                fn()
            samples.append((time.perf_counter() - t0) * 1e6 / burst)
            stream.synchronize()
        print(f"  {name:<18} {np.median(samples):6.2f}", flush=True)


def _profile(plan, x, lse, stream, calls, world):
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile() if world.Get_rank() == 0 else None
    world.Barrier()
    if profiler is not None:
        profiler.enable()
    for k in range(calls):
        plan(x, lse, stream=stream)
        if k % 50 == 49:
            plan.synchronize(stream)
    if profiler is not None:
        profiler.disable()
    plan.synchronize(stream)
    world.Barrier()
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(14)
        print(f"host profile of {calls} calls (sorted by own time):", flush=True)
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip()), flush=True)


if __name__ == "__main__":
    main()
