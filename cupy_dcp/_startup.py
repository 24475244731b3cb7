"""Start-up times: ``python -m cupy_dcp.bench --startup [--ranks 2] [--kinds ...]``.

For each plan kind it starts fresh processes (``mpiexec -n RANKS``; the
direct plan's ranks may share a GPU, the NCCL plans get no more ranks than
GPUs) twice: first on an empty
kernel cache (cold), then on what that run left (warm), and prints the
seconds from the start of the processes to the kind's first result (rank 0's
``since start``: interpreter, MPI and imports included), and three parts of them:
``import cupy_dcp`` (alone: not NumPy's import, nor MPI's start), building the
plan, and its first call (to a
synchronised result; for ``host``, ``plan`` is making the inputs). Kinds: ``host`` (the NumPy path, :func:`dcp_a2a_lse_reduce`
on host arrays over MPI), ``a2a`` (:class:`DcpA2APlan`), ``direct``
(:class:`DcpDirectPlan`) and ``agrs`` (:class:`DcpAgRsPlan`); by default
``host`` without a GPU, else ``a2a,direct``. Run it without ``mpirun``: it
starts its own ranks. ``--alone``: the ranks of the cold run compile every
kernel each, not a share (one rank's cold compile). ``--keep-cache DIR``
keeps the warm cache in DIR.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from ._kernel_table import check_output_path

KINDS = ("host", "a2a", "direct", "agrs")


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m cupy_dcp.bench --startup",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--startup", action="store_true")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--kinds", help=f"comma-separated, of {', '.join(KINDS)}")
    p.add_argument("--tokens", type=int, default=64, help="the first call's B (max_tokens too)")
    p.add_argument("--heads", type=int, default=128)
    p.add_argument("--head-dim", type=int, default=512)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--alone", action="store_true",
                   help="the cold run's ranks do not share their compiles")
    p.add_argument("--keep-cache", metavar="DIR")
    p.add_argument("--json", dest="json_path")
    args = p.parse_args(argv)
    if args.ranks < 1:
        p.error(f"--ranks must be >= 1 (got {args.ranks})")
    for name in ("tokens", "heads", "head_dim"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(args, name)})")
    try:
        check_output_path(args.json_path, "--json")
    except ValueError as exc:
        p.error(str(exc))
    if args.kinds:
        args.kinds = [k for k in args.kinds.split(",") if k]
        bad = [k for k in args.kinds if k not in KINDS]
        if bad:
            p.error(f"--kinds takes {', '.join(KINDS)} (got {', '.join(bad)})")
    return args


def _gpu_count():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


def ranks_of(kind, ranks, gpus):
    """The ranks a start of ``kind`` gets: ``ranks``, but no more than the GPUs for the
    NCCL plans (NCCL refuses two ranks of one GPU; the direct plan's may share)."""
    return min(ranks, max(1, gpus)) if kind in ("a2a", "agrs") else ranks


def _mpiexec():
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else shutil.which("mpiexec")


# A rank of a fresh start, run as ``python -m mpi4py -c``: its clock starts before
# cupy_dcp is imported (``-m cupy_dcp._startup`` would import the package first, and
# time an import already done).
_CHILD = ("import sys, time; began = time.perf_counter(); from cupy_dcp import _startup; "
          "_startup.child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), "
          "sys.argv[5], sys.argv[6], sys.argv[7], float(sys.argv[8]), began)")


def measure(kind, args, folder, ranks):
    """One fresh start of ``kind`` on ``ranks`` ranks and the cache ``folder``: rank
    0's record."""
    from . import _settings

    argv = [sys.executable, "-m", "mpi4py", "-c", _CHILD, kind,
            str(args.tokens), str(args.heads), str(args.head_dim), args.dtype,
            "alone" if args.alone else "shared", str(folder)]
    if ranks > 1:
        mpiexec = _mpiexec()
        if mpiexec is None:
            raise RuntimeError("--ranks > 1 needs mpiexec (the 'mpi' extra)")
        argv = [mpiexec, "--oversubscribe", "-n", str(ranks)] + argv
    env = _settings.spawn_environment(OMPI_ALLOW_RUN_AS_ROOT="1",
                                      OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1")
    argv.append(repr(time.time()))  # the clock at the start, for the ranks' "since start"
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    lines = (re.sub(r"\x1b\[[0-9;]*m", "", line) for line in proc.stdout.splitlines())
    records = [json.loads(line[len("startup "):]) for line in lines
               if line.startswith("startup ")]  # past any terminal colour codes
    if proc.returncode != 0 or not records:
        raise RuntimeError(f"the {kind} start failed (exit {proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return records[0]


def run(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() > 1:
        raise RuntimeError("run `python -m cupy_dcp.bench --startup` without mpirun: it starts "
                           "its own ranks (--ranks)")
    gpus = _gpu_count()
    kinds = args.kinds or (["a2a", "direct"] if gpus else ["host"])
    results = []
    print(f"start-up, B={args.tokens} H={args.heads} D={args.head_dim} "
          f"{args.dtype}: seconds from the processes' start to the first result", flush=True)
    print(f"{'kind':8} {'ranks':>5} {'cache':5} {'since start':>11} {'import':>7} {'plan':>7} "
          f"{'1st call':>8} {'compiled':>8} {'loaded':>6}", flush=True)
    for kind in kinds:
        folder = tempfile.mkdtemp(prefix="cupy-dcp-startup-")
        try:
            ranks = ranks_of(kind, args.ranks, gpus)
            for cache in ("cold", "warm"):
                r = measure(kind, args, folder, ranks)
                r.update(kind=kind, cache=cache, ranks=ranks)
                results.append(r)
                print(f"{kind:8} {ranks:5d} {cache:5} {r['since_start']:11.2f} {r['import']:7.2f} "
                      f"{r['plan']:7.2f} {r['first_call']:8.2f} {r['compiled']:8d} "
                      f"{r['loaded']:6d}", flush=True)
        finally:
            if args.keep_cache:
                shutil.copytree(folder, args.keep_cache, dirs_exist_ok=True)
            shutil.rmtree(folder, ignore_errors=True)
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(results, f, indent=1)
    return results


def child(kind, tokens, heads, head_dim, dtype_name, sharing, folder, spawned, began):
    """One rank of a fresh start: build ``kind`` with the kernel cache in ``folder``,
    make its first call, print rank 0's times as ``startup {json}``; ``sharing``:
    ``"alone"`` to compile without the node's other ranks; ``spawned``: the clock
    (``time.time()``) when the parent started the ranks; ``began``: the
    ``time.perf_counter()`` before this process imported cupy_dcp (:data:`_CHILD`)."""
    import numpy as np

    import cupy_dcp

    light = time.perf_counter()  # ``import cupy_dcp`` alone: MPI's start is not its
    from mpi4py import MPI

    from ._compile import share_compiles
    from .kernels import _cache

    share_compiles(sharing != "alone")
    _cache.set_cache_dir(folder)

    mpi = MPI.COMM_WORLD
    imported = time.perf_counter()
    rng = np.random.default_rng(mpi.Get_rank())
    shape = (tokens, heads, head_dim)
    if kind == "host":
        from .layout import as_dtype

        x = rng.standard_normal(shape).astype(as_dtype(dtype_name))
        lse = rng.standard_normal(shape[:2]).astype(np.float32)
        planned = time.perf_counter()  # no plan: its column holds making the inputs
        cupy_dcp.dcp_a2a_lse_reduce(x, lse, mpi)
    else:
        import cupy

        comm = cupy_dcp.Communicator(mpi)
        plan_class = {"a2a": cupy_dcp.DcpA2APlan, "direct": cupy_dcp.DcpDirectPlan,
                      "agrs": cupy_dcp.DcpAgRsPlan}[kind]
        plan = plan_class(comm, tokens, heads, head_dim, dtype_name)
        planned = time.perf_counter()
        with cupy.cuda.Device(comm.device):
            x = cupy.asarray(rng.standard_normal(shape).astype(np.float32)).astype(plan.dtype)
            lse = cupy.asarray(rng.standard_normal(shape[:2]).astype(np.float32))
            plan(x, lse)
            plan.synchronize()
        plan.close()
    done = time.perf_counter()
    counts = _cache.stats()
    record = dict(since_start=time.time() - spawned, import_=light - began,
                  plan=planned - imported, first_call=done - planned, **counts)
    record["import"] = record.pop("import_")
    records = mpi.gather(record)
    if mpi.Get_rank() == 0:
        slowest = max(records, key=lambda r: r["since_start"])
        for name in counts:  # the node's counts, every one summed over its ranks
            slowest[name] = sum(r[name] for r in records)
        print("startup " + json.dumps(slowest), flush=True)


if __name__ == "__main__":
    run()
