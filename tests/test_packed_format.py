"""The packed send-buffer format: lane counts and the bit layout of pack_reference."""

import ml_dtypes
import numpy as np
import pytest

from cupy_dcp import lse_pack_dim, pack_reference, unpack_reference
from cupy_dcp.layout import BFLOAT16, as_dtype, bits_dtype, send_buffer_shape

DTYPES = {"float16": np.dtype(np.float16), "bfloat16": BFLOAT16,
          "float32": np.dtype(np.float32)}


@pytest.mark.parametrize("dtype, lanes", [
    (np.float16, 2), (ml_dtypes.bfloat16, 2), ("bfloat16", 2), (BFLOAT16, 2),
    (np.float32, 1), ("float32", 1)],
    ids=["float16", "ml_dtypes.bfloat16", "'bfloat16'", "dtype(bfloat16)", "float32", "'float32'"])
def test_lse_pack_dim(dtype, lanes):
    assert lse_pack_dim(dtype) == lanes


@pytest.mark.parametrize("dtype, name", [
    (np.float64, "float64"), (np.int32, "int32"), ("int8", "int8"),
    (np.dtype(np.float64), "float64")], ids=["float64", "int32", "'int8'", "dtype(float64)"])
def test_lse_pack_dim_refuses_other_dtypes(dtype, name):
    with pytest.raises(ValueError,
                       match=rf"^output dtype must be float16, bfloat16 or float32 \(got .*{name}.*\)$"):
        lse_pack_dim(dtype)


def test_as_dtype_reads_torch_style_names_without_torch():
    class FakeTorchDtype:
        def __str__(self):
            return "torch.bfloat16"

    assert as_dtype(FakeTorchDtype()) == BFLOAT16
    assert bits_dtype("bf16") == np.uint16
    assert bits_dtype(np.float32) == np.uint32


def _hand_case(dtype):
    """B=2, H=4, N=2, D=3 with LSEs whose float32 bits are written out by hand."""
    out = np.arange(2 * 4 * 3, dtype=np.float32).reshape(2, 4, 3).astype(dtype)
    lse = np.array([[1.0, -2.5, 3000.0, -np.inf], [0.0, -0.0, np.inf, 1.0]], dtype=np.float32)
    bits = np.array([[0x3F800000, 0xC0200000, 0x453B8000, 0xFF800000],
                     [0x00000000, 0x80000000, 0x7F800000, 0x3F800000]], dtype=np.uint32)
    return out, lse, bits


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_pack_reference_bit_layout(dtype):
    out, lse, bits = _hand_case(dtype)
    send = pack_reference(out, lse, world_size=2)
    assert send.dtype == dtype
    assert send.shape == send_buffer_shape(2, 2, 4, 3, dtype) == (2, 2, 2, 3 + lse_pack_dim(dtype))
    lanes = send.view(bits_dtype(dtype))
    for r in range(2):
        for b in range(2):
            for h in range(2):
                head = r * 2 + h
                np.testing.assert_array_equal(send[r, b, h, :3], out[b, head])
                if dtype == np.float32:
                    assert lanes[r, b, h, 3] == bits[b, head]
                    assert send[r, b, h, 3] == lse[b, head]
                else:
                    assert lanes[r, b, h, 3] == bits[b, head] & 0xFFFF
                    assert lanes[r, b, h, 4] == bits[b, head] >> 16


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_pack_reference_mask_writes_neg_inf_bits(dtype):
    out, lse, _ = _hand_case(dtype)
    send = pack_reference(out, lse, world_size=2, mask=np.array([False, True]))
    lanes = send.view(bits_dtype(dtype))[..., 3:]
    neg_inf = [0xFF800000] if dtype == np.float32 else [0x0000, 0xFF80]
    np.testing.assert_array_equal(lanes[:, 1], np.broadcast_to(neg_inf, lanes[:, 1].shape))
    unmasked = pack_reference(out, lse, world_size=2)
    np.testing.assert_array_equal(lanes[:, 0], unmasked.view(bits_dtype(dtype))[:, 0, :, 3:])
    np.testing.assert_array_equal(send[..., :3], unmasked[..., :3])


def _random_bits(rng, shape, ubits):
    """Random bit patterns, a quarter of them NaN with random payloads and signs.

    0x7F80 sets every exponent bit of both bfloat16 and float16 (and mantissa
    bits of the latter), so the 16-bit NaNs hold for either dtype.
    """
    ubits = np.dtype(ubits).type
    info = np.iinfo(ubits)
    bits = rng.integers(0, info.max, size=shape, endpoint=True, dtype=ubits)
    exp_mask = ubits(0x7F800000 if ubits == np.uint32 else 0x7F80)
    nan = rng.random(shape) < 0.25
    bits[nan] |= exp_mask
    bits[nan & ((bits & ~exp_mask & ubits(info.max >> 1)) == 0)] |= ubits(1)
    return bits


@pytest.mark.parametrize("world_size, heads", [(1, 3), (2, 4), (3, 6), (4, 8)])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_pack_unpack_round_trips_bit_for_bit(dtype, world_size, heads):
    rng = np.random.default_rng(world_size)
    ubits = bits_dtype(dtype)
    out = _random_bits(rng, (5, heads, 7), ubits).view(dtype)
    lse = _random_bits(rng, (5, heads), np.uint32).view(np.float32)
    assert np.isnan(lse).any() and np.isnan(out.astype(np.float32)).any()
    send = pack_reference(out, lse, world_size)
    parts, lses = unpack_reference(send, head_dim=7)
    assert parts.dtype == dtype and lses.dtype == np.float32
    hn = heads // world_size
    expected_parts = out.reshape(5, world_size, hn, 7).transpose(1, 0, 2, 3)
    expected_lses = lse.reshape(5, world_size, hn).transpose(1, 0, 2)
    np.testing.assert_array_equal(parts.view(ubits), expected_parts.view(ubits))
    np.testing.assert_array_equal(lses.view(np.uint32), expected_lses.view(np.uint32))


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_pack_converts_lse_values_to_float32(dtype):
    lse = np.array([[0.1, -1e-3, 3000.123456789, np.nan]], dtype=np.float64)
    send = pack_reference(np.ones((1, 4, 2), dtype=dtype), lse, world_size=2)
    _, lses = unpack_reference(send, head_dim=2)
    np.testing.assert_array_equal(lses.transpose(1, 0, 2).reshape(1, 4), lse.astype(np.float32))


def test_pack_reference_needs_heads_divisible_by_world_size():
    with pytest.raises(ValueError,
                       match=r"^num_heads must be divisible by world_size \(got H=6, N=4\)$"):
        pack_reference(np.zeros((2, 6, 3), np.float16), np.zeros((2, 6), np.float32), 4)
    with pytest.raises(ValueError,
                       match=r"^num_heads must be divisible by world_size \(got H=5, N=2\)$"):
        send_buffer_shape(2, 1, 5, 8, np.float32)


_X, _L = np.zeros((2, 4, 3), np.float16), np.zeros((2, 4), np.float32)
_BEYOND = np.zeros((2, 4))
_BEYOND[1, 3] = 1e300
# id: (pack_reference's arguments, error, message)
_BAD_PACKS = {
    "out-2d": ((_X[0], _L[0], 2), ValueError, r"^out must be \[B, H, D\] \(got shape \(4, 3\)\)$"),
    "lse-transposed": ((_X, _L.T, 2), ValueError,
                       r"^lse must be \[B, H\] = \(2, 4\) \(got shape \(4, 2\)\)$"),
    "lse-int": ((_X, _L.astype(np.int32), 2), TypeError,
                r"^lse must be a float array \(got dtype int32\)$"),
    "lse-beyond-float32": ((_X, _BEYOND, 2), ValueError,
                           r"^lse must fit float32: 1e\+300 at \(1, 3\) is beyond"),
    "world-size-0": ((_X, _L, 0), ValueError, r"^world_size must be >= 1 \(got 0\)$"),
    "world-size-negative": ((_X, _L, -2), ValueError, r"^world_size must be >= 1 \(got -2\)$"),
    "world-size-float": ((_X, _L, 2.0), TypeError,
                         r"^world_size must be an integer \(got float 2.0\)$"),
    "mask-shape": ((_X, _L, 2, np.zeros(3, bool)), ValueError,
                   r"^mask must be \[B\] = \(2,\) \(got shape \(3,\)\)$"),
    # a dtype is a TypeError, as its docstring and the library's calls say
    "out-float64": ((_X.astype(np.float64), _L, 2), TypeError,
                    r"^out dtype must be float16, bfloat16 or float32 \(got float64\)$"),
    "out-int16": ((_X.astype(np.int16), _L, 2), TypeError,
                  r"^out dtype must be float16, bfloat16 or float32 \(got int16\)$"),
    "head-size-0": ((_X[..., :0], _L, 2), ValueError,
                    r"^out's head size D must be >= 1 \(got 0\)$"),
    "mask-int": ((_X, _L, 2, np.array([0, 1])), TypeError,
                 r"^mask must be a bool array \(got dtype int"),
}


@pytest.mark.parametrize("args, error, message", _BAD_PACKS.values(), ids=_BAD_PACKS.keys())
def test_pack_reference_checks_its_inputs(args, error, message):
    with pytest.raises(error, match=message):
        pack_reference(*args)


@pytest.mark.parametrize("args, error, message", [
    ((0, 1, 4, 8, np.float32), ValueError, r"^world_size must be >= 1 \(got 0\)$"),
    ((2, -2, 4, 8, np.float32), ValueError, r"^num_tokens must be >= 0 \(got -2\)$"),
    ((2, 1, -4, 8, np.float32), ValueError, r"^num_heads must be >= 0 \(got -4\)$"),
    ((2, 1, 4, 0, np.float32), ValueError, r"^head_dim must be >= 1 \(got 0\)$"),
    ((2, 1.0, 4, 8, np.float32), TypeError, r"^num_tokens must be an integer \(got float 1.0\)$"),
], ids=["world-size", "tokens", "heads", "head-dim", "tokens-float"])
def test_send_buffer_shape_checks_its_sizes(args, error, message):
    with pytest.raises(error, match=message):
        send_buffer_shape(*args)
    assert send_buffer_shape(2, 0, 4, 1, np.float16) == (2, 0, 2, 3)


def test_unpack_reference_checks_the_width():
    with pytest.raises(ValueError, match=r"^recv must be \[N, B, H/N, 8\+2\] \(got shape \(2, 1, 3, 9\)\)$"):
        unpack_reference(np.zeros((2, 1, 3, 9), np.float16), head_dim=8)


def test_round_from_float64_rounds_once_to_bfloat16():
    """1 + 2^-8 + 2^-30 lies just above the midpoint of two bfloat16 values: rounding
    through float32 first lands exactly on the midpoint, then on the even neighbour."""
    from cupy_dcp.layout import BFLOAT16, round_from_float64
    above = 1.0 + 2.0 ** -8 + 2.0 ** -30
    below = -(1.0 + 2.0 ** -8 - 2.0 ** -31)
    got = round_from_float64(np.array([above, below, 1.0 + 2.0 ** -8, np.nan, -np.inf, 0.0]),
                             BFLOAT16).astype(np.float64)
    assert got[0] == 1.0 + 2.0 ** -7          # up: above the midpoint
    assert got[1] == -1.0                     # down in magnitude: below the midpoint
    assert got[2] == 1.0                      # an exact tie goes to even
    assert np.isnan(got[3]) and got[4] == -np.inf and got[5] == 0.0
    naive = np.float64(above).astype(np.float32).astype(BFLOAT16).astype(np.float64)
    assert naive == 1.0  # what double rounding gives: the case is a real one


def test_round_from_float64_matches_numpy_for_float16_and_float32():
    from cupy_dcp.layout import round_from_float64
    x = np.random.default_rng(3).standard_normal(1000) * 100
    np.testing.assert_array_equal(round_from_float64(x, np.float16), x.astype(np.float16))
    np.testing.assert_array_equal(round_from_float64(x, np.float32), x.astype(np.float32))
