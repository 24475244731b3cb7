"""The registers and spills of the combine for exactly N, linked for a GPU on the CPU.

    python benchmarks/kernel_registers.py [MAJOR MINOR]   (compute capability, 9 0 by default)

No GPU: each kernel's PTX comes from NVVM (``tests/compile_kernels.py``'s) and
is linked for ``sm_MAJORMINOR`` by nvJitLink (the ``nvidia-nvjitlink`` wheel,
through ``cuda.bindings.nvjitlink``), whose verbose log gives the registers a
thread and the bytes spilled. For 16-bit pairs and float32 at N = 2, 4 and 8, each
values a lane the combine can take (``combine._unrolls``), as the library links it
(capped at ``MAX_REGISTERS`` where ``combine.capped``) and capped at 64; each with
its tests against a row's end (``tested``) and, where the rows fill the slices as
they do at these cells, without them (``whole``, the kernel the library launches:
``combine.whole_slices``).

A second table does the same for the combine with a block a row (``_blocks``, the
launch at few rows), as linked and capped at 40 and 32, with the blocks an SM that
the registers and threads allow and the waves of its launch at B = 32 on 132 SMs (an
H100 SXM's and an H200's) at the kernel bench's 64 x 128 and 128 x 512: a block a row
for each of the ``B * H / N`` rows and one more a token for the output LSE (``lib``:
whether the library launches a block a row there, :func:`combine.by_blocks`).

The registers decide how many blocks fit an SM, and so whether a launch of a given
number of warps runs as one wave (``benchmarks/NOTES.md``, 2026-12-05, fourth). The
counts are this linker's: a GPU's driver may link the same PTX to a few registers
more or fewer, so check a kernel that matters under Nsight Compute on the GPU.
Exits 77 where NVVM, NVRTC or nvJitLink is missing.
"""

import re
import sys
from pathlib import Path

CELLS = (("bfloat16", True, 64), ("float32", False, 128))  # (dtype, pairs, values a row)
BLOCK_CELLS = (("bfloat16", True, 64, 128), ("float32", False, 64, 128),
               ("bfloat16", True, 128, 512), ("float32", False, 128, 512))  # (dtype, pairs, H, D)
SM_REGISTERS, SM_THREADS, SM_BLOCKS, WARP_GRANULE = 65536, 2048, 32, 256  # sm_90
SMS, TOKENS = 132, 32  # the launches whose waves the second table gives


def link_log(ptx, cc, max_registers=0):
    """nvJitLink's verbose log of linking ``ptx`` for ``sm_<cc>``."""
    from cuda.bindings import nvjitlink

    options = [f"-arch=sm_{cc[0]}{cc[1]}", "-verbose"]
    if max_registers:
        options.append(f"-maxrregcount={max_registers}")
    handle = nvjitlink.create(len(options), options)
    try:
        data = ptx.encode()
        nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "kernel")
        nvjitlink.complete(handle)
        log = bytearray(nvjitlink.get_info_log_size(handle))
        nvjitlink.get_info_log(handle, log)
    finally:
        nvjitlink.destroy(handle)
    return log.decode(errors="replace")


def registers(log):
    """``(registers a thread, bytes of spill stores)`` in a verbose link log."""
    used = re.search(r"Used (\d+) registers", log)
    spilled = re.search(r"(\d+) bytes spill stores", log)
    if used is None:
        raise RuntimeError(f"no register count in the link log:\n{log}")
    return int(used.group(1)), int(spilled.group(1)) if spilled else 0


def blocks_an_sm(registers_a_thread, threads):
    """The blocks of ``threads`` threads that fit an sm_90 SM by its registers (allocated
    a warp at a time in :data:`WARP_GRANULE`) and its threads and blocks."""
    warps = -(-threads // 32)
    a_warp = -(-registers_a_thread * 32 // WARP_GRANULE) * WARP_GRANULE
    return min(SM_REGISTERS // (a_warp * warps), SM_THREADS // (warps * 32), SM_BLOCKS)


def block_rows_table(cc, kernel_ptx):
    """The second table: the combine with a block a row (the module docstring)."""
    from cupy_dcp.kernels import combine
    from cupy_dcp.kernels._format import as_dtype

    print(f"\nthe block a row; registers / bytes spilled, blocks an SM, waves at B = {TOKENS} "
          f"on {SMS} SMs", flush=True)
    print(f"{'dtype':<16} {'N':>2} {'H x D':>9} {'lib':>3} {'threads':>7} {'values':>6}  "
          f"{'as linked':>22}  "
          f"{'at 40':>22}  {'at 32':>22}", flush=True)
    for dtype_name, pairs, heads, head_dim in BLOCK_CELLS:
        elements = head_dim // 2 if pairs else head_dim
        for n in (2, 4, 8):
            if not combine.by_blocks(elements, 1, 1, n):
                continue
            threads, values = combine.block_threads(elements), combine.block_values(elements)
            kernel = combine.combine_kernel(as_dtype(dtype_name), pairs, threads, n, values, True)
            ptx = kernel_ptx(kernel._dispatcher, kernel.argtypes, cc)
            rows = TOKENS * heads // n
            blocks = rows + TOKENS
            lib = "yes" if combine.by_blocks(elements, TOKENS, rows, n) else "no"
            cells = []
            for cap in (0, 40, 32):
                used, spilled = registers(link_log(ptx, cc, cap))
                fit = blocks_an_sm(used, threads)
                cells.append(f"{used:>3} / {spilled:<3} {fit:>2} {blocks / (fit * SMS):>5.2f}")
            label = f"{dtype_name}{' pairs' if pairs else ''}"
            print(f"{label:<16} {n:>2} {f'{heads} x {head_dim}':>9} {lib:>3} {threads:>7} {values:>6}  "
                  + "  ".join(f"{c:>22}" for c in cells), flush=True)


def main(cc):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from compile_kernels import MISSING, compile_for, kernel_ptx, toolchain_problem

    compile_for(cc)
    problem = toolchain_problem()
    try:
        from cuda.bindings import nvjitlink

        nvjitlink.version()
    except Exception as e:  # no nvJitLink: nothing to link with
        problem = problem or f"{type(e).__name__}: {e}"
    if problem:
        print(f"no NVVM, NVRTC or nvJitLink here ({problem})", flush=True)
        sys.exit(MISSING)
    from cupy_dcp.kernels import combine
    from cupy_dcp.kernels._format import as_dtype
    from cupy_dcp.kernels._rows import MAX_REGISTERS, lanes_per_row

    print(f"sm_{cc[0]}{cc[1]}, nvJitLink {'.'.join(map(str, nvjitlink.version()))}; "
          f"registers a thread / bytes spilled", flush=True)
    print(f"{'dtype':<16} {'N':>2} {'unroll':>6} {'rows':>7}  {'as linked':>14}  {'at 64':>10}",
          flush=True)
    for dtype_name, pairs, elements in CELLS:
        dtype = as_dtype(dtype_name)
        codec = combine.combine_codec(dtype, pairs)[0]
        for n in (2, 4, 8):
            for unroll in combine._unrolls(n):
                group = lanes_per_row(elements, unroll)
                rows = [("tested", ())]
                if combine.whole_slices(elements, group, unroll):
                    rows.append(("whole", (False, False, True)))
                for name, whole in rows:
                    kernel = combine.combine_kernel(dtype, pairs, group, n, unroll, *whole)
                    ptx = kernel_ptx(kernel._dispatcher, kernel.argtypes, cc)
                    cap = MAX_REGISTERS if combine.capped(codec, n, unroll) else 0
                    linked = registers(link_log(ptx, cc, cap))
                    at_64 = registers(link_log(ptx, cc, 64))
                    label = f"{dtype_name}{' pairs' if pairs else ''}"
                    print(f"{label:<16} {n:>2} {unroll:>6} {name:>7}  {linked[0]:>4} / "
                          f"{linked[1]:<3}{' cap' if cap else '    '}  {at_64[0]:>4} / "
                          f"{at_64[1]:<3}", flush=True)
    block_rows_table(cc, kernel_ptx)


if __name__ == "__main__":
    numbers = [int(a) for a in sys.argv[1:]]
    main(tuple(numbers[:2]) if len(numbers) >= 2 else (9, 0))
