"""The combine for exactly N with its 64-register cap flipped, beside the library's.

    python benchmarks/register_cap_ab.py [--rounds 5]

One GPU, no mpirun; N ranks' buffers on it, as in ``python -m cupy_dcp.bench
--kernels``. At the combine's 4096-warp cells of issue 27 (and one that streams),
the library's launch and the same launch with ``combine.capped`` negated (capped
at ``MAX_REGISTERS`` where the library is not, and not where it is), timed in a CUDA
graph of 20 calls, the median of 15 replays, interleaved over ``--rounds`` rounds.
Same PTX either way: only the linker's register cap differs. Run it with
``CUPY_DCP_CACHE=0``, so that neither launch loads the other's linked code from
the kernel cache. ``kernel_registers.py`` gives the registers and spills of each
variant without a GPU.
"""

import argparse

import numpy as np

CELLS = [("bfloat16", 4, 512, 64, 128), ("bfloat16", 4, 1024, 64, 128),
         ("float32", 8, 512, 32, 128), ("bfloat16", 8, 512, 64, 128),
         ("bfloat16", 2, 512, 64, 128), ("float32", 8, 2048, 32, 128)]


def rule_launches(cupy, cell, attr, rules, rebuild=False):
    """``{name: launch}``: the library's combine in ``cell`` (on zeroed buffers, kept alive
    by the launches' arguments) launched with ``combine.<attr>`` set to each ``rule`` of
    ``rules`` (``{name: rule}``) in turn, and the library's own again afterwards.
    ``rebuild``: the rule is read as the kernel is built (``combine_kernel``'s cache is
    cleared around each launch), not only as it is launched."""
    from cupy_dcp.kernels import combine
    from cupy_dcp.kernels._arrays import kernel_array
    from cupy_dcp.layout import as_dtype, bits_dtype, lse_pack_dim

    dtype_name, n, B, H, D = cell
    dtype = as_dtype(dtype_name)
    bits, value = bits_dtype(dtype), combine.combine_codec(dtype)[1]
    recv = cupy.zeros((n, B, H // n, D + lse_pack_dim(dtype)), dtype=bits)
    out = cupy.zeros((B, H // n, D), dtype=dtype)
    out_lse = cupy.zeros((B, H // n), dtype=cupy.float32)
    library = getattr(combine, attr)
    launches = {}
    for name, rule in rules.items():
        setattr(combine, attr, rule)
        if rebuild:
            combine.combine_kernel.cache_clear()  # the kernel is built again under this rule
        try:
            launches[name] = combine.combine_launch(dtype, kernel_array(recv, bits),
                                                    kernel_array(out, value),
                                                    kernel_array(out_lse, np.float32), True)
        finally:
            setattr(combine, attr, library)
            if rebuild:
                combine.combine_kernel.cache_clear()
    return launches


def _launches(cupy, cell):
    """``{"lib": launch, "flip": launch}`` of the combine in ``cell``: ``combine.capped``
    as the library has it, and negated."""
    from cupy_dcp.kernels import combine

    library = combine.capped
    return rule_launches(cupy, cell, "capped",
                         {"lib": library, "flip": lambda *a: not library(*a)}, rebuild=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import cupy

    from cupy_dcp._kernel_bench import _interleaved_us

    stream = cupy.cuda.Stream(non_blocking=True)
    print(f"graph of 20 calls, median of 15 replays, median of {args.rounds} rounds; us",
          flush=True)
    with stream:
        for cell in CELLS:
            launches = _launches(cupy, cell)
            us = _interleaved_us(cupy, stream, launches, args.rounds, 20, 15)
            dtype_name, n, B, H, D = cell
            _, grid, block, _ = launches["lib"]
            print(f"{dtype_name} N={n} B={B} {H}x{D} grid {tuple(grid)} block {tuple(block)}: "
                  f"lib {us['lib']:.2f} us, flipped cap {us['flip']:.2f} us, "
                  f"flip/lib {us['flip'] / us['lib']:.3f}", flush=True)


if __name__ == "__main__":
    main()
