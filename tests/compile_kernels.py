"""Compile every CUDA kernel of cupy_dcp to PTX, without a GPU.

Run: python tests/compile_kernels.py [MAJOR MINOR]   (compute capability, 9 0 by default)

Numba types a kernel only when it compiles it, and CI has no GPU: a typing
error in a kernel would reach main unseen. This compiles each kernel that the
plans can launch (every dtype, both combine lane groups, N = 2 and 3, the
direct kernel in tiles, word by word and in lines, launched plain and as a programmatic
dependent, traced) for the given compute capability, through NVVM alone.
It needs NVVM and NVRTC (``numba-cuda[cu12]`` or ``[cu13]``, or the
``nvidia-nvvm`` and ``nvidia-cuda-nvrtc`` wheels, or a CUDA toolkit) and no
driver; without them it exits with status 77. Prints a line per kernel: its
name, the bits its pushes move, its PTX's size, its 16-byte stores, its
8-byte loads of word pairs, and whether its first atomic add (a block's
arrival) comes before its first push store of two words. Its own
process: device functions are compiled for the capability given here, not for
a GPU's.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository: benchmarks/ holds the bare push

MISSING = 77  # the exit status when NVVM or NVRTC cannot be found
WIDE_STORES = (".v4.u32", ".v4.b32", ".v2.u64", ".v2.b64")  # 16 bytes a store


def kernels():
    """``(name, dispatcher, argtypes)`` of every kernel to compile."""
    import numpy as np

    from cupy_dcp.kernels import agrs, combine, direct, pack
    sys.path.insert(0, str(ROOT))
    from benchmarks import bare_push
    from cupy_dcp.layout import as_dtype

    found = []

    def add(name, k):
        found.append((name, k._dispatcher, k.argtypes))

    dtypes = [as_dtype(t) for t in ("float16", "bfloat16", "float32")]
    for bits in (np.uint16, np.uint32):
        for group in (8, 32):
            add(f"pack {np.dtype(bits)} group {group}", pack.pack_kernel(np.dtype(bits), group))
    for dtype in dtypes:
        for group in (8, 32):
            add(f"combine {dtype} group {group}", combine.combine_kernel(dtype, False, group))
            add(f"agrs correct {dtype} group {group}", agrs.correct_kernel(dtype, group))
            add(f"agrs finish {dtype} group {group}", agrs.finish_kernel(dtype, group))
        if dtype == as_dtype("bfloat16"):
            add(f"combine {dtype} pairs", combine.combine_kernel(dtype, True))
    add("agrs mask", agrs.mask_kernel(32))
    for n in (2, 3):
        add(f"bare push N={n}", bare_push.bare_push_kernel(n))
    for dtype, n, d in ((dtypes[1], 2, 512), (dtypes[0], 3, 72), (dtypes[2], 2, 300)):
        bits = np.dtype(np.uint32 if dtype.itemsize == 4 else np.uint16)
        for path in ("tiles", "words", "lines"):
            for dependent in (False, True):
                for i, k in enumerate(direct.call_kernels(dtype, n, bits, d, dependent,
                                                          path == "words", path == "lines")):
                    add(f"direct {dtype} N={n} D={d} {path}"
                        f"{' dependent' if dependent else ''} #{i} pushes "
                        f"{k.argtypes[1].dtype}", k)
    add("direct bfloat16 N=2 D=512 tiles traced pushes uint32",
        direct.direct_kernel(dtypes[1], 2, np.dtype(np.uint32), True, trace=True))
    return found


def arrives_first(ptx):
    """Whether the PTX's first atomic add comes before its first system-scope store of
    two words (a direct kernel's push, or its word-by-word or line stores)."""
    lines = [line.lstrip() for line in ptx.splitlines()]
    adds = [i for i, line in enumerate(lines) if line.startswith("atom.global.add")]
    pushes = [i for i, line in enumerate(lines) if line.startswith("st.relaxed.sys.global.v2")]
    return bool(adds and pushes and adds[0] < pushes[0])


def toolchain_problem():
    """Why NVVM or NVRTC cannot be used here (a string), or ``None``."""
    try:
        from numba.cuda.cudadrv import nvrtc
        from numba.cuda.cudadrv.nvvm import NVVM

        NVVM()
        nvrtc.get_supported_ccs()
    except Exception as e:  # the libraries are missing: nothing to compile with
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def main(cc):
    os.environ["CUPY_DCP_LAUNCHER"] = "numba"  # the kernels' wrappers then compile nothing
    problem = toolchain_problem()
    if problem:
        print(f"no NVVM or NVRTC here ({problem})", flush=True)
        sys.exit(MISSING)
    from numba import cuda
    import numba.cuda.dispatcher

    class Device:  # device functions compile for the current device's capability
        compute_capability = cc

    numba.cuda.dispatcher.get_current_device = lambda: Device()
    count = 0
    for name, dispatcher, argtypes in kernels():
        options = {k: v for k, v in dispatcher.targetoptions.items() if k == "launch_bounds"}
        ptx, _ = cuda.compile_ptx(dispatcher.py_func, argtypes, cc=cc, **options)
        stores = sum(line.lstrip().startswith("st.") and any(w in line for w in WIDE_STORES)
                     for line in ptx.splitlines())
        pair_loads = sum(line.lstrip().startswith("ld.") and ".v2.u32" in line
                         for line in ptx.splitlines())
        roundings = sum(line.lstrip().startswith("cvt.rn.bf16x2.f32") for line in ptx.splitlines())
        print(f"{name}: {len(ptx)} bytes of PTX, {stores} 16-byte stores, "
              f"{pair_loads} 8-byte loads, {roundings} bf16x2 roundings, "
              f"arrives first {arrives_first(ptx)}", flush=True)
        count += 1
    print(f"compiled {count} kernels for sm_{cc[0]}{cc[1]}", flush=True)


if __name__ == "__main__":
    main(tuple(int(v) for v in sys.argv[1:3]) if len(sys.argv) > 2 else (9, 0))
