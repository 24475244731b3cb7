"""Checks of the CUDA kernels against the NumPy reference, shared by the
simulator suite (NumPy arrays stand for device arrays) and the GPU suite.

``to_device(host) -> device array`` and ``to_host(device) -> NumPy`` adapt the
checks to an array library.
"""

import ml_dtypes
import numpy as np
from numba import cuda

from cupy_dcp import lse_pack_dim, lse_weighted_combine, pack_reference
from cupy_dcp.layout import bits_dtype
from cupy_dcp.kernels import pack_send, unpack_combine

from _helpers import host_bf16_rounding, ulp

DTYPES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32))


def make_inputs(rng, n, b, h, d, dtype, adversarial=True, lse_center=0.0, spread=5.0):
    """Random partials [N, B, H, D] and LSEs [N, B, H], with NaN/inf/empty patterns; where
    B and H exceed 1, the last token's head 0 is a live row whose partials hold +inf (and
    -inf where D > 1), which the output must carry."""
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
        if b > 1 and h > 1 and spread <= 40.0:    # a live row (weights far from 0) with infinities
            xs[0, -1, 0, 0] = np.inf
            if d > 1:
                xs[n - 1, -1, 0, d - 1] = -np.inf
    return xs.astype(dtype), ls


def assert_combine_close(got, expect, xs, ls, dtype, base_e=True):
    """Within 1 ulp of ``dtype`` plus the float32 accumulation bound.

    The kernels accumulate in float32, so under cancellation (terms much larger
    than their sum), with float32 weights, the sum carries an error of up to 16 float32 ulps of
    ``sum_r w_r |x_r|`` before the final rounding; the float64 oracle does not.
    """
    finite = np.isfinite(expect)  # an infinite (or NaN) reference: the same value exactly
    np.testing.assert_array_equal(got[~finite], expect[~finite], err_msg="non-finite outputs")
    assert np.isfinite(got[finite]).all(), f"{int((~np.isfinite(got[finite])).sum())} " \
        "outputs not finite where the reference is"
    magnitude = lse_weighted_combine(np.abs(xs.astype(np.float64)), ls, is_lse_base_on_e=base_e)
    tol = ulp(expect, dtype) + 16.0 * 2.0 ** -24 * magnitude
    got, expect, tol = got[finite], expect[finite], tol[finite]
    err = np.abs(got - expect)
    bad = err > tol
    assert not bad.any(), (f"{int(bad.sum())} of {bad.size} outputs off; worst {err[bad].max():.3g} "
                           f"at reference {expect[bad][np.argmax(err[bad])]:.6g} ({dtype})")


PACK_LAYOUTS = ("heads_major", "every_other", "tokens_reversed")


def pack_mask(b):
    """``(seq_lens, query_start_loc)`` of ``b >= 3`` tokens, int64, and the ``[B]`` bool
    of the tokens they leave empty: padding at both ends (token 0 and the last), a
    sequence of no KV (every third from the second), the rest of length 1."""
    from _helpers import row_mask

    seqs = b - 2
    seq_lens = np.where(np.arange(seqs) % 3 == 1, 0, 1).astype(np.int64)
    qsl = np.arange(1, seqs + 2, dtype=np.int64)
    return seq_lens, qsl, row_mask(b, seq_lens, qsl)


def input_in_layout(to_device, x, strided):
    """``x [B, H, D]`` on the device in layout ``strided`` (see :func:`check_pack`)."""
    if strided is True or strided == "heads_major":
        return to_device(np.ascontiguousarray(x.transpose(1, 0, 2))).transpose(1, 0, 2)
    if strided == "every_other":
        wide = np.zeros(x.shape[:2] + (2 * x.shape[2],), dtype=x.dtype)
        wide[:, :, ::2] = x
        return to_device(wide)[:, :, ::2]
    if strided == "tokens_reversed":
        return to_device(np.ascontiguousarray(x[::-1]))[::-1]
    if strided == "fortran":  # memory of its own in Fortran order
        return to_device(np.asfortranarray(x))
    if strided:
        raise ValueError(f"unknown layout {strided!r}")
    return to_device(x)


def check_pack_by_tokens(to_device, to_host, dtype, n, b, h, d, rng, strided=False,
                         masked=False, signed=False, self_rank=-1, block_tokens=(1,)):
    """The pack a block row per token (``_pack_tokens``), its staged twin where rows
    are words, both with each of ``block_tokens`` tokens a block (a warp a token: rows
    that fit one), and the pack of ``pack``'s kernels, each asked for by
    ``pack_launch(..., tokens=, staged=, block_tokens=)``, write the same bits:
    ``pack_reference``'s rows (chunk ``self_rank`` into the receive buffer, the others
    into the send buffer, nothing else written but a plan's trailer) and, ``signed``,
    the same trailer words and call numbers. ``strided``: ``False`` or ``"heads_major"``
    (rows read through a flat view, as this kernel requires)."""
    from cupy_dcp.kernels._arrays import dummy_index, kernel_array
    from cupy_dcp.kernels._pack_tokens import can_load_quads, fits_a_warp
    from cupy_dcp.kernels._rows import lanes_per_row
    from cupy_dcp.kernels._trailer import trailer_rows
    from cupy_dcp.kernels.pack import pack_launch

    xs, ls = make_inputs(rng, 1, b, h, d, dtype)
    x, lse = xs[0], ls[0]
    dev_x, dev_lse = input_in_layout(to_device, x, strided), to_device(lse)
    bits = bits_dtype(dtype)
    width = d + lse_pack_dim(dtype)
    rows = b + (trailer_rows(h // n, width, bits.itemsize) if signed else 0)
    mask, index = None, (dummy_index(), dummy_index(), -1)
    if masked:
        seq_lens, qsl, mask = pack_mask(b)
        index = (kernel_array(to_device(seq_lens), np.int64),
                 kernel_array(to_device(qsl), np.int64), len(seq_lens))
    signature = to_device(np.array([0x5DC97A11, 0, h, d, 2, 1, 0, 0], np.int64))
    expect = pack_reference(x, lse, n, mask=mask).view(bits)
    ways = [dict(tokens=False), dict(tokens=True, staged=False, block_tokens=1)]
    moved = kernel_array(dev_x, bits)  # as pack_launch moves it: words where it can
    if np.dtype(dtype).itemsize == 4 or d % 2 == 0:  # rows of words: through shared memory
        ways.append(dict(tokens=True, staged=True, quad_loads=False, block_tokens=1))
        moved = moved.as_words() if bits.itemsize == 2 else moved
        if can_load_quads(moved):  # rows of quads: read as quads too
            ways.append(dict(tokens=True, staged=True, quad_loads=True, block_tokens=1))
    together = [t for t in block_tokens if t > 1]
    if together:  # several tokens a block: rows that fit a warp, tokens a multiple
        assert fits_a_warp(h // n, lanes_per_row(moved.shape[2])), "rows past a warp"
        assert all(b % t == 0 for t in together), "tokens not a multiple"
        ways = ways[:1] + [dict(way, block_tokens=t) for t in block_tokens for way in ways[1:]]
    got = []
    for way in ways:
        send = to_device(np.zeros((n, rows, h // n, width), bits))
        recv = to_device(np.zeros((n, rows, h // n, width), bits))
        state = to_device(np.array([41, 0], np.int64))
        sign = (kernel_array(signature, np.int64), kernel_array(state, np.int64)) \
            if signed else None
        kernel, grid, block, args = pack_launch(
            kernel_array(dev_x, bits), kernel_array(dev_lse, np.uint32), *index,
            kernel_array(send, bits), kernel_array(recv, bits), self_rank, sign, **way)
        kernel(grid, block, 0, args)
        got.append((to_host(send), to_host(recv), to_host(state)))
        send, recv, state = got[-1]
        for r in range(n):
            np.testing.assert_array_equal((recv if r == self_rank else send)[r, :b], expect[r])
            assert not (send if r == self_rank else recv)[r].any(), (way, r)
        assert state.tolist() == ([41, 41] if signed else [41, 0]), way
    for other in got[1:]:
        for mine, theirs in zip(got[0], other):
            np.testing.assert_array_equal(mine, theirs)


def check_pack(to_device, to_host, dtype, n, b, h, d, rng, strided=False, lse_dtype=np.float32,
               masked=False):
    """pack_send is bit-exact against pack_reference. ``strided``: the input's layout,
    one of :data:`PACK_LAYOUTS` (``True``: the first): a [H, B, D] storage seen as
    [B, H, D] (rows unit-stride: read through a flat view), every other element of a
    [B, H, 2D] storage, and a token axis of negative stride (both read through the
    strides), or (``"fortran"``) an array of its own in Fortran order. ``masked``: with
    ``seq_lens`` and ``query_start_loc`` (:func:`pack_mask`),
    whose empty tokens carry -inf."""
    xs, ls = make_inputs(rng, 1, b, h, d, dtype)
    x, lse = xs[0], ls[0]
    dev_x = input_in_layout(to_device, x, strided)
    send = to_device(np.zeros((n, b, h // n, d + lse_pack_dim(dtype)), dtype=dtype))
    mask, kwargs = None, {}
    if masked:
        seq_lens, qsl, mask = pack_mask(b)
        kwargs = dict(seq_lens=to_device(seq_lens), query_start_loc=to_device(qsl))
        assert mask.any() and not mask.all(), "the mask leaves some tokens and not others"
    pack_send(dev_x, to_device(lse.astype(lse_dtype)), send, **kwargs)
    expect = pack_reference(x, lse.astype(lse_dtype).astype(np.float32), n, mask=mask)
    got = to_host(send)
    bits = bits_dtype(dtype)
    np.testing.assert_array_equal(got.view(bits), expect.view(bits))


def at_word(to_device, shape, dtype, words):
    """A zeroed device array of ``shape`` and ``dtype`` that starts ``words`` 4-byte words
    past a 16-byte boundary."""
    from cupy_dcp.kernels._arrays import kernel_array

    size, item = int(np.prod(shape)), np.dtype(dtype).itemsize
    storage = to_device(np.zeros(size + 16, dtype))
    skip = (-kernel_array(storage, bits_dtype(dtype)).ptr) % 16
    start = (skip + 4 * words) // item
    return storage[start:start + size].reshape(shape)


def check_pack_quads(to_device, to_host, dtype, n, b, h, d, rng):
    """The pack stores rows of words (float32 values, pairs of 16-bit ones) of more
    than one step as aligned 16-byte quads where the input and the send buffer both
    start 16-byte aligned (``pack.quad_rows``), and a word at a time where either
    starts 4 to 12 bytes past or the rows are shorter; 16-bit data of an odd ``d``
    goes value by value. Bit-exact every way, with a mask and without: over ``b * h``
    rows of ``d`` + 1 words, each lead (the words before a row's first 16-byte
    boundary) from 0 to 3 comes up."""
    from cupy_dcp.kernels import pack

    xs, ls = make_inputs(rng, 1, b, h, d, dtype)
    x, lse = xs[0], ls[0]
    bits = bits_dtype(dtype)
    quads = (dtype.itemsize == 4 or d % 2 == 0) and \
        pack.wide_rows(d if dtype.itemsize == 4 else d // 2)
    picked, quad_rows = [], pack.quad_rows

    def spy(*arrays):
        picked.append(quad_rows(*arrays))
        return picked[-1]

    pack.quad_rows = spy
    try:
        for x_at, send_at in ((0, 0), (1, 0), (0, 2), (3, 1)):
            for masked in (False, True):
                dev_x = at_word(to_device, x.shape, dtype, x_at)
                dev_x[...] = to_device(x)
                send = at_word(to_device, (n, b, h // n, d + lse_pack_dim(dtype)), dtype,
                                send_at)
                mask, kwargs = None, {}
                if masked:
                    seq_lens, qsl, mask = pack_mask(b)
                    kwargs = dict(seq_lens=to_device(seq_lens), query_start_loc=to_device(qsl))
                picked.clear()
                pack_send(dev_x, to_device(lse), send, **kwargs)
                expect = pack_reference(x, lse, n, mask=mask)
                np.testing.assert_array_equal(to_host(send).view(bits), expect.view(bits))
                # (rows of one step may go a block row per token, never asking about quads)
                took = picked[-1] if picked else False
                assert took == (quads and x_at == send_at == 0), (x_at, send_at)
    finally:
        pack.quad_rows = quad_rows


def check_combine(to_device, to_host, dtype, n, b, h, d, rng, base_e=True, head_major=False,
                  return_lse=True, lse_center=0.0, spread=5.0, fortran=False):
    """unpack_combine agrees with lse_weighted_combine within 1 ulp of the output dtype;
    ``fortran``: the output is an array of its own in Fortran order."""
    xs, ls = make_inputs(rng, n, b, h, d, dtype, lse_center=lse_center, spread=spread)
    recv = np.stack([pack_reference(xs[k], ls[k], 1)[0] for k in range(n)])
    expect, expect_lse = lse_weighted_combine(xs, ls, return_lse=True, is_lse_base_on_e=base_e)
    if head_major:
        out = to_device(np.zeros((h, b, d), dtype=dtype)).transpose(1, 0, 2)
    elif fortran:
        out = to_device(np.zeros((b, h, d), dtype=dtype, order="F"))
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


def stream_every_agrs_launch(monkeypatch):
    """Every AG+RS launch takes its shape for many rows (``correct_shape``,
    ``finish_shape``), however few its rows."""
    from cupy_dcp.kernels import agrs

    monkeypatch.setattr(agrs, "CORRECT_STREAMS", 0)
    monkeypatch.setattr(agrs, "FINISH_STREAMS", 0)


def check_agrs(to_device, to_host, dtype, n, b, hn, d, rng, base_e=True, head_major=False,
               lse_center=0.0, spread=5.0, strided=False):
    """The AG+RS kernels, N ranks simulated: correct on every rank, sum the terms (what
    the reduce-scatter does), finish on every rank; each rank's heads against the oracle.
    ``strided``: the partials in a layout of :func:`input_in_layout`."""
    from cupy_dcp.kernels import agrs_correct, agrs_finish

    h = n * hn
    xs, ls = make_inputs(rng, n, b, h, d, dtype, lse_center=lse_center, spread=spread)
    lses = to_device(np.ascontiguousarray(ls))
    terms = []
    for k in range(n):
        corrected = to_device(np.zeros((n, b, hn, d), dtype=np.float32))
        agrs_correct(input_in_layout(to_device, xs[k], strided), lses, k, corrected,
                     is_lse_base_on_e=base_e)
        terms.append(to_host(corrected).astype(np.float32))
    expect, expect_lse = lse_weighted_combine(xs, ls, return_lse=True, is_lse_base_on_e=base_e)
    for rank in range(n):
        summed = np.zeros((b, hn, d), dtype=np.float32)
        for term in terms:  # float32 sums, as the float32 reduce-scatter makes them
            summed += term[rank]
        if head_major:
            out = to_device(np.zeros((hn, b, d), dtype=dtype)).transpose(1, 0, 2)
        else:
            out = to_device(np.zeros((b, hn, d), dtype=dtype))
        out_lse = to_device(np.zeros((b, hn), dtype=np.float32))
        agrs_finish(to_device(summed), lses, rank, out, out_lse, is_lse_base_on_e=base_e)
        heads = slice(rank * hn, (rank + 1) * hn)
        got = to_host(out).astype(np.float64)
        assert not np.isnan(got).any(), f"NaN leaked into rank {rank}'s output"
        assert_combine_close(got, expect[:, heads], xs[:, :, heads], ls[:, :, heads], dtype,
                             base_e)
        g = to_host(out_lse).astype(np.float64)
        ref = expect_lse[:, heads]
        np.testing.assert_array_equal(np.isneginf(g), np.isneginf(ref))
        finite = np.isfinite(ref)
        np.testing.assert_allclose(g[finite], ref[finite], rtol=1e-6, atol=1e-5)


def aligned_zeros(shape, dtype):
    """Host zeros of ``shape`` whose first element is 16-byte aligned."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(size + 16, np.uint8)
    lead = -raw.ctypes.data % 16
    return raw[lead:lead + size].view(dtype).reshape(shape)


def check_finish_flat_is_rows(to_device, to_host, dtype, n, b, hn, d, rng):
    """The flat finish (a C-contiguous output of a multiple of four values) and the rows'
    (a strided one) write the same output bits and the same LSE bits from the same sums:
    values across float32's range with ties, subnormals, overflow, zeros of both signs,
    infinities and NaN; LSEs of empty, NaN and +inf shards; N past what the kernels
    hold."""
    from cupy_dcp.kernels import agrs, agrs_finish
    from cupy_dcp.kernels._arrays import kernel_array

    sums = (rng.standard_normal((b, hn, d)) * 10.0 ** rng.integers(-40, 39, (b, hn, d)))
    with np.errstate(over="ignore"):  # past float32's range to inf: meant
        sums = sums.astype(np.float32)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-40, 3.4e38, 65520.0,
                         65519.0, 1.00390625, 1.01171875, -2.0 ** -24, 2.0 ** -25], np.float32)
    at = rng.choice(sums.size, min(sums.size, 4 * specials.size), replace=False)
    sums.reshape(-1)[at] = np.resize(specials, at.size)
    summed = aligned_zeros(sums.shape, np.float32)
    summed[...] = sums
    _, ls = make_inputs(rng, n, b, n * hn, 1, np.float32, spread=40.0)
    lses, summed = to_device(np.ascontiguousarray(ls)), to_device(summed)
    rank = n - 1
    got = []
    for strided in (False, True):
        out = to_device(aligned_zeros((b, hn, d + 3 if strided else d), dtype))[..., :d]
        out_lse = to_device(np.full((b, hn), 7.0, np.float32))
        kernel = agrs.finish_launch(
            dtype, kernel_array(summed, np.float32), kernel_array(lses, np.float32), rank,
            True, kernel_array(out, agrs.combine_codec(dtype)[1]))[0]
        flat = not strided and b * hn * d % 4 == 0  # else both take the rows
        assert (kernel is agrs.flat_finish_kernel(dtype)) == flat, strided
        agrs_finish(summed, lses, rank, out, out_lse)
        got.append((to_host(out).view(bits_dtype(dtype)), to_host(out_lse).view(np.uint32)))
    (flat, flat_lse), (rows, rows_lse) = got
    np.testing.assert_array_equal(flat, rows)
    np.testing.assert_array_equal(flat_lse, rows_lse)


def check_correct_vectors_is_rows(to_device, to_host, dtype, n, b, hn, d, rng):
    """The correction that moves whole quads (aligned rows: contiguous, or padded by
    16 bytes) and the rows' (the same values through rows padded by one value) write
    the same float32 bits: partials with NaN, infinities, zeros of both signs and
    subnormals; LSEs of empty, NaN and +inf shards; N past what the kernels hold."""
    from cupy_dcp.kernels import agrs, agrs_correct
    from cupy_dcp.kernels._arrays import kernel_array

    h = n * hn
    xs, ls = make_inputs(rng, n, b, h, d, dtype, spread=40.0)
    x = xs[n - 1].astype(np.float32)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 6e4], np.float32)
    at = rng.choice(x.size, min(x.size, 3 * specials.size), replace=False)
    x.reshape(-1)[at] = np.resize(specials, at.size)
    x = x.astype(dtype)
    lses = to_device(np.ascontiguousarray(ls))
    value = agrs.combine_codec(dtype)[1]
    got = []
    for pad in (0, 8, 1):  # contiguous, rows padded to keep 16-byte alignment, and not
        strided = pad % 8 != 0
        host = aligned_zeros((b, h, d + pad), dtype)
        host[..., :d] = x
        data = to_device(host)[..., :d]
        corrected = to_device(aligned_zeros((n, b, hn, d), np.float32))
        kernel = agrs.correct_launch(dtype, kernel_array(data, value),
                                     kernel_array(lses, np.float32), n - 1, True,
                                     kernel_array(corrected, np.float32))[0]
        vectors = kernel._dispatcher.py_func.__name__ == "correct_vectors"
        assert vectors == (not strided and d % 4 == 0), (strided, d)
        agrs_correct(data, lses, n - 1, corrected)
        got.append(to_host(corrected).view(np.uint32))
    np.testing.assert_array_equal(got[0], got[2])
    np.testing.assert_array_equal(got[1], got[2])


def check_copy_floor(to_device, to_host, read_bytes, written_bytes, quads, grid, block):
    """The kernel bench's copy floor built for ``quads`` in flight: dst quad q is the XOR
    of src quads q, q + Q, ... (Q = dst's quads), zeros past src; a plain copy where
    src is no longer than dst."""
    from cupy_dcp._floors import copy_kernel, quad_words
    from cupy_dcp.kernels._arrays import kernel_array

    rng = np.random.default_rng(read_bytes + written_bytes + quads)
    src = rng.integers(0, 2**32, quad_words(read_bytes), dtype=np.uint32)
    dst = to_device(np.full(quad_words(written_bytes), 0xDEADBEEF, dtype=np.uint32))
    copy_kernel(quads)(grid, block, 0, (kernel_array(to_device(src), np.uint32),
                                        kernel_array(dst, np.uint32)))
    got = to_host(dst)
    expect = np.zeros((got.size // 4, 4), dtype=np.uint32)
    for q in range(expect.shape[0]):
        for s in range(q, src.size // 4, expect.shape[0]):
            expect[q] ^= src[4 * s:4 * s + 4]
    np.testing.assert_array_equal(got, expect.reshape(-1))
    if src.size <= got.size:
        np.testing.assert_array_equal(got[:src.size], src)


def check_combine_rounds_to_nearest_even(to_device, to_host, dtype, b, hn, d, rng):
    """Two shards of equal LSE: every weight is exactly 1/2, the float32 sum is exact,
    so the output must be that sum rounded to nearest even, bit for bit."""
    xs = rng.standard_normal((2, b, hn, d)).astype(np.float32).astype(dtype)
    ls = np.zeros((2, b, hn), dtype=np.float32)
    recv = np.stack([pack_reference(xs[k], ls[k], 1)[0] for k in range(2)])
    out = to_device(np.zeros((b, hn, d), dtype=dtype))
    unpack_combine(to_device(recv), out)
    exact = np.float32(0.5) * xs[0].astype(np.float32) + np.float32(0.5) * xs[1].astype(np.float32)
    bits = bits_dtype(dtype)
    np.testing.assert_array_equal(to_host(out).view(bits), exact.astype(dtype).view(bits))


def _pack_bf16x2_kernel():
    """A kernel that packs ``low[i]`` and ``high[i]`` into ``out[i]``
    (``pack_bf16x2``); ``cuda`` a global, for the simulator to swap."""
    from cupy_dcp.kernels._device import device_functions

    pack = device_functions()["pack_bf16x2"]

    @cuda.jit
    def kernel(low, high, out):
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if i < out.shape[0]:
            out[i] = pack(low[i], high[i])

    return kernel


def check_pack_bf16x2(to_device, to_host, rng):
    """``pack_bf16x2`` (a ``cvt.rn.bf16x2.f32`` when compiled) against the kernels'
    integer rounding and ml_dtypes' on every kind of float32 a sum can be: random
    bits, ties (to even), subnormals, the largest finite values (up to inf), ±0,
    ±inf and the canonical NaN (the only NaN a GPU's float32 arithmetic gives)."""
    kernel = _pack_bf16x2_kernel()
    special = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FFFFFFF, 1, 0x807FFFFF, 0x3F808000,
               0x3F818000, 0x3F80FFFF, 0x3F807FFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF]
    bits = np.concatenate([rng.integers(0, 2**32, 2048, dtype=np.uint64).astype(np.uint32),
                           np.array(special, np.uint32)])
    bits[(bits & 0x7FFFFFFF) > 0x7F800000] = 0x7FFFFFFF  # every NaN the canonical one
    low, high = bits, bits[::-1].copy()
    out = to_device(np.zeros(bits.size, np.uint32))
    kernel[(bits.size + 127) // 128, 128](to_device(low.view(np.float32)),
                                         to_device(high.view(np.float32)), out)
    got = to_host(out)

    integer = host_bf16_rounding()  # the other kernels' (f32_to_bf16_bits), on the host
    np.testing.assert_array_equal(got, integer(low).astype(np.uint32)
                                  | (integer(high).astype(np.uint32) << 16))
    finite = (bits & 0x7FFFFFFF) <= 0x7F800000
    by_ml = low.view(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal((got & 0xFFFF)[finite], by_ml[finite])
    assert (got & 0xFFFF)[~finite].tolist() == [0x7FFF] * int((~finite).sum())


def _aligned_zeros(shape, dtype, alignment):
    """Zeros whose first byte is ``alignment``-aligned (a host array's may not be)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(nbytes + alignment, np.uint8)
    skip = -raw.ctypes.data % alignment
    return raw[skip:skip + nbytes].view(dtype).reshape(shape)


class DirectRanks:
    """The direct kernel of N ranks in one process: their windows, flags, states and
    statuses. ``push`` and ``combine`` run one rank's call a phase at a time, so that
    every rank's push can run before any rank's combine (the order the flags impose
    across GPUs) where the ranks cannot run at once (the CUDA simulator); ``call``
    runs the whole call on a stream, for ranks whose kernels run concurrently."""

    def __init__(self, to_device, dtype, n, max_tokens, h, d, timeout_ns=10**9, max_blocks=3,
                 warps=2, ll_rows=None, line_rows=0):
        from cupy_dcp.kernels._arrays import kernel_array
        from cupy_dcp.kernels.direct import STATE_WORDS, window_layout
        from cupy_dcp.layout import bits_dtype

        self.to_device, self.dtype, self.n, self.h, self.d = to_device, dtype, n, h, d
        self.bits = bits_dtype(dtype)
        self.timeout_ns, self.max_blocks, self.warps = timeout_ns, max_blocks, warps
        width = d + lse_pack_dim(dtype)
        # the plan's layout (ll_rows, line_rows None: as the plan sizes them), each part
        # its own array
        layout = window_layout(n, max_tokens, h // n, width, self.bits.itemsize, ll_rows,
                               line_rows)
        self.owners = [to_device(np.zeros(layout.padded_slots_shape, self.bits)) for _ in range(n)]
        rows = [w[..., :width] for w in self.owners]  # the plan's padded rows
        self.flag_owners = [to_device(np.zeros(layout.flag_words, np.int64)) for _ in range(n)]
        self.state_owners = [to_device(np.zeros(STATE_WORDS, np.int64)) for _ in range(n)]
        self.status_owners = [to_device(np.zeros(n, np.int64)) for _ in range(n)]
        self.ll_owners = [to_device(np.zeros(layout.ll_shape, np.uint64)) for _ in range(n)]
        self.lls = tuple(kernel_array(w, np.uint64) for w in self.ll_owners)
        self.line_owners = [to_device(_aligned_zeros(layout.line_shape, np.uint64, 128))
                            for _ in range(n)]
        self.lines = tuple(kernel_array(w, np.uint64) for w in self.line_owners)
        self.windows = tuple(kernel_array(w, self.bits) for w in rows)
        self.flags = tuple(kernel_array(f, np.int64) for f in self.flag_owners)
        self.states = [kernel_array(s, np.int64) for s in self.state_owners]
        self.statuses = [kernel_array(s, np.int64) for s in self.status_owners]
        self.extra_blocks = 0  # launched beyond the call's grid: blocks without a tile
        self.paths = []  # each call's Protocol

    def _mask(self, mask):
        from cupy_dcp.kernels._arrays import dummy_index, kernel_array

        if mask is None:
            return dummy_index(), dummy_index(), -1
        seq, qsl = mask
        return (kernel_array(self.to_device(seq), np.int64), kernel_array(self.to_device(qsl), np.int64),
                len(seq))

    def call(self, r, x, lse, out=None, out_lse=None, mask=None, base_e=True, phases=None,
             stream=None):
        """Rank r's call (``phases``: both by default) on ``stream``."""
        from cupy_dcp.kernels._arrays import kernel_array, stream_ptr
        from cupy_dcp.kernels._rows import WARP
        from cupy_dcp.kernels.direct import COMBINE, PUSH, direct_launch, region_grid

        phases = PUSH | COMBINE if phases is None else phases
        kernel, grid, block, args = direct_launch(
            self.dtype, kernel_array(x, self.bits), kernel_array(lse, np.float32),
            *self._mask(mask), self.windows, self.flags, self.lls, self.states[r],
            self.statuses[r],
            None if out is None else kernel_array(out, self.bits),
            None if out_lse is None else kernel_array(out_lse, np.float32), base_e, r,
            self.timeout_ns, self.max_blocks, phases, self.warps, lines=self.lines)
        self.last_args = args
        rows = x.shape[0] * self.windows[r].shape[3]  # the grid direct_launch cut
        self.paths.append(region_grid(len(self.windows), rows, self.lls[r].shape,
                                      self.lines[r].shape, self.max_blocks,
                                      threads=WARP * self.warps).protocol)
        kernel((grid[0] + self.extra_blocks,), block, stream_ptr(stream), args)

    def push(self, r, x, lse, mask=None):
        from cupy_dcp.kernels.direct import PUSH
        self.call(r, x, lse, mask=mask, phases=PUSH)

    def combine(self, r, x, lse, out, out_lse=None, mask=None, base_e=True):
        from cupy_dcp.kernels.direct import COMBINE
        self.call(r, x, lse, out, out_lse, mask, base_e, COMBINE)


def _mask_lses(ls, seq_lens, qsl):
    """The LSEs the kernels see under per-rank masks: -inf for empty and padding tokens."""
    ls = ls.copy()
    for r, seq in enumerate(seq_lens):
        for t in range(ls.shape[1]):
            s = np.searchsorted(qsl, t, side="right") - 1
            if t < qsl[0] or t >= qsl[-1] or seq[s] == 0:
                ls[r, t] = -np.inf
    return ls


def check_direct(to_device, to_host, dtype, n, tokens, h, d, rng, base_e=True, head_major=False,
                 strided_input=False, masks=False, streams=None, sync=None, max_blocks=3,
                 warps=2, ll_rows=None, epoch=0, line_rows=0):
    """Calls of the direct kernel (one per entry of ``tokens``: B may change between
    calls, the slots alternate) against the oracle, on every rank: a phase at a
    time, or with ``streams`` (one per rank) whole calls running concurrently
    (``sync()`` waits for all the device's work). Calls of no more than ``ll_rows``
    rows per rank pair go word by word (``None``: as many as the plan's), then
    those of no more than ``line_rows`` in lines (``None``: as the plan's; 0:
    none; a tile in lines needs few enough rows, too: ``max_blocks``). ``epoch``:
    the calls the ranks' plans are taken to have made before. Returns the set of
    the paths the calls took (their ``Protocol``)."""
    hn = h // n
    ranks = DirectRanks(to_device, dtype, n, max(tokens), h, d, max_blocks=max_blocks,
                        warps=warps, ll_rows=ll_rows, line_rows=line_rows)
    if epoch:
        for r in range(n):
            ranks.state_owners[r][...] = to_device(np.array([epoch, 0, 0, 0], dtype=np.int64))
    for b in tokens:
        xs, ls = make_inputs(rng, n, b, h, d, dtype)
        mask = [None] * n
        seen = ls
        if masks and b > 2:
            qsl = np.array([0, 1, b - 1], dtype=np.int64)  # token b-1 is padding
            seqs = [np.array([0 if r == 0 else 3, 5], dtype=np.int64) for r in range(n)]
            # on the device now: a kernel on another stream must not race their upload
            mask = [(to_device(seqs[r]), to_device(qsl)) for r in range(n)]
            seen = _mask_lses(ls, seqs, qsl)
        if strided_input:  # [H, B, D] storage seen as [B, H, D]
            xd = [to_device(np.ascontiguousarray(xs[r].transpose(1, 0, 2))).transpose(1, 0, 2)
                  for r in range(n)]
        else:
            xd = [to_device(xs[r]) for r in range(n)]
        ld = [to_device(ls[r]) for r in range(n)]
        outs, out_lses = [], []
        for r in range(n):
            if head_major:
                outs.append(to_device(np.zeros((hn, b, d), dtype=dtype)).transpose(1, 0, 2))
            else:
                outs.append(to_device(np.zeros((b, hn, d), dtype=dtype)))
            out_lses.append(to_device(np.zeros((b, hn), dtype=np.float32)))
        if streams is None:
            for r in range(n):
                ranks.push(r, xd[r], ld[r], mask[r])
            for r in range(n):
                ranks.combine(r, xd[r], ld[r], outs[r], out_lses[r], mask[r], base_e)
        else:
            sync()  # the inputs are ready before any rank's call
            for r in range(n):
                ranks.call(r, xd[r], ld[r], outs[r], out_lses[r], mask[r], base_e,
                           stream=streams[r])
            sync()
        expect, expect_lse = lse_weighted_combine(xs, seen, return_lse=True, is_lse_base_on_e=base_e)
        for r in range(n):
            heads = slice(r * hn, (r + 1) * hn)
            got = to_host(outs[r]).astype(np.float64)
            assert not np.isnan(got).any(), f"NaN leaked into rank {r}'s output (B={b})"
            assert_combine_close(got, expect[:, heads], xs[:, :, heads], seen[:, :, heads], dtype, base_e)
            g = to_host(out_lses[r]).astype(np.float64)
            ref = expect_lse[:, heads]
            np.testing.assert_array_equal(np.isneginf(g), np.isneginf(ref))
            finite = np.isfinite(ref)
            np.testing.assert_allclose(g[finite], ref[finite], rtol=1e-6, atol=1e-5)
    for r in range(n):
        state = to_host(ranks.state_owners[r])
        assert state[0] == epoch + len(tokens) and state[1] == 0 and state[2] == 0, state
        assert not to_host(ranks.status_owners[r]).any()
        # every word sent word by word was consumed (zeroed) by its reader
        assert not to_host(ranks.ll_owners[r]).any(), f"rank {r}: words left unconsumed"
    return set(ranks.paths)


def check_direct_quads(to_device, to_host, dtype, rng, b, d, pad=0, offset=0):
    """One direct call in tiles on two ranks whose inputs are rows of ``d`` elements at
    ``offset`` in rows of ``d + pad``: exact against the oracle. Returns whether the
    pushes moved 16-byte quads (they may only where every row is aligned for them)."""
    from cupy_dcp import lse_weighted_combine

    n, h = 2, 4
    hn = h // n
    ranks = DirectRanks(to_device, dtype, n, b, h, d, ll_rows=0)
    xs, ls = make_inputs(rng, n, b, h, d, dtype)
    xd = []
    for r in range(n):
        wide = np.zeros((b, h, d + pad), dtype)
        wide[..., offset:offset + d] = xs[r]
        xd.append(to_device(wide)[..., offset:offset + d])
    ld = [to_device(ls[r]) for r in range(n)]
    outs = [to_device(np.zeros((b, hn, d), dtype)) for _ in range(n)]
    vector = set()
    for r in range(n):
        ranks.push(r, xd[r], ld[r])
        vector.add(ranks.last_args[-1])
    for r in range(n):
        ranks.combine(r, xd[r], ld[r], outs[r])
    assert len(vector) == 1
    expect = lse_weighted_combine(xs, ls)
    for r in range(n):
        heads = slice(r * hn, (r + 1) * hn)
        got = to_host(outs[r]).astype(np.float64)
        assert_combine_close(got, expect[:, heads], xs[:, :, heads], ls[:, :, heads], dtype)
    return bool(vector.pop())


QUAD_CASES = [  # (dtype, b, d, pad, offset, moved as quads): b = 3 small, 30 split
    (np.dtype(ml_dtypes.bfloat16), 3, 16, 0, 0, True),  # 8 words: two quads a row
    (np.dtype(np.float16), 30, 40, 0, 0, True),
    (np.dtype(np.float32), 3, 300, 0, 0, True),  # two steps a row
    (np.dtype(np.float32), 30, 8, 8, 4, True),  # an aligned view inside wider rows
    (np.dtype(ml_dtypes.bfloat16), 3, 16, 2, 0, False),  # rows 36 bytes apart
    (np.dtype(ml_dtypes.bfloat16), 30, 16, 8, 2, False),  # rows start 4 bytes off
    (np.dtype(ml_dtypes.bfloat16), 3, 12, 0, 0, False),  # 6 words: not whole quads
    (np.dtype(np.float32), 3, 7, 0, 0, False),
]


def check_direct_missing_peer(to_device, to_host, dtype, rng, timeout_ns=50_000_000, b=40,
                              slack_s=1.0, ll_rows=0, line_rows=0):
    """Rank 1 skips call 2: rank 0's combine gives up (TIMED_OUT, NaN out, tells rank 1)
    within the bound, though its grid has several blocks (once one gave up, the
    others stop; ``b``, ``ll_rows`` and ``line_rows`` pick the schedule, see
    ``call_grid``); rank
    1's call 2 then fails at once (PEER_FAILED); rank 0's call 3 neither pushes nor
    waits: it takes no longer than a whole call that had no wait (call 1, rank 0's
    push and combine, timed after a first call 1 that launched everything once) by
    half the bound (the simulator's launches cost seconds on a slow machine, a
    GPU's microseconds)."""

    import time

    from cupy_dcp.kernels._rows import WARP
    from cupy_dcp.kernels.direct import PEER_FAILED, TIMED_OUT, region_grid

    n, h, d = 2, 4, 8
    rows = b * h // n
    ranks = DirectRanks(to_device, dtype, n, b, h, d, timeout_ns=timeout_ns, ll_rows=ll_rows,
                        line_rows=line_rows)
    grid = region_grid(n, rows, ranks.lls[0].shape, ranks.lines[0].shape, ranks.max_blocks,
                       threads=WARP * ranks.warps)
    assert grid[1] > 1, "the test needs several blocks"
    xs, ls = make_inputs(rng, n, b, h, d, dtype, adversarial=False)
    xd, ld = [to_device(xs[r]) for r in range(n)], [to_device(ls[r]) for r in range(n)]
    outs = [to_device(np.zeros((b, h // n, d), dtype=dtype)) for _ in range(n)]
    lses = [to_device(np.zeros((b, h // n), dtype=np.float32)) for _ in range(n)]
    for _ in range(2):  # call 1, twice: everyone (the second time is the one timed)
        start = time.monotonic()
        ranks.push(0, xd[0], ld[0])
        normal = time.monotonic() - start
        ranks.push(1, xd[1], ld[1])
        start = time.monotonic()
        ranks.combine(0, xd[0], ld[0], outs[0], lses[0])
        assert not np.isnan(to_host(outs[0]).astype(np.float32)).any()
        normal += time.monotonic() - start
        ranks.combine(1, xd[1], ld[1], outs[1], lses[1])
    ranks.push(0, xd[0], ld[0])  # call 2: rank 1 is missing
    start = time.monotonic()
    ranks.combine(0, xd[0], ld[0], outs[0], lses[0])
    got = to_host(outs[0]).astype(np.float32)
    waited = time.monotonic() - start
    assert np.isnan(got).all() and np.isnan(to_host(lses[0])).all()
    assert to_host(ranks.status_owners[0]).tolist() == [0, TIMED_OUT]
    assert to_host(ranks.state_owners[0])[2] == 1
    assert to_host(ranks.flag_owners[1])[0] == -1, "rank 0 did not tell rank 1"
    assert timeout_ns * 1e-9 <= waited <= 2 * timeout_ns * 1e-9 + slack_s, waited
    # rank 1's call 2, whole: rank 0 gave up before it (though it pushed its own call 2:
    # word by word, those words are there to be found), so it fails
    ranks.call(1, xd[1], ld[1], outs[1], lses[1])
    assert np.isnan(to_host(outs[1]).astype(np.float32)).all()
    assert to_host(ranks.status_owners[1]).tolist() == [PEER_FAILED, 0]
    before = [to_host(a[1]).copy() for a in (ranks.owners, ranks.ll_owners, ranks.line_owners)]
    start = time.monotonic()
    ranks.push(0, xd[0], ld[0])  # rank 0's call 3: dead, pushes nothing, waits for nothing
    ranks.combine(0, xd[0], ld[0], outs[0], lses[0])
    assert np.isnan(to_host(outs[0]).astype(np.float32)).all()
    dead_call = time.monotonic() - start
    assert dead_call < normal + 0.5 * timeout_ns * 1e-9, (dead_call, normal, waited)
    for a, was in zip((ranks.owners, ranks.ll_owners, ranks.line_owners), before):
        np.testing.assert_array_equal(to_host(a[1]), was)


def check_bare_push(to_device, to_host, n, words, blocks, rng, calls=2, timeout_ns=20_000_000):
    """The bench's bare push, N ranks played in turn: each call delivers every rank's
    row for each peer into that peer's window, whole; a rank finds the flags of the
    ranks that went before it, and its wait for those after it runs out after
    ``timeout_ns`` (recorded in its status), so the last rank's status stays clear."""
    from cupy_dcp.kernels._arrays import kernel_array
    from benchmarks.bare_push import bare_push_kernel

    max_tiles = blocks + 3
    windows = [to_device(np.zeros((n, words), np.uint64)) for _ in range(n)]
    flags = [to_device(np.zeros(n + n * max_tiles, np.int64)) for _ in range(n)]
    states = [to_device(np.zeros(2, np.int64)) for _ in range(n)]
    kernel = bare_push_kernel(n)
    for call in range(1, calls + 1):
        srcs = [rng.integers(0, 2**63, (n, words), dtype=np.uint64) for _ in range(n)]
        statuses = [to_device(np.zeros(n, np.int64)) for _ in range(n)]
        for r in range(n):
            dsts = tuple(kernel_array(w[r], np.uint64) for w in windows)
            kernel((blocks,), (32,), 0, (
                kernel_array(to_device(srcs[r]), np.uint64), dsts,
                tuple(kernel_array(f, np.int64) for f in flags), kernel_array(states[r], np.int64),
                kernel_array(statuses[r], np.int64), r, timeout_ns))
        for r in range(n):
            got = to_host(windows[r])
            for p in range(n):
                if p != r:
                    np.testing.assert_array_equal(got[p], srcs[p][r])  # p's row for r, whole
            assert not got[r].any(), "a rank wrote into its own row of its window"
            expect = [1 if p > r else 0 for p in range(n)]  # the later ranks were missing
            assert list(to_host(statuses[r])) == expect, (call, r, to_host(statuses[r]))
            assert to_host(states[r])[0] == call and to_host(states[r])[1] == 0
            mine = to_host(flags[r])[n:].reshape(n, max_tiles)
            for p in range(n):
                assert (mine[p, :blocks] == (call if p != r else 0)).all(), (call, r, p, mine)
                assert not mine[p, blocks:].any()
