"""Benchmark of the DCP combine: ``mpirun -n N python -m cupy_dcp.bench``.

For each token count it times, on the same communicator and in the same run:

- ``raw_alltoall``: the exchange alone (grouped NCCL send/recv of the packed
  bytes, or ``MPI.Alltoall`` on host arrays): the floor;
- ``cupy_dcp_a2a``: a :class:`DcpA2APlan` call (pack, exchange, combine);
- ``ag_rs``: all-gather of the LSEs, correction, reduce-scatter (:class:`DcpAgRsPlan`);
- ``direct``: a :class:`DcpDirectPlan` call (one kernel: tiles pushed into the
  peers' windows over NVLink, each combined once it has arrived; no NCCL),
  where every rank is on one node with peer access (``direct_problem``);

eagerly (calls launched back to back) and as CUDA-graph replays (a captured
batch of calls), and reports the median and p90 microseconds per call and the
ratio to the floor. ``--kernels`` instead times the pack and combine kernels
alone on one GPU against its device-to-device copy bandwidth.

Rank 0 prints progress and a table, and writes ``--json`` (a list of records:
``strategy``, ``mode``, ``world_size``, ``tokens``, ``heads``, ``head_dim``,
``dtype``, ``median_us``, ``p90_us``, ``device``, ``ratio_to_floor``) and
``--plot`` (PNG, when matplotlib is installed). A run that fails part-way
raises, and leaves the records it had in ``--json`` + ``.partial`` (the
``--kernels`` run too, its rows).

A script may time strategies of its own beside these: ``run(args, extra_cases)``
with ``parse_args(argv, extra_cases)`` (``benchmarks/bare_push.py`` in the
repository does so).
"""

import argparse
import json
import sys
import time

import numpy as np
from mpi4py import MPI

from ._kernel_table import add_kernel_args, check_kernel_args, check_output_path
from .comm import Communicator
from .layout import as_dtype, bits_dtype, send_buffer_shape

STRATEGIES = ("raw_alltoall", "cupy_dcp_a2a", "ag_rs", "direct")


def _ints(text):
    try:
        return [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers (got {text!r})") from None


MODES = ("graph", "eager")


def parse_args(argv=None, extra_cases=(), prog=None):
    """The bench's arguments; ``extra_cases`` names strategies ``--strategies`` may add;
    ``prog``: the command named in the help (a script that extends the bench)."""
    p = argparse.ArgumentParser(
        prog=prog or "python -m cupy_dcp.bench", description=__doc__.split("\n\n")[0],
        epilog=None if prog else (
            "python -m cupy_dcp.bench --startup instead times a plan's start-up in fresh "
            "processes (its options: python -m cupy_dcp.bench --startup --help)"))
    p.add_argument("--tokens", type=_ints, default=[1, 8, 32, 128, 512, 2048])
    p.add_argument("--heads", type=int, default=128)
    p.add_argument("--head-dim", type=int, default=512)
    p.add_argument("--dtype", default="bfloat16",
                   help="bfloat16, float16 or float32 (--kernels: a comma list of them)")
    p.add_argument("--mode", default="graph,eager", help="graph, eager or both (comma-separated)")
    known = (*STRATEGIES, *extra_cases)
    p.add_argument("--strategies", default=",".join(STRATEGIES),
                   help=f"comma-separated, of {', '.join(known)}")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "gpu"])
    p.add_argument("--reps", type=int, default=30, help="timed repetitions (median, p90 over them)")
    p.add_argument("--calls", type=int, default=20, help="calls per repetition (and per graph)")
    p.add_argument("--json", dest="json_path")
    p.add_argument("--plot", dest="plot_path")
    p.add_argument("--kernels", action="store_true", help="time the kernels alone (one GPU)")
    p.add_argument("--profile", type=int, default=0, metavar="K",
                   help="after each eager timing, profile K more calls on rank 0 (host time, "
                        "cProfile) and print the top functions")
    add_kernel_args(p)
    args = p.parse_args(argv)
    named = [s for s in args.strategies.split(",") if s]
    unknown = [s for s in named if s not in known]
    if unknown or not named:
        p.error(f"--strategies: unknown {', '.join(unknown)} (expected some of {', '.join(known)})"
                if unknown else f"--strategies names none (got {args.strategies!r})")
    modes = [m for m in args.mode.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        p.error(f"--mode takes graph, eager or both, comma-separated (got {args.mode!r})")
    try:
        check_kernel_args(args)
        check_output_path(args.json_path, "--json")
        check_output_path(args.plot_path, "--plot")
    except ValueError as exc:
        p.error(str(exc))
    return args


def _say(comm, *args):
    if comm.rank == 0:
        print(*args, flush=True)


def _use_gpu(device):
    if device == "cpu":
        return False
    try:
        import cupy
        ok = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy or no driver
        ok = False
    if device == "gpu" and not ok:
        raise RuntimeError("--device gpu needs CuPy and a CUDA GPU")
    return ok


def _slowest(world, samples):
    """Each repetition's figure from the slowest rank."""
    samples = np.ascontiguousarray(samples, dtype=np.float64)
    result = np.empty_like(samples)
    world.Allreduce(samples, result, op=MPI.MAX)
    return result


def _stats(samples):
    samples = np.asarray(samples, dtype=np.float64)
    return float(np.median(samples)), float(np.percentile(samples, 90))


# ---------------------------------------------------------------- GPU timings

def gpu_time(fn, stream, reps, calls, graph, world):
    """Median and p90 µs per call of ``fn()`` on ``stream`` (a ``cupy.cuda.Stream``),
    eagerly (``graph=False``: ``calls`` calls back to back) or as replays of a CUDA
    graph of ``calls`` calls, over ``reps`` repetitions, each repetition's figure the
    slowest rank's of ``world`` (an mpi4py communicator; collective)."""
    import cupy

    fn()  # NCCL connects lazily, kernels load: once eagerly before timing or capture
    stream.synchronize()
    world.Barrier()
    if graph:
        stream.begin_capture()
        for _ in range(calls):
            fn()
        g = stream.end_capture()
        g.upload(stream)
        run = lambda: g.launch(stream)  # noqa: E731
    else:
        def run():
            for _ in range(calls):
                fn()
    run()
    stream.synchronize()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    samples = []
    for _ in range(reps):
        world.Barrier()
        start.record(stream)
        run()
        stop.record(stream)
        stop.synchronize()
        samples.append(cupy.cuda.get_elapsed_time(start, stop) * 1e3 / calls)
    return _stats(_slowest(world, samples))


def _gpu_cases(comm, args, B, dtype, extra_cases):
    import cupy

    from .plan import DcpA2APlan, DcpAgRsPlan

    n, H, D = comm.world_size, args.heads, args.head_dim
    rng = np.random.default_rng(comm.rank)
    x = cupy.asarray(rng.standard_normal((B, H, D)).astype(np.float32)).astype(dtype)
    lse = cupy.asarray(rng.uniform(-5, 5, (B, H)).astype(np.float32))
    stream = cupy.cuda.Stream(non_blocking=True)
    cases = {}
    plan = DcpA2APlan(comm, B, H, D, dtype)
    shape = send_buffer_shape(n, B, H, D, dtype)
    raw_send = cupy.zeros(shape, dtype=bits_dtype(dtype))
    raw_recv = cupy.zeros_like(raw_send)
    chunk = raw_send[0].nbytes

    def raw():
        comm.alltoall_device(raw_send.data.ptr, raw_recv.data.ptr, chunk, stream.ptr)

    agrs = DcpAgRsPlan(comm, B, H, D, dtype)
    cases["raw_alltoall"] = raw
    cases["cupy_dcp_a2a"] = lambda: plan(x, lse, stream=stream)
    cases["ag_rs"] = lambda: agrs(x, lse, stream=stream)
    closers = []
    wanted = args.strategies.split(",")
    if "direct" in wanted:
        from .direct import DcpDirectPlan, direct_problem

        problem = direct_problem(comm)
        if problem is None:
            direct = DcpDirectPlan(comm, B, H, D, dtype)
            cases["direct"] = lambda: direct(x, lse, stream=stream)
            closers.append(direct.close)
        else:
            _say(comm, f"  direct: skipped ({problem})")
    for name, make in extra_cases.items():
        case = make(comm, args, B, dtype, stream) if name in wanted else None
        if case is not None:
            cases[name], close = case
            closers.append(close)
    # the inputs were made on the null stream, the calls go on another: a kernel must
    # not read an epoch counter (or data) before its zeroing (or copy) has run
    cupy.cuda.runtime.deviceSynchronize()
    return cases, stream, closers


# --------------------------------------------------------------- host timings

def _host_cases(comm, args, B, dtype):
    from .reduce import dcp_a2a_lse_reduce, dcp_ag_rs_lse_reduce

    n, H, D = comm.world_size, args.heads, args.head_dim
    rng = np.random.default_rng(comm.rank)
    x = rng.standard_normal((B, H, D)).astype(np.float32).astype(dtype)
    lse = rng.uniform(-5, 5, (B, H)).astype(np.float32)
    send = np.zeros(send_buffer_shape(n, B, H, D, dtype), dtype=bits_dtype(dtype))
    recv = np.zeros_like(send)
    return {"raw_alltoall": lambda: comm.alltoall_host(send, recv),
            "cupy_dcp_a2a": lambda: dcp_a2a_lse_reduce(x, lse, comm),
            "ag_rs": lambda: dcp_ag_rs_lse_reduce(x, lse, comm)}


def _host_time(fn, reps, calls, world):
    fn()
    samples = []
    for _ in range(reps):
        world.Barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) * 1e6 / calls)
    return _stats(_slowest(world, samples))


def _profile(comm, fn, calls, stream, top=15):
    """Where the host time of ``calls`` eager calls goes (cProfile on rank 0; every rank
    makes the same calls, so that the collectives match)."""
    import cProfile
    import io
    import pstats

    comm.mpi_comm.Barrier()
    profiler = cProfile.Profile() if comm.rank == 0 else None
    if profiler is not None:
        profiler.enable()
    for _ in range(calls):
        fn()
    if profiler is not None:
        profiler.disable()
    if stream is not None:
        stream.synchronize()
    comm.mpi_comm.Barrier()
    if profiler is not None:
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("tottime").print_stats(top)
        print(f"host profile of {calls} calls (sorted by own time):", flush=True)
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:6000],
              flush=True)


# ------------------------------------------------------------------ reporting

def _table(records):
    lines = [f"{'tokens':>7} {'mode':>6} {'strategy':>14} {'median us':>10} {'p90 us':>9} {'x floor':>8}"]
    for r in records:
        ratio = "-" if r["ratio_to_floor"] is None else f"{r['ratio_to_floor']:.2f}"
        lines.append(f"{r['tokens']:>7} {r['mode']:>6} {r['strategy']:>14} {r['median_us']:>10.1f} "
                     f"{r['p90_us']:>9.1f} {ratio:>8}")
    return "\n".join(lines)


def _plot(records, path):
    if not records:
        print(f"nothing was timed: no plot written to {path}", flush=True)
        return
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no plot written to {path}", flush=True)
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    keys = sorted({(r["strategy"], r["mode"]) for r in records})
    for strategy, mode in keys:
        rows = sorted((r["tokens"], r["median_us"]) for r in records
                      if r["strategy"] == strategy and r["mode"] == mode)
        ax.plot(*zip(*rows), marker="o", label=f"{strategy} ({mode})")
    r0 = records[0]
    ax.set(xscale="log", yscale="log", xlabel="tokens B", ylabel="us per call (median)",
           title=f"DCP combine, N={r0['world_size']}, H={r0['heads']}, D={r0['head_dim']}, "
                 f"{r0['dtype']} ({r0['device']})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}", flush=True)


def run(args, extra_cases=None):
    """Time every strategy of ``args`` (``parse_args``) and return the records (rank 0
    prints them and writes ``--json``/``--plot``). ``extra_cases`` maps a strategy name
    to ``make(comm, args, B, dtype, stream) -> (fn, close)`` (or None where it cannot
    run): on the GPU, ``fn()`` is timed like the bench's own and ``close()`` (collective)
    runs after each token count."""
    extra_cases = dict(extra_cases or {})
    world = MPI.COMM_WORLD
    gpu = _use_gpu(args.device)
    comm = Communicator.from_mpi(world, backend="nccl" if gpu else "mpi")
    dtype = as_dtype(args.dtype)
    modes = [m for m in args.mode.split(",") if m]
    if not gpu:
        modes = ["eager"]  # no graphs on the host
    wanted = [s for s in args.strategies.split(",") if s]
    if args.heads % comm.world_size:
        raise SystemExit(f"--heads ({args.heads}) must be a multiple of the ranks "
                         f"({comm.world_size})")
    device = "gpu" if gpu else "cpu"
    if gpu:
        import cupy
        device = cupy.cuda.runtime.getDeviceProperties(comm.device)["name"].decode()
    _say(comm, f"cupy_dcp bench: N={comm.world_size} H={args.heads} D={args.head_dim} "
               f"{args.dtype} on {device}; modes {modes}; tokens {args.tokens}")
    if not gpu:
        for name in wanted:
            if name not in ("raw_alltoall", "cupy_dcp_a2a", "ag_rs"):
                _say(comm, f"  {name}: skipped (needs a GPU)")
    records = []
    try:
        _time_all(comm, args, dtype, modes, wanted, device, gpu, extra_cases, world, records)
    except BaseException:
        _keep_partial(comm, args.json_path, records)
        raise
    _say(comm, "\n" + _table(records))
    if comm.rank == 0 and args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(records, f, indent=1)
        print(f"results written to {args.json_path}", flush=True)
    if comm.rank == 0 and args.plot_path:
        _plot(records, args.plot_path)
    return records


def _keep_partial(comm, json_path, records):
    """Where a run fails part-way, rank 0 writes the records it had to ``json_path``
    + ``.partial`` (never to ``json_path``: a partial file must not pass for a whole
    one), and says so."""
    if comm.rank != 0 or not json_path or not records:
        return
    partial = json_path + ".partial"
    try:
        with open(partial, "w") as f:
            json.dump(records, f, indent=1)
    except OSError as exc:
        print(f"the run failed, and its {len(records)} records could not be kept ({exc})",
              file=sys.stderr, flush=True)
        return
    print(f"the run failed: the {len(records)} records it had are in {partial}",
          file=sys.stderr, flush=True)


def _time_all(comm, args, dtype, modes, wanted, device, gpu, extra_cases, world, records):
    """Time every (B, mode, strategy) of the run, appending each record to
    ``records`` as it is made."""
    for B in args.tokens:
        closers = []
        if gpu:
            cases, stream, closers = _gpu_cases(comm, args, B, dtype, extra_cases)
        else:
            cases, stream = _host_cases(comm, args, B, dtype), None
        for mode in modes:
            floor = None
            for strategy in [s for s in (*STRATEGIES, *extra_cases) if s in wanted and s in cases]:
                if gpu:
                    med, p90 = gpu_time(cases[strategy], stream, args.reps, args.calls,
                                         mode == "graph", world)
                else:
                    med, p90 = _host_time(cases[strategy], args.reps, args.calls, world)
                floor = med if strategy == "raw_alltoall" else floor
                rec = dict(strategy=strategy, mode=mode, world_size=comm.world_size, tokens=B,
                           heads=args.heads, head_dim=args.head_dim, dtype=args.dtype,
                           median_us=round(med, 2), p90_us=round(p90, 2), device=device,
                           ratio_to_floor=round(med / floor, 3) if floor else None)
                records.append(rec)
                _say(comm, f"  B={B:<5} {mode:<5} {strategy:<13} median {med:8.1f} us  p90 {p90:8.1f} us")
                if args.profile and mode == "eager":
                    _profile(comm, cases[strategy], args.profile, stream)
        for close in closers:
            close()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--startup" in argv:  # fresh processes of their own: see cupy_dcp._startup
        from ._startup import run as run_startup
        run_startup(argv)
        return
    args = parse_args(argv)
    if args.kernels:
        try:
            _use_gpu("gpu")
        except RuntimeError:
            raise SystemExit("python -m cupy_dcp.bench --kernels needs CuPy and a CUDA GPU "
                             "(the kernels alone have no host version to time)") from None
        from ._kernel_bench import run_kernels
        run_kernels(args)
    else:
        run(args)


if __name__ == "__main__":
    sys.exit(main())
