"""The pack by tokens with several tokens a block, a warp each, against a block row a
token, on one GPU, in CUDA-graph replay.

    python benchmarks/pack_block_tokens_ab.py [--rounds 3] [--calls 20] [--reps 15]
                                              [--cells 0,5] [--batches 32,128,256,512,2048]

Where a token's rows of one rank fit one warp (bfloat16 at N = 8, 32 x 128: four rows
of 64 words, eight lanes each), the pack a block row per token launches blocks of one
warp: 16384 of them at B = 2048, too small to stage through shared memory
(``_pack_tokens.STAGED_WARPS_LEAST``), and from 256 tokens and 8 MiB on the grid walks
its tokens in ``pack``'s kernels. There the masked pack ran at 1.56x a copy of its
bytes in its grid on an H200 (``results/h200_kernels_quad_loads``), and at B = 512 the
empty kernel in that grid took 3.1 of the pack's 3.85 us. With ``block_tokens`` a block
takes that many consecutive tokens, a warp each; their rows are one contiguous span of
each chunk, so the block can stage them too.

For each cell (dtype, N, B, H, D; a token's rows within a warp) this launches, plain,
as a plan's (signed: its trailer and call number) and masked (``seq_lens``, every
fourth sequence empty):

- ``one``: ``pack_launch(..., block_tokens=1)``, what the library launched before;
- ``t2``, ``t4``: ``block_tokens=2`` and ``4`` (staged where ``_pack_tokens.stages``
  allows, as the library would);

checks that they wrote the same buffers and call numbers, then times them beside the
empty kernel, the 16-byte copy of the pack's bytes and their copy in 4-byte words in
one's grid (``word_floor.word_floors``), interleaved over ``--rounds``. Prints each
way's grid and whether it staged, us per call, t2 / one and t4 / one, and each as a
percentage of the 16-byte vector copy's rate (issue 27's 85 %), then the geometric
mean of the ratios by batch and mode.
"""

from one_test_ab import geometric_mean  # run as a script: benchmarks/ on the path
from pack_staged_ab import MODES, setup, timed_cells

WAYS = {"one": dict(block_tokens=1), "t2": dict(tokens=True, block_tokens=2),
        "t4": dict(tokens=True, block_tokens=4)}


def cells_of(batches):
    """``(dtype, N, B, H, D)`` whose token's rows of one rank fit a warp: the kernel
    bench's 32 x 128 at N = 8, and rows of 8, 16 and 32 lanes with one to four a warp."""
    shapes = (("bfloat16", 8, 32, 128), ("float16", 8, 32, 128), ("bfloat16", 8, 16, 128),
              ("float32", 8, 16, 128), ("float32", 8, 32, 64), ("bfloat16", 8, 8, 512),
              ("bfloat16", 4, 16, 128))
    return [(dt, n, B, H, D) for dt, n, H, D in shapes for B in batches]


def main():
    from cupy_dcp.kernels._pack_tokens import variant_of

    args, cells, cupy, kb, rng, stream, rate = setup(
        __doc__, "pack_block_tokens_ab", cells_of, "one")
    print(f"{'cell':>30} {'empty':>6} {'quads':>6} {'words':>6} | " + " | ".join(
        f"{m:>6}: {'one':>6} {'t2':>6} {'t4':>6} {'t2/1':>6} {'t4/1':>6} {'one%':>5} "
        f"{'t4%':>5}" for m in MODES))
    ratios = {}
    for cell, launches, same, us, _, pct in timed_cells(cupy, kb, stream, args, rng, rate,
                                                         cells, "one", ("t2", "t4"), WAYS,
                                                         floors="one"):
        dt, n, B, H, D = cell
        staged = {way: "s" if getattr(variant_of(launches[f"{way}_plain"][0]), "staged",
                                      False) else "-" for way in WAYS}
        grids = " ".join(f"{way}{launches[f'{way}_plain'][1]}{staged[way]}".replace(" ", "")
                         for way in WAYS)
        line = f"{dt:>8} N={n} B={B:>4} {H:>3}x{D:<3} {'same' if same else 'DIFFER':>6} " \
               f"{us['empty']:>6.2f} {us['quads']:>6.2f} {us['words']:>6.2f} |"
        for m in MODES:
            one, t2, t4 = us[f"one_{m}"], us[f"t2_{m}"], us[f"t4_{m}"]
            ratios.setdefault((B, m, "t2"), []).append(t2 / one)
            ratios.setdefault((B, m, "t4"), []).append(t4 / one)
            line += f" {m:>6}: {one:>6.2f} {t2:>6.2f} {t4:>6.2f} {t2 / one:>6.3f} " \
                    f"{t4 / one:>6.3f} {pct(one):>5.1f} {pct(t4):>5.1f} |"
        print(line.rstrip(" |") + "  " + grids, flush=True)
        assert same, f"the packs wrote different bits in {cell}"
    for (B, m, way), values in sorted(ratios.items()):
        print(geometric_mean(f"{way} / one, B = {B}, {m}", values))


if __name__ == "__main__":
    main()
