"""The kernels' own description of the packed format (``kernels/_format.py``): the
host's split of packed rows agrees bit for bit with the oracle's layout."""

import numpy as np
import pytest

from cupy_dcp import pack_reference
from cupy_dcp.kernels._format import (BFLOAT16, LSE_HALF_BITS, LSE_HALF_MASK, bits_dtype,
                                      lse_lanes, lse_pack_dim, self_overlapping, split_packed)

DTYPES = [np.dtype(np.float16), BFLOAT16, np.dtype(np.float32)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_split_packed_inverts_the_reference_pack(dtype):
    rng = np.random.default_rng(3)
    out = rng.standard_normal((3, 4, 5)).astype(dtype)
    lse = rng.standard_normal((3, 4)).astype(np.float32)
    lse[0, 1], lse[2, 3] = -np.inf, np.nan
    send = pack_reference(out, lse, world_size=2)
    partials, lses = split_packed(send, head_dim=5)
    assert partials.dtype == dtype and partials.shape == (2, 3, 2, 5)
    bits = bits_dtype(dtype)
    expect = out.view(bits).reshape(3, 2, 2, 5).transpose(1, 0, 2, 3)
    assert np.array_equal(partials.view(bits), expect)
    assert lses.dtype == np.float32
    assert np.array_equal(lses.view(np.uint32),
                          lse.view(np.uint32).reshape(3, 2, 2).transpose(1, 0, 2))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lse_lanes_are_the_reference_pack_lanes(dtype):
    lse = np.array([[1.5, -np.inf, 3e38]], dtype=np.float32)
    out = np.zeros((1, 3, 2), dtype=dtype)
    send = pack_reference(out, lse, world_size=1)
    lanes = send.view(bits_dtype(dtype))[0, ..., 2:]
    assert lanes.shape[-1] == lse_pack_dim(dtype)
    assert np.array_equal(lse_lanes(lse.view(np.uint32), lse_pack_dim(dtype)), lanes)
    if lse_pack_dim(dtype) == 2:  # lane D the low half, lane D + 1 the high half
        word = lse.view(np.uint32)
        assert np.array_equal(lanes[..., 0], word & LSE_HALF_MASK)
        assert np.array_equal(lanes[..., 1], word >> LSE_HALF_BITS)


def test_split_packed_checks_the_width():
    with pytest.raises(ValueError, match=r"^recv's rows must have head_dim \+ 2 = 10 lanes "
                                         r"\(got shape \(2, 1, 3, 9\)\)$"):
        split_packed(np.zeros((2, 1, 3, 9), np.float16), head_dim=8)


@pytest.mark.parametrize("shape, strides, overlapping", [
    ((4, 2, 8), (32, 16, 2), False),           # C order
    ((4, 2, 8), (2, 8, 16), False),            # Fortran order
    ((4, 2, 8), (16, 64, 2), False),           # heads-major storage seen token-major
    ((4, 2, 8), (44, 22, 2), False),           # padded rows
    ((4, 2, 8), (-32, 16, 2), False),          # tokens reversed
    ((4, 1, 8), (16, 999, 2), False),          # an axis of one element imposes nothing
    ((0, 2, 8), (0, 0, 0), False),             # no element at all
    ((4, 2, 8), (0, 16, 2), True),             # broadcast tokens
    ((4, 2, 8), (32, 16, 0), True),            # broadcast values
    ((4, 2, 8), (32, 8, 2), True),             # heads that overlap half a row
    ((4, 2, 8), (16, 16, 2), True),            # tokens on top of heads
    ((3, 3), (4, 8), True),                    # element (2, 0) is element (0, 1)
    ((3, 2), (4, 6), True),                    # interleaved without a collision: refused too
], ids=["c", "fortran", "heads_major", "padded", "reversed", "extent_one", "empty",
        "broadcast_tokens", "broadcast_values", "half_rows", "tokens_on_heads", "colliding",
        "interleaved"])
def test_self_overlapping_judges_by_strides(shape, strides, overlapping):
    assert self_overlapping(shape, strides, 2) is overlapping


def test_buffers_of_more_rows_than_the_kernels_number_are_refused(monkeypatch):
    """The kernels number a buffer's rows [N, B, H/N] in 32 bits: the launchers refuse
    more (checked before any device work, so host arrays do here)."""
    from cupy_dcp.kernels import _specs, pack_send, unpack_combine

    monkeypatch.setattr(_specs, "MAX_ROWS", 15)
    x, lse = np.zeros((4, 4, 3), np.float32), np.zeros((4, 4), np.float32)
    send = np.zeros((2, 4, 2, 4), np.float32)  # 16 rows
    match = r"^send must hold at most 2\*\*32 - 1 rows \[N, B, H/N\] \(got 16\)"
    with pytest.raises(ValueError, match=match):
        pack_send(x, lse, send)
    with pytest.raises(ValueError, match=match.replace("send", "recv")):
        unpack_combine(send, np.zeros((4, 2, 3), np.float32))
    assert _specs.check_pack_args(x[:3], lse[:3], send[:, :3]).tokens == 3  # 12 rows pass
