"""The pack a block row per token (``kernels/_pack_tokens.py``) against the library's
other packs, on one GPU, in CUDA-graph replay, with the same inputs.

    python benchmarks/pack_tokens.py [CELLS]

For each cell (dtype, N, B, H, D; the first ``CELLS`` of them) it launches
``pack_launch(..., tokens=False)`` (lib) and ``tokens=True`` (tok), each plain, signed
(a plan's trailer rows and call number) and masked (``seq_lens``, every fourth
sequence empty), checks that both wrote the same send and receive buffers and call
numbers, then times them beside the empty kernel and a copy of the pack's bytes in
lib's grid: graphs of 20 calls, the median of 15 replays, the median of 3
interleaved rounds. Rows of two steps (float32 at D = 512) are not this kernel's and
are left out; where B is past the grid's z, tok is not timed. Results:
``results/h200_pack_tokens_ab.log``.
"""
import sys
import numpy as np
import cupy
from cupy_dcp import _kernel_bench as kb
from cupy_dcp._floors import copy_kernel, empty_kernel, in_flight, quad_words
from cupy_dcp.kernels._arrays import kernel_array
from pack_staged_ab import cell_launches  # run as a script: benchmarks/ on the path

WAYS = {"lib": dict(tokens=False), "tok": dict(tokens=True, staged=False)}

rng = np.random.default_rng(0)
stream = cupy.cuda.Stream(non_blocking=True)
print("# pack lib (tokens=False) vs tok (a block row per token): us, graph of 20 calls, "
      "median of 15 replays, median of 3 rounds; x: over the copy floor in lib's grid")
cells = []
for dt, n in (("bfloat16", 2), ("bfloat16", 8), ("float16", 4), ("float32", 2), ("float32", 8)):
    for H, D in ((32, 128), (64, 128), (128, 512)):
        if dt == "float32" and D == 512:
            continue  # wide rows: not this kernel
        for B in (1, 8, 32, 128, 256, 512, 1024):
            cells.append((dt, n, B, H, D))
if len(sys.argv) > 1:
    cells = cells[:int(sys.argv[1])]
for dt, n, B, H, D in cells:
    launches, bufs, (nread, nwritten) = cell_launches(cupy, rng, dt, n, B, H, D, WAYS)
    cupy.cuda.runtime.deviceSynchronize()  # the buffers' memsets ran on the legacy stream
    for key, (kern, g, bl, a) in launches.items():
        kern(g, bl, stream.ptr, a)
    stream.synchronize()
    same = {}
    for mode in ("plain", "signed", "masked"):
        if f"tok_{mode}" in bufs:
            same[mode] = all(bool(cupy.array_equal(p, q)) for p, q in
                             zip(bufs[f"lib_{mode}"], bufs[f"tok_{mode}"]))
    grid, block = launches["lib_plain"][1:3]
    src = cupy.zeros(quad_words(nread), dtype=cupy.uint32)
    dstf = cupy.empty(quad_words(nwritten), dtype=cupy.uint32)
    fa = (kernel_array(src, np.uint32), kernel_array(dstf, np.uint32))
    fg = kb.floor_blocks(grid)
    launches["empty"] = (empty_kernel(), fg, block, fa)
    launches["copy"] = (copy_kernel(in_flight(nread, nwritten)), fg, block, fa)
    with stream:
        us = kb._interleaved_us(cupy, stream, launches, 3, 20, 15)
    c, e = us["copy"], us["empty"]
    line = f"{dt:>8} N={n} B={B:>4} {H}x{D} grid {grid}: same {same} | empty {e:.2f} copy {c:.2f} |"
    for mode in ("plain", "signed", "masked"):
        lib = us[f"lib_{mode}"]
        tok = us.get(f"tok_{mode}")
        line += f" {mode} {lib:.2f}" + (f"->{tok:.2f} ({tok / lib:.3f})" if tok else "")
    print(line, flush=True)
    assert all(same.values()), same
