"""The kernel bench's launches under the Numba CUDA simulator, NumPy standing in for
CuPy: every kernel of a case launches with the arguments the bench builds, and the
bytes it is set beside are those of its buffers. Collected only with
NUMBA_ENABLE_CUDASIM=1 (see ``tests/conftest.py``)."""

import numpy as np
import pytest

from cupy_dcp import _kernel_bench
from cupy_dcp._kernel_table import KERNELS
from cupy_dcp.kernels import agrs
from cupy_dcp.layout import as_dtype, lse_pack_dim


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_every_kernel_of_a_case_launches(dtype):
    n, B, H, D = 2, 3, 4, 8
    launches = _kernel_bench._case_kernels(np, (dtype, n, B, H, D))
    assert [name for name, *_ in launches] == list(KERNELS)
    size = as_dtype(dtype).itemsize
    width = D + lse_pack_dim(as_dtype(dtype))
    expected = {  # bytes read, bytes written
        "pack": (B * H * D * size + B * H * 4, B * H * width * size),
        "pack_masked": (B * H * D * size + B * H * 4 + B * 8 + (B + 1) * 8,
                        B * H * width * size),
        "combine": (B * H * width * size, B * (H // n) * D * size + B * (H // n) * 4),
        "agrs_correct": (B * H * D * size + n * B * H * 4, B * H * D * 4),
        "agrs_finish": (B * (H // n) * D * 4 + B * H * 4,
                        B * (H // n) * D * size + B * (H // n) * 4),
    }
    # the tile grid: H/N = 2 rows a token along x (one warp holds both: 4 lanes a row), the
    # ranks along y for the pack and the correction, the B tokens along z; the combine runs
    # a block a row (one warp: D = 8) and one more a token that writes the output LSE:
    # (H/N + 1, B); the finish is flat (its output contiguous): a block of FLAT_BLOCK
    # threads holds the B * H/N * D / 4 quads and the B * H/N LSEs
    grids = {"pack": (1, n, B), "pack_masked": (1, n, B), "combine": (H // n + 1, B, 1),
             "agrs_correct": (1, n, B), "agrs_finish": (1, 1, 1)}
    blocks = {**dict.fromkeys(grids, (32, 1)), "agrs_finish": (agrs.FLAT_BLOCK, 1, 1)}
    for name, (kernel, grid, block, args), nread, nwritten in launches:
        assert (nread, nwritten) == expected[name], name
        assert tuple(block) == blocks[name] and tuple(grid) == grids[name], (name, grid, block)
        assert _kernel_bench.floor_blocks(grid) == (int(np.prod(grid)),)
        kernel(grid, block, 0, args)  # raises where an argument is of the wrong kind


def test_exact_cost_twins_differ_only_in_their_part():
    """``benchmarks/exact_cost.py``: each twin of the combine launches with the bench's
    arguments, computes what it claims (the library's result; the weights of vLLM's
    precision, the same under the simulator; 1/2 a shard where every weight is one
    FFMA), and the library's kernels are its own again afterwards."""
    from benchmarks import exact_cost
    from cupy_dcp import lse_weighted_combine, pack_reference
    from cupy_dcp.kernels import _slices, combine
    from cupy_dcp.kernels._arrays import kernel_array

    saved = (combine.combine_kernel, combine.slices_kernel, _slices.held_weights,
             combine.by_blocks)
    n, B, H, D = 2, 3, 4, 8
    launches, _ = exact_cost._launches(np, ("float32", n, B, H, D, 0.0))
    assert set(launches) == set(exact_cost.VARIANTS) | {"no_lse"}
    for kernel, grid, block, args in launches.values():
        kernel(grid, block, 0, args)
    assert (combine.combine_kernel, combine.slices_kernel, _slices.held_weights,
            combine.by_blocks) == saved

    rng = np.random.default_rng(5)
    xs = rng.standard_normal((n, B, H // n, D)).astype(np.float32)
    ls = rng.uniform(-2, 2, (n, B, H // n)).astype(np.float32)
    recv = np.stack([pack_reference(xs[r], ls[r], 1)[0] for r in range(n)]).view(np.uint32)
    expect = lse_weighted_combine(xs.astype(np.float64), ls)
    outs = {}
    for variant in exact_cost.VARIANTS:
        out = np.zeros((B, H // n, D), np.float32)
        with exact_cost._built_with(exact_cost._weights(variant)):
            kernel, grid, block, args = combine.combine_launch(
                np.dtype(np.float32), kernel_array(recv, np.uint32),
                kernel_array(out, np.float32), None, True)
        assert tuple(grid) == (1, 1, B)  # the rows-split kernel, as the docstring says
        kernel(grid, block, 0, args)
        outs[variant] = out
    np.testing.assert_allclose(outs["exact"], expect, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs["fast"], expect, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs["bare"], 0.5 * xs.sum(axis=0), rtol=1e-6, atol=1e-6)
    assert (combine.combine_kernel, combine.slices_kernel, _slices.held_weights,
            combine.by_blocks) == saved


def test_combine_lean_launches_the_library_and_its_twins(monkeypatch):
    """``benchmarks/combine_lean.py``: the library's block a row (its output LSE from one
    more block a token) gives the reference's values and LSEs; ``no_lse`` runs without
    those blocks, writes no LSE and gives the library's very values; the bare twin weighs
    every shard 1/2; the ``fast`` twin (weights at vLLM's precision) and the ``fast_lse``
    twin (its output LSE's logarithm so) give the reference's values and LSEs,
    ``fast_lse`` the library's very values; the library's kernels are its own again
    afterwards."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import combine_lean  # as its command line runs it: beside exact_cost
    from cupy_dcp import lse_weighted_combine
    from cupy_dcp.kernels import _blocks

    def library():
        return (_blocks.held_weights, _blocks._row_combiner, _blocks.blocks_kernel,
                _blocks.device_functions)

    saved = library()
    n, B, H, D = 2, 2, 4, 8
    made = combine_lean._launches(np, ("float32", n, B, H, D), np.random.default_rng(3))
    assert made is not None and library() == saved
    launches, (recv, outs) = made
    assert set(launches) == {"lib", "no_lse", "bare", "fast", "fast_lse"}
    hn = H // n
    assert launches["lib"][1:3] == ((hn + 1, B, 1), (32, 1)) and launches["lib"][3][4] == 1
    assert launches["no_lse"][1:3] == ((hn, B, 1), (32, 1)) and launches["no_lse"][3][4] == 0
    for kernel, grid, block, args in launches.values():
        kernel(grid, block, 0, args)
    xs = recv[..., :D].view(np.float32)
    ls = recv[..., D].view(np.float32)
    expect, expect_lse = lse_weighted_combine(xs, ls, return_lse=True)
    for key in ("lib", "fast", "fast_lse"):
        out, lse = outs[key]
        np.testing.assert_allclose(out.view(np.float32), expect, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lse, expect_lse, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(outs["lib"][0], outs["fast_lse"][0])  # exact weights
    np.testing.assert_array_equal(outs["lib"][0], outs["no_lse"][0])
    assert not outs["no_lse"][1].any()  # no LSE written
    np.testing.assert_allclose(outs["bare"][0].view(np.float32), 0.5 * xs.sum(axis=0),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("B, by_rows", [(3, True), (300, False)], ids=["few_rows", "many_rows"])
def test_kernel_shapes_candidates_are_the_shapes_they_name(B, by_rows):
    """``benchmarks/kernel_shapes.py``: each combine candidate launches in the shape it
    names (a block a row on grid ``(H/N, B)``, the others on the tile grid whatever the
    library would pick), the one marked picked is the library's own launch, every
    candidate of few rows gives the reference's values, and the library's choices
    are its own again afterwards."""
    from benchmarks import kernel_shapes
    from cupy_dcp import lse_weighted_combine, pack_reference
    from cupy_dcp.kernels import _rows, combine
    from cupy_dcp.kernels._arrays import kernel_array

    saved = (_rows.WARPS_PER_BLOCK, combine._combine_shape, combine.block_warps,
             combine.by_blocks, _rows.MAX_GRID_Z)
    n, H, D = 2, 4, 8
    launches, picked, (_, _, _, recv, out, out_lse) = kernel_shapes._launches(
        np, ("float32", n, B, H, D))
    assert (_rows.WARPS_PER_BLOCK, combine._combine_shape, combine.block_warps,
            combine.by_blocks, _rows.MAX_GRID_Z) == saved
    assert (picked["combine"] == "block a row") == by_rows, picked
    shapes = [shape for kind, shape in launches if kind == "combine"]
    walks = [] if by_rows else list(kernel_shapes.WALKS)  # the picked tiles, walking tokens
    assert "block a row" in shapes and len(shapes) == 1 + len(kernel_shapes.UNROLLS) * len(
        kernel_shapes.COMBINE_WARPS) + len(walks)
    for walk in walks:
        picked_grid = tuple(launches[("combine", picked["combine"])][1])
        _, grid, block, _ = launches[("combine", f"{picked['combine']} walk {walk}")]
        assert tuple(grid) == (*picked_grid[:2], -(-B // walk)), (walk, grid)
    _, grid, block, _ = launches[("combine", "block a row")]
    assert tuple(grid) == (H // n + 1, B, 1)  # and the LSE blocks, one a token
    for shape in shapes:
        if shape != "block a row":
            assert tuple(launches[("combine", shape)][1]) != (H // n + 1, B, 1), shape
    _, grid, block, _ = combine.combine_launch(
        np.dtype(np.float32), kernel_array(recv, np.uint32), kernel_array(out, np.float32),
        kernel_array(out_lse, np.float32), True)
    assert (tuple(grid), tuple(block)) == tuple(
        tuple(v) for v in launches[("combine", picked["combine"])][1:3])
    if B > 3:
        return  # the shapes' values at few rows: the simulator runs a launch a thread
    rng = np.random.default_rng(11)
    xs = rng.standard_normal((n, B, H // n, D)).astype(np.float32)
    ls = rng.uniform(-3, 3, (n, B, H // n)).astype(np.float32)
    recv[...] = np.stack([pack_reference(xs[r], ls[r], 1)[0] for r in range(n)]).view(np.uint32)
    expect = lse_weighted_combine(xs.astype(np.float64), ls)
    for shape in shapes:
        out[...] = np.nan
        kernel, grid, block, args = launches[("combine", shape)]
        kernel(grid, block, 0, args)
        np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-6, err_msg=shape)


def test_whole_slices_ab_launches_the_library_and_its_guarded_twin(monkeypatch):
    """``benchmarks/whole_slices_ab.py``: at a cell whose rows fill the combine's slices,
    the library's launch (the kernel with no test against a row's end) and its guarded
    twin, in the same grid; no launches where the library runs a block a row or the rows
    do not fill the slices; the library's rule is its own again afterwards."""
    from pathlib import Path

    from cupy_dcp.kernels import combine

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import whole_slices_ab  # as its command line runs it: beside register_cap_ab

    library = combine.whole_slices
    n, B, H, D = 2, 300, 4, 64  # 600 rows of 64 values: 16 lanes of 4 values a row
    launches = whole_slices_ab._launches(np, ("float32", n, B, H, D))
    assert combine.whole_slices is library
    assert set(launches) == {"guarded", "whole"}
    group, unroll, slices = combine._combine_shape(D, B * H // n, n)
    assert (group, unroll, slices) == (16, 4, 1)
    assert launches["whole"][0] is combine.combine_kernel(np.dtype(np.float32), False, group,
                                                          n, unroll, False, False, True)
    assert launches["guarded"][0] is combine.combine_kernel(np.dtype(np.float32), False,
                                                            group, n, unroll)
    assert [tuple(launches[k][1]) for k in launches] == [tuple(launches["whole"][1])] * 2
    assert whole_slices_ab._launches(np, ("float32", n, 3, H, D)) is None  # a block a row
    assert whole_slices_ab._launches(np, ("float32", n, B, H, D - 2)) is None  # 62 values
    assert whole_slices_ab._launches(np, ("float32", 33, B, 33, D)) is None  # any N
    assert combine.whole_slices is library


@pytest.mark.parametrize("dtype, n", [("float32", 2), ("bfloat16", 4), ("float16", 8)])
def test_row_floor_loads_as_the_combine_and_stores_the_xor_of_its_rows(monkeypatch, dtype,
                                                                       n):
    """``benchmarks/row_floor.py``: beside the combine for exactly N on rows that fill
    its slices, a copy in the combine's grid stores at each output word the XOR of every
    shard's word there and its LSE word; no copy where the combine runs a block a row,
    the kernel for any N or rows that do not fill its slices."""
    from pathlib import Path

    from cupy_dcp._kernel_bench import _case_kernels

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import row_floor  # as its command line runs it: beside exact_cost and word_floor

    def combine_of(cell):
        return [c for c in _case_kernels(np, cell) if c[0] == "combine"][0][1]

    B, H, D = 300, 2 * n, 64  # 600 rows of 64 values (32 words in pairs): whole slices
    launch = combine_of((dtype, n, B, H, D))
    found = row_floor.row_launch(np, launch)
    assert found is not None
    (kernel, grid, block, args), src, dst = found
    assert tuple(grid) == tuple(launch[1]) and tuple(block) == tuple(launch[2])
    width = args[4]
    src[...] = np.random.default_rng(n).integers(0, 2 ** 32, src.size, dtype=np.uint64)
    kernel(grid, block, 0, args)
    rows = src.reshape(n, B, H // n, width)
    expect = np.bitwise_xor.reduce(rows[..., :args[5]] ^ rows[..., width - 1:], axis=0)
    assert np.array_equal(dst.reshape(expect.shape), expect)
    assert row_floor.row_launch(np, combine_of((dtype, n, 3, H, D))) is None  # a block a row
    assert row_floor.row_launch(np, combine_of(("float32", n, B, H, D - 2))) is None  # 62
    assert row_floor.row_launch(np, combine_of(("float32", 33, B, 33, D))) is None  # any N


@pytest.mark.parametrize("dtype, n, B, H, D, kind", [
    ("bfloat16", 2, 3, 4, 128, "blocks"), ("float16", 4, 300, 8, 64, "whole"),
    ("float32", 3, 300, 6, 62, "slices")])
def test_one_test_twin_gives_the_combines_bits(monkeypatch, dtype, n, B, H, D, kind):
    """``benchmarks/one_test_ab.py``: the twin of each combine for exactly N (a block a
    row, slices that rows fill, slices that they do not) is other code than the
    library's and gives its bits, with NaN and infinite partials, a NaN LSE, a token
    empty on every shard, a row empty on one shard and a wide LSE spread; and the
    library's factories are left as they were."""
    from pathlib import Path

    from cupy_dcp.kernels import _blocks, _slices, combine
    from cupy_dcp.kernels._arrays import kernel_array
    from cupy_dcp.kernels._cache import code_fingerprint
    from cupy_dcp.reference import pack_reference

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import one_test_ab  # as its command line runs it: beside exact_cost and word_floor

    dt = as_dtype(dtype)
    rng = np.random.default_rng(B + n + D)
    x = rng.standard_normal((n, B, H // n, D)).astype(np.float32)
    x[0, 0, 0, 1], x[1, B - 1, H // n - 1, 2], x[n - 1, 1, 0, 0] = np.nan, np.inf, -np.inf
    lse = rng.uniform(-30, 30, (n, B, H // n)).astype(np.float32)
    lse[0, 0, 0] = np.nan
    lse[:, B - 1, 0] = -np.inf  # a token's row empty on every shard
    lse[1, 1, 1] = -np.inf  # a row empty on one shard: the path with a branch a shard,
    x[1, 1, 1, 0] = np.nan  # whose NaN the sums must skip
    lse[0, 0, 1], lse[n - 1, 0, 1] = 3000.0, 2950.0
    recv = np.stack([pack_reference(x[r].astype(dt), lse[r], 1)[0] for r in range(n)])
    sums = (_slices.shard_sums, _blocks.shard_sums)
    outputs = []
    for use_twin in (False, True):
        out = np.zeros((B, H // n, D), dt)
        out_lse = np.zeros((B, H // n), np.float32)
        launch = combine.combine_launch(dt, kernel_array(recv.copy(), recv.dtype),
                                        kernel_array(out, combine.combine_codec(dt)[1]),
                                        kernel_array(out_lse, np.float32), True)
        kernel, grid, block, args = launch
        if use_twin:
            found, twin = one_test_ab.twin(launch, dt, n)
            assert found == kind
            assert code_fingerprint(twin._dispatcher) != code_fingerprint(kernel._dispatcher)
            kernel = twin
        kernel(grid, block, 0, args)
        outputs.append((out.view(np.uint8), out_lse.view(np.uint32)))
    assert (_slices.shard_sums, _blocks.shard_sums) == sums
    assert np.array_equal(outputs[0][0], outputs[1][0])
    assert np.array_equal(outputs[0][1], outputs[1][1])


@pytest.mark.parametrize("dtype, streams", [("bfloat16", False), ("float32", True)])
def test_many_shards_ab_launches_the_combine_for_any_n_and_for_its_n(monkeypatch, dtype,
                                                                    streams):
    """``benchmarks/many_shards_ab.py`` at N = 16: ``any`` is the kernel for any N
    (no flat views), ``own`` the one built for 16 shards, and where ``own`` streams
    ``fewer`` moves ``SLICED_UNROLL`` values a lane; all give the same bits (NaN and
    infinite partials, a NaN LSE, a token empty on every shard), and the library's
    switches are left as they were."""
    from pathlib import Path

    from cupy_dcp.kernels import combine
    from cupy_dcp.reference import pack_reference

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import many_shards_ab  # as its command line runs it: beside exact_cost and word_floor

    monkeypatch.setattr(combine, "by_blocks", lambda *shape: False)  # rows split over warps
    monkeypatch.setattr(combine, "MANY_WARPS", 0 if streams else 1 << 40)
    switches = combine.MAX_STATIC_SHARDS, combine.STREAM_UNROLL
    n, B, H, D = 16, 3, 32, 12
    dt = as_dtype(dtype)
    rng = np.random.default_rng(n + D)
    x = rng.standard_normal((n, B, H // n, D)).astype(np.float32)
    x[2, 1, 0, 3], x[3, 0, 1, 0] = np.nan, np.inf
    lse = rng.uniform(-30, 30, (n, B, H // n)).astype(np.float32)
    lse[0, 1, 1] = np.nan
    lse[:, 0, :] = -np.inf  # a token empty on every shard
    recv = np.stack([pack_reference(x[r].astype(dt), lse[r], 1)[0] for r in range(n)])
    out = np.zeros((B, H // n, D), dt)
    out_lse = np.zeros((B, H // n), np.float32)
    made = many_shards_ab.launches(np, dt, n, recv, out, out_lse)
    assert (combine.MAX_STATIC_SHARDS, combine.STREAM_UNROLL) == switches
    assert set(made) == ({"any", "own", "fewer"} if streams else {"any", "own"})
    assert len(made["any"][3]) == 8 and len(made["own"][3]) == 10  # flat views: its N
    got = {}
    for name, (kernel, grid, block, args) in made.items():
        out[...] = 0
        out_lse[...] = 0
        kernel(grid, block, 0, args)
        got[name] = (out.view(np.uint8).copy(), out_lse.view(np.uint32).copy())
    for name in made:
        assert np.array_equal(got[name][0], got["any"][0]), name
        assert np.array_equal(got[name][1], got["any"][1]), name
    assert np.isneginf(got["any"][1].view(np.float32)[0]).all()  # empty on every shard
    assert np.isfinite(got["any"][1].view(np.float32)[1]).all()


def _assert_ways_wrote_alike(modes, buffers, base, others):
    """In each of ``modes``, ``base`` wrote something and each of ``others`` wrote the
    same buffers and call numbers (``buffers``: ``{"way_mode": arrays}``, as the pack
    A/Bs' ``cell_launches`` gives them)."""
    for mode in modes:
        assert buffers[f"{base}_{mode}"][0].any()
        for way in others:
            for mine, theirs in zip(buffers[f"{base}_{mode}"], buffers[f"{way}_{mode}"]):
                np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("dtype, n, B, H, D", [("bfloat16", 2, 3, 72, 32), ("float32", 4, 2, 8, 7)])
def test_pack_staged_ab_launches_three_packs_with_the_same_bits(monkeypatch, dtype, n, B, H, D):
    """``benchmarks/pack_staged_ab.py``: ``pack``'s kernels, the pack by tokens and its
    staged twin, plain, signed and masked, each the kernel it names, write the same
    buffers and call numbers."""
    from pathlib import Path

    from cupy_dcp.kernels import _pack_tokens

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import pack_staged_ab

    launches, buffers, (nread, nwritten) = pack_staged_ab.cell_launches(
        np, np.random.default_rng(B), dtype, n, B, H, D)
    assert set(launches) == {f"{w}_{m}" for w in pack_staged_ab.WAYS
                             for m in pack_staged_ab.MODES}
    assert nread == B * H * (D * (2 if dtype == "bfloat16" else 4) + 4)
    for key, (kernel, grid, block, args) in launches.items():
        staged = any(kernel is _pack_tokens.tokens_kernel(np.dtype(np.uint32), g, *flags, True)
                     for g in (4, 8) for flags in ((False, False, False), (True, False, False),
                                                   (False, True, True), (False, True, False)))
        assert staged == key.startswith("stg"), key
        kernel(grid, block, 0, args)
    _assert_ways_wrote_alike(pack_staged_ab.MODES, buffers, "lib", ("tok", "stg"))


@pytest.mark.parametrize("dtype, n, B, H, D", [("bfloat16", 8, 4, 32, 16), ("float32", 4, 8, 8, 9)])
def test_pack_block_tokens_ab_launches_packs_of_one_two_and_four_tokens_a_block(
        monkeypatch, dtype, n, B, H, D):
    """``benchmarks/pack_block_tokens_ab.py``: a block row a token and two and four
    tokens a block, plain, signed and masked, each the kernel it names, write the same
    buffers and call numbers."""
    from pathlib import Path

    from cupy_dcp.kernels import _pack_tokens

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import pack_block_tokens_ab
    import pack_staged_ab

    launches, buffers, _ = pack_staged_ab.cell_launches(
        np, np.random.default_rng(B), dtype, n, B, H, D, ways=pack_block_tokens_ab.WAYS)
    assert set(launches) == {f"{w}_{m}" for w in pack_block_tokens_ab.WAYS
                             for m in pack_staged_ab.MODES}
    for key, (kernel, grid, block, args) in launches.items():
        together = {"one": 1, "t2": 2, "t4": 4}[key.split("_")[0]]
        mode = key.split("_")[1]
        lead = mode == "signed" and together == 1  # a small grid: a lead plane signs
        assert kernel is _pack_tokens.tokens_kernel(
            np.dtype(np.uint32), 4, mode == "masked", mode == "signed", lead, False, False,
            together), key
        if together > 1:
            assert block == (32, together) and grid == (1, n, B // together), key
        kernel(grid, block, 0, args)
    _assert_ways_wrote_alike(pack_staged_ab.MODES, buffers, "one", ("t2", "t4"))
