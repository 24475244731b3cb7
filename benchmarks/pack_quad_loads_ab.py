"""The staged pack reading its rows as 16-byte quads, against it reading them as words,
on one GPU, in CUDA-graph replay.

    python benchmarks/pack_quad_loads_ab.py [--rounds 3] [--calls 20] [--reps 15]
                                            [--cells 0,5] [--batches 256,512,1024,2048]

The staged pack (``_pack_tokens``, ``staged``) writes a block's span of the buffer as
aligned quads, but a row's group of lanes still reads its input as 4-byte words, lane
``l`` words ``l, l + group, ...``, although the input's rows start 16-byte aligned
where their words are a multiple of four (the misalignment is only in the packed
buffer). With ``quad_loads`` a lane reads quads ``l, l + group`` of its row, a quarter
of the load instructions, and writes their words into shared memory as before. At
bfloat16 N = 2, B = 512, 32 x 128 the pack ran 1.29x a copy of its bytes in its grid on
an H200 (``results/h200_kernels_staged``), the last pack cell under issue 27's 85 %.

For each cell (dtype, N, B, H, D; rows of words of one step, all of 4k words) this
launches, plain, as a plan's (signed: its trailer and call number) and masked
(``seq_lens``, every fourth sequence empty):

- ``stg``: ``pack_launch(..., tokens=True, staged=True, quad_loads=False)``;
- ``stq``: ``quad_loads=True``;

checks that they wrote the same buffers and call numbers, then times them beside the
empty kernel, the 16-byte copy of the pack's bytes and their copy in 4-byte words, in
their grid (``word_floor.word_floors``), interleaved over ``--rounds``. Prints the warps
a block (``w``), the lanes a row (``g``), us per call, stq / stg, and each as a
percentage of the 16-byte vector copy's rate (issue 27's 85 %), then the geometric
mean of stq / stg by lanes a row and mode.
"""

import numpy as np

from one_test_ab import geometric_mean  # run as a script: benchmarks/ on the path
from pack_staged_ab import MODES, setup, timed_cells

WAYS = {"stg": dict(tokens=True, staged=True, quad_loads=False, block_tokens=1),
        "stq": dict(tokens=True, staged=True, quad_loads=True, block_tokens=1)}


def main():
    from cupy_dcp.kernels._rows import lanes_per_row

    args, cells, cupy, kb, rng, stream, rate = setup(__doc__, "pack_quad_loads_ab")
    print(f"{'cell':>34} {'empty':>6} {'quads':>6} {'words':>6} | " + " | ".join(
        f"{m:>6}: {'stg':>6} {'stq':>6} {'stq/stg':>7} {'stg%':>5} {'stq%':>5}" for m in MODES))
    ratios = {}
    for cell, _, same, us, block, pct in timed_cells(cupy, kb, stream, args, rng, rate, cells,
                                                      "stg", ("stq",), WAYS):
        dt, n, B, H, D = cell
        words = D // 2 if np.dtype(dt).itemsize == 2 else D
        group = lanes_per_row(words)
        line = f"{dt:>8} N={n} B={B:>4} {H:>3}x{D:<3} w{block[1]} g{group:<2} " \
               f"{'same' if same else 'DIFFER':>6} {us['empty']:>6.2f} {us['quads']:>6.2f} " \
               f"{us['words']:>6.2f} |"
        for m in MODES:
            stg, stq = us[f"stg_{m}"], us[f"stq_{m}"]
            ratios.setdefault((group, m), []).append(stq / stg)
            line += f" {m:>6}: {stg:>6.2f} {stq:>6.2f} {stq / stg:>7.3f} {pct(stg):>5.1f} " \
                    f"{pct(stq):>5.1f} |"
        print(line.rstrip(" |"), flush=True)
        assert same, f"the packs wrote different bits in {cell}"
    for (group, m), values in sorted(ratios.items()):
        print(geometric_mean(f"stq / stg, {group} lanes a row, {m}", values))


if __name__ == "__main__":
    main()
