"""lse_weighted_combine, the oracle, against cases worked out by hand."""

import math

import numpy as np
import pytest

from cupy_dcp import lse_weighted_combine
from cupy_dcp.layout import BFLOAT16


def _partials(n, b=2, h=3, d=4, seed=0):
    return np.random.default_rng(seed).standard_normal((n, b, h, d))


def _lses(values, b=2, h=3):
    """``[N, B, H]`` where shard r's LSE is ``values[r]`` everywhere."""
    return np.broadcast_to(np.asarray(values, dtype=np.float64)[:, None, None],
                           (len(values), b, h)).copy()


def test_equal_lses_give_the_mean():
    x = _partials(3)
    out, lse = lse_weighted_combine(x, _lses([5.0, 5.0, 5.0]), return_lse=True)
    np.testing.assert_allclose(out, x.mean(axis=0), rtol=1e-14)
    np.testing.assert_allclose(lse, 5.0 + math.log(3.0), rtol=1e-15)


def test_dominant_shard_wins_exactly():
    x = _partials(2)
    out, lse = lse_weighted_combine(x, _lses([0.0, -1000.0]), return_lse=True)
    np.testing.assert_array_equal(out, x[0])
    np.testing.assert_array_equal(lse, 0.0)


def test_return_lse_is_log_sum_exp():
    x = _partials(2)
    out, lse = lse_weighted_combine(x, _lses([0.0, math.log(3.0)]), return_lse=True)
    np.testing.assert_allclose(lse, math.log(4.0), rtol=1e-15)
    np.testing.assert_allclose(out, 0.25 * x[0] + 0.75 * x[1], rtol=1e-13)


def test_base_two_uses_exp2_and_log2():
    x = _partials(2)
    lses = _lses([1.0, 3.0])
    out, lse = lse_weighted_combine(x, lses, return_lse=True, is_lse_base_on_e=False)
    total = np.exp2(1.0) + np.exp2(3.0)
    np.testing.assert_allclose(lse, np.log2(total), rtol=1e-15)
    np.testing.assert_allclose(out, (2.0 * x[0] + 8.0 * x[1]) / total, rtol=1e-13)
    natural = lse_weighted_combine(x, lses)
    assert not np.allclose(natural, out), "base e and base 2 must weigh differently"


def test_single_shard_returns_input_and_its_lse():
    x = _partials(1).astype(np.float32)
    lses = np.random.default_rng(1).uniform(-50, 50, size=(1, 2, 3)).astype(np.float32)
    out, lse = lse_weighted_combine(x, lses, return_lse=True)
    np.testing.assert_array_equal(out, x[0])
    np.testing.assert_array_equal(lse, lses[0])


def test_nan_and_pos_inf_lses_are_ignored():
    x = _partials(3)
    out, lse = lse_weighted_combine(x, _lses([np.nan, np.inf, 2.0]), return_lse=True)
    np.testing.assert_array_equal(out, x[2])
    np.testing.assert_array_equal(lse, 2.0)


@pytest.mark.parametrize("empty", [-np.inf, np.nan, np.inf], ids=["-inf", "nan", "+inf"])
def test_all_shards_empty_gives_zero_and_neg_inf(empty):
    x = _partials(3)
    x[1] = np.nan
    x[2] = np.inf
    out, lse = lse_weighted_combine(x, _lses([empty, -np.inf, empty]), return_lse=True)
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(out, 0.0)
    np.testing.assert_array_equal(lse, -np.inf)


@pytest.mark.parametrize("lse_other", [-np.inf, -1000.0], ids=["empty", "underflow"])
@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["nan", "inf"])
def test_bad_partial_on_zero_weight_shard_adds_exactly_zero(lse_other, bad):
    x = _partials(2)
    x[1, 0, 1, 2] = bad
    out = lse_weighted_combine(x, _lses([0.0, lse_other]))
    np.testing.assert_array_equal(out, x[0])


@pytest.mark.parametrize("dtype, expected", [
    (np.float64, np.float64), (np.float32, np.float32),
    (np.float16, np.float32), (BFLOAT16, np.float32),
    (np.dtype(np.float64).newbyteorder(), np.float64),
    (np.dtype(np.float32).newbyteorder(), np.float32)],
    ids=["float64", "float32", "float16", "bfloat16", "float64-swapped", "float32-swapped"])
def test_result_dtype(dtype, expected):
    x = _partials(2).astype(dtype)
    out, lse = lse_weighted_combine(x, _lses([0.0, 1.0]), return_lse=True)
    assert out.dtype == expected
    assert lse.dtype == expected
    np.testing.assert_allclose(out, lse_weighted_combine(x.astype(np.float64), _lses([0.0, 1.0])),
                               rtol=1e-6)


def test_bfloat16_partials_are_read_as_values():
    x = np.full((2, 1, 1, 2), 1.5, dtype=BFLOAT16)
    np.testing.assert_array_equal(lse_weighted_combine(x, np.zeros((2, 1, 1))), 1.5)


_BAD_SHAPES = {
    "outputs-3d": (np.zeros((2, 3, 4)), np.zeros((2, 3)),
                   r"^outputs must be \[N, B, H, D\] \(got shape \(2, 3, 4\)\)$"),
    "outputs-5d": (np.zeros((1, 2, 3, 4, 5)), np.zeros((1, 2, 3)),
                   r"^outputs must be \[N, B, H, D\] \(got shape \(1, 2, 3, 4, 5\)\)$"),
    "lses-2d": (np.zeros((2, 3, 4, 5)), np.zeros((2, 3)),
                r"^lses must be \[N, B, H\] = \(2, 3, 4\) \(got shape \(2, 3\)\)$"),
    "lses-transposed": (np.zeros((2, 3, 4, 5)), np.zeros((2, 4, 3)),
                        r"^lses must be \[N, B, H\] = \(2, 3, 4\) \(got shape \(2, 4, 3\)\)$"),
}


@pytest.mark.parametrize("outputs, lses, message", _BAD_SHAPES.values(), ids=_BAD_SHAPES.keys())
def test_bad_shapes_raise(outputs, lses, message):
    with pytest.raises(ValueError, match=message):
        lse_weighted_combine(outputs, lses)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(outputs=np.zeros((0, 2, 3, 4)), lses=np.zeros((0, 2, 3))), ValueError,
     r"^outputs must hold at least one shard \(got shape \(0, 2, 3, 4\)\)$"),
    (dict(lses=np.zeros((2, 2, 3), np.int64)), TypeError,
     r"^lses must be a float array \(got dtype int64\)$"),
    (dict(is_lse_base_on_e=None), TypeError, r"^is_lse_base_on_e must be True or False \(got None\)$"),
    (dict(return_lse="no"), TypeError, r"^return_lse must be True or False \(got 'no'\)$"),
    (dict(outputs=np.zeros((2, 2, 3, 4), np.int32)), TypeError,
     r"^outputs must be a float array \(got dtype int32\)$"),
    (dict(outputs=np.zeros((2, 2, 3, 4), np.complex64)), TypeError,
     r"^outputs must be a float array \(got dtype complex64\)$"),
], ids=["no-shards", "integer-lses", "base-none", "return-lse-str", "integer-outputs",
        "complex-outputs"])
def test_bad_arguments_raise(kwargs, error, message):
    args = dict(outputs=np.zeros((2, 2, 3, 4)), lses=np.zeros((2, 2, 3)))
    args.update(kwargs)
    with pytest.raises(error, match=message):
        lse_weighted_combine(**args)


@pytest.mark.parametrize("level", [1e10, 1e17, 3e38, -3e38])
def test_the_reference_weighs_huge_lses_right(level):
    """Equal LSEs weigh their shards equally, however large: the weights are
    exp(l - m) / total (m + log(total) loses log(total) past about 4.5e15)."""
    outputs = np.ones((2, 1, 1, 1), np.float32)
    lses = np.full((2, 1, 1), level, np.float32)
    got, lse = lse_weighted_combine(outputs, lses, return_lse=True)
    assert got[0, 0, 0] == 1.0, got
    np.testing.assert_allclose(lse[0, 0], float(np.float32(level)) + math.log(2), rtol=1e-7)

