"""The combine kernel: the exact LSE-weighted sum of the N received partials.

For each (token, local head) row, one warp reads the N LSEs from the packed
lanes and computes the weights of ``_math`` in float32 (every lane on its
own: no shared memory, no synchronisation); each lane then accumulates
``UNROLL`` output elements per step in float32 (a zero-weight shard is
skipped, so its NaN or inf never reaches the sum) and rounds them once to the
output dtype: round to nearest even, NaN kept NaN.

The received buffer is seen twice: as values (float32, float16, the bfloat16
bits as uint16, or pairs of 16-bit values as uint32 words) and as bits (to read
the LSE lanes).

Two kernels: for N from 2 to :data:`MAX_STATIC_SHARDS` one built for its N
(every loop over the shards unrolled, every shard's loads issued before any
is weighed, a row's LSEs and weights held in registers), which for fewer than
:data:`SLICED_ROWS` rows also splits each row over the grid's second
dimension so that each lane has :data:`SLICED_UNROLL` values to move; for any
other N one that walks the shards two at a time. Both give the same bits.
"""

import functools

import numpy as np
from numba import cuda, float32, uint32

from numba.core import types

from ._format import LSE_HALF_BITS, LSE_HALF_MASK, is_bfloat16
from ._arrays import dummy_index, kernel_array, stream_ptr
from ._device import device_functions, held_weights, inline_device, row_weights_of
from ._launch import DeviceArray, SpecializedKernel, array_type
from ._rows import UNROLL, WARP, lanes_per_row, row_cursor, row_grid
from ._specs import check_combine_args
from ._trailer import WORDS, combine_checks

__all__ = ["MAX_STATIC_SHARDS", "SLICED_ROWS", "SLICED_UNROLL", "codec_functions",
           "combine_codec", "combine_kernel", "combine_launch", "combine_variants", "lane_weights",
           "row_accumulator", "shard_accumulator", "static_shards", "unpack_combine"]


_F32, _F16, _BF16, _BF16X2 = "float32", "float16", "bfloat16", "bfloat16x2"
_F16X2 = "float16x2"
RAW = {_F32: np.float32, _F16: np.float16, _BF16: np.uint16, _BF16X2: np.uint32,
       _F16X2: np.uint32}  # as loaded
PAIRS = (_BF16X2, _F16X2)  # codecs whose uint32 words hold two values
RAW_BITS = {codec: np.dtype(np.uint32 if np.dtype(raw).itemsize == 4 else np.uint16)
            for codec, raw in RAW.items()}  # the buffer seen as bits


@functools.cache
def codec_functions(codec):
    """Device functions that decode the low and high value of a loaded word, encode
    one output word from two accumulators, and read one shard's LSE."""
    f = device_functions()
    as_float, as_bits = f["as_float"], f["as_bits"]
    bf16_to_f32_bits, pack_bf16x2 = f["bf16_to_f32_bits"], f["pack_bf16x2"]
    pack_f16x2, f16_low, f16_high = f["pack_f16x2"], f["f16_low"], f["f16_high"]
    low16, high16, sixteen = np.uint32(0xFFFF), np.uint32(0xFFFF0000), np.uint32(16)
    lse_mask, lse_shift = np.uint32(LSE_HALF_MASK), np.uint32(LSE_HALF_BITS)
    jit = cuda.jit(device=True)

    # ``lse_lanes(vals, bits, b, h, width)`` gives the row's LSE lanes as views over the
    # ranks (the low and high half for 16-bit outputs); ``load_lse(low, high, r)`` reads one.
    if codec in (_F32,) + PAIRS:
        @jit
        def lse_lanes(vals, bits, b, h, width):
            lanes = vals[:, b, h, width - 1]
            return lanes, lanes
    else:
        @jit
        def lse_lanes(vals, bits, b, h, width):
            return bits[:, b, h, width - 2], bits[:, b, h, width - 1]

    if codec == _F32:
        @jit
        def load_lse(low, high, r):
            return low[r]

        @jit
        def decode_lo(x):
            return x

        @jit
        def encode(lo, hi):
            return lo
    elif codec in PAIRS:  # one uint32 word: two 16-bit values, or the LSE's bits
        @jit
        def load_lse(low, high, r):
            return as_float(uint32(low[r]))

        if codec == _BF16X2:
            @jit
            def decode_lo(x):
                return as_float(uint32((uint32(x) & low16) << sixteen))

            @jit
            def encode(lo, hi):  # one cvt.rn.bf16x2.f32 (the sums' NaN is the canonical one)
                return pack_bf16x2(lo, hi)
        else:
            @jit
            def decode_lo(x):
                return f16_low(x)

            @jit
            def decode_hi(x):
                return f16_high(x)

            @jit
            def encode(lo, hi):  # one cvt.rn.f16x2.f32, as the float16 stores round
                return pack_f16x2(lo, hi)
    else:
        @jit
        def load_lse(low, high, r):
            return as_float(uint32((uint32(low[r]) & lse_mask)
                                   | ((uint32(high[r]) & lse_mask) << lse_shift)))

        if codec == _F16:
            @jit
            def decode_lo(x):
                return float32(x)

            @jit
            def encode(lo, hi):
                return lo  # the float16 store rounds to nearest even
        else:
            @jit
            def decode_lo(x):
                return as_float(uint32(bf16_to_f32_bits(x)))

            @jit
            def encode(lo, hi):
                return pack_bf16x2(lo, lo) & low16

    if codec != _F16X2:
        @jit
        def decode_hi(x):
            return as_float(uint32(uint32(x) & high16))

    return lse_lanes, load_lse, decode_lo, decode_hi, encode


@functools.cache
def lane_weights(codec, own_first=False):
    """The weights of a row (``_math.build_row_weights``, inlined) from its LSE lanes
    ``lanes = (low, high)`` as :func:`codec_functions`' ``lse_lanes`` gives them:
    ``row_weights(lanes, count, base_e)``, or ``row_weights(lanes, own, me, count,
    base_e)`` where ``own_first``."""
    load_lse = codec_functions(codec)[1]

    @inline_device
    def lane_lse(lanes, r):
        return load_lse(lanes[0], lanes[1], r)

    return row_weights_of(lane_lse, own_first)


@functools.cache
def row_accumulator(codec, group=WARP, unroll=UNROLL):
    """Device functions ``load_two(first, second, src0, src1, base, d_count)``
    (two shards' values into ``first`` and ``second``, every load issued before
    any is used), ``add_weighted(acc, first, second, w0, w1, base, d_count)``
    (two shards' loaded values, weighted, into the float32 accumulators; a zero
    weight adds nothing, even NaN) and ``store_row(dst, acc, base, d_count)``
    (the accumulators rounded once into the output), for this lane's ``unroll``
    elements from ``base`` in steps of ``group``. Shared by the combine kernels.
    """
    _, _, decode_lo, decode_hi, encode = codec_functions(codec)
    pairs = codec in PAIRS  # each element is a word of two values
    zero = device_functions()["zero"]
    u64 = np.uint64
    u_group = u64(group)
    jit = cuda.jit(device=True)

    @jit
    def load_two(first, second, src0, src1, base, d_count):
        for k in range(unroll):
            d = base + u64(k) * u_group
            if d < d_count:
                first[k] = src0[d]
                second[k] = src1[d]

    @jit
    def add_weighted(acc, first, second, w0, w1, base, d_count):
        for k in range(unroll):
            if base + u64(k) * u_group < d_count:
                if w0 != zero:
                    acc[k] += w0 * decode_lo(first[k])
                    if pairs:
                        acc[unroll + k] += w0 * decode_hi(first[k])
                if w1 != zero:
                    acc[k] += w1 * decode_lo(second[k])
                    if pairs:
                        acc[unroll + k] += w1 * decode_hi(second[k])

    @jit
    def store_row(dst, acc, base, d_count):
        for k in range(unroll):
            d = base + u64(k) * u_group
            if d < d_count:
                dst[d] = encode(acc[k], acc[unroll + k])

    return load_two, add_weighted, store_row


@functools.cache
def shard_accumulator(codec, group=WARP, unroll=UNROLL):
    """Device functions ``load_shard(buf, at, src, base, d_count)`` (one shard's values
    into ``buf[at:at + unroll]``) and ``add_shard(acc, buf, at, w, base, d_count)``
    (those values, weighted by ``w``, into the float32 accumulators; a zero weight
    adds nothing, even NaN): :func:`row_accumulator`'s steps one shard at a time, for
    the combine that loads every shard before it weighs any."""
    _, _, decode_lo, decode_hi, _ = codec_functions(codec)
    pairs = codec in PAIRS
    zero = device_functions()["zero"]
    u64 = np.uint64
    u_group = u64(group)
    jit = cuda.jit(device=True)

    @jit
    def load_shard(buf, at, src, base, d_count):
        for k in range(unroll):
            d = base + u64(k) * u_group
            if d < d_count:
                buf[at + k] = src[d]

    @jit
    def add_shard(acc, buf, at, w, base, d_count):
        if w != zero:
            for k in range(unroll):
                if base + u64(k) * u_group < d_count:
                    acc[k] += w * decode_lo(buf[at + k])
                    if pairs:
                        acc[unroll + k] += w * decode_hi(buf[at + k])

    return load_shard, add_shard


@functools.cache
def _combine_kernel(codec, group=WARP, unroll=UNROLL):
    f = device_functions()
    accumulators = 2 * unroll  # low and high value of each word in pairs mode
    lse_lanes, load_lse = codec_functions(codec)[:2]
    load_two, add_weighted, store_row = row_accumulator(codec, group, unroll)
    raw = RAW[codec]
    row_weights = lane_weights(codec)
    global_lse, shard_weight, zero = f["global_lse"], f["shard_weight"], f["zero"]
    step = group * unroll
    cursor = row_cursor()

    begin_checks, finish_checks = combine_checks(RAW_BITS[codec].itemsize == 2)

    u64 = np.uint64
    u_group, u_step, u_one, u_two = u64(group), u64(step), u64(1), u64(2)
    u_words = u64(WORDS)

    # Indices are unsigned so that Numba emits no negative-index wraparound.
    @cuda.jit
    def combine(vals, bits, out, out_lse, write_lse, base_e, status, state):
        n = u64(vals.shape[0])
        hn = u64(vals.shape[2])
        tokens = u64(out.shape[0])
        rows = tokens * hn
        # A plan's trailer rows: did every peer sign as rank 0? Threads 0 .. (N-1) * WORDS
        # - 1 compare a word each; they load both before their rows and compare after, so
        # that no row waits on those loads.
        signed = u64(vals.shape[1]) > tokens
        checks = (n - u_one) * u_words if signed else u64(0)
        t, t_step, count, ours, theirs = begin_checks(bits, state, tokens, signed, checks)
        width = u64(vals.shape[3])
        d_count = u64(out.shape[2])
        lane, row, row_step = cursor(u_group)
        acc = cuda.local.array(accumulators, np.float32)
        first = cuda.local.array(unroll, raw)
        second = cuda.local.array(unroll, raw)
        while row < rows:  # one lane group per (token, head) row; no synchronisation
            b = row // hn
            h = row % hn
            dst = out[b, h]
            low, high = lse_lanes(vals, bits, b, h, width)
            m = zero
            inv_total = zero
            weighed = False
            base = lane
            while base < d_count:
                for k in range(accumulators):
                    acc[k] = zero
                r = u64(0)
                while r < n:  # two shards at a time
                    r1 = min(r + u_one, n - u_one)
                    load_two(first, second, vals[r, b, h], vals[r1, b, h], base, d_count)
                    if not weighed:  # the row's LSEs load while the partials do (lane 0
                        # always gets here: D >= 1)
                        m, inv_total, total = row_weights((low, high), n, base_e)
                        if write_lse and lane == 0:
                            out_lse[b, h] = global_lse(total, m, base_e)
                        weighed = True
                    w0 = shard_weight(load_lse(low, high, r), m, inv_total, base_e)
                    w1 = zero
                    if r1 != r:
                        w1 = shard_weight(load_lse(low, high, r1), m, inv_total, base_e)
                    add_weighted(acc, first, second, w0, w1, base, d_count)
                    r += u_two
                store_row(dst, acc, base, d_count)
                base += u_step
            row += row_step
        finish_checks(bits, status, state, tokens, signed, checks, t, t_step, count, ours,
                      theirs)

    return combine


MAX_STATIC_SHARDS = 8  # up to this N the combine is built for its N (every shard's loads first)


def static_shards(n):
    """The ``shards`` of the combine kernel for ``n`` ranks: ``n`` from 2 to
    :data:`MAX_STATIC_SHARDS`, else 0 (the kernel for any N)."""
    return int(n) if 2 <= int(n) <= MAX_STATIC_SHARDS else 0


SLICED_UNROLL = 2  # the values per lane of the combine that splits its rows over warps
SLICED_ROWS = 4 * 132  # below this many rows the combine splits them (MAX_BLOCKS' H200)


@functools.cache
def _combine_shards_kernel(codec, shards, group=WARP, unroll=UNROLL):
    """The combine for exactly ``shards`` ranks, every loop over them unrolled: a
    step's loads of every shard are issued before any is weighed (the pairwise loop
    of :func:`_combine_kernel` waits for each pair's sums before it loads the next
    pair), and a row's LSEs are read once into registers, each weight computed once
    (``held_weights``). The same sums in the same order, so the same bits.

    The grid's second dimension splits each row: block ``(x, y)`` handles the
    values ``y * S, (y + Y) * S, ...`` (``S = group * unroll``, ``Y = gridDim.y``)
    of its rows; only ``y = 0`` writes the global LSE and checks the trailer.
    Few rows then still give every lane little to do (:data:`SLICED_UNROLL`)."""
    f = device_functions()
    accumulators = 2 * unroll
    lse_lanes, load_lse = codec_functions(codec)[:2]
    store_row = row_accumulator(codec, group, unroll)[2]
    load_shard, add_shard = shard_accumulator(codec, group, unroll)
    raw = RAW[codec]
    weigh = held_weights()
    global_lse, zero = f["global_lse"], f["zero"]
    cursor = row_cursor()
    begin_checks, finish_checks = combine_checks(RAW_BITS[codec].itemsize == 2)

    u64 = np.uint64
    u_step, u_one = u64(group * unroll), u64(1)
    u_words = u64(WORDS)
    n = u64(shards)
    loaded = shards * unroll  # every shard's values of one step

    @cuda.jit
    def combine(vals, bits, out, out_lse, write_lse, base_e, status, state):
        hn = u64(vals.shape[2])
        tokens = u64(out.shape[0])
        rows = tokens * hn
        first_slice = cuda.blockIdx.y == 0
        signed = first_slice and u64(vals.shape[1]) > tokens  # as in _combine_kernel
        checks = (n - u_one) * u_words if signed else u64(0)
        t, t_step, count, ours, theirs = begin_checks(bits, state, tokens, signed, checks)
        width = u64(vals.shape[3])
        d_count = u64(out.shape[2])
        lane, row, row_step = cursor(u64(group))
        start = lane + u64(cuda.blockIdx.y) * u_step
        slice_step = u64(cuda.gridDim.y) * u_step
        acc = cuda.local.array(accumulators, np.float32)
        buf = cuda.local.array(loaded, raw)
        lses = cuda.local.array(shards, np.float32)
        weights = cuda.local.array(shards, np.float32)
        while row < rows:
            b = row // hn
            h = row % hn
            dst = out[b, h]
            low, high = lse_lanes(vals, bits, b, h, width)
            weighed = False
            base = start
            while base < d_count:
                for k in range(accumulators):
                    acc[k] = zero
                for r in range(shards):
                    load_shard(buf, r * unroll, vals[u64(r), b, h], base, d_count)
                if not weighed:
                    for r in range(shards):
                        lses[r] = load_lse(low, high, u64(r))
                    m, total = weigh(lses, weights, shards, base_e)
                    if write_lse and first_slice and lane == 0:
                        out_lse[b, h] = global_lse(total, m, base_e)
                    weighed = True
                for r in range(shards):
                    add_shard(acc, buf, r * unroll, weights[r], base, d_count)
                store_row(dst, acc, base, d_count)
                base += slice_step
            row += row_step
        finish_checks(bits, status, state, tokens, signed, checks, t, t_step, count, ours,
                      theirs)

    return combine


def combine_codec(dtype, pairs=False):
    """The codec (how the kernels decode and encode values) for output ``dtype``,
    and the dtype it sees values as.

    ``pairs``: bfloat16 or float16 read and written as uint32 words of two values
    (when ``D`` is even and the output's rows are contiguous and 4-byte aligned).
    """
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return _F32, dtype
    if dtype == np.float16:
        return (_F16X2, np.dtype(np.uint32)) if pairs else (_F16, dtype)
    if not is_bfloat16(dtype):
        raise TypeError(f"output dtype must be float16, bfloat16 or float32 (got {dtype})")
    if pairs:
        return _BF16X2, np.dtype(np.uint32)
    return _BF16, np.dtype(np.uint16)


@functools.cache
def combine_kernel(dtype, pairs=False, group=WARP, shards=0, unroll=UNROLL):
    """The combine kernel specialised for output ``dtype`` (and 16-bit pairs),
    ``group`` lanes per row and, where ``shards`` (2 to :data:`MAX_STATIC_SHARDS`),
    for exactly that many ranks (0: any) with ``unroll`` values per lane and step
    (:data:`SLICED_UNROLL` for the kernel that splits rows over its grid's
    second dimension)."""
    codec, value = combine_codec(dtype, pairs)
    bits = np.dtype(np.uint32 if value.itemsize == 4 else np.uint16)
    i64 = types.int64
    argtypes = (array_type(value, 4, True), array_type(bits, 4, True),
                array_type(value, 3, False), array_type(np.float32, 2, False), i64, i64,
                array_type(np.int64, 1, True), array_type(np.int64, 1, True))
    body = _combine_shards_kernel(codec, shards, group, unroll) if shards else \
        _combine_kernel(codec, group)
    return SpecializedKernel(body, argtypes)


def _combine_shape(elements, rows, shards):
    """``(group, unroll, slices)`` of the combine of ``rows`` rows of ``elements`` values
    (words in pairs) by the kernel for ``shards`` (:func:`static_shards`): whole rows
    (``slices`` 0, a 1-D grid), or for few rows each split into ``slices`` along the
    grid's second dimension."""
    if shards and rows < SLICED_ROWS:  # few rows: split them, little work per lane
        group = lanes_per_row(elements, SLICED_UNROLL)
        return group, SLICED_UNROLL, -(-elements // (group * SLICED_UNROLL))
    return lanes_per_row(elements), UNROLL, 0


def combine_variants(elements, shards):
    """``[(group, unroll)]`` of the combine kernels that a combine of rows of ``elements``
    values (words in pairs) can launch (:func:`combine_launch`): whole rows, and for
    ``shards`` ranks built for their N also few rows split."""
    whole = _combine_shape(elements, SLICED_ROWS, shards)[:2]
    return [whole, _combine_shape(elements, 0, shards)[:2]] if shards else [whole]


def unpack_combine(recv, out, out_lse=None, is_lse_base_on_e=True, stream=None):
    """Combine the received partials exactly, on ``stream``.

    Args:
        recv: ``[N, B, H/N, D + P]`` device array in the output dtype (or its
            unsigned-integer twin), C-contiguous; ``recv[r]`` came from rank r.
        out: ``[B, H/N, D]`` float16, bfloat16 or float32 device array, any
            strides (token-major, or head-major storage ``[H/N, B, D]`` seen as
            ``[B, H/N, D]``); written.
        out_lse: optional ``[B, H/N]`` float32 device array; receives the
            global LSE (-inf where every shard is empty).
        is_lse_base_on_e: natural-log LSEs; ``False`` for base 2.
        stream: the stream to run on; ``None`` is CuPy's current stream.
    """
    spec = check_combine_args(recv, out, out_lse)
    if spec.tokens == 0:
        return
    _, value = combine_codec(spec.dtype)
    lse_arr = None if out_lse is None else kernel_array(out_lse, np.float32, "out_lse")
    kernel, grid, block, args = combine_launch(
        spec.dtype, kernel_array(recv, spec.bits, "recv"), kernel_array(out, value, "out"),
        lse_arr, is_lse_base_on_e)
    kernel(grid, block, stream_ptr(stream), args)


def combine_launch(dtype, recv_bits, out, out_lse, is_lse_base_on_e, signed=None):
    """``(kernel, grid, block, args)`` of one combine, for ``recv_bits`` (the receive
    buffer seen as bits), ``out`` (seen as the codec's values) and optional
    ``out_lse``; 16-bit values go in pairs (uint32 words) where both buffers allow it.

    ``signed``: a plan's ``(status, state)``, int64 device arrays: ``recv_bits``
    then holds ``B + k`` token rows per chunk (``B = out.shape[0]``), the
    trailers of ``_trailer``; the kernel compares every peer's with rank 0's and
    marks each differing word in ``status`` (``N * WORDS * STATUS_WORDS`` words,
    host-mapped memory in a plan); it sets ``state[0]`` to ``state[1] + 1``.
    """
    codec, value = combine_codec(dtype)
    recv_bits.require_c_contiguous("recv")
    recv_vals = recv_bits.view(value)
    if codec in (_BF16, _F16):
        recv_words, out_words = recv_bits.as_words(), out.as_words()
        if recv_words is not None and out_words is not None:
            codec, recv_vals, recv_bits, out = combine_codec(dtype, True)[0], recv_words, \
                recv_words, out_words
    write_lse = out_lse is not None
    if not write_lse:  # never read: a placeholder of the right type
        out_lse = DeviceArray(out.ptr, (0, 0), (4, 4), np.float32, out.owner)
    status, state = (dummy_index(), dummy_index()) if signed is None else signed
    shards = static_shards(recv_vals.shape[0])
    rows = out.shape[0] * out.shape[1]
    group, unroll, slices = _combine_shape(out.shape[2], rows, shards)
    grid, block = row_grid(rows, group)
    if slices:
        grid = grid + (slices,)
    kernel = combine_kernel(dtype, codec in PAIRS, group, shards, unroll)
    return kernel, grid, block, (recv_vals, recv_bits, out, out_lse, int(write_lse),
                                 int(bool(is_lse_base_on_e)), status, state)
