"""Checks of the CUDA kernels against the NumPy reference, shared by the
simulator suite (NumPy arrays stand for device arrays) and the GPU suite.

``to_device(host) -> device array`` and ``to_host(device) -> NumPy`` adapt the
checks to an array library.
"""

import ml_dtypes
import numpy as np

from cupy_dcp import lse_pack_dim, lse_weighted_combine, pack_reference
from cupy_dcp.kernels import pack_send, unpack_combine

from _helpers import ulp

DTYPES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32))


def make_inputs(rng, n, b, h, d, dtype, adversarial=True, lse_center=0.0, spread=5.0):
    """Random partials [N, B, H, D] and LSEs [N, B, H], with NaN/inf/empty patterns."""
    xs = rng.standard_normal((n, b, h, d)).astype(np.float32)
    ls = (lse_center + rng.uniform(-spread, spread, size=(n, b, h))).astype(np.float32)
    if adversarial and b > 0:
        ls[0, 0, 0] = np.nan                      # NaN from one rank
        if n > 1:
            ls[1, 0, 0] = np.inf                  # +inf from another
        ls[:, -1, h - 1] = -np.inf                # every shard empty
        xs[:, -1, h - 1] = np.nan                 # garbage partials in the empty row
        ls[n - 1, 0, h - 1] = -np.inf             # one empty shard with a NaN partial
        xs[n - 1, 0, h - 1] = np.nan
    return xs.astype(dtype), ls


def assert_combine_close(got, expect, xs, ls, dtype, base_e=True):
    """Within 1 ulp of ``dtype`` plus the float32 accumulation bound.

    The kernels accumulate in float32, so under cancellation (terms much larger
    than their sum), with float32 weights, the sum carries an error of up to 16 float32 ulps of
    ``sum_r w_r |x_r|`` before the final rounding; the float64 oracle does not.
    """
    magnitude = lse_weighted_combine(np.abs(xs.astype(np.float64)), ls, is_lse_base_on_e=base_e)
    tol = ulp(expect, dtype) + 16.0 * 2.0 ** -24 * magnitude
    err = np.abs(got - expect)
    bad = err > tol
    assert not bad.any(), (f"{int(bad.sum())} of {bad.size} outputs off; worst {err[bad].max():.3g} "
                           f"at reference {expect[bad][np.argmax(err[bad])]:.6g} ({dtype})")


def check_pack(to_device, to_host, dtype, n, b, h, d, rng, strided=False, lse_dtype=np.float32):
    """pack_send is bit-exact against pack_reference."""
    xs, ls = make_inputs(rng, 1, b, h, d, dtype)
    x, lse = xs[0], ls[0]
    if strided:  # a [H, B, D] storage seen as [B, H, D]
        dev_x = to_device(np.ascontiguousarray(x.transpose(1, 0, 2))).transpose(1, 0, 2)
    else:
        dev_x = to_device(x)
    send = to_device(np.zeros((n, b, h // n, d + lse_pack_dim(dtype)), dtype=dtype))
    pack_send(dev_x, to_device(lse.astype(lse_dtype)), send)
    expect = pack_reference(x, lse.astype(lse_dtype).astype(np.float32), n)
    got = to_host(send)
    bits = np.uint16 if dtype.itemsize == 2 else np.uint32
    np.testing.assert_array_equal(got.view(bits), expect.view(bits))


def check_combine(to_device, to_host, dtype, n, b, h, d, rng, base_e=True, head_major=False,
                  return_lse=True, lse_center=0.0, spread=5.0):
    """unpack_combine agrees with lse_weighted_combine within 1 ulp of the output dtype."""
    xs, ls = make_inputs(rng, n, b, h, d, dtype, lse_center=lse_center, spread=spread)
    recv = np.stack([pack_reference(xs[k], ls[k], 1)[0] for k in range(n)])
    expect, expect_lse = lse_weighted_combine(xs, ls, return_lse=True, is_lse_base_on_e=base_e)
    if head_major:
        out = to_device(np.zeros((h, b, d), dtype=dtype)).transpose(1, 0, 2)
    else:
        out = to_device(np.zeros((b, h, d), dtype=dtype))
    out_lse = to_device(np.zeros((b, h), dtype=np.float32)) if return_lse else None
    unpack_combine(to_device(recv), out, out_lse, is_lse_base_on_e=base_e)
    got = to_host(out).astype(np.float64)
    assert not np.isnan(got).any(), "NaN leaked into the output"
    assert_combine_close(got, expect, xs, ls, dtype, base_e)
    if return_lse:
        g = to_host(out_lse).astype(np.float64)
        finite = np.isfinite(expect_lse)
        np.testing.assert_array_equal(g[~finite], expect_lse[~finite])
        np.testing.assert_allclose(g[finite], expect_lse[finite], rtol=1e-6, atol=1e-5)


def check_agrs(to_device, to_host, dtype, n, b, hn, d, rng, base_e=True, head_major=False):
    """The AG+RS kernels, N ranks simulated: correct on every rank, sum the terms
    (what the reduce-scatter does), finish on rank 1; against the oracle."""
    from cupy_dcp.kernels import agrs_correct, agrs_finish

    h = n * hn
    xs, ls = make_inputs(rng, n, b, h, d, dtype)
    lses = to_device(np.ascontiguousarray(ls))
    terms = []
    for k in range(n):
        corrected = to_device(np.zeros((n, b, hn, d), dtype=np.float32))
        agrs_correct(to_device(xs[k]), lses, k, corrected, is_lse_base_on_e=base_e)
        terms.append(to_host(corrected).astype(np.float32))
    rank = min(1, n - 1)
    summed = np.zeros((b, hn, d), dtype=np.float32)
    for term in terms:  # float32 sums, as the float32 reduce-scatter makes them
        summed += term[rank]
    if head_major:
        out = to_device(np.zeros((hn, b, d), dtype=dtype)).transpose(1, 0, 2)
    else:
        out = to_device(np.zeros((b, hn, d), dtype=dtype))
    out_lse = to_device(np.zeros((b, hn), dtype=np.float32))
    agrs_finish(to_device(summed), lses, rank, out, out_lse, is_lse_base_on_e=base_e)
    expect, expect_lse = lse_weighted_combine(xs, ls, return_lse=True, is_lse_base_on_e=base_e)
    heads = slice(rank * hn, (rank + 1) * hn)
    got = to_host(out).astype(np.float64)
    assert not np.isnan(got).any(), "NaN leaked into the output"
    assert_combine_close(got, expect[:, heads], xs[:, :, heads], ls[:, :, heads], dtype, base_e)
    g = to_host(out_lse).astype(np.float64)
    ref = expect_lse[:, heads]
    np.testing.assert_array_equal(np.isneginf(g), np.isneginf(ref))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(g[finite], ref[finite], rtol=1e-6, atol=1e-5)


def check_combine_rounds_to_nearest_even(to_device, to_host, dtype, b, hn, d, rng):
    """Two shards of equal LSE: every weight is exactly 1/2, the float32 sum is exact,
    so the output must be that sum rounded to nearest even, bit for bit."""
    xs = rng.standard_normal((2, b, hn, d)).astype(np.float32).astype(dtype)
    ls = np.zeros((2, b, hn), dtype=np.float32)
    recv = np.stack([pack_reference(xs[k], ls[k], 1)[0] for k in range(2)])
    out = to_device(np.zeros((b, hn, d), dtype=dtype))
    unpack_combine(to_device(recv), out)
    exact = np.float32(0.5) * xs[0].astype(np.float32) + np.float32(0.5) * xs[1].astype(np.float32)
    bits = np.uint16 if dtype.itemsize == 2 else np.uint32
    np.testing.assert_array_equal(to_host(out).view(bits), exact.astype(dtype).view(bits))
