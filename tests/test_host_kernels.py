"""The Numba host kernels, driven through an in-process simulation of N ranks (no MPI).

Each simulated rank packs with ``pack_host`` (checked bit for bit against
``pack_reference``); rank r's receive buffer is chunk r of every send buffer,
unpacked and combined with ``combine_host`` exactly as ``reduce._reduce_host``
does, and compared with the float64 oracle over all ranks' inputs.
"""

import ml_dtypes
import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _helpers import (check_rank_result, host_bf16_rounding, random_rank_inputs, row_mask,
                      row_scale)
from cupy_dcp import lse_weighted_combine, pack_reference, unpack_reference
from cupy_dcp.kernels import combine_host, pack_host
from cupy_dcp.kernels._math import build_bits
from cupy_dcp.layout import BFLOAT16, bits_dtype, send_buffer_shape

DTYPES = (np.dtype(np.float16), BFLOAT16, np.dtype(np.float32))


def _pack(x, lse, world_size, seq_lens=None, query_start_loc=None):
    """``pack_host`` on the bit views of ``x`` and ``lse``, as ``_reduce_host`` calls it."""
    B, H, D = x.shape
    ubits = bits_dtype(x.dtype)
    send = np.empty(send_buffer_shape(world_size, B, H, D, x.dtype), dtype=ubits)
    pack_host(x.view(ubits), lse.view(np.uint32), send, seq_lens, query_start_loc)
    return send


def _combine(recv, head_dim, base_e):
    """Unpack and ``combine_host`` one rank's receive buffer, rounding as ``_reduce_host``."""
    parts, lses = unpack_reference(recv, head_dim)
    n, B, hn, D = parts.shape
    acc = np.empty((B, hn, D), dtype=np.float64)
    global_lse = np.empty((B, hn), dtype=np.float64)
    combine_host(parts.astype(np.float32), lses, acc, global_lse, base_e)
    return acc.astype(np.float32).astype(recv.dtype), global_lse.astype(np.float32)


def simulate(xs, lses, base_e, seq_lens=None, query_start_loc=None):
    """Run N ranks' pack -> all-to-all -> combine in process; return each rank's result."""
    n = len(xs)
    B, H, D = xs[0].shape
    dtype = xs[0].dtype
    ubits = bits_dtype(dtype)
    sends = []
    for k in range(n):
        lens = None if seq_lens is None else seq_lens[k]
        send = _pack(xs[k], lses[k], n, lens, None if lens is None else query_start_loc)
        mask = None if lens is None else row_mask(B, lens, query_start_loc)
        expected = pack_reference(xs[k], lses[k], n, mask).view(ubits)
        np.testing.assert_array_equal(send, expected, err_msg=f"send buffer of rank {k}")
        sends.append(send)
    return [_combine(np.stack([s[r] for s in sends]).view(dtype), D, base_e) for r in range(n)]


@st.composite
def cases(draw):
    n = draw(st.integers(1, 5))
    return dict(
        n=n, B=draw(st.integers(0, 6)), H=n * draw(st.integers(1, 4)),
        D=draw(st.sampled_from([1, 2, 3, 8, 72, 576])), dtype=draw(st.sampled_from(DTYPES)),
        base_e=draw(st.booleans()), regime=draw(st.sampled_from(["spread", "large", "mixed"])),
        p_bad=draw(st.sampled_from([0.0, 0.1, 0.4])), masked=draw(st.booleans()),
        seed=draw(st.integers(0, 2**32 - 1)))


def _masks(rng, n, B):
    """Per-rank ``seq_lens`` (a third of them 0) and one shared ``query_start_loc``.

    ``query_start_loc`` may start past 0 and end before B: both ends are padding.
    """
    num_seqs = int(rng.integers(0, 4))
    qsl = np.sort(rng.integers(0, B + 1, num_seqs + 1)).astype(np.int32)
    return [rng.integers(0, 3, num_seqs).astype(np.int32) for _ in range(n)], qsl


# Widening a signalling-NaN LSE to float64 sets the invalid flag; that is expected here.
@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(cases())
def test_simulated_ranks_match_the_oracle(case):
    n, B, H, D, dtype = case["n"], case["B"], case["H"], case["D"], case["dtype"]
    rng = np.random.default_rng(case["seed"])
    inputs = [random_rank_inputs(rng, (B, H, D), dtype, case["regime"], case["p_bad"])
              for _ in range(n)]
    xs = [x for x, _ in inputs]
    lses = [lse for _, lse in inputs]
    if B and rng.random() < 0.5:
        b, h = rng.integers(0, B), rng.integers(0, H)
        for k, lse in enumerate(lses):
            lse[b, h] = [-np.inf, np.nan, np.inf][k % 3]
    seq_lens = qsl = None
    ref_lses = np.stack(lses)
    if case["masked"]:
        seq_lens, qsl = _masks(rng, n, B)
        for k in range(n):
            ref_lses[k, row_mask(B, seq_lens[k], qsl)] = -np.inf

    results = simulate(xs, lses, case["base_e"], seq_lens, qsl)

    stacked = np.stack(xs)
    ref, ref_lse = lse_weighted_combine(stacked.astype(np.float64), ref_lses, return_lse=True,
                                        is_lse_base_on_e=case["base_e"])
    scale = row_scale(stacked, ref_lses)
    hn = H // n
    for r, (out, lse) in enumerate(results):
        heads = slice(r * hn, (r + 1) * hn)
        assert out.dtype == dtype and out.shape == (B, hn, D)
        check_rank_result(out, lse, ref[:, heads], ref_lse[:, heads], scale[:, heads],
                          where=f"rank {r} of {n}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pack_masks_empty_sequences_and_padding(dtype):
    B, H, D = 8, 4, 3
    rng = np.random.default_rng(7)
    x = rng.standard_normal((B, H, D)).astype(dtype)
    lse = rng.uniform(-5, 5, (B, H)).astype(np.float32)
    seq_lens = np.array([3, 0, 2, 5], dtype=np.int64)
    qsl = np.array([1, 3, 5, 5, 6], dtype=np.int32)  # token 0 and tokens 6, 7: padding
    empty = np.array([True, False, False, True, True, False, True, True])
    ubits = bits_dtype(dtype)

    send = _pack(x, lse, 2, seq_lens, qsl)

    lanes = send[..., D:]
    if dtype == np.float32:
        expected = np.broadcast_to(lse.view(np.uint32).reshape(B, 2, 2, 1).transpose(1, 0, 2, 3),
                                   lanes.shape).copy()
        expected[:, empty] = 0xFF800000
    else:
        bits = lse.view(np.uint32).reshape(B, 2, 2).transpose(1, 0, 2)
        expected = np.stack([bits & 0xFFFF, bits >> 16], axis=-1).astype(ubits)
        expected[:, empty] = [0x0000, 0xFF80]
    np.testing.assert_array_equal(lanes, expected)
    np.testing.assert_array_equal(send[..., :D], x.view(ubits).reshape(B, 2, 2, D).transpose(1, 0, 2, 3))
    assert row_mask(B, seq_lens, qsl).tolist() == empty.tolist()


def test_pack_without_sequences_masks_every_token():
    x = np.ones((3, 2, 2), dtype=np.float32)
    send = _pack(x, np.zeros((3, 2), np.float32), 2, np.zeros(0, np.int64), np.array([0]))
    np.testing.assert_array_equal(send[..., 2], 0xFF800000)


def test_pack_reads_strided_inputs():
    """A head-major ``[H, B, D]`` buffer seen as ``[B, H, D]`` packs like its copy."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 5, 4)).astype(np.float16).transpose(1, 0, 2)
    lse = rng.standard_normal((6, 5)).astype(np.float32).T
    np.testing.assert_array_equal(_pack(x, lse, 3),
                                  pack_reference(x, lse, 3).view(np.uint16))


@pytest.fixture(scope="module")
def bits():
    return build_bits(numba.njit)


@pytest.fixture(scope="module")
def convert_all():
    return host_bf16_rounding()


def _interesting_float32_bits():
    """Every bfloat16 high half with low halves at and around the rounding tie,
    plus random patterns: NaN, inf, subnormals and ties included."""
    highs = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    lows = np.array([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32)
    rng = np.random.default_rng(11)
    random = rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([(highs[:, None] | lows[None, :]).ravel(), random])


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
def test_f32_to_bf16_bits_rounds_like_ml_dtypes(convert_all):
    values = _interesting_float32_bits()
    got = convert_all(values)
    want = values.view(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    is_nan = np.isnan(values.view(np.float32))
    assert is_nan.any() and np.isinf(values.view(np.float32)).any()
    np.testing.assert_array_equal(got[~is_nan], want[~is_nan])
    assert np.isnan(got[is_nan].view(ml_dtypes.bfloat16).astype(np.float32)).all()
    tie_rounds_to_even = np.array([0x3F808000, 0x3F818000], dtype=np.uint32)
    assert convert_all(tie_rounds_to_even).tolist() == [0x3F80, 0x3F82]
    assert convert_all(np.array([0x7F7FFFFF, 0x7F800001], dtype=np.uint32))[0] == 0x7F80


def test_bf16_to_f32_bits_round_trips(bits, convert_all):
    every = np.arange(1 << 16, dtype=np.uint32)
    widened = np.array([bits.bf16_to_f32_bits(b) for b in every], dtype=np.uint32)
    want = every.astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float32).view(np.uint32)
    is_nan = np.isnan(widened.view(np.float32))
    np.testing.assert_array_equal(widened[~is_nan], want[~is_nan])
    np.testing.assert_array_equal(convert_all(widened)[~is_nan], every[~is_nan])
    assert np.isnan(convert_all(widened[is_nan]).view(ml_dtypes.bfloat16).astype(np.float32)).all()


def test_f16_to_f32_bits_widens_every_float16_exactly(bits):
    """Every float16 bit pattern: zeros, subnormals, normals, infinities and NaNs (payload
    kept), as NumPy widens them; only the low 16 bits of the argument count."""
    every = np.arange(1 << 16, dtype=np.uint32)
    widened = np.array([bits.f16_to_f32_bits(b | 0xABCD0000) for b in every], dtype=np.uint32)
    want = every.astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
    np.testing.assert_array_equal(widened, want)
    assert np.isnan(widened.view(np.float32)).sum() == 2 * 1023


def test_row_is_empty_against_a_linear_scan():
    """The mask's lookup (a guess that token b is sequence b, then a binary search)
    against the definition, over random valid batches: sequences of 0 to 3 tokens
    (equal starts), a first start past 0, padding after the last, empty ``seq_lens``."""
    import numba

    from cupy_dcp.kernels._math import build_mask

    row_is_empty = build_mask(numba.njit)
    rng = np.random.default_rng(5)
    for trial in range(300):
        s = int(rng.integers(0, 7))
        counts = rng.choice([0, 1, 1, 1, 2, 3], size=s) if trial % 3 else np.ones(s, np.int64)
        starts = (int(rng.integers(0, 3)) if trial % 2 else 0) + np.concatenate(
            [[0], np.cumsum(counts)]).astype(np.int64)
        seq_lens = rng.integers(0, 3, size=s).astype(np.int64)
        for b in range(int(starts[-1]) + 3):
            owners = [k for k in range(s) if starts[k] <= b < starts[k + 1]]
            expect = not owners or seq_lens[owners[0]] <= 0
            assert row_is_empty(b, seq_lens, starts, s) == expect, (b, starts, seq_lens)
    assert not row_is_empty(0, seq_lens, starts, -1)  # no mask


def test_the_host_twins_refuse_sizes_they_would_overrun():
    """Numba code without bounds checks: a wrong size would read or write past an array."""
    from cupy_dcp.kernels import agrs_correct_host, agrs_lse_host, combine_host, pack_host

    data = np.zeros((3, 4, 8), np.uint16)
    lse_bits = np.zeros((3, 4), np.uint32)
    with pytest.raises(ValueError, match=r"^send_bits must have shape \(2, 3, 2, 10\)"):
        pack_host(data, lse_bits, np.zeros((2, 3, 2, 9), np.uint16))  # narrower than D + P
    with pytest.raises(ValueError, match=r"^send_bits must be \[N, B, H/N, D\+P\] with N "
                                         r"dividing H = 4"):
        pack_host(data, lse_bits, np.zeros((3, 3, 2, 10), np.uint16))
    with pytest.raises(TypeError, match=r"^data_bits must be a \[B, H, D\] NumPy array of "
                                        r"uint16 or uint32 bits"):
        pack_host(data.astype(np.float32), lse_bits, np.zeros((2, 3, 2, 9), np.float32))
    with pytest.raises(TypeError, match=r"^lse_bits has dtype int32"):
        pack_host(data, lse_bits.astype(np.int32), np.zeros((2, 3, 2, 10), np.uint16))
    with pytest.raises(ValueError, match=r"^out must have shape \(3, 2, 8\)"):
        combine_host(np.zeros((2, 3, 2, 8)), np.zeros((2, 3, 2)), np.zeros((3, 2, 7)),
                     np.zeros((3, 2)))
    with pytest.raises(ValueError, match=r"^self_rank must be in \[0, 2\) \(got 2\)$"):
        agrs_correct_host(np.zeros((3, 4, 8)), np.zeros((2, 3, 4)), 2, np.zeros((2, 3, 2, 8)))
    with pytest.raises(ValueError, match=r"^out_lse must have shape \(3, 2\)"):
        agrs_lse_host(np.zeros((2, 3, 4)), 0, 2, np.zeros((3, 4)))


def test_the_host_twins_check_masks_and_flags_as_the_kernels_do():
    """A mask shorter than its sequences would be read past its end; a flag that is not a
    bool would be read as one (``"False"`` as base e)."""
    from cupy_dcp.kernels import (agrs_correct_host, agrs_lse_host, combine_host, mask_lse_host,
                                  pack_host)

    data, lse_bits = np.zeros((3, 4, 8), np.uint16), np.zeros((3, 4), np.uint32)
    send = np.zeros((2, 3, 2, 10), np.uint16)
    lens, starts = np.array([1, 2], np.int64), np.array([0, 1, 3], np.int64)
    for call in (lambda *m: pack_host(data, lse_bits, send, *m),
                 lambda *m: mask_lse_host(np.zeros((3, 4), np.float32), *m)):
        with pytest.raises(ValueError, match=r"^query_start_loc must have len\(seq_lens\) \+ 1 "
                                             r"entries \(got \(1,\) for \(2,\)\)$"):
            call(lens, starts[:1])
        with pytest.raises(TypeError, match=r"^seq_lens must be a 1-D integer array \(got "
                                            r"float64 of shape \(2,\)\)$"):
            call(lens.astype(np.float64), starts)
        with pytest.raises(TypeError, match=r"^query_start_loc must be a 1-D integer array "
                                            r"\(got int64 of shape \(3, 1\)\)$"):
            call(lens, starts[:, None])
        with pytest.raises(ValueError, match=r"^seq_lens and query_start_loc must be given "
                                             r"together$"):
            call(lens, None)
        with pytest.raises(TypeError, match=r"^seq_lens must be a 1-D integer array \(got list "
                                            r"of shape None\)$"):
            call([1, 2], starts)
    parts, lses = np.zeros((2, 3, 2, 8), np.float32), np.zeros((2, 3, 2), np.float32)
    for flag in ("False", None, 0):
        with pytest.raises(TypeError, match=r"^is_lse_base_on_e must be True or False"):
            combine_host(parts, lses, np.zeros((3, 2, 8)), np.zeros((3, 2)), flag)
        with pytest.raises(TypeError, match=r"^is_lse_base_on_e must be True or False"):
            agrs_correct_host(np.zeros((3, 4, 8)), np.zeros((2, 3, 4)), 0,
                              np.zeros((2, 3, 2, 8)), flag)
        with pytest.raises(TypeError, match=r"^is_lse_base_on_e must be True or False"):
            agrs_lse_host(np.zeros((2, 3, 4)), 0, 2, np.zeros((3, 2)), flag)
    out_lse = np.zeros((3, 2))
    combine_host(parts, lses, np.zeros((3, 2, 8)), out_lse, np.False_)  # NumPy's bool is one
    np.testing.assert_array_equal(out_lse, np.float64(1.0))  # log2(2 * 2**0)


def test_the_host_twins_refuse_results_they_would_write_wrong():
    """A twin's results must be writeable float64 (pack_host's its bits), with no two
    elements in the same memory and, for the combine, apart from each other: else
    rows would overwrite each other (and race where the twins run threads). Inputs
    of a dtype Numba cannot weigh are refused by name."""
    from numpy.lib.stride_tricks import as_strided

    from cupy_dcp.kernels import agrs_correct_host, agrs_lse_host, mask_lse_host

    parts = np.arange(24, dtype=np.float32).reshape(2, 2, 2, 3)
    lses = np.zeros((2, 2, 2), np.float32)
    broadcast = as_strided(np.zeros(3), (2, 2, 3), (0, 0, 8))
    with pytest.raises(ValueError, match=r"^out must not have elements that share memory"):
        combine_host(parts, lses, broadcast, np.zeros((2, 2)))
    frozen = np.zeros((2, 2))
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match=r"^out_lse must be writeable"):
        combine_host(parts, lses, np.zeros((2, 2, 3)), frozen)
    store = np.zeros(2 * 2 * 3 + 4)
    out = store[:12].reshape(2, 2, 3)
    with pytest.raises(ValueError, match=r"^out_lse shares memory with out: the call writes "
                                         r"both"):
        combine_host(parts, lses, out, store[9:13].reshape(2, 2))  # on out's last 3
    combine_host(parts, lses, out, store[12:].reshape(2, 2))  # apart in one buffer: runs
    np.testing.assert_array_equal(out, (parts[0] + parts[1]) / 2)  # equal LSEs: the mean
    np.testing.assert_array_equal(store[12:], np.log(2.0))
    for name, bad in (("parts", parts.astype(np.float16)), ("lses", lses.astype(np.float16)),
                      ("out", np.zeros((2, 2, 3), np.float32)),
                      ("out_lse", np.zeros((2, 2), np.dtype(np.float64).newbyteorder()))):
        args = dict(parts=parts, lses=lses, out=np.zeros((2, 2, 3)), out_lse=np.zeros((2, 2)))
        args[name] = bad
        with pytest.raises(TypeError, match=f"^{name} must have dtype "):
            combine_host(**args)
    data, lse_bits = np.zeros((2, 4, 8), np.uint16), np.zeros((2, 4), np.uint32)
    send = np.zeros((2, 2, 2, 10), np.uint16)
    send.flags.writeable = False
    with pytest.raises(ValueError, match=r"^send_bits must be writeable"):
        pack_host(data, lse_bits, send)
    with pytest.raises(ValueError, match=r"^send_bits must not have elements that share"):
        pack_host(data, lse_bits, as_strided(np.zeros(10, np.uint16), (2, 2, 2, 10),
                                             (0, 0, 0, 2)))
    with pytest.raises(ValueError, match=r"^corrected must not have elements that share"):
        agrs_correct_host(np.zeros((2, 4, 8), np.float32), np.zeros((2, 2, 4), np.float32), 0,
                          as_strided(np.zeros(8), (2, 2, 2, 8), (0, 0, 0, 8)))
    with pytest.raises(TypeError, match=r"^data must have dtype "):
        agrs_correct_host(np.zeros((2, 4, 8), np.float16), np.zeros((2, 2, 4), np.float32), 0,
                          np.zeros((2, 2, 2, 8)))
    with pytest.raises(ValueError, match=r"^out_lse must not have elements that share"):
        agrs_lse_host(np.zeros((2, 2, 4), np.float32), 0, 2,
                      as_strided(np.zeros(2), (2, 2), (0, 8)))
    masked = np.zeros((2, 4), np.float32)
    masked.flags.writeable = False
    with pytest.raises(ValueError, match=r"^lse must be writeable"):
        mask_lse_host(masked, np.array([1]), np.array([0, 1]))

