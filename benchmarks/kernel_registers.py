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


if __name__ == "__main__":
    numbers = [int(a) for a in sys.argv[1:]]
    main(tuple(numbers[:2]) if len(numbers) >= 2 else (9, 0))
