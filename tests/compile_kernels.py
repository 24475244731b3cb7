"""Compile every CUDA kernel of cupy_dcp to PTX, without a GPU.

Run: python tests/compile_kernels.py [MAJOR MINOR] [--check-fingerprints | --write-fingerprints]
(compute capability, 9 0 by default)

Numba types a kernel only when it compiles it, and CI has no GPU: a typing
error in a kernel would reach main unseen. This compiles each kernel that the
plans can launch (every dtype, both combine lane groups, N = 2, 3, 8 and 16, the
direct kernel in tiles, word by word and in lines, launched plain and as a programmatic
dependent, traced) for the given compute capability, through NVVM alone.
It needs NVVM and NVRTC (``numba-cuda[cu12]`` or ``[cu13]``, or the
``nvidia-nvvm`` and ``nvidia-cuda-nvrtc`` wheels, or a CUDA toolkit) and no
driver; without them it exits with status 77. Prints a line per kernel: its
name, the bits its pushes move, its PTX's size, its 16-byte stores, its
8-byte loads of word pairs, and whether its first atomic add (a block's
arrival) comes before its first push store of two words, and its PTX
fingerprint. Its own process: device functions are compiled for the capability
given here, not for a GPU's.

The fingerprint proves that a refactor changed no kernel: a hash of the PTX with
comments, source locations and Numba's environment declarations left out, and
every mangled name (``_Z...``, which carries the module path and a unique id)
replaced by its order of first appearance. ``--write-fingerprints`` records
every kernel's fingerprint, with the toolchain that made it, in
``ptx_fingerprints.json`` beside this file; ``--check-fingerprints`` compares
against it and exits 1 naming the kernels whose PTX changed.
"""

import hashlib
import json
import re
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository: benchmarks/ holds the bare push

MISSING = 77  # the exit status when NVVM or NVRTC cannot be found
WIDE_STORES = (".v4.u32", ".v4.b32", ".v2.u64", ".v2.b64")  # 16 bytes a store
FINGERPRINTS = Path(__file__).resolve().parent / "ptx_fingerprints.json"
_MANGLED = re.compile(r"(?<![\w$])_Z[\w$]+")
_SKIPPED = (".file", ".loc")


def fingerprint(ptx):
    """A hash of ``ptx`` that ignores where the kernels' Python code lives: see the
    module docstring."""
    kept = []
    for line in ptx.splitlines():
        line = line.strip()
        if not line or line.startswith("//") or line.startswith(_SKIPPED):
            continue
        if line.startswith(".common .global") and "NumbaEnv" in line:
            continue  # one per device function compiled, in compilation order; never read
        kept.append(line)
    names = {}
    masked = _MANGLED.sub(lambda m: f"_Z{names.setdefault(m.group(0), len(names))}",
                          "\n".join(kept))
    return hashlib.sha256(masked.encode()).hexdigest()[:20]


def toolchain(ptx):
    """What made ``ptx``: the compiler release its header names and numba-cuda's version."""
    release = re.search(r"^// Cuda compilation tools, (.*)$", ptx, re.M)
    return {"nvvm": release.group(1).strip() if release else "unknown",
            "numba-cuda": metadata.version("numba-cuda")}


def kernels():
    """``(name, dispatcher, argtypes)`` of every kernel to compile."""
    import numpy as np

    from cupy_dcp import _floors
    from cupy_dcp.kernels import _pack_tokens, agrs, combine, direct, pack
    from cupy_dcp.kernels._format import as_dtype
    sys.path.insert(0, str(ROOT))
    from benchmarks import bare_push

    found = []

    def add(name, k):
        found.append((name, k._dispatcher, k.argtypes))

    dtypes = [as_dtype(t) for t in ("float16", "bfloat16", "float32")]
    for bits in (np.uint16, np.uint32):
        for group in (8, 32):
            add(f"pack {np.dtype(bits)} group {group}", pack.pack_kernel(np.dtype(bits), group))
        add(f"pack {np.dtype(bits)} group 32 wide", pack.pack_kernel(np.dtype(bits), 32, True))
        for group, wide in ((8, False), (32, False), (32, True)):  # with no mask
            add(f"pack {np.dtype(bits)} group {group}{' wide' if wide else ''} unmasked",
                pack.pack_kernel(np.dtype(bits), group, wide, False))
    for bits in (np.uint16, np.uint32):  # a block row per token: masked or not, signed or
        for masked in (True, False):  # not, by the rows' blocks or by a lead plane
            for signed, lead in ((False, False), (True, False), (True, True)):
                add(f"pack {np.dtype(bits)} group 8 by tokens{'' if masked else ' unmasked'}"
                    f"{' signed' if signed else ''}{' lead' if lead else ''}",
                    _pack_tokens.tokens_kernel(np.dtype(bits), 8, masked, signed, lead))
        add(f"pack {np.dtype(bits)} group 32 by tokens", _pack_tokens.tokens_kernel(
            np.dtype(bits), 32))
    for masked in (True, False):  # wide rows of words, stored as aligned quads
        add(f"pack uint32 group 32 wide{'' if masked else ' unmasked'} quads",
            pack.pack_kernel(np.dtype(np.uint32), 32, True, masked, True))
    for dtype in dtypes:
        for group in (8, 32):
            add(f"combine {dtype} group {group}", combine.combine_kernel(dtype, False, group))
            add(f"agrs correct {dtype} group {group}", agrs.correct_kernel(dtype, group))
            add(f"agrs finish {dtype} group {group}", agrs.finish_kernel(dtype, group))
        add(f"agrs finish {dtype} flat", agrs.flat_finish_kernel(dtype))
        for kernel in ("correct", "finish"):  # rows past a warp's UNROLL: twice the values a lane
            group, unroll = agrs.agrs_shape(512)
            add(f"agrs {kernel} {dtype} group {group} unroll {unroll}",
                getattr(agrs, f"{kernel}_kernel")(dtype, group, unroll))
        for elements in (128, 512):  # many rows: correct streams, twice the values a lane
            group, unroll = agrs.correct_shape(elements, 1 << 40)
            add(f"agrs correct {dtype} group {group} unroll {unroll}",
                agrs.correct_kernel(dtype, group, unroll))
            for rows in (1, 1 << 40):  # whole quads in and out: few rows and many
                group, unroll = agrs.correct_shape(elements, rows)
                add(f"agrs correct {dtype} group {group} unroll {unroll} vectors",
                    agrs.vector_correct_kernel(dtype, group, unroll))
        if dtype.itemsize == 2:  # 16-bit values combined in pairs
            add(f"combine {dtype} pairs", combine.combine_kernel(dtype, True))
        for shards in (2, 3, 8, 16):  # the combine built for its N (every shard loaded first)
            for unroll in combine._unrolls(shards):  # each that it can launch
                suffix = {combine.UNROLL: "", combine.SLICED_UNROLL: " sliced"}.get(
                    unroll, f" unroll {unroll}")
                for whole in ((), (False, False, True)):  # rows that fill the slices too
                    what = f"{suffix}{' whole' if whole else ''}"
                    add(f"combine {dtype} group 32 N={shards}{what}",
                        combine.combine_kernel(dtype, False, 32, shards, unroll, *whole))
                    if dtype.itemsize == 2:
                        add(f"combine {dtype} pairs N={shards}{what}",
                            combine.combine_kernel(dtype, True, 32, shards, unroll, *whole))
        for shards, per in ((2, 2), (3, 3), (8, 4), (16, 2)):  # a block a row: values a thread
            for signed in (False, True):
                suffix = f"N={shards} block a row, {per} a thread{' signed' if signed else ''}"
                add(f"combine {dtype} {suffix}",
                    combine.combine_kernel(dtype, False, 128, shards, per, True, signed))
                if dtype.itemsize == 2:
                    add(f"combine {dtype} pairs {suffix}",
                        combine.combine_kernel(dtype, True, 128, shards, per, True, signed))
        # rows of 64 values (words in pairs): a block of two warps, one value a thread
        add(f"combine {dtype} N=8 block a row of 64 threads signed",
            combine.combine_kernel(dtype, False, 64, 8, 1, True, True))
        if dtype.itemsize == 2:
            add(f"combine {dtype} pairs N=8 block a row of 64 threads signed",
                combine.combine_kernel(dtype, True, 64, 8, 1, True, True))
    add("agrs mask", agrs.mask_kernel(32))
    for n in (2, 3):
        add(f"bare push N={n}", bare_push.bare_push_kernel(n))
    for dtype, n, d in ((dtypes[1], 2, 512), (dtypes[0], 3, 72), (dtypes[2], 2, 300)):
        bits = np.dtype(np.uint32 if dtype.itemsize == 4 else np.uint16)
        for path in ("tiles", "words", "lines"):
            for dependent in (False, True):
                for i, k in enumerate(direct.call_kernels(dtype, n, bits, d, dependent,
                                                          direct.Protocol(path))):
                    add(f"direct {dtype} N={n} D={d} {path}"
                        f"{' dependent' if dependent else ''} #{i} pushes "
                        f"{k.argtypes[1].dtype}", k)
    add("direct bfloat16 N=2 D=512 tiles traced pushes uint32",
        direct.direct_kernel(dtypes[1], 2, np.dtype(np.uint32), True, trace=True))
    add("floor empty", _floors.empty_kernel())  # the kernel bench's floors
    add("floor copy", _floors.copy_kernel())
    for quads in (2, 4, 8):  # beside a kernel that reads N rows a row it writes
        add(f"floor copy {quads} in flight", _floors.copy_kernel(quads))
    # Added last: Numba numbers device functions as they are made, and the PTX's order
    # follows, so that kernels made earlier in the list would fingerprint otherwise
    for masked in (True, False):  # rows of words staged through shared memory
        for signed, lead in ((False, False), (True, False), (True, True)):
            add(f"pack uint32 group 8 by tokens staged{'' if masked else ' unmasked'}"
                f"{' signed' if signed else ''}{' lead' if lead else ''}",
                _pack_tokens.tokens_kernel(np.dtype(np.uint32), 8, masked, signed, lead, True))
    add("pack uint32 group 32 by tokens staged", _pack_tokens.tokens_kernel(
        np.dtype(np.uint32), 32, True, False, False, True))
    for group in (4, 8, 16):  # ... reading its rows as 16-byte quads
        for masked in (True, False):
            add(f"pack uint32 group {group} by tokens staged quad loads"
                f"{'' if masked else ' unmasked'}",
                _pack_tokens.tokens_kernel(np.dtype(np.uint32), group, masked, False, False,
                                           True, True))
    add("pack uint32 group 8 by tokens staged quad loads signed lead",
        _pack_tokens.tokens_kernel(np.dtype(np.uint32), 8, True, True, True, True, True))
    for together in (2, 4):  # ... several tokens a block, a warp each: as is, staged, and
        for staged, quads in ((False, False), (True, False), (True, True)):  # reading quads
            for masked, signed in ((True, False), (False, False), (True, True)):
                add(f"pack uint32 group 8 by tokens {together} a block"
                    f"{' staged' if staged else ''}{' quad loads' if quads else ''}"
                    f"{'' if masked else ' unmasked'}{' signed' if signed else ''}",
                    _pack_tokens.tokens_kernel(np.dtype(np.uint32), 8, masked, signed, False,
                                               staged, quads, together))
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


def compile_for(cc):
    """Set this process up to compile the kernels for compute capability ``cc`` with
    no GPU: the kernels' wrappers compile nothing, and device functions compile for
    ``cc`` (Numba asks the current device's capability). For a process of its own."""
    import numba.cuda.dispatcher

    from cupy_dcp.kernels._launch import choose_launcher

    choose_launcher("numba")

    class Device:
        compute_capability = cc

    numba.cuda.dispatcher.get_current_device = lambda: Device()


def kernel_ptx(dispatcher, argtypes, cc):
    """The PTX of ``dispatcher``'s kernel for ``argtypes`` and capability ``cc``, with
    its launch bounds (after :func:`compile_for`)."""
    from numba import cuda

    options = {k: v for k, v in dispatcher.targetoptions.items() if k == "launch_bounds"}
    return cuda.compile_ptx(dispatcher.py_func, argtypes, cc=cc, **options)[0]


def main(cc, mode=None):
    compile_for(cc)
    problem = toolchain_problem()
    if problem:
        print(f"no NVVM or NVRTC here ({problem})", flush=True)
        sys.exit(MISSING)
    count, prints, tools = 0, {}, None
    for name, dispatcher, argtypes in kernels():
        ptx = kernel_ptx(dispatcher, argtypes, cc)
        stores = sum(line.lstrip().startswith("st.") and any(w in line for w in WIDE_STORES)
                     for line in ptx.splitlines())
        pair_loads = sum(line.lstrip().startswith("ld.") and ".v2.u32" in line
                         for line in ptx.splitlines())
        roundings = sum(line.lstrip().startswith("cvt.rn.bf16x2.f32") for line in ptx.splitlines())
        prints[name] = fingerprint(ptx)
        tools = tools or toolchain(ptx)
        print(f"{name}: {len(ptx)} bytes of PTX, {stores} 16-byte stores, "
              f"{pair_loads} 8-byte loads, {roundings} bf16x2 roundings, "
              f"fingerprint {prints[name]}, arrives first {arrives_first(ptx)}", flush=True)
        count += 1
    print(f"compiled {count} kernels for sm_{cc[0]}{cc[1]}", flush=True)
    print(f"toolchain {json.dumps(tools, separators=(',', ':'))}", flush=True)
    record = {"cc": f"{cc[0]}.{cc[1]}", "toolchain": tools, "kernels": prints}
    if mode == "--write-fingerprints":
        FINGERPRINTS.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(prints)} fingerprints to {FINGERPRINTS.name}", flush=True)
    elif mode == "--check-fingerprints":
        sys.exit(compare_fingerprints(record, json.loads(FINGERPRINTS.read_text())))


def compare_fingerprints(record, recorded):
    """Print how ``record`` differs from ``recorded``; 0 when every kernel's PTX is
    the same, 1 when any changed, appeared or went."""
    if (record["cc"], record["toolchain"]) != (recorded["cc"], recorded["toolchain"]):
        print(f"fingerprints were recorded for sm {recorded['cc']} with {recorded['toolchain']}, "
              f"this is sm {record['cc']} with {record['toolchain']}", flush=True)
        return 1
    now, then = record["kernels"], recorded["kernels"]
    changed = sorted(n for n in now.keys() & then.keys() if now[n] != then[n])
    for label, names in (("changed", changed), ("new", sorted(now.keys() - then.keys())),
                         ("gone", sorted(then.keys() - now.keys()))):
        for name in names:
            print(f"fingerprint {label}: {name}", flush=True)
    same = not changed and now.keys() == then.keys()
    print(f"fingerprints {'unchanged' if same else 'DIFFER'} ({len(now)} kernels)", flush=True)
    return 0 if same else 1


if __name__ == "__main__":
    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    numbers = [int(a) for a in sys.argv[1:] if not a.startswith("--")]
    if flags and flags[0] not in ("--check-fingerprints", "--write-fingerprints") or len(flags) > 1:
        sys.exit(f"usage: compile_kernels.py [MAJOR MINOR] "
                 f"[--check-fingerprints | --write-fingerprints] (got {' '.join(flags)})")
    main(tuple(numbers[:2]) if len(numbers) >= 2 else (9, 0), flags[0] if flags else None)
