"""Fill the kernel cache ahead of time, for the plans of one layer shape.

Run::

    python -m cupy_dcp.warmup --dtype bfloat16 --heads 128 --head-dim 512 \\
        --world-size 8 --max-tokens 256 [--cc 9.0] [--plans a2a,direct,agrs]

On a machine with a GPU it compiles, for that GPU, the CUDA kernels that the
named plans of that shape can launch (the direct plan's every path, plain and,
on Hopper or later, as programmatic dependents: which of them a run takes
depends on how its ranks sit on the GPUs; for ``a2a``, also the kernels that
``pack_send`` and ``unpack_combine`` launch outside a plan) and stores their
cubins. With
``--cc MAJOR.MINOR`` it needs no GPU nor driver: it stores their PTX for that
compute capability, which the first process to load a kernel on a GPU links
into a cubin (and stores). The cache is the one a run would use
(``cupy_dcp.kernels._cache``: ``CUPY_DCP_CACHE_DIR`` moves it). Prints a
line per kernel and a summary; exits 1 if the cache is off or a kernel compiled
or linked was not stored (an unwritable folder, say, or a kernel the cache
cannot hold), 2 for bad arguments (a ``--cc`` that NVRTC does not list among
the capabilities it compiles for, a ``CUPY_DCP_CACHE`` other than 0 or 1), under
the CUDA simulator (which caches nothing) or, without ``--cc``, with no GPU.
"""

import argparse
import sys
import time

PLANS = ("a2a", "direct", "agrs")
MIN_CC = (7, 5)  # the oldest compute capability CUDA 13's NVVM compiles for


def parse(argv):
    parser = argparse.ArgumentParser(prog="python -m cupy_dcp.warmup",
                                     description="Fill the kernel cache for one layer shape.")
    parser.add_argument("--dtype", required=True, help="float16, bfloat16 or float32")
    parser.add_argument("--heads", type=int, required=True, help="H, all heads")
    parser.add_argument("--head-dim", type=int, required=True, help="D")
    parser.add_argument("--world-size", type=int, required=True, help="N, ranks of a group")
    parser.add_argument("--max-tokens", type=int, required=True, help="the plans' max_tokens")
    parser.add_argument("--cc", help="compute capability MAJOR.MINOR: PTX, without a GPU")
    parser.add_argument("--plans", default=",".join(PLANS),
                        help=f"comma-separated, of {', '.join(PLANS)} (default: all)")
    args = parser.parse_args(argv)
    from .layout import as_dtype, is_supported

    try:
        supported = is_supported(as_dtype(args.dtype))
    except TypeError:
        supported = False
    if not supported:
        parser.error(f"--dtype must be float16, bfloat16 or float32 (got {args.dtype!r})")
    args.plans = [p for p in args.plans.split(",") if p]
    bad = [p for p in args.plans if p not in PLANS]
    if bad or not args.plans:
        parser.error(f"--plans takes {', '.join(PLANS)} (got {', '.join(bad) or 'none'})")
    if args.cc is not None:
        try:
            major, minor = (int(v) for v in args.cc.split("."))
        except ValueError:
            parser.error(f"--cc must be MAJOR.MINOR, e.g. 9.0 (got {args.cc!r})")
        args.cc = (major, minor)
        if args.cc < MIN_CC:
            parser.error(f"--cc must be {MIN_CC[0]}.{MIN_CC[1]} or later, as NVVM compiles "
                         f"for (got {args.cc[0]}.{args.cc[1]})")
        known = _known_capabilities()
        if known and args.cc not in known:  # (NVVM would quietly target the one below)
            parser.error(f"--cc must be a compute capability the CUDA toolkit knows: "
                         f"{', '.join(f'{a}.{b}' for a, b in known)} (got {args.cc[0]}."
                         f"{args.cc[1]})")
    for name in ("heads", "head_dim", "world_size", "max_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(args, name)})")
    if args.heads % args.world_size:
        parser.error(f"--heads must be a multiple of --world-size (got {args.heads} heads "
                     f"for {args.world_size} ranks)")
    return args


def _known_capabilities():
    """The compute capabilities NVRTC lists (NVVM's targets are the same), or ``()``
    where it cannot be asked."""
    try:
        from numba.cuda.cudadrv import nvrtc

        return tuple(sorted(tuple(cc) for cc in nvrtc.get_supported_ccs()))
    except Exception:  # no NVRTC library, or a numba-cuda without the call
        return ()


def tasks(args):
    """``(name, task)`` of every kernel to warm: each task builds a kernel wrapper."""
    import numpy as np

    from . import _compile
    from .layout import as_dtype, bits_dtype, lse_pack_dim

    dtype = as_dtype(args.dtype)
    n, D = args.world_size, args.head_dim
    bits = bits_dtype(dtype)
    found = []
    if "a2a" in args.plans:
        found += [(f"a2a #{i}", t)  # a plan's, and pack_send's and unpack_combine's alone
                  for i, t in enumerate(_compile.a2a_tasks(dtype, D, n, standalone=True,
                                                           max_tokens=args.max_tokens,
                                                           local_heads=args.heads // n))]
    if "agrs" in args.plans:
        found += [(f"agrs #{i}", t)
                  for i, t in enumerate(_compile.agrs_tasks(dtype, args.heads, D))]
    if "direct" in args.plans and n > 1:
        width, hn = D + lse_pack_dim(dtype), args.heads // n
        paths = _compile.direct_paths(n, args.max_tokens, hn, width, np.dtype(bits).itemsize,
                                      None, None, None)
        cc = args.cc or _current_capability()
        for dependent in (False, True) if cc >= (9, 0) else (False,):
            for path in sorted(paths):
                for i, t in enumerate(_compile.direct_tasks(dtype, n, bits, D, dependent, path)):
                    found.append((f"direct {path}{' dependent' if dependent else ''} #{i}", t))
    return found


def _current_capability():
    from numba import cuda

    return tuple(cuda.get_current_device().compute_capability)


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    from numba import config

    from .kernels import _cache

    if config.ENABLE_CUDASIM:
        print("the CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1): it compiles no kernels, "
              "and nothing is cached under it", file=sys.stderr)
        return 2
    try:
        folder = _cache.cache_dir()
    except ValueError as exc:  # CUPY_DCP_CACHE neither 0 nor 1
        print(exc, file=sys.stderr)
        return 2
    if args.cc is not None:
        from .kernels._launch import choose_launcher

        choose_launcher("numba")  # the wrappers then compile nothing: the PTX is made below

    else:
        from numba import cuda

        if not cuda.is_available():
            print("there is no CUDA GPU here: pass --cc MAJOR.MINOR (9.0 for Hopper) to store "
                  "PTX for that compute capability", file=sys.stderr)
            return 2
    if folder is None:
        print("the kernel cache is off (CUPY_DCP_CACHE=0 or CUPY_DCP_CACHE_DIR empty): "
              "nothing to fill", file=sys.stderr)
        return 1
    start = time.perf_counter()
    for name, task in tasks(args):
        began = time.perf_counter()
        kernel = task()
        if args.cc is not None:
            _cache.cuda_ptx(kernel._dispatcher, kernel.argtypes, args.cc)
        print(f"{name}: {time.perf_counter() - began:.1f} s", flush=True)
    counts = _cache.stats()
    target = f"sm_{args.cc[0]}{args.cc[1]} PTX" if args.cc else "this GPU's cubins"
    print(f"{target} in {folder}: {counts['compiled']} compiled, {counts['loaded']} already "
          f"there, {counts['stored']} stored, in {time.perf_counter() - start:.1f} s",
          flush=True)
    missing = counts["unstored"] + counts["uncacheable"]
    if missing:
        print(f"{missing} of the kernels compiled or linked were not stored (an unwritable "
              f"folder: see the warnings above; or kernels that the cache cannot hold)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
