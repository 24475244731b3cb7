"""The plans' signature trailer under the CUDA simulator: the pack signs every chunk,
the combine stays exact where every chunk carries rank 0's signature and marks the
word that differs, with both values, where one does not."""

import numpy as np
import pytest

from cupy_dcp import lse_weighted_combine
from cupy_dcp.kernels._arrays import dummy_index, kernel_array
from cupy_dcp.kernels._format import as_dtype, bits_dtype, lse_pack_dim
from cupy_dcp.kernels import combine
from cupy_dcp.kernels._trailer import (CALL, DTYPE_CODES, FIELDS, MAGIC, STATUS_WORDS, TOKENS,
                                       WORDS, trailer_rows)
from cupy_dcp.kernels.combine import combine_codec, combine_launch, unpack_combine
from cupy_dcp.kernels.pack import pack_launch
from cupy_dcp.reference import pack_reference

N, B, HN = 2, 3, 2


def signature(dtype, d, base=True):
    sig = np.zeros(WORDS, np.int64)
    sig[:] = (MAGIC, 0, N * HN, d, DTYPE_CODES[np.dtype(dtype).name], base, 1, 0)
    return sig


def words_of(chunk_rows, bits):
    """The trailer words of a chunk ``[B + k, HN, W]`` (as the host sees them)."""
    flat = np.ascontiguousarray(chunk_rows).reshape(-1).view(bits)
    return flat.view(np.uint32)[:WORDS] if bits.itemsize == 4 else flat[:2 * WORDS].view(np.uint32)


def pack_rank(rank, x, lse, sig, state, d):
    """Rank ``rank``'s pack into plan buffers: ``(send, recv)`` ``[N, B + k, HN, W]``."""
    bits = bits_dtype(x.dtype)
    width = d + lse_pack_dim(x.dtype)
    k = trailer_rows(HN, width, bits.itemsize)
    send = np.zeros((N, B + k, HN, width), bits)
    recv = np.zeros_like(send)
    kernel, grid, block, args = pack_launch(
        kernel_array(x, bits), kernel_array(lse, np.uint32), dummy_index(), dummy_index(), -1,
        kernel_array(send, bits), kernel_array(recv, bits), rank,
        signed=(kernel_array(sig, np.int64), kernel_array(state, np.int64)))
    kernel(grid, block, 0, args)
    return send, recv


def inputs(rank, dtype, d):
    rng = np.random.default_rng([rank, d])
    return (rng.standard_normal((B, N * HN, d)).astype(np.float32).astype(dtype),
            rng.uniform(-3, 3, (B, N * HN)).astype(np.float32))


@pytest.mark.parametrize("d", [1, 8, 30])  # 30: rows that hold the whole trailer
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_the_pack_signs_every_chunk(dtype, d):
    dtype = as_dtype(dtype)
    x, lse = inputs(0, dtype, d)
    state = np.array([41, 0], np.int64)
    send, recv = pack_rank(1, x, lse, signature(dtype, d), state, d)
    plain = pack_reference(x, lse, N)
    bits = bits_dtype(dtype)
    want = signature(dtype, d).astype(np.uint32)
    want[TOKENS], want[CALL] = B, 41
    for r in range(N):
        mine = recv if r == 1 else send
        np.testing.assert_array_equal(mine[r, :B], plain[r].view(bits))
        np.testing.assert_array_equal(words_of(mine[r, B:], bits), want)
    assert not send[1].any()  # its own chunk went straight to recv
    assert state.tolist() == [41, 41]  # the combine advances state[0]


@pytest.fixture(params=["block_a_row", "rows_split"])
def combine_kernel(request, monkeypatch):
    """The combine kernel that checks the trailer: a block a row (``_blocks``' signed
    twin), or rows split over warps (``_slices``); whether it is a block a row."""
    blocks = request.param == "block_a_row"
    monkeypatch.setattr(combine, "by_blocks", lambda *shape: blocks)
    return blocks


def combine_ranks(dtype, d, odd_sig=None, odd_state=None, blocks=None):
    """Rank 1's combine of both ranks' signed chunks: ``(out, out_lse, status, state,
    xs, lses)``; rank 1 packs with ``odd_sig`` / ``odd_state`` when given; the
    combine runs a block a row or not as ``blocks`` says, where given."""
    me = 1
    xs, lses, chunks = [], [], []
    for rank in range(N):
        x, lse = inputs(rank, dtype, d)
        sig = signature(dtype, d) if odd_sig is None or rank != me else odd_sig
        state = np.array([7, 0], np.int64) if odd_state is None or rank != me else odd_state
        send, recv = pack_rank(rank if rank == me else -1, x, lse, sig, state, d)
        chunks.append(recv[me] if rank == me else send[me])
        xs.append(x)
        lses.append(lse)
    recv = np.stack(chunks)
    bits = bits_dtype(dtype)
    _, value = combine_codec(dtype)
    out = np.zeros((B, HN, d), dtype)
    out_lse = np.zeros((B, HN), np.float32)
    status = np.zeros(N * WORDS * STATUS_WORDS, np.int64)
    state = np.array([0, 7], np.int64)
    kernel, grid, block, args = combine_launch(
        dtype, kernel_array(recv, bits), kernel_array(out, value),
        kernel_array(out_lse, np.float32), True,
        signed=(kernel_array(status, np.int64), kernel_array(state, np.int64)))
    # a block a row: (H/N, B), a block before the rows' that checks the trailer and one
    # after them that writes the output LSE
    assert blocks is None or (tuple(grid) == (HN + 2, B, 1)) == blocks
    kernel(grid, block, 0, args)
    return out, out_lse, status, state, np.stack(xs), np.stack(lses)


@pytest.mark.parametrize("d", [1, 8, 30])  # 30: rows that hold the whole trailer
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_the_combine_of_signed_chunks_is_exact(dtype, d, combine_kernel):
    dtype = as_dtype(dtype)
    out, out_lse, status, state, xs, lses = combine_ranks(dtype, d, blocks=combine_kernel)
    assert not status.any() and state.tolist() == [8, 7]
    plain = np.stack([pack_reference(xs[r], lses[r], N)[1] for r in range(N)])
    want = np.zeros_like(out)
    want_lse = np.zeros_like(out_lse)
    unpack_combine(plain, want, want_lse)
    bits = bits_dtype(dtype)
    np.testing.assert_array_equal(out.view(bits), want.view(bits))
    np.testing.assert_array_equal(out_lse, want_lse)
    ref, ref_lse = lse_weighted_combine(xs.astype(np.float64), lses, return_lse=True)
    np.testing.assert_allclose(out.astype(np.float64), ref[:, HN:], rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(out_lse, ref_lse[:, HN:], rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("field, change", [
    ("dtype", lambda sig: sig.__setitem__(4, DTYPE_CODES["bfloat16"])),
    ("is_lse_base_on_e", lambda sig: sig.__setitem__(5, 0)),
    ("head_dim", lambda sig: sig.__setitem__(3, 9)),
    ("call_number", None),
])
def test_the_combine_marks_the_word_that_differs(field, change, combine_kernel):
    dtype = as_dtype("float16")
    sig, state = signature(dtype, 8), None
    if change is None:
        state = np.array([8, 0], np.int64)  # rank 1 made one call more
    else:
        change(sig)
    out, out_lse, status, state, xs, lses = combine_ranks(dtype, 8, sig, state, combine_kernel)
    marks = status.reshape(N, WORDS, STATUS_WORDS)
    f = FIELDS.index(field)
    assert marks[:, :, 0].sum() == 1 and marks[1, f, 0] == 1, marks
    mine = signature(dtype, 8)
    mine[CALL] = 7
    theirs = sig.copy()
    theirs[CALL] = 7 if change is not None else 8
    assert (marks[1, f, 1], marks[1, f, 2]) == (mine[f], theirs[f])
