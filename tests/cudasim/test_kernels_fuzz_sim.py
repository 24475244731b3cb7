"""Hypothesis fuzzing of the CUDA kernels under the Numba CUDA simulator.

``pack_send`` must match ``pack_reference`` bit for bit and ``unpack_combine``
must match ``lse_weighted_combine`` (within ``assert_combine_close``), over
tiny shapes, every dtype, both LSE bases, NaN (any payload) / +inf / -inf LSEs
placed per (rank, token, head), NaN or inf partials in rows whose LSE is
empty, strided and misaligned inputs and outputs, ``seq_lens`` /
``query_start_loc`` masks, and grids capped so that blocks loop over tokens
(the pack then packs two tokens' rows a trip). Runs only in a process started with
NUMBA_ENABLE_CUDASIM=1 (see ``tests/test_simulator.py``); NumPy arrays stand for
device arrays. The examples are derandomized, so every run draws the same ones.
"""

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cupy_dcp import lse_pack_dim, lse_weighted_combine, pack_reference
from cupy_dcp.kernels import pack_send, unpack_combine
from cupy_dcp.layout import bits_dtype

from _helpers import row_mask
from kernel_checks import DTYPES, assert_combine_close

HEAD_DIMS = (1, 2, 3, 7, 8, 64, 72, 130)
LSE_REGIMES = ((0.0, 5.0), (0.0, 80.0), (3000.0, 3.0))  # (center, half-width)
POS_INF_BITS, NEG_INF_BITS = 0x7F800000, 0xFF800000

# Widening a signalling-NaN LSE to float64 in the oracle sets the invalid flag.
pytestmark = pytest.mark.filterwarnings(
    "ignore:invalid value encountered in cast:RuntimeWarning")

# float32 bit patterns of an empty shard: +inf, -inf, or NaN of any sign and payload
# (signalling ones included).
empty_lse_bits = st.one_of(
    st.just(POS_INF_BITS), st.just(NEG_INF_BITS),
    st.builds(lambda sign, payload: (sign << 31) | POS_INF_BITS | payload,
              st.integers(0, 1), st.integers(1, (1 << 23) - 1)))
poison = st.sampled_from([None, np.nan, np.inf, -np.inf])


@st.composite
def sizes(draw):
    n = draw(st.integers(1, 4))
    return dict(n=n, B=draw(st.integers(1, 4)), hn=draw(st.integers(1, 3)),
                D=draw(st.sampled_from(HEAD_DIMS)), dtype=draw(st.sampled_from(DTYPES)),
                regime=draw(st.sampled_from(LSE_REGIMES)), seed=draw(st.integers(0, 2**32 - 1)),
                max_blocks=draw(st.sampled_from([None, 1, 2])))


@contextlib.contextmanager
def _grid_cap(max_blocks):
    """Kernels launched on about ``max_blocks`` blocks at most (``None``: as many as
    they take), so that their blocks loop over the tokens."""
    from cupy_dcp.kernels import _rows

    saved = _rows.MAX_BLOCKS
    if max_blocks is not None:
        _rows.MAX_BLOCKS = max_blocks
    try:
        yield
    finally:
        _rows.MAX_BLOCKS = saved


def _specials(draw, ranks, tokens, heads):
    """Single empty LSEs at (rank, token, head), and whole rows empty on every rank."""
    singles = draw(st.lists(st.tuples(st.integers(0, ranks - 1), st.integers(0, tokens - 1),
                                      st.integers(0, heads - 1), empty_lse_bits, poison),
                            max_size=4))
    rows = draw(st.lists(st.tuples(st.integers(0, tokens - 1), st.integers(0, heads - 1),
                                   st.lists(st.tuples(empty_lse_bits, poison),
                                            min_size=ranks, max_size=ranks)),
                         max_size=2))
    for b, h, per_rank in rows:
        singles += [(r, b, h, bits, bad) for r, (bits, bad) in enumerate(per_rank)]
    return singles


def _inject(xs, lses, specials):
    """Write the special LSE bits into ``lses [N, B, H]`` float32 and poison the partials."""
    lse_bits = lses.view(np.uint32)
    for r, b, h, bits, bad in specials:
        lse_bits[r, b, h] = bits
        if bad is not None:
            xs[r, b, h] = bad


def _partials_and_lses(case, heads):
    """Random ``xs [N, B, heads, D]`` of the case's dtype and ``lses [N, B, heads]`` float32."""
    rng = np.random.default_rng(case["seed"])
    n, B, D = case["n"], case["B"], case["D"]
    center, width = case["regime"]
    xs = (rng.standard_normal((n, B, heads, D)) * 10.0 ** rng.uniform(-2, 2)).astype(np.float32)
    lses = (center + rng.uniform(-width, width, (n, B, heads))).astype(np.float32)
    return xs, lses, rng


@st.composite
def masks(draw, tokens):
    """``seq_lens [S]`` (some 0) and a sorted ``query_start_loc [S+1]`` that may leave
    padding at both ends; None for no mask."""
    if not draw(st.booleans()):
        return None
    num_seqs = draw(st.integers(0, 3))
    starts = sorted(draw(st.lists(st.integers(0, tokens), min_size=num_seqs + 1,
                                  max_size=num_seqs + 1)))
    lens = draw(st.lists(st.integers(0, 2), min_size=num_seqs, max_size=num_seqs))
    index = draw(st.sampled_from([np.int32, np.int64]))
    return np.array(lens, dtype=index), np.array(starts, dtype=index)


def _strided_copy(x, layout):
    """``x [B, H, D]`` held as ``layout``: C order, a head-major ``[H, B, D]`` storage seen
    as ``[B, H, D]``, or a view that starts one element into its buffer (not 4-byte
    aligned for 16-bit dtypes, so the kernels cannot move it as words)."""
    if layout == "head_major":
        return np.ascontiguousarray(x.transpose(1, 0, 2)).transpose(1, 0, 2)
    if layout == "offset":
        storage = np.zeros(x.shape[:-1] + (x.shape[-1] + 1,), dtype=x.dtype)
        storage[..., 1:] = x
        return storage[..., 1:]
    return x.copy()


def _sentinel(shape, dtype, rng):
    """A buffer of random bits: lanes a kernel forgets to write cannot pass for zeros."""
    ubits = bits_dtype(dtype)
    return rng.integers(0, np.iinfo(ubits).max, shape, dtype=ubits, endpoint=True).view(dtype)


@st.composite
def pack_cases(draw):
    case = draw(sizes())
    case["specials"] = _specials(draw, 1, case["B"], case["n"] * case["hn"])
    case["layout"] = draw(st.sampled_from(["contiguous", "head_major", "offset"]))
    case["mask"] = draw(masks(case["B"]))
    case["self_rank"] = draw(st.none() | st.integers(0, case["n"] - 1))
    return case


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(pack_cases())
def test_pack_send_is_bit_exact(case):
    n, B, D, dtype = case["n"], case["B"], case["D"], case["dtype"]
    H = n * case["hn"]
    xs, lses, rng = _partials_and_lses(case, H)
    xs = xs.astype(dtype)
    _inject(xs, lses, case["specials"])
    x, lse = _strided_copy(xs[0], case["layout"]), lses[0]
    if case["layout"] == "head_major":  # the LSE too: [H, B] storage seen as [B, H]
        lse = np.ascontiguousarray(lse.T).T
    shape = (n, B, case["hn"], D + lse_pack_dim(dtype))
    send = _sentinel(shape, dtype, rng)
    recv = _sentinel(shape, dtype, rng)
    send_before, recv_before = send.copy(), recv.copy()
    mask_args, mask = {}, None
    if case["mask"] is not None:
        seq_lens, qsl = case["mask"]
        mask_args = dict(seq_lens=seq_lens, query_start_loc=qsl)
        mask = row_mask(B, seq_lens, qsl)
    self_rank = case["self_rank"]
    if self_rank is not None:
        mask_args.update(recv=recv, self_rank=self_rank)

    with _grid_cap(case["max_blocks"]):
        pack_send(x, lse, send, **mask_args)

    ubits = bits_dtype(dtype)
    expect = pack_reference(xs[0], lses[0], n, mask=mask).view(ubits)
    got = send.view(ubits).copy()
    if self_rank is not None:  # our own chunk went to recv; send's stays as it was
        np.testing.assert_array_equal(got[self_rank], send_before.view(ubits)[self_rank])
        got[self_rank] = recv.view(ubits)[self_rank]
        others = np.arange(n) != self_rank
        np.testing.assert_array_equal(recv.view(ubits)[others], recv_before.view(ubits)[others])
    np.testing.assert_array_equal(got, expect)
    if mask is not None:  # masked rows carry exactly the bits of -inf
        lanes = got[:, mask, :, D:]
        want = [NEG_INF_BITS] if dtype.itemsize == 4 else [0x0000, 0xFF80]
        np.testing.assert_array_equal(lanes, np.broadcast_to(np.array(want, ubits), lanes.shape))


@st.composite
def combine_cases(draw):
    case = draw(sizes())
    case["specials"] = _specials(draw, case["n"], case["B"], case["hn"])
    case["base_e"] = draw(st.booleans())
    case["out_layout"] = draw(st.sampled_from(["contiguous", "head_major", "offset"]))
    case["return_lse"] = draw(st.booleans())
    case["recv_as_bits"] = draw(st.booleans())
    return case


def _check_global_lse(got, expect):
    got, expect = np.asarray(got, dtype=np.float64), np.asarray(expect, dtype=np.float64)
    empty = ~np.isfinite(expect)
    np.testing.assert_array_equal(got[empty], expect[empty])
    np.testing.assert_allclose(got[~empty], expect[~empty], rtol=1e-6, atol=1e-5)


def _check_combined(got, got_lse, xs, lses, dtype, base_e):
    """``got [B, H/N, D]`` (and the global LSE unless None) against the float64 oracle."""
    expect, expect_lse = lse_weighted_combine(xs, lses, return_lse=True, is_lse_base_on_e=base_e)
    got = np.asarray(got).astype(np.float64)
    assert not np.isnan(got).any(), "NaN leaked into the output"
    assert_combine_close(got, expect, xs, lses, dtype, base_e)
    np.testing.assert_array_equal(got[np.isneginf(expect_lse)], 0.0)
    if got_lse is not None:
        _check_global_lse(got_lse, expect_lse)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(combine_cases())
def test_unpack_combine_matches_the_oracle(case):
    n, B, hn, D, dtype = case["n"], case["B"], case["hn"], case["D"], case["dtype"]
    xs, lses, rng = _partials_and_lses(case, hn)
    xs = xs.astype(dtype)
    _inject(xs, lses, case["specials"])
    recv = np.stack([pack_reference(xs[r], lses[r], 1)[0] for r in range(n)])
    if case["recv_as_bits"]:
        recv = recv.view(bits_dtype(dtype))
    out = _strided_copy(_sentinel((B, hn, D), dtype, rng), case["out_layout"])
    out_lse = np.full((B, hn), np.nan, dtype=np.float32) if case["return_lse"] else None

    with _grid_cap(case["max_blocks"]):
        unpack_combine(recv, out, out_lse, is_lse_base_on_e=case["base_e"])

    _check_combined(out, out_lse, xs, lses, dtype, case["base_e"])


@st.composite
def pipeline_cases(draw):
    case = draw(sizes())
    n, B = case["n"], case["B"]
    case["specials"] = _specials(draw, n, B, n * case["hn"])
    case["base_e"] = draw(st.booleans())
    case["layout"] = draw(st.sampled_from(["contiguous", "head_major", "offset"]))
    case["masks"] = [draw(masks(B)) for _ in range(n)]
    return case


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(pipeline_cases())
def test_pack_exchange_combine_matches_the_oracle(case):
    """N simulated ranks: pack on each, chunk r of every send buffer to rank r, combine."""
    n, B, hn, D, dtype = case["n"], case["B"], case["hn"], case["D"], case["dtype"]
    xs, lses, rng = _partials_and_lses(case, n * hn)
    xs = xs.astype(dtype)
    _inject(xs, lses, case["specials"])
    masked = lses.copy()
    sends = []
    for k in range(n):
        send = _sentinel((n, B, hn, D + lse_pack_dim(dtype)), dtype, rng)
        mask_args = {}
        if case["masks"][k] is not None:
            seq_lens, qsl = case["masks"][k]
            mask_args = dict(seq_lens=seq_lens, query_start_loc=qsl)
            masked[k, row_mask(B, seq_lens, qsl)] = -np.inf
        with _grid_cap(case["max_blocks"]):
            pack_send(_strided_copy(xs[k], case["layout"]), lses[k], send, **mask_args)
        sends.append(send)

    for r in range(n):
        heads = slice(r * hn, (r + 1) * hn)
        out = np.full((B, hn, D), np.nan, dtype=dtype)
        out_lse = np.full((B, hn), np.nan, dtype=np.float32)
        with _grid_cap(case["max_blocks"]):
            unpack_combine(np.stack([s[r] for s in sends]), out, out_lse,
                           is_lse_base_on_e=case["base_e"])
        _check_combined(out, out_lse, xs[:, :, heads], masked[:, :, heads], dtype,
                        case["base_e"])
