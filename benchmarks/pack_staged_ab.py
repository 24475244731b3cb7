"""The pack by tokens with its rows staged through shared memory, against it without
and against ``pack``'s kernels, on one GPU, in CUDA-graph replay.

    python benchmarks/pack_staged_ab.py [--rounds 3] [--calls 20] [--reps 15]
                                        [--cells 0,5] [--batches 256,512,1024,2048]

The packed rows hold ``D + P`` values, so a row's group of lanes stores 4-byte words
of rows that start off a 32-byte sector, and at B >= 512 the pack of short rows ran
at 1.2x a copy of its bytes in 4-byte words (``benchmarks/NOTES.md``, 2026-12-05,
third). The staged twin (``_pack_tokens``, ``staged``) gathers a block's rows in
shared memory and writes their span of the buffer as aligned 16-byte quads. For
each cell (dtype, N, B, H, D; rows of words of one step) this launches, plain, as a
plan's (signed: its trailer and call number) and masked (``seq_lens``, every fourth
sequence empty):

- ``lib``: ``pack_launch(..., tokens=False)``, ``pack``'s kernels;
- ``tok``: ``tokens=True, staged=False``, the pack a block row per token;
- ``stg``: ``tokens=True, staged=True, quad_loads=False``, its staged twin (reading
  its input as words, as it did when this was written: ``pack_quad_loads_ab.py`` times
  it against quad loads);

checks that they wrote the same buffers and call numbers, then times them beside
the empty kernel, the 16-byte copy of the pack's bytes and their copy in 4-byte
words, in stg's grid (where B is past ``tile_grid``'s tokens, tok cannot run: stg's
grid is a block row for every token, and the line shows lib and stg alone; a cell
where stg cannot run either is named and skipped) (``word_floor.word_floors``), interleaved over
``--rounds``. Prints the warps a block (``w``), us per call, stg / tok, and each
as a percentage of the 16-byte vector copy's rate (issue 27's 85 %).
"""

import argparse

import numpy as np

from exact_cost import arguments  # run as a script: benchmarks/ on the path
from one_test_ab import geometric_mean
from word_floor import word_floors

WAYS = {"lib": dict(tokens=False), "tok": dict(tokens=True, staged=False, block_tokens=1),
        "stg": dict(tokens=True, staged=True, quad_loads=False, block_tokens=1)}
MODES = ("plain", "signed", "masked")


def cells_of(batches):
    """``(dtype, N, B, H, D)`` of rows of words of one step: 16-bit pairs at every
    shape, float32 at D = 128 (its D = 512 rows take two steps)."""
    shapes = {"bfloat16": ((32, 128), (64, 128), (128, 512)), "float32": ((32, 128), (64, 128))}
    return [(dt, n, B, H, D) for dt, hd in shapes.items() for n in (2, 4, 8) for H, D in hd
            for B in batches]


def cell_launches(cupy, rng, dtype_name, n, B, H, D, ways=WAYS):
    """``({"way_mode": launch}, {"way_mode": buffers}, (read bytes, written bytes))`` for
    each of ``ways`` (``{name: pack_launch's keyword arguments}``) and :data:`MODES`;
    ``tok`` is left out where it cannot run the cell."""
    from cupy_dcp.kernels._arrays import dummy_index, kernel_array
    from cupy_dcp.kernels._trailer import trailer_rows
    from cupy_dcp.kernels.pack import pack_launch
    from cupy_dcp.layout import as_dtype, bits_dtype, lse_pack_dim

    dtype = as_dtype(dtype_name)
    bits = bits_dtype(dtype)
    x = cupy.asarray(rng.standard_normal((B, H, D)).astype(np.float32).astype(dtype).view(bits))
    lse = cupy.asarray(rng.standard_normal((B, H)).astype(np.float32)).view(np.uint32)
    width = D + lse_pack_dim(dtype)
    extra = trailer_rows(H // n, width, np.dtype(bits).itemsize)
    seq_lens = cupy.asarray(np.where(np.arange(B) % 4 == 0, 0, 7).astype(np.int64))
    starts = cupy.arange(B + 1, dtype=cupy.int64)
    signature = cupy.asarray(np.array([11, 0, H, D, 2, 1, 0, 0], np.int64))
    launches, buffers = {}, {}
    for mode in MODES:
        for way, kwargs in ways.items():
            send = cupy.zeros((n, B + (extra if mode == "signed" else 0), H // n, width), bits)
            recv, state = cupy.zeros_like(send), cupy.zeros(2, cupy.int64)
            mask = (kernel_array(seq_lens, np.int64), kernel_array(starts, np.int64), B) \
                if mode == "masked" else (dummy_index(), dummy_index(), -1)
            signed = (kernel_array(signature, np.int64), kernel_array(state, np.int64)) \
                if mode == "signed" else None
            try:
                launches[f"{way}_{mode}"] = pack_launch(
                    kernel_array(x, bits), kernel_array(lse, np.uint32), *mask,
                    kernel_array(send, bits), kernel_array(recv, bits), 0, signed, **kwargs)
            except ValueError:  # B past tok's grid (its z walks the tokens): no tok
                if way != "tok":
                    raise
                continue
            buffers[f"{way}_{mode}"] = (send, recv, state)
    written = n * B * (H // n) * width * np.dtype(bits).itemsize
    return launches, buffers, (x.nbytes + lse.nbytes, written)


def setup(doc, name, cells_for=cells_of, floors="stg"):
    """``(args, cells, cupy, kb, rng, stream, rate)`` for an A/B of the packs by tokens:
    the command line (``--batches`` beside :func:`exact_cost.arguments`'s, described by
    ``doc``'s first line), the cells it picks (``cells_for(batches)``, :func:`cells_of`
    by default), a non-blocking stream
    and the GPU's 16-byte copy rate in GB/s, measured on it and printed in a header line
    that names ``name`` and the way whose grid the floors take (``floors``)."""
    import sys

    from cupy_dcp.bench import _ints

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--batches", type=_ints, default=[256, 512, 1024, 2048])
    known, rest = extra.parse_known_args()
    sys.argv = sys.argv[:1] + rest
    if not known.batches or min(known.batches) < 1:
        raise SystemExit("--batches must be a comma list of positive token counts")
    args, cells = arguments(doc.splitlines()[0], cells_for(known.batches))
    import cupy

    from cupy_dcp import _kernel_bench as kb

    rng = np.random.default_rng(0)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        memcpy, vector = kb.copy_bandwidth(cupy, stream)
    rate = max(memcpy, vector)
    print(f"# {name}: us per call, graph of {args.calls} calls, median of {args.reps} "
          f"replays, median of {args.rounds} rounds; the 16-byte copy at {rate:.0f} GB/s "
          f"(pct: of it); floors in {floors}'s grid")
    return args, cells, cupy, kb, rng, stream, rate


def run_cell(cupy, kb, stream, args, launches, buffers, nread, nwritten, base, others,
             floors="stg"):
    """Launch every pack of ``launches`` once, then time them with the floors of
    ``word_floors`` in the grid of way ``floors``, interleaved over ``args.rounds``:
    ``(same, us, block)``, ``same`` where each of ``others`` wrote what ``base`` did in
    every mode it ran (``buffers``, as :func:`cell_launches` gives them)."""
    # the buffers were zeroed on the legacy stream, which a non-blocking stream does
    # not wait for: a pack launched on it at once could race their memsets
    cupy.cuda.runtime.deviceSynchronize()
    for kernel, grid, block, kargs in launches.values():
        kernel(grid, block, stream.ptr, kargs)
    stream.synchronize()
    same = all(all(bool(cupy.array_equal(p, q)) for p, q in
                   zip(buffers[f"{base}_{m}"], buffers[f"{way}_{m}"]))
               for m in MODES for way in others if f"{way}_{m}" in buffers)
    grid, block = launches[f"{floors}_plain"][1:3]
    launches.update(word_floors(cupy, nread, nwritten, grid, block, quads=True))
    with stream:
        us = kb._interleaved_us(cupy, stream, launches, args.rounds, args.calls, args.reps)
    return same, us, block


def timed_cells(cupy, kb, stream, args, rng, rate, cells, base, others, ways=WAYS,
                floors="stg"):
    """For each of ``cells`` that :func:`cell_launches` can build with ``ways``, yield
    ``(cell, launches, same, us, block, pct)`` from :func:`run_cell` (``base`` against
    ``others``, the floors in ``floors``'s grid), where ``pct(us)`` is the cell's bytes
    at ``us`` per call as a percentage of ``rate``; a cell none can build is named as
    not timed and skipped. The caller asserts ``same`` once it has printed the line."""
    for cell in cells:
        try:
            launches, buffers, (nread, nwritten) = cell_launches(cupy, rng, *cell, ways=ways)
        except ValueError as exc:  # B past the grid's z: no pack by tokens
            print(f"{' '.join(map(str, cell))}: not timed ({exc})", flush=True)
            continue
        same, us, block = run_cell(cupy, kb, stream, args, launches, buffers, nread, nwritten,
                                   base, others, floors)
        moved = nread + nwritten
        yield cell, launches, same, us, block, lambda t, moved=moved: 100 * moved / t / 1e3 / rate


def main():
    args, cells, cupy, kb, rng, stream, rate = setup(__doc__, "pack_staged_ab")
    print(f"{'cell':>30} {'empty':>6} {'quads':>6} {'words':>6} | " + " | ".join(
        f"{m:>6}: {'lib':>6} {'tok':>6} {'stg':>6} {'stg/tok':>7} {'tok%':>5} {'stg%':>5}"
        for m in MODES))
    ratios = {m: [] for m in MODES}
    for cell, _, same, us, block, pct in timed_cells(cupy, kb, stream, args, rng, rate, cells,
                                                      "lib", ("tok", "stg")):
        dt, n, B, H, D = cell
        line = f"{dt:>8} N={n} B={B:>4} {H:>3}x{D:<3} w{block[1]} " \
               f"{'same' if same else 'DIFFER':>6} {us['empty']:>6.2f} {us['quads']:>6.2f} " \
               f"{us['words']:>6.2f} |"
        for m in MODES:
            lib, stg = us[f"lib_{m}"], us[f"stg_{m}"]
            tok = us.get(f"tok_{m}")
            if tok is None:  # (a grid of B blocks' rows is the staged kernel's alone)
                line += f" {m:>6}: {lib:>6.2f} {'-':>6} {stg:>6.2f} {'-':>7} {'-':>5} " \
                        f"{pct(stg):>5.1f} |"
                continue
            ratios[m].append(stg / tok)
            line += f" {m:>6}: {lib:>6.2f} {tok:>6.2f} {stg:>6.2f} {stg / tok:>7.3f} " \
                    f"{pct(tok):>5.1f} {pct(stg):>5.1f} |"
        print(line.rstrip(" |"), flush=True)
        assert same, f"the packs wrote different bits in {cell}"
    for m in MODES:
        print(geometric_mean(f"stg / tok, {m}", ratios[m]))


if __name__ == "__main__":
    main()
