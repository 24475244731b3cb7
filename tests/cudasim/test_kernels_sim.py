"""The CUDA kernels under the Numba CUDA simulator (NUMBA_ENABLE_CUDASIM=1).

Collected only in a process started with that variable: ``tests/test_simulator.py``
runs this file so; the ordinary suite ignores it (see ``tests/conftest.py``).
"""

import numpy as np
import pytest
from numba import cuda  # the simulator's, swapped in for the kernels' global ``cuda``

from _helpers import device_array
from kernel_checks import (DTYPES, PACK_LAYOUTS, QUAD_CASES, at_word, check_agrs,
                           check_bare_push, check_combine, check_direct,
                           check_direct_missing_peer, check_direct_quads, check_pack,
                           check_pack_bf16x2, check_pack_by_tokens, check_pack_quads)


def ident(x):
    return x


def host(x):
    return np.asarray(x)


# (N, B, H, D); the combine takes H/N heads a rank, so every shape keeps a live row
SHAPES = [(1, 2, 2, 1), (2, 2, 4, 3), (3, 1, 6, 8), (2, 3, 4, 72), (4, 1, 8, 33)]
# and rows of more than one step (the wide pack): float32 and 16-bit values, and 16-bit
# data as words (300 words a row)
PACK_SHAPES = SHAPES + [(2, 1, 2, 577), (2, 2, 2, 600)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", PACK_SHAPES, ids=lambda s: "N%dB%dH%dD%d" % s)
def test_pack_bit_exact(dtype, shape):
    check_pack(ident, host, dtype, *shape, np.random.default_rng(sum(shape)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 3, 4, 1), (3, 4, 6, 7), (2, 3, 4, 72), (8, 3, 8, 33),
                                   (2, 3, 72, 16), (2, 3, 4, 40)],
                         ids=lambda s: "N%dB%dH%dD%d" % s)
def test_pack_by_tokens_writes_the_bits_of_the_other_packs(dtype, shape, monkeypatch):
    """The pack a block row per token, its staged twin and ``pack``'s kernels: the
    reference's rows, masked or not, rows unit-stride or heads-major, routed to the
    receive buffer or not, with a plan's trailer or without (signed by a lead plane of
    blocks, as these small grids are, or by the rows' blocks), the same bits; the staged
    twin also reading its rows as quads where they allow it (rows of 4k words: some
    lanes with one quad or none); (2, 3, 72, 16) takes two blocks a token, each staging
    a span that starts off a quad."""
    from cupy_dcp.kernels import _pack_tokens

    rng = np.random.default_rng(sum(shape))
    for strided in (False, "heads_major"):
        for masked in (False, True):
            for signed, self_rank in ((False, -1), (True, 1), (False, shape[0] - 1)):
                check_pack_by_tokens(ident, host, dtype, *shape, rng, strided, masked, signed,
                                     self_rank)
    monkeypatch.setattr(_pack_tokens, "LEAD_MOST_BLOCKS", 0)  # the rows' blocks sign
    for masked in (False, True):
        check_pack_by_tokens(ident, host, dtype, *shape, rng, False, masked, True, 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 4, 6, 7), (4, 4, 12, 36), (2, 8, 6, 36)],
                         ids=lambda s: "N%dB%dH%dD%d" % s)
def test_pack_of_tokens_a_block_writes_the_bits_of_a_token_a_block(dtype, shape):
    """The pack by tokens with two and four tokens a block, a warp each, plain and staged
    (and reading quads where the rows allow), writes what a block row a token and
    ``pack``'s kernels write: plain, and heads-major, masked, signed by the rows' blocks
    and routed. (4, 4, 12, 36): three rows of 19 or 37 words a token, so that a block's
    span starts off a quad; (3, 4, 6, 7): rows of 16-bit elements, not staged; (2, 8,
    6, 36): blocks past the grid's first plane at four tokens a block."""
    rng = np.random.default_rng(sum(shape))
    for strided, masked, signed, self_rank in ((False, False, False, -1),
                                               ("heads_major", True, True, 1)):
        check_pack_by_tokens(ident, host, dtype, *shape, rng, strided, masked, signed,
                             self_rank, (1, 2, 4))


def test_pack_by_tokens_where_the_rule_allows():
    """``pack_launch`` picks the pack a block row per token for rows of one step read
    through a flat view, at few tokens or few bytes, and ``pack``'s kernels otherwise;
    asked for it where it cannot run, it says so."""
    from cupy_dcp.kernels import _pack_tokens
    from cupy_dcp.kernels._arrays import dummy_index, kernel_array
    from cupy_dcp.kernels.pack import pack_launch

    def picked(b, h, d, strides=None, n=2, **kwargs):
        x = np.zeros((b, h, d), np.float32)
        if strides == "every_other":
            x = np.zeros((b, h, 2 * d), np.float32)[:, :, ::2]
        send = np.zeros((n, b, h // n, d + 1), np.float32)
        kernel = pack_launch(kernel_array(x, np.uint32), kernel_array(np.zeros((b, h),
                             np.float32), np.uint32), dummy_index(), dummy_index(), -1,
                             kernel_array(send, np.uint32), kernel_array(send, np.uint32), -1,
                             **kwargs)[0]
        return kernel._dispatcher.py_func.__module__.endswith("_pack_tokens")

    assert picked(1, 8, 64) and picked(256, 32, 128)
    big = _pack_tokens.TOKEN_BYTES_MOST // (4 * 64 * 128)  # tokens of 8 MiB at 64 x 128
    assert picked(big, 64, 128) and not picked(big + 1, 64, 128, staged=False)
    assert picked(big + 1, 64, 128)  # past those bytes, rows of words staged
    assert picked(_pack_tokens.TOKEN_BLOCKS_MOST + 1, 2, 8)  # few bytes
    assert not picked(4, 8, 600)  # rows of two steps
    assert not picked(4, 8, 64, "every_other")  # rows read through their strides
    assert not picked(4, 8, 64, tokens=False)
    with pytest.raises(ValueError, match="by tokens"):
        picked(4, 8, 64, "every_other", tokens=True)


def test_pack_of_tokens_a_block_where_the_rule_allows(monkeypatch):
    """With ``BLOCK_TOKENS`` above 1, a pack by tokens takes that many tokens a block,
    a warp each, where a token's rows fit a warp, from ``BLOCK_TOKENS_LEAST`` tokens, at
    a multiple of it; staged then from two warps a block; never with a lead plane; asked
    for where it cannot run, it says so. With 1, never."""
    from cupy_dcp.kernels import _pack_tokens
    from cupy_dcp.kernels._arrays import dummy_index, kernel_array
    from cupy_dcp.kernels._rows import lanes_per_row
    from cupy_dcp.kernels.pack import pack_launch

    def launch(b, h, d, n=8, dtype=np.float32, signed=False, **kwargs):
        """``(tokens a block, staged, grid, block)`` of the pack ``pack_launch`` picks."""
        bits = np.uint32 if dtype == np.float32 else np.uint16
        x = np.zeros((b, h, d), dtype).view(bits)
        width = d + (1 if dtype == np.float32 else 2)
        send = np.zeros((n, b + (4 if signed else 0), h // n, width), dtype).view(bits)
        sign = (kernel_array(np.zeros(8, np.int64), np.int64),
                kernel_array(np.zeros(2, np.int64), np.int64)) if signed else None
        kernel, grid, block, _ = pack_launch(
            kernel_array(x, bits), kernel_array(np.zeros((b, h), np.float32), np.uint32),
            dummy_index(), dummy_index(), -1, kernel_array(send, bits),
            kernel_array(send, bits), -1, sign, **kwargs)
        variant = _pack_tokens.variant_of(kernel)
        if variant is None:  # one of pack's kernels
            return 0, False, grid, block
        moved = np.dtype(np.uint32 if dtype == np.float32 or d % 2 == 0 else np.uint16)
        assert variant.bits == moved
        assert variant.group == lanes_per_row(d if dtype == np.float32 or d % 2 else d // 2)
        assert kernel is _pack_tokens.tokens_kernel(*variant)  # the very kernel it names
        return variant.block_tokens, variant.staged, grid, block

    least = _pack_tokens.BLOCK_TOKENS_LEAST
    assert least >= _pack_tokens.STAGED_TOKENS_LEAST  # (staged whenever it takes words)
    monkeypatch.setattr(_pack_tokens, "BLOCK_TOKENS", 1)
    assert launch(least, 32, 64)[:2] == (1, False)  # one warp a token: a block row
    monkeypatch.setattr(_pack_tokens, "BLOCK_TOKENS", 4)
    assert launch(least, 32, 64) == (4, True, (1, 8, least // 4), (32, 4))
    assert launch(least, 32, 64, signed=True)[:2] == (4, True)  # by the rows' blocks
    assert launch(least - 4, 32, 64)[:2] == (1, False)  # too few tokens
    assert launch(least + 2, 32, 64)[:2] == (1, False)  # not a multiple of 4
    assert launch(least, 40, 64)[:2] == (1, True)  # 5 rows a token: two warps, staged
    assert launch(least, 32, 64, dtype=np.float16)[:2] == (4, True)  # in pairs: words
    assert launch(least, 32, 63, dtype=np.float16)[:2] == (4, False)  # an odd D: 16 bits
    assert launch(least, 32, 64, tokens=False)[0] == 0  # pack's kernels
    assert launch(8, 32, 64, block_tokens=2)[:2] == (2, False)  # asked for: few tokens
    assert launch(8, 32, 64, signed=True, block_tokens=4)[:2] == (4, False)  # no lead plane
    big = 2 * _pack_tokens.TOKEN_BYTES_MOST // (4 * 32 * 64)  # past 8 MiB: staged or not
    assert launch(big, 32, 64)[:2] == (4, True)
    assert launch(big, 32, 64, staged=False)[:2] == (0, False)  # pack's kernels, as before
    assert launch(big, 32, 64, staged=True)[:2] == (4, True)
    with pytest.raises(ValueError, match="one token a block or more"):
        launch(8, 32, 64, block_tokens=0)
    with pytest.raises(ValueError, match="fit a warp a token"):
        launch(8, 40, 64, block_tokens=2)
    with pytest.raises(ValueError, match="multiple of 4 tokens"):
        launch(6, 32, 64, block_tokens=4)
    with pytest.raises(ValueError, match="several tokens a block is a pack by tokens"):
        launch(8, 32, 64, tokens=False, block_tokens=2)
    with pytest.raises(ValueError, match="1 to 4 tokens"):
        _pack_tokens.tokens_kernel(np.uint32, 8, block_tokens=8)
    with pytest.raises(ValueError, match="not in a lead plane"):
        _pack_tokens.tokens_kernel(np.uint32, 8, True, True, True, block_tokens=2)


def test_pack_staged_where_the_rule_allows(monkeypatch):
    """A pack by tokens goes through shared memory from ``STAGED_TOKENS_LEAST`` tokens
    of rows of words into 16-byte aligned buffers, in blocks of ``STAGED_WARPS_LEAST``
    warps or more, at any bytes and a block row for each token; asked for where it
    cannot, it says so."""
    from cupy_dcp.kernels import _pack_tokens, _rows
    from cupy_dcp.kernels._arrays import dummy_index, kernel_array
    from cupy_dcp.kernels._rows import lanes_per_row
    from cupy_dcp.kernels.pack import pack_launch

    least = _pack_tokens.STAGED_TOKENS_LEAST
    # a token a block row, the rule here (several tokens a block: the test above)
    monkeypatch.setattr(_pack_tokens, "BLOCK_TOKENS", 1)

    def staged(b, h, d, dtype=np.float32, shift=0, x_shift=0, quads=None, **kwargs):
        """``(staged, block's warps, grid's z)``; ``quads``: whether the staged pack
        picked is the one that reads quads (``None``: either)."""
        bits = np.uint32 if dtype == np.float32 else np.uint16
        x = np.zeros(b * h * d + 8, dtype)[x_shift:][:b * h * d].reshape(b, h, d)
        width = d + (1 if dtype == np.float32 else 2)
        store = np.zeros(2 * b * (h // 2) * width + 8, bits)[shift:]
        send = store[:2 * b * (h // 2) * width].reshape(2, b, h // 2, width)
        kernel, grid, block, _ = pack_launch(
            kernel_array(x, bits), kernel_array(np.zeros((b, h), np.float32), np.uint32),
            dummy_index(), dummy_index(), -1, kernel_array(send, bits),
            kernel_array(send, bits), -1, **kwargs)
        variant = _pack_tokens.variant_of(kernel)
        picked = variant is not None and variant.staged and \
            (quads is None or variant.quad_loads == quads)
        if picked:
            assert variant.group == lanes_per_row(d if dtype == np.float32 else d // 2)
            assert (variant.bits, variant.block_tokens) == (np.dtype(np.uint32), 1)
            assert kernel is _pack_tokens.tokens_kernel(*variant)
        return picked, block[1], grid[2]

    # 32 heads of 32 float32 (4 lanes a row): 16 rows a rank, in blocks of 2 warps
    assert staged(least, 32, 32) == (True, 2, least)
    assert staged(least - 1, 32, 32) == (False, 2, least - 1)
    assert staged(least, 4, 32)[:2] == (False, 1)  # blocks of one warp
    assert staged(least, 32, 64, np.float16)[0]  # 16-bit values in pairs: words
    assert not staged(least, 32, 63, np.float16)[0]  # an odd D: 16-bit elements
    assert not staged(least, 32, 32, shift=1)[0]  # buffers off a 16-byte boundary
    big = _pack_tokens.TOKEN_BYTES_MOST // (4 * 32 * 32) + least  # past those bytes too
    assert staged(big, 32, 32)[0]
    assert staged(4, 4, 32, staged=True)[0] and not staged(least, 32, 32, staged=False)[0]
    assert not staged(least, 32, 32, tokens=False)[0]
    with pytest.raises(ValueError, match="uint32 words into 16-byte aligned"):
        staged(4, 4, 32, shift=1, staged=True)
    with pytest.raises(ValueError, match="a staged pack is a pack by tokens"):
        staged(4, 4, 32, tokens=False, staged=True)
    with pytest.raises(ValueError, match="a pack by tokens moves rows of one step"):
        staged(4, 4, 600, staged=True)  # rows of two steps
    # it reads rows of 4k words as quads, of at most QUAD_LOADS_GROUP_MOST lanes (32
    # float32: 4 lanes; 64: 8), where every row of the input starts 16-byte aligned
    most = _pack_tokens.QUAD_LOADS_GROUP_MOST  # (128 float32: 16 lanes a row)
    assert staged(least, 32, 128, quads=most >= 16)[0]
    monkeypatch.setattr(_pack_tokens, "QUAD_LOADS_GROUP_MOST", 8)
    assert staged(least, 32, 32, quads=True)[0] and staged(least, 32, 128, quads=False)[0]
    assert staged(least, 32, 64, quads=True)[0] and staged(least, 32, 128, np.float16, quads=True)[0]
    assert staged(least, 32, 36, quads=True)[0]  # 9 quads a row: 8 lanes, one with two
    assert staged(least, 32, 34, quads=False)[0]  # rows of 34 words: not quads
    assert staged(least, 32, 68, np.float16, quads=False)[0]  # 34 words of pairs
    assert staged(least, 32, 32, x_shift=1, quads=False)[0]  # the input 4 bytes off
    assert staged(least, 32, 32, quad_loads=False, quads=False)[0]
    monkeypatch.setattr(_pack_tokens, "QUAD_LOADS_GROUP_MOST", 4)
    assert staged(least, 32, 64, quads=False)[0] and staged(least, 32, 32, quads=True)[0]
    assert staged(least, 32, 64, quad_loads=True, quads=True)[0]
    with pytest.raises(ValueError, match="reads its rows as quads where it is staged"):
        staged(least, 32, 32, x_shift=1, quad_loads=True)
    with pytest.raises(ValueError, match="reads its rows as quads where it is staged"):
        staged(least, 32, 34, quad_loads=True)
    with pytest.raises(ValueError, match="reads its rows as quads where it is staged"):
        staged(4, 4, 32, quad_loads=True)  # not staged (few tokens)
    with pytest.raises(ValueError, match="reads its rows as quads where it is staged"):
        staged(4, 4, 32, tokens=False, quad_loads=True)
    monkeypatch.setattr(_rows, "MAX_BLOCKS", 8)  # grids of tile_grid walk their tokens
    assert staged(least, 32, 32) == (True, 2, least)  # staged: a block row for each token
    assert staged(least, 4, 32)[1:] == (1, 4)  # otherwise not


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pack_staged_past_the_blocks_of_a_grid_matches_reference(dtype, monkeypatch):
    """Where ``tile_grid`` would walk the tokens, the staged pack runs a block row for
    each token: the reference's rows, masked or not, from any layout the rule takes."""
    from cupy_dcp.kernels import _pack_tokens, _rows

    monkeypatch.setattr(_pack_tokens, "STAGED_TOKENS_LEAST", 1)
    monkeypatch.setattr(_rows, "MAX_BLOCKS", 2)
    rng = np.random.default_rng(11)
    for masked in (False, True):
        for strided in (False, "heads_major"):
            check_pack(ident, host, dtype, 2, 5, 36, 14, rng, strided=strided, masked=masked)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pack_strided_input_and_lse_conversion(dtype):
    rng = np.random.default_rng(7)
    for layout in PACK_LAYOUTS:
        for masked in (False, True):
            check_pack(ident, host, dtype, 2, 4, 4, 5, rng, strided=layout, masked=masked)
            check_pack(ident, host, dtype, 2, 4, 2, 300, rng, strided=layout,  # the wide pack
                       masked=masked)
    check_pack(ident, host, dtype, 2, 3, 4, 5, rng, lse_dtype=np.float16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernels_take_arrays_in_fortran_order(dtype):
    """An input or output whose own memory is in Fortran order (the simulator once copied
    such an array's base to view it, so the kernels wrote into the copy)."""
    rng = np.random.default_rng(11)
    check_pack(ident, host, dtype, 2, 3, 4, 5, rng, strided="fortran")
    check_combine(ident, host, dtype, 2, 3, 2, 5, rng, fortran=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "N%dB%dH%dD%d" % s)
@pytest.mark.parametrize("base_e", [True, False], ids=["base_e", "base_2"])
def test_combine_matches_reference(dtype, shape, base_e):
    n, b, h, d = shape
    check_combine(ident, host, dtype, n, b, h // n, d, np.random.default_rng(d), base_e=base_e)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ["spread_e80", "near_3000", "head_major", "no_lse"])
def test_combine_adversarial(dtype, case):
    rng = np.random.default_rng(11)
    kwargs = {"spread_e80": dict(spread=80.0), "near_3000": dict(lse_center=3000.0, spread=3.0),
              "head_major": dict(head_major=True), "no_lse": dict(return_lse=False)}[case]
    check_combine(ident, host, dtype, 3, 2, 3, 9, rng, **kwargs)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ["spread_e80", "near_3000", "heads_major", "every_other",
                                  "tokens_reversed"])
def test_agrs_adversarial(dtype, case):
    """The AG+RS kernels against the reference at LSE spreads and offsets that stress the
    weights, and from strided partials."""
    from kernel_checks import check_agrs

    kwargs = {"spread_e80": dict(spread=80.0), "near_3000": dict(lse_center=3000.0, spread=3.0)
              }.get(case, dict(strided=case))
    check_agrs(ident, host, dtype, 3, 3, 2, 9, np.random.default_rng(13), **kwargs)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", [5, 72, 600], ids=["D5", "D72", "D600_wide"])
def test_kernels_whose_blocks_loop_over_tokens(dtype, d, monkeypatch):
    """A grid capped at a block per row of heads: each block walks every token (the
    pack two tokens a trip, an odd count leaving one alone), and every kernel still
    matches its reference."""
    from cupy_dcp.kernels import _rows, combine

    monkeypatch.setattr(_rows, "MAX_BLOCKS", 1)
    monkeypatch.setattr(combine, "by_blocks", lambda *shape: False)  # a block a row never loops
    monkeypatch.setattr(combine, "MAX_STATIC_SHARDS", 16)  # N = 17: the combine for any N
    rng = np.random.default_rng(d)
    for b in (3, 4):
        check_pack(ident, host, dtype, 2, b, 4, d, rng)
        for layout in PACK_LAYOUTS:  # a masked trip of two rows reads through the strides
            check_pack(ident, host, dtype, 2, b, 4, d, rng, strided=layout, masked=True)
        check_combine(ident, host, dtype, 2, b, 2, d, rng)
        check_combine(ident, host, dtype, 17, b, 1, d, rng)  # the combine for any N
    check_agrs(ident, host, dtype, 2, 3, 2, d, rng)


def test_zero_tokens_is_a_no_op():
    """Calls of no token write nothing: views of none of a buffer's tokens leave it as it was."""
    from cupy_dcp.kernels import pack_send, unpack_combine
    sent = np.full((2, 3, 2, 6), 7, dtype=np.float32)
    pack_send(np.zeros((0, 4, 5), np.float32), np.zeros((0, 4), np.float32), sent[:, :0])
    np.testing.assert_array_equal(sent, 7)
    received = np.ones((2, 3, 2, 6), dtype=np.float32)
    combined = np.full((3, 2, 5), 7, dtype=np.float32)
    lse = np.full((3, 2), 7, dtype=np.float32)
    unpack_combine(received[:, :0], combined[:0], lse[:0])
    np.testing.assert_array_equal(combined, 7)
    np.testing.assert_array_equal(lse, 7)


def test_kernels_refuse_outputs_whose_elements_share_memory():
    """An output with a stride of 0 (a broadcast) or axes that overlap would have rows'
    writes race: every kernel refuses it, and writes nothing."""
    from cupy_dcp import pack_reference
    from cupy_dcp.kernels import agrs_finish, pack_send, unpack_combine
    from kernel_checks import make_inputs

    strided = np.lib.stride_tricks.as_strided
    rng = np.random.default_rng(3)
    xs, ls = make_inputs(rng, 2, 3, 4, 5, np.dtype(np.float32))
    recv = np.stack([pack_reference(xs[k], ls[k], 2)[0] for k in range(2)])
    store = np.full(64, 7, np.float32)
    match = r"must not have elements that share memory"
    with pytest.raises(ValueError, match=r"^send " + match):
        pack_send(xs[0], ls[0], strided(store, (2, 3, 2, 6), (0, 48, 24, 4)))
    with pytest.raises(ValueError, match=r"^out " + match):
        unpack_combine(recv, strided(store, (3, 2, 5), (20, 8, 4)))  # heads overlap
    with pytest.raises(ValueError, match=r"^out_lse " + match):
        unpack_combine(recv, np.zeros((3, 2, 5), np.float32), strided(store, (3, 2), (0, 4)))
    with pytest.raises(ValueError, match=r"^out " + match):
        agrs_finish(np.zeros((3, 2, 5), np.float32), ls, 0, strided(store, (3, 2, 5), (0, 20, 4)))
    np.testing.assert_array_equal(store, 7)


def test_kernels_refuse_arguments_they_would_misuse():
    """Arguments the kernels would index with, or read at the wrong size: refused before
    any launch, and nothing written."""
    from cupy_dcp import pack_reference
    from cupy_dcp.kernels import agrs_correct, agrs_finish, pack_send, unpack_combine
    from kernel_checks import make_inputs

    rng = np.random.default_rng(5)
    xs, ls = make_inputs(rng, 2, 3, 4, 5, np.dtype(np.float32))
    recv = np.stack([pack_reference(xs[k], ls[k], 2)[0] for k in range(2)])
    lses = np.ascontiguousarray(ls)  # [N, B, H]
    summed = np.zeros((3, 2, 5), np.float32)
    out = np.full((3, 2, 5), 7, np.float32)
    corrected = np.full((2, 3, 2, 5), 7, np.float32)
    send = np.full((2, 3, 2, 6), 7, np.float32)
    for bad, error in ((2, ValueError), (-1, ValueError), (1.0, TypeError), (True, TypeError)):
        with pytest.raises(error, match=r"^self_rank must be"):
            agrs_correct(xs[0], lses, bad, corrected)
        with pytest.raises(error, match=r"^self_rank must be"):
            agrs_finish(summed, lses, bad, out)
        with pytest.raises(error, match=r"^self_rank must be"):
            pack_send(xs[0], ls[0], send, recv=np.zeros_like(send), self_rank=bad)
    with pytest.raises(ValueError, match=r"^self_rank names the chunk written to recv"):
        pack_send(xs[0], ls[0], send, self_rank=1)
    with pytest.raises(ValueError, match=r"^num_heads must be divisible by world_size"):
        agrs_correct(np.zeros((3, 5, 5), np.float32), np.zeros((2, 3, 5), np.float32), 0,
                     np.zeros((2, 3, 2, 5), np.float32))
    with pytest.raises(TypeError, match=r"^out_lse must be float32 \(got float64\)$"):
        agrs_finish(summed, lses, 0, out, np.zeros((3, 2), np.float64))
    with pytest.raises(TypeError, match=r"^lses must be float32 \(got float16\)$"):
        agrs_finish(summed, lses.astype(np.float16), 0, out)
    with pytest.raises(TypeError, match=r"^is_lse_base_on_e must be True or False"):
        agrs_correct(xs[0], lses, 0, corrected, is_lse_base_on_e="False")
    with pytest.raises(TypeError, match=r"^is_lse_base_on_e must be True or False"):
        unpack_combine(recv, out, is_lse_base_on_e="False")
    with pytest.raises(TypeError, match=r"^seq_lens must be a 1-D integer array"):
        pack_send(xs[0], ls[0], send, seq_lens=np.zeros((2, 1), np.int64),
                  query_start_loc=np.zeros(3, np.int64))
    with pytest.raises(TypeError, match=r"^query_start_loc must be a 1-D integer array"):
        pack_send(xs[0], ls[0], send, seq_lens=np.zeros(2, np.int64),
                  query_start_loc=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match=r"^out's head size D must be >= 1 \(got 0\)$"):
        unpack_combine(np.zeros((2, 1, 2, 1), np.float32), np.zeros((1, 2, 0), np.float32))
    with pytest.raises(ValueError, match=r"^out's head size D must be >= 1 \(got 0\)$"):
        pack_send(np.zeros((1, 2, 0), np.float32), np.zeros((1, 2), np.float32),
                  np.zeros((2, 1, 1, 1), np.float32))
    np.testing.assert_array_equal(out, 7)
    np.testing.assert_array_equal(corrected, 7)
    np.testing.assert_array_equal(send, 7)


def test_kernel_arrays_of_another_element_size_are_refused():
    from cupy_dcp.kernels._arrays import kernel_array

    with pytest.raises(TypeError, match=r"^lses must have 4-byte elements, as float32 \(got "
                                        r"float64\)$"):
        kernel_array(np.zeros(3), np.float32, "lses")
    assert kernel_array(np.zeros(3, np.float32), np.uint32).dtype == np.uint32  # same size


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 2, 2, 1), (2, 2, 2, 8), (3, 2, 1, 33),
                                   (9, 2, 1, 5),  # more LSEs than finish's lane 0 holds
                                   (2, 2, 1, 600)],  # two trips of twice UNROLL values a lane
                         ids=lambda s: "N%dB%dHn%dD%d" % s)
@pytest.mark.parametrize("base_e", [True, False], ids=["base_e", "base_2"])
@pytest.mark.parametrize("streams", [False, True], ids=["few_rows", "streams"])
def test_agrs_kernels_match_reference(dtype, shape, base_e, streams, monkeypatch):
    """The AG+RS kernels against the reference, in the shapes of few rows and in those
    of many (``correct_shape``, ``finish_shape``: every launch streams)."""
    from kernel_checks import check_agrs, stream_every_agrs_launch

    if streams:
        stream_every_agrs_launch(monkeypatch)
    check_agrs(ident, host, dtype, *shape, np.random.default_rng(sum(shape)), base_e=base_e,
               head_major=shape[3] == 8)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 3, 2, 8), (9, 2, 3, 4),  # N past what finish holds
                                   (2, 4, 1, 1), (3, 2, 2, 6)],  # D = 1: threads of LSEs only
                         ids=lambda s: "N%dB%dHn%dD%d" % s)
def test_agrs_flat_finish_writes_the_rows_bits(dtype, shape):
    from kernel_checks import check_finish_flat_is_rows
    check_finish_flat_is_rows(ident, host, dtype, *shape, np.random.default_rng(sum(shape)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 3, 2, 8), (9, 2, 1, 16),  # N past what weigh holds
                                   (2, 2, 1, 12),  # a lane's last quads past the row
                                   (2, 2, 2, 10),  # D not a multiple of four: rows
                                   (3, 2, 1, 576)],  # two trips a row
                         ids=lambda s: "N%dB%dHn%dD%d" % s)
@pytest.mark.parametrize("streams", [False, True], ids=["few_rows", "streams"])
def test_agrs_vector_correct_writes_the_rows_bits(dtype, shape, streams, monkeypatch):
    from kernel_checks import check_correct_vectors_is_rows, stream_every_agrs_launch
    if streams:
        stream_every_agrs_launch(monkeypatch)
    check_correct_vectors_is_rows(ident, host, dtype, *shape, np.random.default_rng(sum(shape)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", [7, 64])
def test_combine_rounds_to_nearest_even(dtype, d):
    from kernel_checks import check_combine_rounds_to_nearest_even
    check_combine_rounds_to_nearest_even(ident, host, dtype, 3, 2, d, np.random.default_rng(d))


def test_mask_kernel_copies_the_lse_with_empty_tokens_at_minus_inf():
    """The AG+RS masking copy: strided input, sequences without KV, padding on both ends."""
    from _helpers import row_mask
    from cupy_dcp.kernels._arrays import kernel_array
    from cupy_dcp.kernels.agrs import mask_launch

    rng = np.random.default_rng(5)
    lse = rng.standard_normal((6, 12)).astype(np.float32).T.copy().T  # a strided [B, H] view
    seq_lens = np.array([3, 0, 2], dtype=np.int64)
    query_start_loc = np.array([1, 2, 4, 5], dtype=np.int64)  # token 0 and 5 are padding
    out = np.full((6, 12), 7.0, dtype=np.float32)
    kernel, grid, block, args = mask_launch(
        kernel_array(lse, np.float32), kernel_array(seq_lens, np.int64),
        kernel_array(query_start_loc, np.int64), 3, kernel_array(out, np.float32))
    kernel(grid, block, 0, args)
    empty = row_mask(6, seq_lens, query_start_loc) | (np.arange(6) < 1) | (np.arange(6) >= 5)
    assert empty.tolist() == [True, False, True, True, False, True]
    np.testing.assert_array_equal(out[~empty], lse[~empty])
    assert np.isneginf(out[empty]).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n, h, d", [(2, 4, 3), (3, 6, 8), (2, 2, 1), (4, 4, 6)],
                         ids=["N2D3", "N3D8", "N2D1", "N4D6"])
@pytest.mark.parametrize("base_e", [True, False], ids=["base_e", "base_2"])
def test_direct_push_and_combine(dtype, n, h, d, base_e):
    # B <= 2 word by word (calls 2, 3, 5: both slots), B = 3, 4 in tiles behind flags
    # (calls 1, 4: a slot each, shared with word-by-word calls)
    check_direct(ident, host, dtype, n, [3, 1, 2, 4, 1], h, d, np.random.default_rng(n * d),
                 base_e=base_e, ll_rows=2 * (h // n))


def test_direct_word_by_word_across_the_tag_wrap():
    """Word-by-word calls around the epoch where a 32-bit tag of the epoch would be 0,
    the tag of a word never written (or consumed): exact, every word consumed. (A
    reader taking a zeroed word for its own needs ranks running at once: on the GPU.)"""
    check_direct(ident, host, np.dtype(np.float32), 2, [2, 1, 2, 1, 2], 4, 3,
                 np.random.default_rng(11), ll_rows=4, epoch=2**32 - 3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_direct_word_by_word_with_several_items_per_thread(dtype):
    """Word-by-word tiles of more (row, pair) items than a block has threads (64): a
    thread's later items, some of them holding a row's LSE, are taken after its first."""
    from cupy_dcp.kernels.direct import Protocol, call_grid, ll_words

    width_bytes = (40 + (1 if dtype.itemsize == 4 else 2)) * dtype.itemsize
    tile_rows, _, _, protocol = call_grid(4 * 4, 16, 3)
    assert protocol is Protocol.WORDS and tile_rows * ll_words(width_bytes, 1) // 2 > 64
    check_direct(ident, host, dtype, 2, [4, 3], 8, 40, np.random.default_rng(3), ll_rows=16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n, h, d", [(2, 4, 3), (3, 6, 8), (2, 2, 1), (4, 4, 6), (2, 4, 40),
                                     (2, 2, 75)],
                         ids=["N2D3", "N3D8", "N2D1", "N4D6", "N2D40", "N2D75"])
def test_direct_in_lines(dtype, n, h, d):
    """Calls in 128-byte lines among calls word by word (B = 1) and in tiles (B = 30:
    more rows than the lines region's 8 tokens), the slots' parities shared: exact,
    the LSE anywhere in a row (D = 40, 75: rows of two and three lines), B = 8 with
    more items than a block of 64 threads has threads."""
    from cupy_dcp.kernels.direct import Protocol

    paths = check_direct(ident, host, dtype, n, [3, 1, 2, 30, 8, 1, 5], h, d,
                         np.random.default_rng(n * d + 1), ll_rows=h // n, line_rows=8 * (h // n))
    assert {Protocol.LINES, Protocol.WORDS, Protocol.TILES} <= paths, paths


def test_direct_in_lines_with_every_item_held():
    """Tiles in lines whose blocks hold as many items as they can: four per thread
    (16 rows of 16 chunks on 64 threads), or fewer; other calls between them."""
    from cupy_dcp.kernels.direct import Protocol, line_tile_rows, line_words

    assert line_tile_rows(2, line_words(41, 4), 64) == 16
    paths = check_direct(ident, host, np.dtype(np.float32), 2, [24, 20, 23, 24], 4, 40,
                         np.random.default_rng(24), ll_rows=0, line_rows=None)
    assert paths == {Protocol.LINES}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_direct_in_lines_strided_masked(dtype):
    check_direct(ident, host, dtype, 3, [4, 5], 6, 4, np.random.default_rng(15),
                 head_major=True, strided_input=True, masks=True, ll_rows=0, line_rows=None)


def _one_exact_float32_call(ranks, n, b, h, d, rng):
    """One direct call of every rank (every push, then every combine) on float32
    inputs of B = b, checked against the oracle."""
    from cupy_dcp import lse_weighted_combine
    from kernel_checks import make_inputs

    xs, ls = make_inputs(rng, n, b, h, d, np.dtype(np.float32), adversarial=False)
    outs = [np.zeros((b, h // n, d), np.float32) for _ in range(n)]
    for r in range(n):
        ranks.push(r, xs[r], ls[r])
    for r in range(n):
        ranks.combine(r, xs[r], ls[r], outs[r])
    expect = lse_weighted_combine(xs, ls)
    for r in range(n):
        np.testing.assert_allclose(outs[r], expect[:, r * (h // n):(r + 1) * (h // n)],
                                   rtol=1e-5, atol=1e-6)


def test_direct_rows_of_several_steps():
    """Rows that a lane group moves in two steps (float32 D = 300: 32 lanes of 8
    each a step), in tiles of several rows per group: each thread's first step of
    its first row is loaded before the block's first barrier and its first combine
    values with the LSEs; every later step and row loads its own."""
    check_direct(ident, host, np.dtype(np.float32), 2, [4, 6, 3], 8, 300,
                 np.random.default_rng(300), ll_rows=0)


@pytest.mark.parametrize("dtype, b, d, pad, offset, quads", QUAD_CASES,
                         ids=lambda v: ("quads" if v else "words") if isinstance(v, bool) else str(v))
def test_direct_pushes_16_byte_quads_where_rows_allow(dtype, b, d, pad, offset, quads):
    assert check_direct_quads(ident, host, dtype, np.random.default_rng(d + offset), b, d, pad,
                              offset) == quads


@pytest.mark.parametrize("ll_rows, line_rows", [(16, 0), (0, None), (0, 0)],
                         ids=["word_by_word", "lines", "tiles"])
def test_direct_blocks_without_a_tile_arrive(ll_rows, line_rows):
    """A grid with a block more than the call has tiles: that block still counts in
    the epoch's arrival, so the epoch advances and the count is reset."""
    from kernel_checks import DirectRanks

    n, h, d, b = 2, 4, 8, 2
    ranks = DirectRanks(ident, np.dtype(np.float32), n, b, h, d, ll_rows=ll_rows,
                        line_rows=line_rows)
    ranks.extra_blocks = 1
    _one_exact_float32_call(ranks, n, b, h, d, np.random.default_rng(4))
    for r in range(n):
        assert ranks.state_owners[r].tolist() == [1, 0, 0, 0]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_direct_split_schedule(dtype):
    """Calls large enough that some blocks only push and the others only combine,
    between small ones where every block does both."""
    from cupy_dcp.kernels.direct import tile_grid

    assert tile_grid(30 * 2, 3)[2] == 1 and tile_grid(3 * 2, 3)[2] == 0
    check_direct(ident, host, dtype, 2, [30, 3, 41], 4, 5, np.random.default_rng(7), ll_rows=6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_direct_strided_masked(dtype):
    check_direct(ident, host, dtype, 3, [4, 5], 6, 4, np.random.default_rng(5),
                 head_major=True, strided_input=True, masks=True, ll_rows=8)  # B = 4 word by word


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b, ll_rows, line_rows", [(8, 0, 0), (40, 0, 0), (8, 16, 0), (8, 0, None)],
                         ids=["blocks_push_and_combine", "split_blocks", "word_by_word", "lines"])
def test_direct_missing_peer(dtype, b, ll_rows, line_rows):
    # several blocks wait; the simulator is slow, hence the slack
    check_direct_missing_peer(ident, host, dtype, np.random.default_rng(9), timeout_ns=2 * 10**9,
                              b=b, slack_s=20.0, ll_rows=ll_rows, line_rows=line_rows)


@pytest.mark.parametrize("n, words, blocks", [(2, 2, 1), (2, 34, 3), (3, 130, 2)])
def test_bare_push_delivers_every_row_and_bounds_its_wait(n, words, blocks):
    check_bare_push(ident, host, n, words, blocks, np.random.default_rng(words))


@pytest.mark.parametrize("b, ll_rows, line_rows, path",
                         [(1, 16, 0, "WORDS"), (6, 0, None, "LINES"), (6, 0, 0, None)],
                         ids=["word_by_word", "lines", "tiles"])
def test_direct_trace_notes_each_block_milestones_in_order(monkeypatch, b, ll_rows, line_rows,
                                                           path):
    """A traced kernel (``benchmarks/direct_trace.py``): every block of the call notes its
    milestones, in time order, in the call's parity of the enlarged state; the result
    is still exact."""
    import functools

    from benchmarks.direct_trace import MILESTONES, summarise
    from cupy_dcp.kernels import direct as kernels
    from cupy_dcp.kernels._arrays import kernel_array
    from kernel_checks import DirectRanks

    monkeypatch.setattr(kernels, "direct_kernel",
                        functools.partial(kernels.direct_kernel, trace=True))
    n, h, d = 2, 4, 8
    ranks = DirectRanks(ident, np.dtype(np.float32), n, b, h, d, ll_rows=ll_rows,
                        line_rows=line_rows)
    words = kernels.STATE_WORDS + 2 * 3 * kernels.TRACE_STAMPS  # max_blocks 3
    for r in range(n):
        ranks.state_owners[r] = np.zeros(words, np.int64)
        ranks.states[r] = kernel_array(ranks.state_owners[r], np.int64)
    _one_exact_float32_call(ranks, n, b, h, d, np.random.default_rng(2))
    assert ranks.paths == [kernels.Protocol[path or "TILES"]] * 2 * n
    assert ranks.last_args[-3] == 0  # push_blocks: in tiles, a small call
    grid = -(-(b * h // n) // ranks.last_args[-4])  # the call's rows by its tiles' rows
    assert grid > 1
    for r in range(n):
        state = ranks.state_owners[r]
        assert state[0] == 1  # the epoch of the call: its parity is 1
        # [parity, block, stamp], room for 3 blocks; the combine phase notes no pushes
        stamps = state[kernels.STATE_WORDS:].reshape(2, 3, kernels.TRACE_STAMPS)
        noted = stamps[1, :grid][:, [MILESTONES.index(name) for name in
                                     ("entry", "awaited", "barrier", "arrived", "end")]]
        assert (noted > 0).all() and (np.diff(noted, axis=1) >= 0).all()
        assert not stamps[0].any() and not stamps[1, grid:].any()
        line = summarise(stamps[1], grid)  # (the simulator runs the blocks one by one)
        assert line.startswith(f"{grid} blocks; entry ")
        assert [part.split()[0] for part in line.split("; ")[1].split(", ")] == \
            [name for k, name in enumerate(MILESTONES) if stamps[1][:, k].any()]
        assert len(MILESTONES) <= kernels.TRACE_STAMPS


def test_simulated_warp_votes(monkeypatch):
    """The votes gather every lane of a warp (two warps a block here, each its own
    vote); a lane that never comes breaks its warp's barrier, failing the launch,
    and a later launch votes afresh."""
    from cupy_dcp.kernels import _sync

    monkeypatch.setattr(_sync, "SIMULATED_VOTE_TIMEOUT", 0.5)
    s = _sync.sync_functions()
    vote_all, vote_any = s["vote_all"], s["vote_any"]

    @cuda.jit
    def votes(out, odd, skip):
        lane, warp = cuda.threadIdx.x, cuda.threadIdx.y
        if lane == skip:
            return
        ok = lane % 2 == 1 if warp == odd else True
        out[warp, lane, 0] = vote_all(ok)
        out[warp, lane, 1] = vote_any(lane == 5 and warp == odd)

    out = np.zeros((2, 32, 2), np.int32)
    votes[1, (32, 2)](out, 1, -1)
    assert (out[0, :, 0] == 1).all() and (out[1, :, 0] == 0).all()  # warp 1 had a False
    assert (out[0, :, 1] == 0).all() and (out[1, :, 1] == 1).all()
    with pytest.raises(Exception):  # lane 3 of each warp never votes
        votes[1, (32, 2)](out, 0, 3)
    out[...] = 0
    votes[1, (32, 2)](out, 0, -1)
    assert (out[0, :, 0] == 0).all() and (out[1, :, 0] == 1).all()
    assert (out[0, :, 1] == 1).all() and (out[1, :, 1] == 0).all()


def test_pack_bf16x2_rounds_as_the_integer_path():
    check_pack_bf16x2(ident, host, np.random.default_rng(16))


def _combine_bits(dtype, recv, layout="rows"):
    """Run the combine that ``combine_launch`` picks for ``recv [N, B, H/N, D + P]`` (as
    packed for ``dtype``): its grid, block and arguments, and the output's and the
    output LSE's bits. ``layout``: the output's storage, ``"rows"`` (C-contiguous),
    ``"heads_major"`` (``[H/N, B, D]`` seen as ``[B, H/N, D]``), ``"padded"`` (rows of
    ``D`` in rows of ``D + 2``) or ``"every_other"`` (every other value of rows of
    ``2 D``: no flat view)."""
    from cupy_dcp.kernels import combine
    from cupy_dcp.kernels._arrays import kernel_array
    from cupy_dcp.layout import lse_pack_dim

    b, hn, d = recv.shape[1], recv.shape[2], recv.shape[3] - lse_pack_dim(dtype)
    bits = np.dtype(np.uint32 if np.dtype(dtype).itemsize == 4 else np.uint16)
    out = {"rows": lambda: np.zeros((b, hn, d), dtype),
           "heads_major": lambda: np.zeros((hn, b, d), dtype).transpose(1, 0, 2),
           "padded": lambda: np.zeros((b, hn, d + 2), dtype)[..., :d],
           "every_other": lambda: np.zeros((b, hn, 2 * d), dtype)[..., ::2]}[layout]()
    out_lse = np.zeros((b, hn), np.float32)
    kernel, grid, block, args = combine.combine_launch(
        dtype, kernel_array(recv, bits), kernel_array(out, combine.combine_codec(dtype)[1]),
        kernel_array(out_lse, np.float32), True)
    kernel(grid, block, 0, args)
    return grid, block, args, (out.view(bits).copy(), out_lse.view(np.uint32).copy())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [2, 3, 5, 8, 12, 16, 32])
@pytest.mark.parametrize("d, loads", [(10, "most"), (10, "fewest"), (150, "most"),
                                      (150, "fewest")])
def test_combine_for_its_n_is_the_combine_for_any_n_bit_for_bit(dtype, n, d, loads,
                                                                monkeypatch):
    """The combine built for exactly N ranks (every shard loaded before any is weighed),
    with the most values a lane for its N (N = 2: 8, to N = 16 4, past it 2) or the fewest
    (2), rows whole or split over the grid (D = 150: two or more slices, the last one
    partial), gives the bits of the one built for any N, NaN, +-inf and empty shards
    included."""
    from cupy_dcp.kernels import combine
    from cupy_dcp.reference import pack_reference

    # MANY_WARPS 0: every launch streams (the most values a lane); else none does, and
    # every launch counts as few warps (the fewest)
    monkeypatch.setattr(combine, "MANY_WARPS", 0 if loads == "most" else 1 << 40)
    monkeypatch.setattr(combine, "FEW_WARPS", 1 << 40)
    monkeypatch.setattr(combine, "by_blocks", lambda *shape: False)  # rows split over warps
    rng = np.random.default_rng(n)
    b, hn = 3, 2
    x = rng.standard_normal((b, n * hn, d)).astype(np.float32)
    x[0, 0, 1], x[1, 1, 2] = np.nan, np.inf
    lse = rng.uniform(-30, 30, (b, n * hn)).astype(np.float32)
    lse[0, 0], lse[2, :] = np.nan, -np.inf  # a NaN LSE, and a token empty everywhere
    recv = np.stack([pack_reference(x.astype(dtype), lse + r, n)[0] for r in range(n)])
    outs = []
    for shards in (combine.static_shards, lambda n: 0):  # for its N, then for any N
        monkeypatch.setattr(combine, "static_shards", shards)
        grid, _, args, got = _combine_bits(dtype, recv)
        if shards(n):  # values (or word pairs) a row, as the kernel sees them
            elements = args[2].shape[2]
            unroll = combine.combine_unroll(elements, b * hn, n)
            assert unroll == ((8 if n == 2 else 4 if n <= 16 else 2) if loads == "most" else 2)
            assert (grid[1] > 1) == (elements > combine.lanes_per_row(elements, unroll) * unroll)
        else:
            assert grid[1] == 1
        outs.append(got)
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
    assert np.isfinite(outs[0][1].view(np.float32)[1]).all()  # a token with every shard
    assert np.isneginf(outs[0][1].view(np.float32)[2]).all()  # the token empty everywhere


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("d", [64, 512])
@pytest.mark.parametrize("loads", ["most", "fewest"])
@pytest.mark.parametrize("layout", ["rows", "every_other"])
def test_combine_over_rows_that_fill_its_slices_gives_the_bits_of_the_guarded(dtype, n, d,
                                                                            loads, layout,
                                                                            monkeypatch):
    """Rows that fill every slice of the combine for exactly N (``whole_slices``: one
    slice at D = 64, two or more at D = 512 with the fewest values a lane), with the
    most values a lane (streaming) or the fewest, and outputs whose rows are contiguous
    or strided, run the kernel with no test against a row's end: the bits of the same
    launch with the tests, NaN, +-inf and empty shards included; rows that do not fill
    their slices keep the tests."""
    from cupy_dcp.kernels import combine
    from cupy_dcp.reference import pack_reference

    monkeypatch.setattr(combine, "by_blocks", lambda *shape: False)  # rows split over warps
    monkeypatch.setattr(combine, "MANY_WARPS", 0 if loads == "most" else 1 << 40)
    rng = np.random.default_rng(d + n)
    b, hn = 2, 2
    x = rng.standard_normal((b, n * hn, d)).astype(np.float32)
    x[0, 0, 1], x[1, 1, d - 1] = np.nan, -np.inf
    lse = rng.uniform(-30, 30, (b, n * hn)).astype(np.float32)
    lse[0, 0], lse[1, 1] = np.inf, -np.inf  # an inf LSE (weighed 0), an empty shard
    recv = np.stack([pack_reference(x.astype(dtype), lse + r, n)[0] for r in range(n)])
    library, launch = combine.whole_slices, combine.combine_launch
    outs, kernels = [], []

    def kept(*args, **kwargs):  # the launch, its kernel noted
        found = launch(*args, **kwargs)
        kernels.append(found[0])
        return found

    monkeypatch.setattr(combine, "combine_launch", kept)
    for rule in (library, lambda *a: False):  # the library's, then every slice tested
        monkeypatch.setattr(combine, "whole_slices", rule)
        grid, _, args, got = _combine_bits(dtype, recv, layout)
        elements = args[2].shape[2]
        pairs = args[2].dtype.itemsize == 4 and np.dtype(dtype).itemsize == 2
        group, unroll, slices = combine._combine_shape(elements, b * hn, n)
        assert unroll == ((8 if n == 2 else 4) if loads == "most" else 2)
        assert slices and library(elements, group, unroll)  # the rows fill their slices
        assert grid[1] == slices >= (2 if d == 512 and loads == "fewest" else 1)
        whole = (False, False, True) if rule is library else ()
        assert kernels[-1] is combine.combine_kernel(dtype, pairs, group, n, unroll, *whole)
        outs.append(got)
    assert kernels[0] is not kernels[1]
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
    assert not library(elements + 1, group, unroll) and not library(elements - 1, group, unroll)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [2, 4])
def test_combine_in_blocks_of_two_warps_gives_the_bits_of_blocks_of_four(dtype, n,
                                                                        monkeypatch):
    """A combine for its N that launches few warps runs them in blocks of
    ``SPREAD_WARPS`` (``block_warps``): the same bits as in blocks of four, with five
    heads (a block's last warp idle), rows split in several slices, three tokens,
    NaN, +-inf and a token empty everywhere included."""
    from cupy_dcp.kernels import combine
    from cupy_dcp.reference import pack_reference

    rng = np.random.default_rng(50 + n)
    b, hn, d = 3, 5, 150
    x = rng.standard_normal((b, n * hn, d)).astype(np.float32)
    x[0, 0, 1], x[1, 1, 2], x[2, 3, 4] = np.nan, np.inf, -np.inf
    lse = rng.uniform(-30, 30, (b, n * hn)).astype(np.float32)
    lse[0, 0], lse[2, :] = np.nan, -np.inf
    recv = np.stack([pack_reference(x.astype(dtype), lse + r, n)[0] for r in range(n)])
    monkeypatch.setattr(combine, "FEW_WARPS", 1 << 40)  # the fewest values a lane: slices
    monkeypatch.setattr(combine, "by_blocks", lambda *shape: False)
    outs = []
    for spread_from, warps in ((1, combine.SPREAD_WARPS), (1 << 40, 4)):
        monkeypatch.setattr(combine, "SPREAD_FROM", spread_from)
        grid, block, _, got = _combine_bits(dtype, recv)
        assert block == (32, warps) and grid[1] > 1
        outs.append(got)
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
    assert np.isneginf(outs[0][1].view(np.float32)[2]).all()  # the token empty everywhere
    assert np.isfinite(outs[0][1].view(np.float32)[1]).all()


@pytest.mark.parametrize("dtype", [d for d in DTYPES if np.dtype(d).itemsize == 2], ids=str)
@pytest.mark.parametrize("n", [2, 3, 16, 17])
@pytest.mark.parametrize("blocks", [True, False], ids=["block_a_row", "rows_split"])
def test_combine_in_word_pairs_gives_the_bits_of_the_combine_by_value(dtype, n, blocks,
                                                                      monkeypatch):
    """16-bit outputs combine two values a word where the rows allow it: the same bits
    as value by value (an output that starts 2 bytes into its buffer), NaN, +-inf and
    a token empty everywhere included; a block a row or rows split over warps (N = 17:
    the combine for any N either way, ``MAX_STATIC_SHARDS`` set below it)."""
    from cupy_dcp.kernels import combine
    from cupy_dcp.kernels._arrays import kernel_array
    from cupy_dcp.reference import pack_reference

    if not blocks:
        monkeypatch.setattr(combine, "by_blocks", lambda *shape: False)
    monkeypatch.setattr(combine, "MAX_STATIC_SHARDS", 16)

    rng = np.random.default_rng(40 + n)
    b, hn, d = 3, 2, 12
    x = (rng.standard_normal((b, n * hn, d)) * 300).astype(np.float32)
    x[0, 0, 1], x[1, 1, 2], x[2, 0, 3] = np.nan, np.inf, -np.inf
    lse = rng.uniform(-20, 20, (b, n * hn)).astype(np.float32)
    lse[1, :] = -np.inf
    recv = np.stack([pack_reference(x.astype(dtype), lse + r, n)[0] for r in range(n)])
    bits = np.dtype(np.uint16)
    _, value = combine.combine_codec(dtype)
    outs = []
    for offset in (0, 1):  # word-aligned rows (pairs), then rows 2 bytes off (values)
        store = np.zeros(b * hn * d + 1, dtype)
        out = store[offset:offset + b * hn * d].reshape(b, hn, d)
        kernel, grid, block, args = combine.combine_launch(
            dtype, kernel_array(recv, bits), kernel_array(out, value),
            kernel_array(np.zeros((b, hn), np.float32), np.float32), True)
        assert (args[0].dtype == np.uint32) == (offset == 0)
        # (H/N + 1, B): a block a row, and one more a token for the output LSE
        assert (grid == (hn + 1, b, 1)) == (blocks and n <= combine.MAX_STATIC_SHARDS)
        kernel(grid, block, 0, args)
        outs.append(out.view(bits).copy())
    np.testing.assert_array_equal(outs[0], outs[1])
    assert (outs[0].view(dtype)[1] == 0).all()  # the token empty everywhere
    assert np.isfinite(outs[0].view(dtype)[2, 1]).all()  # a row without NaN or inf


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [2, 3, 5, 8, 16])
@pytest.mark.parametrize("d", [1, 10, 150, 300])
def test_combine_a_block_a_row_gives_the_bits_of_the_sliced_combine(dtype, n, d,
                                                                    monkeypatch):
    """The combine with a block a row (``_blocks``) gives the bits of the one that splits
    rows over warps (``_slices``), for rows of one value to several a thread (D = 300:
    3 values a thread, or 2 words, the last partial), NaN, +-inf, a NaN LSE and a
    token empty everywhere included, its output LSE written by one more block a token;
    into a C-contiguous output, a heads-major one and one of padded rows (the block a
    row writes them through their flat view, at their strides), and one whose rows are
    not unit-stride (no flat view: the rows split)."""
    from cupy_dcp.kernels import combine
    from cupy_dcp.reference import pack_reference

    rng = np.random.default_rng(60 + n + d)
    b, hn = 3, 2
    x = rng.standard_normal((b, n * hn, d)).astype(np.float32)
    x[0, 0, d - 1], x[1, 1, 0], x[0, 1, d // 2] = np.nan, np.inf, -np.inf
    lse = rng.uniform(-30, 30, (b, n * hn)).astype(np.float32)
    lse[0, 0], lse[2, :] = np.nan, -np.inf
    lse[1, 1] = np.inf  # +inf on every shard: as empty as -inf
    recv = np.stack([pack_reference(x.astype(dtype), lse + r, n)[0] for r in range(n)])
    outs = []
    for blocks, layout in ((True, "rows"), (False, "rows"), (True, "heads_major"),
                           (True, "padded"), (True, "every_other")):
        monkeypatch.setattr(combine, "by_blocks", lambda *shape, on=blocks: on)
        grid, block, args, got = _combine_bits(dtype, recv, layout)
        # an output with no flat view (rows not unit-stride) takes the rows split
        flat = layout != "every_other" or d == 1
        assert (grid == (hn + 1, b, 1)) == (blocks and flat), layout  # + the LSE blocks
        if grid == (hn + 1, b, 1):  # the fewest warps that give each value (word) a thread
            elements = args[9]  # D, in the kernel's elements
            assert block == (min(128, 32 * -(-elements // 32)), 1)
            assert args[4] == 1
            assert args[8] == b * hn * args[7]  # one rank's chunk, in the kernel's elements
            item = args[2].dtype.itemsize  # the output's token and head strides, in elements:
            pad = {"padded": 2 * np.dtype(dtype).itemsize // item,
                   "every_other": elements}.get(layout, 0)  # (D = 1: rows of 2)
            row = elements + pad
            strides = (row, b * row) if layout == "heads_major" else (hn * row, row)
            assert args[10:12] == strides, layout
            assert args[2].shape == (strides[0] * (b - 1) + strides[1] * (hn - 1) + elements,)
        outs.append(got)
    for other in outs[1:]:
        np.testing.assert_array_equal(outs[0][0], other[0])
        np.testing.assert_array_equal(outs[0][1], other[1])
    got_lse = outs[0][1].view(np.float32)
    assert np.isneginf(got_lse[2]).all()  # the token empty everywhere
    assert np.isneginf(got_lse[1, 1]) and np.isfinite(got_lse[1, 0])  # the +inf row: empty


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"], ids=str)
def test_combine_lse_block_weighs_more_rows_than_it_has_threads(dtype, monkeypatch):
    """The block a row's LSE block (one a token, ``_blocks``) weighs every row of its
    token where the token has more rows than the block threads (70 heads, blocks of 32
    threads): the bits of the combine that splits rows over warps, -inf for a row empty
    everywhere and the reference's LSEs."""
    from cupy_dcp import lse_weighted_combine
    from cupy_dcp.kernels import combine
    from cupy_dcp.reference import pack_reference

    rng = np.random.default_rng(70)
    n, b, hn, d = 2, 2, 70, 4
    x = rng.standard_normal((b, n * hn, d)).astype(np.float32)
    lse = rng.uniform(-20, 20, (b, n * hn)).astype(np.float32)
    lse[1, 69], lse[1, hn + 69] = -np.inf, np.nan  # the last row: empty on both shards
    recv = np.stack([pack_reference(x.astype(dtype), lse + r, n)[0] for r in range(n)])
    outs = []
    for blocks in (True, False):
        monkeypatch.setattr(combine, "by_blocks", lambda *shape, on=blocks: on)
        grid, block, _, got = _combine_bits(dtype, recv)
        assert (grid == (hn + 1, b, 1)) == blocks  # + the LSE blocks, one a token
        if blocks:  # D = 4: a block of one warp, fewer threads than the token has rows
            assert block == (32, 1)
        outs.append(got)
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
    got_lse = outs[0][1].view(np.float32)
    assert np.isneginf(got_lse[1, 69]) and np.isfinite(got_lse[:, :69]).all()
    shard_lses = recv[..., d:].copy().view(np.float32)[..., 0]  # the LSE's bits, as packed
    expect_lse = lse_weighted_combine(np.zeros((n, b, hn, 1), np.float32), shard_lses,
                                      return_lse=True)[1]
    np.testing.assert_allclose(got_lse, expect_lse, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_combine_past_32_bit_offsets_splits_rows(dtype, monkeypatch):
    """The block a row makes every offset in 32 bits: where the received buffer or the
    output's span holds ``combine.NARROW`` elements or more, the launch takes the rows
    split over warps, with the same bits (``NARROW`` lowered to this test's sizes)."""
    from cupy_dcp.kernels import combine
    from cupy_dcp.reference import pack_reference

    rng = np.random.default_rng(7)
    n, b, hn, d = 2, 3, 2, 10
    x = rng.standard_normal((b, n * hn, d)).astype(np.float32)
    lse = rng.uniform(-8, 8, (b, n * hn)).astype(np.float32)
    lse[1, :] = -np.inf  # a token empty everywhere
    recv = np.stack([pack_reference(x.astype(dtype), lse + r, n)[0] for r in range(n)])
    words = np.dtype(dtype).itemsize == 2  # even D: 16-bit values go in word pairs
    buffer = recv.size // 2 if words else recv.size  # in the kernel's elements
    output = b * hn * d // 2 if words else b * hn * d
    outs = []
    for narrow in (combine.NARROW, buffer + 1, buffer, output):
        monkeypatch.setattr(combine, "NARROW", narrow)
        grid, _, _, got = _combine_bits(dtype, recv)
        assert (grid == (hn + 1, b, 1)) == (narrow > buffer), narrow  # (+ the LSE blocks)
        outs.append(got)
    for other in outs[1:]:
        np.testing.assert_array_equal(outs[0][0], other[0])
        np.testing.assert_array_equal(outs[0][1], other[1])


def test_combine_runs_a_block_a_row_only_where_it_fits():
    """``by_blocks``: for N from 2 to 32, a row in one step of at most ``BLOCK_LOADS``
    loads a thread, the tokens within a grid's y, and few rows or long ones; the
    block's threads and each thread's values."""
    from cupy_dcp.kernels import combine

    by_blocks = combine.by_blocks
    assert combine.block_values(1) == 1 and combine.block_values(128) == 1
    assert combine.block_values(129) == 2 and combine.block_values(512) == 4
    # a block of the fewest warps that cover the row, at most four
    assert [combine.block_threads(e) for e in (1, 32, 33, 64, 75, 128, 129, 512)] == \
        [32, 32, 64, 64, 96, 128, 128, 128]
    assert by_blocks(256, 1, 64, 2)  # bf16 N = 2, 128 heads of 512 (in words), one token
    assert by_blocks(256, 8, 512, 2)  # eight tokens: 512 rows
    assert not by_blocks(256, 32, 2048, 2)  # many rows of 2 words a thread
    assert by_blocks(512, 32, 2048, 2)  # many rows of 4 values a thread (fp32 D = 512)
    assert by_blocks(512, 32, 512, 8)  # 8 shards of 4: 32 loads a thread
    assert not by_blocks(1024, 1, 64, 8)  # 64 loads a thread
    assert by_blocks(256, 1, 64, 16) and not by_blocks(512, 1, 64, 16)  # 32 loads, 64
    assert not by_blocks(256, 1, 64, 0)  # the combine for any N
    assert not by_blocks(64, combine.MAX_GRID_Z + 1, 1 << 20, 2)  # tokens past a grid's y
    assert not by_blocks(64, 4096, 16384, 2)  # 2048 tokens of D = 128: split over warps


def test_combine_streams_from_many_warps_and_skips_the_tests_of_whole_rows():
    """``combine_unroll`` streams (at least ``STREAM_UNROLL`` values a lane and shard) from
    ``MANY_WARPS`` warps on, and ``whole_slices`` holds exactly where slices of
    ``group * unroll`` values cover a row."""
    from cupy_dcp.kernels import combine

    # 64 words a row at N = 8: 2 values a lane, a warp a row; 4096 rows are 4096 warps
    assert combine._warps(64, 4096, 2) == combine.MANY_WARPS
    assert combine.combine_unroll(64, 4096, 8) == combine.STREAM_UNROLL == 4
    assert combine.combine_unroll(64, 4095, 8) == 2
    assert combine.combine_unroll(64, 16384, 2) == 8 and combine.combine_unroll(64, 4096, 4) == 4
    assert combine.whole_slices(64, 32, 2) and combine.whole_slices(64, 16, 4)
    assert combine.whole_slices(256, 32, 2)  # four slices of 64
    assert not combine.whole_slices(65, 16, 4) and not combine.whole_slices(63, 16, 4)
    assert not combine.whole_slices(1, 4, 2) and not combine.whole_slices(3, 4, 8)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n, b, d", [(8, 1, 1 << 23), (2, 1, 1 << 26), (2, 1, (1 << 25) + 512),
                                     (8, 1, (1 << 22) + 1), (2, 70000, 3), (8, 70000, 128)])
def test_every_launch_of_a_huge_shape_fits_the_grid(dtype, n, b, d):
    """Rows of millions of values and more tokens than a grid's y or z: the pack, the
    combine (a plan's and a stand-alone one) and the AG+RS kernels launch within the
    grid's limits (x below 2**31, y and z at most 65535), and the combine's kernel is
    one that a plan of that head size builds (``combine_variants``); past a grid's y
    of slices it is the combine for any N, which walks a row in steps."""
    from cupy_dcp.kernels import combine
    from cupy_dcp.kernels._arrays import dummy_index
    from cupy_dcp.kernels.agrs import correct_launch, finish_launch
    from cupy_dcp.kernels.pack import pack_launch
    from cupy_dcp.layout import bits_dtype, lse_pack_dim

    hn, width, bits = 1, d + lse_pack_dim(dtype), bits_dtype(dtype)
    value = combine.combine_codec(dtype)[1]
    at = iter(range(1 << 40, 1 << 60, 1 << 40))  # far apart: no two share memory
    recv = device_array((n, b, hn, width), bits, next(at))
    out = device_array((b, hn, d), value, next(at))
    out_lse = device_array((b, hn), np.float32, next(at))
    lses = device_array((n, b, n * hn), np.float32, next(at))
    status = device_array((n * 64,), np.int64, next(at))
    state = device_array((8,), np.int64, next(at))
    pairs = np.dtype(dtype).itemsize == 2 and d % 2 == 0
    elements = d // 2 if pairs else d
    launches = {
        "pack": pack_launch(device_array((b, n * hn, d), bits, next(at)),
                            device_array((b, n * hn), np.uint32, next(at)), dummy_index(),
                            dummy_index(), -1, device_array(recv.shape, bits, next(at)), recv, 0),
        "combine": combine.combine_launch(dtype, recv, out, out_lse, True),
        "signed combine": combine.combine_launch(dtype, recv, out, out_lse, True,
                                                 (status, state)),
        "agrs_correct": correct_launch(dtype, device_array((b, n * hn, d), value, next(at)),
                                       lses, 0, True,
                                       device_array((n, b, hn, d), np.float32, next(at))),
        "agrs_finish": finish_launch(dtype, device_array((b, hn, d), np.float32, next(at)),
                                     lses, 0, True, out)}
    for name, (kernel, grid, block, _) in launches.items():
        grid = tuple(grid) + (1,) * (3 - len(grid))
        assert grid[0] < 2 ** 31 and grid[1] <= 65535 and grid[2] <= 65535, (name, grid)
    shards = combine.static_shards(n)
    built = {id(combine.combine_kernel(dtype, pairs, *variant))
             for signed in (False, True)
             for variant in combine.combine_variants(elements, shards, signed)}
    for name in ("combine", "signed combine"):
        assert id(launches[name][0]) in built, name
    # a long row splits into slices of a warp's combine_unroll values a lane each
    slices = -(-elements // (32 * combine.combine_unroll(elements, b * hn, shards)))
    any_n = combine.combine_kernel(dtype, pairs, combine.lanes_per_row(elements), 0,
                                   combine.UNROLL)
    assert (launches["combine"][0] is any_n) == (slices > 65535), slices
    if slices > 65535:  # a plan of this head size lists the combine for any N
        assert (combine.lanes_per_row(elements), 0, combine.UNROLL) in \
            combine.combine_variants(elements, shards)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [2, 8])
def test_combine_past_a_grid_of_slices_is_the_combine_for_any_n(dtype, n, monkeypatch):
    """Where a row's slices would be more than a grid's y holds, the combine launches
    the kernel for any N on one plane and gives the bits of the combine split over the
    grid, NaN, +-inf and empty shards included (the grid's limit lowered to 1 here:
    the real one takes rows of millions of values, run on the GPU)."""
    from cupy_dcp.kernels import combine
    from cupy_dcp.reference import pack_reference

    monkeypatch.setattr(combine, "by_blocks", lambda *shape: False)  # rows split over warps
    rng = np.random.default_rng(n + 7)
    b, hn, d = 3, 2, 150
    x = rng.standard_normal((b, n * hn, d)).astype(np.float32)
    x[0, 0, 1], x[1, 1, 2] = np.nan, np.inf
    lse = rng.uniform(-30, 30, (b, n * hn)).astype(np.float32)
    lse[0, 0], lse[2, :] = np.nan, -np.inf
    recv = np.stack([pack_reference(x.astype(dtype), lse + r, n)[0] for r in range(n)])
    grid, _, _, sliced = _combine_bits(dtype, recv)
    assert grid[1] > 1  # D = 150: two or more slices
    monkeypatch.setattr(combine, "MAX_GRID_Z", 1)
    grid, _, args, whole = _combine_bits(dtype, recv)
    assert grid[1] == 1 and len(args) == 8  # the kernel for any N takes no flat views
    np.testing.assert_array_equal(sliced[0], whole[0])
    np.testing.assert_array_equal(sliced[1], whole[1])


def test_stand_alone_kernels_refuse_outputs_on_their_inputs():
    """``pack_send``, ``unpack_combine``, ``agrs_correct`` and ``agrs_finish`` refuse an
    output that shares memory with an input (one kernel writes it while its other
    blocks still read), or the two outputs that share memory, naming both, before they
    launch; outputs in the same buffer but apart from the inputs run."""
    from cupy_dcp.kernels import agrs_correct, agrs_finish, pack_send, unpack_combine

    n, b, h, d = 2, 2, 4, 8
    f32 = np.float32
    buf = np.zeros(1024, f32)
    x, lse = buf[:64].reshape(b, h, d), buf[64:72].reshape(b, h)
    x[...] = np.random.default_rng(5).standard_normal(x.shape)
    lse[:] = 1.0  # every weight 1/2: the sums are exact
    refused = [
        ("send shares memory with out", lambda: pack_send(
            x, lse, buf[32:104].reshape(n, b, h // n, d + 1))),
        ("send shares memory with lse", lambda: pack_send(
            x, lse, buf[70:142].reshape(n, b, h // n, d + 1))),
        ("out shares memory with recv", lambda: unpack_combine(
            buf[:72].reshape(n, b, h // n, d + 1), buf[40:72].reshape(b, h // n, d))),
        ("out_lse shares memory with recv", lambda: unpack_combine(
            buf[:72].reshape(n, b, h // n, d + 1), buf[200:232].reshape(b, h // n, d),
            buf[71:75].reshape(b, h // n))),
        ("corrected shares memory with data", lambda: agrs_correct(
            x, buf[300:316].reshape(n, b, h), 0, buf[:64].reshape(n, b, h // n, d))),
        ("out_lse shares memory with lses", lambda: agrs_finish(
            buf[400:432].reshape(b, h // n, d), buf[300:316].reshape(n, b, h), 0,
            buf[500:532].reshape(b, h // n, d), buf[314:318].reshape(b, h // n))),
        # two outputs of one call: one would overwrite the other
        ("out_lse shares memory with out", lambda: unpack_combine(
            buf[128:200].reshape(n, b, h // n, d + 1), buf[200:232].reshape(b, h // n, d),
            buf[230:234].reshape(b, h // n))),
        ("out_lse shares memory with out", lambda: agrs_finish(
            buf[400:432].reshape(b, h // n, d), buf[300:316].reshape(n, b, h), 0,
            buf[500:532].reshape(b, h // n, d), buf[531:535].reshape(b, h // n)))]
    for message, call in refused:
        with pytest.raises(ValueError, match=message):
            call()
    send = buf[128:200].reshape(n, b, h // n, d + 1)  # apart: the kernels run
    pack_send(x, lse, send)
    out = buf[200:232].reshape(b, h // n, d)
    unpack_combine(send, out, buf[232:236].reshape(b, h // n))
    np.testing.assert_array_equal(out, x.reshape(b, n, h // n, d).sum(axis=1) / n)


def test_every_agrs_kernel_a_launch_picks_is_one_the_plan_built():
    """An AG+RS plan warms up its kernels (``_compile.agrs_tasks``): the correcting and
    finishing kernels that the launches pick, for rows shorter and longer than a
    warp's UNROLL values, for few rows and for as many as stream (``correct_shape``,
    ``finish_shape``), into a contiguous output (the flat finish) and a strided one
    (the rows), are those very kernels."""
    from cupy_dcp._compile import agrs_tasks
    from cupy_dcp.kernels import agrs
    from cupy_dcp.kernels._arrays import kernel_array
    from cupy_dcp.kernels.combine import combine_codec
    from kernel_checks import aligned_zeros

    for dtype in DTYPES:
        value = combine_codec(dtype)[1]
        for d in (1, 128, 300, 512, 576):
            built = {id(task()) for task in agrs_tasks(dtype, 4, d)}
            picked = []
            for b in (3, 8192 if d <= 128 else 1024):  # few rows, then enough to stream
                n, h = 2, 4
                lses = kernel_array(np.zeros((n, b, h), np.float32), np.float32)
                correct, _, _, _ = agrs.correct_launch(
                    dtype, kernel_array(np.zeros((b, h, d), dtype), value), lses, 0, True,
                    kernel_array(np.zeros((n, b, h // n, d), np.float32), np.float32))
                summed = kernel_array(aligned_zeros((b, h // n, d), np.float32), np.float32)
                flat, _, _, _ = agrs.finish_launch(
                    dtype, summed, lses, 0, True,
                    kernel_array(aligned_zeros((b, h // n, d), dtype), value))
                rows, _, _, _ = agrs.finish_launch(
                    dtype, summed, lses, 0, True,
                    kernel_array(aligned_zeros((b, h // n, d + 1), dtype)[..., :d], value))
                assert id(correct) in built and id(flat) in built and id(rows) in built
                assert (flat is agrs.flat_finish_kernel(dtype)) == (b * d % 2 == 0), (d, b)
                assert rows is not agrs.flat_finish_kernel(dtype), (d, b)
                picked.append((correct, rows))
            assert picked[0][0] is not picked[1][0], d  # many rows: correct streams
            assert (picked[0][1] is not picked[1][1]) == (d > 256), d  # finish, past 8 a lane


def test_the_warmup_builds_the_kernels_of_pack_send_and_unpack_combine():
    """``python -m cupy_dcp.warmup --plans a2a`` builds the pack and the combine that the
    functions launch outside a plan (the combine a block a row without a plan's
    trailer), besides the plan's own; a plan warms up only its own."""
    from cupy_dcp._compile import a2a_tasks
    from cupy_dcp.kernels import combine, pack
    from cupy_dcp.kernels._arrays import dummy_index, kernel_array
    from cupy_dcp.layout import as_dtype, bits_dtype, send_buffer_shape

    for dtype, n, B, H, D in ((as_dtype("bfloat16"), 2, 3, 8, 128),
                              (as_dtype("float32"), 4, 2, 8, 64)):
        built = {id(task()) for task in a2a_tasks(dtype, D, n, standalone=True)}
        own = {id(task()) for task in a2a_tasks(dtype, D, n)}
        bits = bits_dtype(dtype)
        send = np.zeros(send_buffer_shape(n, B, H, D, dtype), bits)
        out = np.zeros((B, H // n, D), bits)
        alone = combine.combine_launch(dtype, kernel_array(send, bits), kernel_array(out, bits),
                                       None, True)[0]
        in_plan = combine.combine_launch(dtype, kernel_array(send, bits), kernel_array(out, bits),
                                         None, True, signed=(dummy_index(), dummy_index()))[0]
        packs = pack.pack_launch(kernel_array(np.zeros((B, H, D), bits), bits),
                                 kernel_array(np.zeros((B, H), np.float32), np.uint32),
                                 dummy_index(), dummy_index(), -1, kernel_array(send, bits),
                                 kernel_array(send, bits), -1)[0]
        assert alone is not in_plan and {id(alone), id(in_plan), id(packs)} <= built, dtype
        assert id(in_plan) in own and id(alone) not in own, dtype
        assert own <= built, dtype


def test_every_combine_a_launch_picks_is_one_the_plan_built():
    """An a2a plan warms up its combines (``_compile.a2a_tasks``); every combine that
    ``combine_launch`` picks then is one of those very kernels, whole rows or split,
    for its N or for any N: none is built again at the first call."""
    from cupy_dcp._compile import a2a_tasks
    from cupy_dcp.kernels import combine
    from cupy_dcp.kernels._arrays import kernel_array
    from cupy_dcp.layout import lse_pack_dim

    from cupy_dcp.kernels._arrays import dummy_index

    blocks = set()
    for dtype in DTYPES:
        bits = np.uint32 if np.dtype(dtype).itemsize == 4 else np.uint16
        for n in (2, 8, 9):
            for b, d in ((1, 512), (64, 512), (3, 72), (600, 72)):
                built = {id(task()) for task in a2a_tasks(dtype, d, n)}
                recv = np.zeros((n, b + 1, 4, d + lse_pack_dim(dtype)), bits)  # a trailer row
                out = np.zeros((b, 4, d), dtype)
                kernel, grid, block, _ = combine.combine_launch(  # as a plan calls it
                    dtype, kernel_array(recv, bits),
                    kernel_array(out, combine.combine_codec(dtype)[1]), None, True,
                    (dummy_index(), dummy_index()))
                assert id(kernel) in built, (dtype, n, b, d, grid)
                blocks.add(grid == (5, b, 1))  # a block a row: (H/N, B), and signed a
                # block that checks the trailer first
    assert blocks == {True, False}  # a block a row, and rows split over warps


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 5, 4, 1), (3, 3, 6, 7), (2, 3, 4, 72), (2, 2, 2, 600),
                                   (2, 3, 4, 517), (2, 3, 2, 1030)],
                         ids=lambda s: "N%dB%dH%dD%d" % s)
def test_pack_stores_aligned_quads_where_it_can(dtype, shape):
    check_pack_quads(ident, host, dtype, *shape, np.random.default_rng(sum(shape)))


def test_every_pack_a_launch_picks_is_one_the_plan_built():
    """An a2a plan warms up its packs (``_compile.a2a_tasks``): with its aligned
    buffers, every pack ``pack_launch`` picks, with a mask or without, is one of those
    very kernels: rows of words as aligned quads, 16-bit values of an odd D by value."""
    from cupy_dcp._compile import a2a_tasks
    from cupy_dcp.kernels._arrays import dummy_index, kernel_array
    from cupy_dcp.kernels.pack import pack_launch
    from cupy_dcp.layout import lse_pack_dim

    for dtype in DTYPES:
        bits = np.uint32 if np.dtype(dtype).itemsize == 4 else np.uint16
        for b, d in ((1, 512), (64, 512), (3, 72), (2, 33), (5, 300)):
            built = {id(task()) for task in a2a_tasks(dtype, d, 2)}
            x = at_word(ident, (b, 4, d), dtype, 0)  # 16-byte aligned, as CuPy's are
            send = at_word(ident, (2, b + 1, 2, d + lse_pack_dim(dtype)), bits, 0)  # a trailer
            seq_lens, qsl = np.ones(b, np.int64), np.arange(b + 1, dtype=np.int64)
            recv = at_word(ident, send.shape, bits, 0)
            lse = np.zeros((b, 4), np.float32)
            for mask in ((dummy_index(), dummy_index(), -1),
                         (kernel_array(seq_lens, np.int64), kernel_array(qsl, np.int64), b)):
                kernel, *_ = pack_launch(
                    kernel_array(x, bits), kernel_array(lse, np.uint32), *mask,
                    kernel_array(send, bits), kernel_array(recv, bits), 0,
                    (dummy_index(), dummy_index()))
                assert id(kernel) in built, (dtype, b, d, mask[2])
