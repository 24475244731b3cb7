"""The CUDA kernels on a real GPU, at real sizes, through every array protocol."""

import numpy as np
import pytest

from gpu import requires_gpu
from kernel_checks import (DTYPES, PACK_LAYOUTS, QUAD_CASES, check_bare_push, check_combine,
                           check_copy_floor, check_direct, check_direct_missing_peer,
                           check_direct_quads, check_pack, check_pack_bf16x2,
                           check_pack_by_tokens, check_pack_quads)

pytestmark = [pytest.mark.gpu, requires_gpu]

HEAD_DIMS = [1, 72, 128, 192, 512, 576]


def cupy_io():
    import cupy
    return cupy.asarray, cupy.asnumpy


def numba_io():
    from numba import cuda
    # Numba has no bfloat16: its device arrays hold bfloat16 as uint16 bits.
    def to_device(x):
        x = np.asarray(x)
        return cuda.to_device(x.view(np.uint16) if x.dtype.kind == "V" else x)

    def to_host(x):
        return x.copy_to_host()
    return to_device, to_host


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_pack_bit_exact(dtype, d, monkeypatch):
    from cupy_dcp.kernels import _rows

    to_device, to_host = cupy_io()
    rng = np.random.default_rng(d)
    check_pack(to_device, to_host, dtype, 2, 64, 16, d, rng)
    check_pack(to_device, to_host, dtype, 2, 64, 16, d, rng, masked=True)
    for layout in PACK_LAYOUTS:
        check_pack(to_device, to_host, dtype, 4, 3, 8, d, rng, strided=layout)
        check_pack(to_device, to_host, dtype, 4, 3, 8, d, rng, strided=layout, masked=True)
    monkeypatch.setattr(_rows, "MAX_BLOCKS", 1)  # blocks loop over tokens, two a trip
    for layout in (False,) + PACK_LAYOUTS:
        check_pack(to_device, to_host, dtype, 2, 7, 4, d, rng, strided=layout, masked=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 3, 4, 1), (2, 64, 32, 128), (8, 32, 32, 128),
                                   (4, 33, 128, 256), (2, 5, 8, 77)],
                         ids=lambda s: "N%dB%dH%dD%d" % s)
def test_pack_by_tokens_writes_the_bits_of_the_other_packs(dtype, shape, monkeypatch):
    """Compiled, the pack a block row per token and ``pack``'s kernels give the same
    bits: the reference's rows, masked or not, routed or not, a plan's trailer or not,
    signed by a lead plane of blocks or by the rows' blocks, as the grid has it, and
    each way for every grid."""
    from cupy_dcp.kernels import _pack_tokens

    to_device, to_host = cupy_io()
    rng = np.random.default_rng(sum(shape))
    for strided in (False, "heads_major"):
        for masked in (False, True):
            for signed, self_rank in ((False, -1), (True, 1), (False, shape[0] - 1)):
                check_pack_by_tokens(to_device, to_host, dtype, *shape, rng, strided, masked,
                                     signed, self_rank)
    for most in (0, 1 << 30):  # the rows' blocks sign, then a lead plane does
        monkeypatch.setattr(_pack_tokens, "LEAD_MOST_BLOCKS", most)
        for masked in (False, True):
            check_pack_by_tokens(to_device, to_host, dtype, *shape, rng, False, masked, True, 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 4, 6, 7), (4, 4, 12, 36), (8, 512, 32, 128),
                                   (8, 256, 8, 512)], ids=lambda s: "N%dB%dH%dD%d" % s)
def test_pack_of_tokens_a_block_writes_the_bits_of_a_token_a_block(dtype, shape):
    """Compiled, the pack by tokens with two and four tokens a block, a warp each, plain
    and staged, writes what a block row a token and ``pack``'s kernels write: plain, and
    heads-major, masked, signed and routed; at the kernel bench's N = 8, 32 x 128 cell
    and rows of one warp a token too (float32 at half their D: the same words a row)."""
    to_device, to_host = cupy_io()
    if np.dtype(dtype).itemsize == 4 and shape[3] >= 128:
        shape = shape[:3] + (shape[3] // 2,)
    rng = np.random.default_rng(sum(shape))
    for strided, masked, signed, self_rank in ((False, False, False, -1),
                                               ("heads_major", True, True, 1)):
        check_pack_by_tokens(to_device, to_host, dtype, *shape, rng, strided, masked, signed,
                             self_rank, (1, 2, 4))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 5, 4, 1), (2, 9, 8, 72), (2, 33, 8, 512), (8, 3, 16, 576),
                                   (2, 5, 4, 1030)], ids=lambda s: "N%dB%dH%dD%d" % s)
def test_pack_stores_aligned_quads_where_it_can(dtype, shape):
    to_device, to_host = cupy_io()
    check_pack_quads(to_device, to_host, dtype, *shape, np.random.default_rng(sum(shape)))


@pytest.mark.parametrize("masked", [True, False])
def test_the_quads_pack_holds_its_registers(masked):
    """The pack of rows as aligned quads, as every pack, is capped at MAX_REGISTERS
    registers, and spills none there (no local memory)."""
    import cupy
    from cupy_dcp.kernels import pack
    from cupy_dcp.kernels._rows import MAX_REGISTERS

    kernel = pack.pack_kernel(np.dtype(np.uint32), 32, True, masked, True)
    module = cupy.cuda.function.Module()
    module.load(kernel._image)
    function = module.get_function(kernel._entry)
    assert cupy.cuda.driver.funcGetAttribute(4, function.ptr) <= MAX_REGISTERS  # NUM_REGS
    assert cupy.cuda.driver.funcGetAttribute(3, function.ptr) == 0  # LOCAL_SIZE_BYTES


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("base_e", [True, False], ids=["base_e", "base_2"])
@pytest.mark.parametrize("loads", ["most", "fewest", "blocks"])
def test_combine_matches_reference(dtype, d, base_e, loads, monkeypatch):
    """The combine for exactly N, with the most values a lane for its N (N = 2: 8,
    N = 4: 4; the longer rows split over the grid), with the fewest (2: rows
    split), and with a block a row (``_blocks``)."""
    from cupy_dcp.kernels import combine

    monkeypatch.setattr(combine, "MANY_WARPS", 0 if loads == "most" else 1 << 40)
    monkeypatch.setattr(combine, "FEW_WARPS", 1 << 40)
    monkeypatch.setattr(combine, "by_blocks", lambda *shape: loads == "blocks")
    to_device, to_host = cupy_io()
    rng = np.random.default_rng(d)
    check_combine(to_device, to_host, dtype, 2, 64, 8, d, rng, base_e=base_e)
    check_combine(to_device, to_host, dtype, 4, 160, 4, d, rng, base_e=base_e)


# Issue cells whose combine takes a decode-size shape. Rows split over warps (the
# block a row turned off): blocks of two warps (N = 4 and 8 at B = 1), the float32
# kernel capped at 64 registers (N = 2, B = 32), both (B = 1). A block a row (warps 0,
# as the library picks): few rows of words, 4 float32 values a thread, short rows (64
# words: a block of two warps). A 4096-warp launch (N = 8, B = 512): it streams, four
# word pairs a lane and shard, over rows that fill its slices (combine.whole_slices).
# N = 16: a block a row of two words a thread; rows split over warps, whole slices.
DECODE_CELLS = [("bfloat16", 4, 1, 128, 512, 2), ("bfloat16", 8, 1, 128, 512, 2),
                ("float32", 2, 32, 128, 512, 4), ("float32", 2, 1, 128, 512, 2),
                ("bfloat16", 2, 1, 128, 512, 0), ("float32", 8, 32, 128, 512, 0),
                ("bfloat16", 8, 32, 32, 128, 0), ("bfloat16", 8, 512, 64, 128, 4),
                ("bfloat16", 16, 1, 128, 512, 0), ("bfloat16", 16, 32, 64, 128, 2)]


@pytest.mark.parametrize("cell", DECODE_CELLS, ids=lambda c: "-".join(map(str, c[:6])))
def test_combine_at_decode_shapes_matches_reference(cell, monkeypatch):
    """At the issue's decode cells the combine launches the shape ``by_blocks``,
    ``block_warps`` and ``capped`` give it: a capped kernel holds at most
    MAX_REGISTERS registers, none spills (no local memory), a 16-bit one or a block
    a row is not capped, and the outputs agree with the reference, adversarial LSEs
    included."""
    import cupy
    from cupy_dcp.kernels import combine
    from cupy_dcp.kernels._arrays import kernel_array
    from cupy_dcp.kernels._rows import MAX_REGISTERS
    from cupy_dcp.layout import as_dtype, bits_dtype, lse_pack_dim

    name, n, b, h, d, warps = cell
    if warps:
        monkeypatch.setattr(combine, "by_blocks", lambda *shape: False)
    dtype = as_dtype(name)
    bits = bits_dtype(dtype)
    recv = cupy.zeros((n, b, h // n, d + lse_pack_dim(dtype)), dtype=bits)
    out = cupy.zeros((b, h // n, d), dtype=dtype)
    kernel, _, block, args = combine.combine_launch(
        dtype, kernel_array(recv, bits), kernel_array(out, combine.combine_codec(dtype)[1]),
        None, True)
    assert block == ((32, warps) if warps else (combine.block_threads(args[9]), 1))  # D
    if warps:  # the tiles: the kernel for these rows, whole where they fill the slices
        elements = args[2].shape[2]  # words in pairs
        group, unroll, _ = combine._combine_shape(elements, b * (h // n), n)
        whole = (False, False, True) if combine.whole_slices(elements, group, unroll) else ()
        assert kernel is combine.combine_kernel(dtype, args[2].dtype.itemsize == 4 and
                                                dtype.itemsize == 2, group, n, unroll, *whole)
        if (n, b, h, d) == (8, 512, 64, 128):  # 4096 warps at 2 values a lane: streams
            assert (unroll, whole) == (4, (False, False, True))
    module = cupy.cuda.function.Module()
    module.load(kernel._image)
    function = module.get_function(kernel._entry)
    registers = cupy.cuda.driver.funcGetAttribute(4, function.ptr)  # CU_FUNC_ATTRIBUTE_NUM_REGS
    spilled = cupy.cuda.driver.funcGetAttribute(3, function.ptr)  # ..._LOCAL_SIZE_BYTES
    assert spilled == 0
    if dtype.itemsize == 4:
        assert registers <= MAX_REGISTERS
    assert kernel._dispatcher.targetoptions.get("max_registers") == (
        MAX_REGISTERS if dtype.itemsize == 4 and warps else None)
    to_device, to_host = cupy_io()
    check_combine(to_device, to_host, dtype, n, b, h // n, d, np.random.default_rng(b + n))


@pytest.mark.parametrize("dtype, n, d", [("float32", 8, 1 << 23), ("bfloat16", 2, (1 << 25) + 512)],
                         ids=["float32-N8-D8M", "bfloat16-N2-D32M"])
def test_combine_of_rows_past_a_grid_of_slices_matches_reference(dtype, n, d):
    """Rows so long that their slices would be more than a grid's y holds (65536 and
    65537 of them) run the combine for any N, and agree with the reference,
    adversarial values included: D of any size stays exact."""
    from cupy_dcp.layout import as_dtype

    to_device, to_host = cupy_io()
    # three tokens: a row with NaN and +inf LSEs, a plain one, one empty everywhere
    check_combine(to_device, to_host, as_dtype(dtype), n, 3, 1, d, np.random.default_rng(n))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ["spread_e80", "near_3000", "head_major", "no_lse", "n5",
                                  "n16", "n17", "n32", "n33"])
def test_combine_adversarial(dtype, case):
    """N = 3, 5, 16, 17 and 32 (the combine for its N), 33 (the combine for any N)."""
    to_device, to_host = cupy_io()
    kwargs = {"spread_e80": dict(spread=80.0), "near_3000": dict(lse_center=3000.0, spread=3.0),
              "head_major": dict(head_major=True), "no_lse": dict(return_lse=False)}.get(case, {})
    n = int(case[1:]) if case[0] == "n" and case[1:].isdigit() else 3
    check_combine(to_device, to_host, dtype, n, 33, 4, 576, np.random.default_rng(3), **kwargs)


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), np.dtype(np.float32)], ids=str)
def test_numba_device_arrays(dtype):
    to_device, to_host = numba_io()
    rng = np.random.default_rng(5)
    check_pack(to_device, to_host, dtype, 2, 8, 8, 128, rng)
    check_combine(to_device, to_host, dtype, 2, 8, 4, 128, rng)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_arrays_by_dlpack(dtype):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    import cupy

    def to_device(x):
        x = np.asarray(x)
        if x.dtype.kind == "V":  # torch has bfloat16 itself: hand the bits over
            t = torch.from_numpy(x.view(np.int16).copy()).cuda().view(torch.bfloat16)
        else:
            t = torch.from_numpy(x.copy()).cuda()
        return t

    def to_host(t):
        t = t.contiguous()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).cpu().numpy().view(dtype)
        return t.cpu().numpy()

    rng = np.random.default_rng(9)
    check_pack(to_device, to_host, dtype, 2, 8, 8, 72, rng)
    check_combine(to_device, to_host, dtype, 2, 8, 4, 72, rng)
    cupy.cuda.runtime.deviceSynchronize()


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), np.dtype(np.float32)], ids=str)
def test_jax_arrays_by_dlpack(dtype):
    jax = pytest.importorskip("jax")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        pytest.skip("JAX without a GPU")
    import cupy
    import jax.numpy as jnp

    def to_device(x):
        # JAX arrays are immutable: inputs come from JAX; the outputs (the
        # zero-filled buffers the checks allocate) are CuPy arrays.
        x = np.asarray(x)
        if not np.any(x):
            return cupy.asarray(x)
        return jax.device_put(jnp.asarray(x), gpus[0])

    def to_host(x):
        return cupy.asnumpy(x) if isinstance(x, cupy.ndarray) else np.asarray(x)

    rng = np.random.default_rng(13)
    check_pack(to_device, to_host, dtype, 2, 8, 8, 64, rng)
    check_combine(to_device, to_host, dtype, 2, 8, 4, 64, rng)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pack_and_combine_capture_in_a_cuda_graph(dtype):
    """N ranks simulated in one process: pack each, exchange by copies, combine;
    captured once, replayed with new inputs each time."""
    import cupy

    from cupy_dcp import lse_pack_dim, lse_weighted_combine
    from cupy_dcp.kernels import pack_send, unpack_combine
    from kernel_checks import assert_combine_close, make_inputs

    n, b, hn, d = 3, 17, 4, 200
    h = n * hn
    xs = cupy.zeros((n, b, h, d), dtype=dtype)
    ls = cupy.zeros((n, b, h), dtype=cupy.float32)
    sends = cupy.zeros((n, n, b, hn, d + lse_pack_dim(dtype)), dtype=dtype)
    recv = cupy.zeros_like(sends[0])
    out = cupy.zeros((b, hn, d), dtype=dtype)
    out_lse = cupy.zeros((b, hn), dtype=cupy.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        def step():
            for k in range(n):
                pack_send(xs[k], ls[k], sends[k], stream=stream)
            for k in range(n):  # rank 1 receives chunk 1 of every rank
                recv[k] = sends[k, 1]
            unpack_combine(recv, out, out_lse, stream=stream)
        step()
        stream.synchronize()
        stream.begin_capture()
        step()
        graph = stream.end_capture()
        for replay in range(3):
            hx, hl = make_inputs(np.random.default_rng(replay), n, b, h, d, dtype)
            xs[...] = cupy.asarray(hx)
            ls[...] = cupy.asarray(hl)
            graph.launch(stream)
            stream.synchronize()
            expect, expect_lse = lse_weighted_combine(hx, hl, return_lse=True)
            got = cupy.asnumpy(out.view(np.uint16) if dtype.itemsize == 2 else out).view(dtype)
            heads = slice(hn, 2 * hn)
            assert_combine_close(got.astype(np.float64), expect[:, heads], hx[:, :, heads],
                                 hl[:, :, heads], dtype)
            g = cupy.asnumpy(out_lse)
            ref_g = expect_lse[:, hn:2 * hn]
            np.testing.assert_array_equal(np.isneginf(g), np.isneginf(ref_g))
            finite = np.isfinite(ref_g)
            np.testing.assert_allclose(g[finite], ref_g[finite], rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", [1, 128, 576])
@pytest.mark.parametrize("base_e", [True, False], ids=["base_e", "base_2"])
@pytest.mark.parametrize("streams", [False, True], ids=["few_rows", "streams"])
def test_agrs_kernels_match_reference(dtype, d, base_e, streams, monkeypatch):
    """The AG+RS kernels against the reference, in the shapes of few rows and in those
    of many (``correct_shape``, ``finish_shape``: every launch streams)."""
    from kernel_checks import check_agrs, stream_every_agrs_launch

    if streams:
        stream_every_agrs_launch(monkeypatch)
    to_device, to_host = cupy_io()
    check_agrs(to_device, to_host, dtype, 2, 40, 8, d, np.random.default_rng(d), base_e=base_e)
    check_agrs(to_device, to_host, dtype, 3, 5, 2, d, np.random.default_rng(d + 1), head_major=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 40, 8, 128), (9, 5, 3, 4), (3, 7, 2, 1),
                                   (4, 64, 16, 512)], ids=lambda s: "N%dB%dHn%dD%d" % s)
def test_agrs_flat_finish_writes_the_rows_bits(dtype, shape):
    """The flat finish (C-contiguous output) and the rows' (strided) write the same bits."""
    from kernel_checks import check_finish_flat_is_rows
    check_finish_flat_is_rows(*cupy_io(), dtype, *shape, np.random.default_rng(sum(shape)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 40, 8, 128), (9, 5, 3, 16), (3, 7, 2, 12),
                                   (4, 64, 16, 512), (2, 3, 2, 576)],
                         ids=lambda s: "N%dB%dHn%dD%d" % s)
@pytest.mark.parametrize("streams", [False, True], ids=["few_rows", "streams"])
def test_agrs_vector_correct_writes_the_rows_bits(dtype, shape, streams, monkeypatch):
    """The correction in whole quads (aligned rows) and the rows' write the same bits."""
    from kernel_checks import check_correct_vectors_is_rows, stream_every_agrs_launch
    if streams:
        stream_every_agrs_launch(monkeypatch)
    check_correct_vectors_is_rows(*cupy_io(), dtype, *shape, np.random.default_rng(sum(shape)))


def test_pack_bf16x2_rounds_as_the_integer_path():
    """The lines kernel's bfloat16 pairs: one ``cvt.rn.bf16x2.f32`` each, bit for bit
    the integer rounding the other kernels use."""
    check_pack_bf16x2(*cupy_io(), np.random.default_rng(16))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", [71, 512])
def test_combine_rounds_to_nearest_even(dtype, d):
    from kernel_checks import check_combine_rounds_to_nearest_even
    to_device, to_host = cupy_io()
    check_combine_rounds_to_nearest_even(to_device, to_host, dtype, 64, 8, d,
                                         np.random.default_rng(d))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", [1, 72, 128, 512])
@pytest.mark.parametrize("n", [2, 4])
def test_direct_kernels_match_reference(dtype, d, n):
    """The direct kernel of N ranks in one process, over calls of changing B, against
    the oracle: a phase at a time (every push before any combine), then whole
    calls of every rank running at once on their own streams."""
    import cupy
    to_device, to_host = cupy_io()
    rng = np.random.default_rng(d + n)
    check_direct(to_device, to_host, dtype, n, [64, 7, 33], 8 * n, d, rng, base_e=d != 72)
    check_direct(to_device, to_host, dtype, n, [5, 6], 2 * n, d, rng, head_major=True,
                 strided_input=True, masks=True, ll_rows=10)  # B = 5 word by word
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(n)]
    sync = cupy.cuda.runtime.deviceSynchronize
    blocks = cupy.cuda.Device().attributes["MultiProcessorCount"] // n  # all resident
    for warps, ll_rows in ((8, None), (2, 0)):  # B = 1, 2 word by word, then in tiles
        check_direct(to_device, to_host, dtype, n, [1, 300, 64, 2], 8 * n, d, rng,
                     base_e=d != 72, streams=streams, sync=sync, max_blocks=blocks, warps=warps,
                     ll_rows=ll_rows)
        check_direct(to_device, to_host, dtype, n, [3, 40], 2 * n, d, rng, head_major=True,
                     strided_input=True, masks=True, streams=streams, sync=sync, max_blocks=3,
                     warps=warps, ll_rows=6)
    # word by word across the epoch whose 32-bit tag would be that of a zeroed word
    check_direct(to_device, to_host, dtype, n, [2, 1, 2, 1, 2, 1], 2 * n, d, rng,
                 streams=streams, sync=sync, max_blocks=blocks, ll_rows=4, epoch=2**32 - 3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", [1, 72, 128, 512])
@pytest.mark.parametrize("n", [2, 4])
def test_direct_kernels_in_lines(dtype, d, n):
    """Calls in 128-byte lines among calls word by word and in tiles, against the
    oracle: a phase at a time, then whole calls of every rank running at once on
    their own streams (each line's flag polled while its stores are in flight),
    strided, masked and head-major among them."""
    import cupy

    from cupy_dcp.kernels.direct import Protocol

    to_device, to_host = cupy_io()
    rng = np.random.default_rng(d + n + 1)
    paths = check_direct(to_device, to_host, dtype, n, [3, 1, 2, 9, 40], 2 * n, d, rng,
                         base_e=d != 72, warps=8, ll_rows=2, line_rows=None)
    assert Protocol.LINES in paths, paths
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(n)]
    sync = cupy.cuda.runtime.deviceSynchronize
    blocks = cupy.cuda.Device().attributes["MultiProcessorCount"] // n  # all resident
    paths = check_direct(to_device, to_host, dtype, n, [5, 1, 6, 600, 7, 24, 2, 5, 6], 8 * n, d,
                         rng, base_e=d != 72, streams=streams, sync=sync, max_blocks=blocks,
                         warps=8, ll_rows=8, line_rows=None)
    assert set(Protocol) <= paths, paths  # lines, words, and some in tiles
    paths = check_direct(to_device, to_host, dtype, n, [3, 40, 4], 2 * n, d, rng,
                         head_major=True, strided_input=True, masks=True, streams=streams,
                         sync=sync, max_blocks=blocks, warps=8, ll_rows=2, line_rows=None)
    assert Protocol.LINES in paths, paths


@pytest.mark.parametrize("dtype, b, d, pad, offset, quads", QUAD_CASES,
                         ids=lambda v: ("quads" if v else "words") if isinstance(v, bool) else str(v))
def test_direct_pushes_16_byte_quads_where_rows_allow(dtype, b, d, pad, offset, quads):
    """A misaligned 16-byte access would fault: only aligned rows move as quads."""
    to_device, to_host = cupy_io()
    assert check_direct_quads(to_device, to_host, dtype, np.random.default_rng(d + offset), b,
                              d, pad, offset) == quads


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b, ll_rows, line_rows", [(8, 0, 0), (40, 0, 0), (8, 16, 0), (8, 0, None)],
                         ids=["blocks_push_and_combine", "split_blocks", "word_by_word", "lines"])
def test_direct_kernels_missing_peer(dtype, b, ll_rows, line_rows):
    to_device, to_host = cupy_io()
    check_direct_missing_peer(to_device, to_host, dtype, np.random.default_rng(3), b=b,
                              ll_rows=ll_rows, line_rows=line_rows)


@pytest.mark.parametrize("n, words, blocks", [(2, 2, 1), (2, 4098, 16), (3, 130, 5)])
def test_bare_push_delivers_every_row_and_bounds_its_wait(n, words, blocks):
    import cupy

    check_bare_push(cupy.asarray, cupy.asnumpy, n, words, blocks, np.random.default_rng(words))


@pytest.mark.parametrize("quads", [1, 2, 4, 8], ids=lambda q: f"{q}-in-flight")
def test_copy_floor_reads_and_writes_every_word(quads):
    """The kernel bench's copy floor, compiled: a pack's bytes (as many read as
    written), a combine's of N = 2 and N = 8 (N rows and their LSE lanes a row
    written), and more source quads than in flight, in a combine's grid."""
    to_device, to_host = cupy_io()
    for read, written in ((131_584, 131_584), (2 * 65_792, 65_536 + 256),
                          (8 * 65_792, 65_536 + 256), (40_000, 1000)):
        check_copy_floor(to_device, to_host, read, written, quads, (64,), (32, 4))
