"""The combine kernel: the exact LSE-weighted sum of the N received partials.

For each (token, local head) row, one warp reads the N LSEs from the packed
lanes and computes the weights of ``_math`` in float32 (every lane on its
own: no shared memory, no synchronisation); each lane then accumulates
``UNROLL`` output elements per step in float32 (a zero-weight shard is
skipped, so its NaN or inf never reaches the sum) and rounds them once to the
output dtype: round to nearest even, NaN kept NaN.

The received buffer is seen twice: as values (float32, float16, the bfloat16
bits as uint16, or pairs of bfloat16 as uint32 words) and as bits (to read
the LSE lanes).
"""

import functools

import numpy as np
from numba import cuda, float32, uint32

from numba.core import types

from ._format import LSE_HALF_BITS, LSE_HALF_MASK, is_bfloat16
from ._arrays import dummy_index, kernel_array, stream_ptr
from ._device import device_functions, inline_device, row_weights_of
from ._launch import DeviceArray, SpecializedKernel, array_type
from ._rows import UNROLL, WARP, lanes_per_row, row_cursor, row_grid
from ._specs import check_combine_args
from ._trailer import STATUS_WORDS, WORDS, trailer_functions

__all__ = ["codec_functions", "combine_codec", "combine_kernel", "combine_launch", "lane_weights",
           "row_accumulator", "unpack_combine"]


_F32, _F16, _BF16, _BF16X2 = "float32", "float16", "bfloat16", "bfloat16x2"
RAW = {_F32: np.float32, _F16: np.float16, _BF16: np.uint16, _BF16X2: np.uint32}  # as loaded
RAW_BITS = {codec: np.dtype(np.uint32 if np.dtype(raw).itemsize == 4 else np.uint16)
            for codec, raw in RAW.items()}  # the buffer seen as bits


@functools.cache
def codec_functions(codec):
    """Device functions that decode the low and high value of a loaded word, encode
    one output word from two accumulators, and read one shard's LSE."""
    f = device_functions()
    as_float, as_bits = f["as_float"], f["as_bits"]
    bf16_to_f32_bits, f32_to_bf16_bits = f["bf16_to_f32_bits"], f["f32_to_bf16_bits"]
    low16, high16, sixteen = np.uint32(0xFFFF), np.uint32(0xFFFF0000), np.uint32(16)
    lse_mask, lse_shift = np.uint32(LSE_HALF_MASK), np.uint32(LSE_HALF_BITS)
    jit = cuda.jit(device=True)

    # ``lse_lanes(vals, bits, b, h, width)`` gives the row's LSE lanes as views over the
    # ranks (the low and high half for 16-bit outputs); ``load_lse(low, high, r)`` reads one.
    if codec in (_F32, _BF16X2):
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
    elif codec == _BF16X2:  # one uint32 word: two bfloat16 values, or the LSE's bits
        @jit
        def load_lse(low, high, r):
            return as_float(uint32(low[r]))

        @jit
        def decode_lo(x):
            return as_float(uint32((uint32(x) & low16) << sixteen))

        @jit
        def encode(lo, hi):
            return uint32(f32_to_bf16_bits(as_bits(lo)) | (f32_to_bf16_bits(as_bits(hi)) << sixteen))
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
                return f32_to_bf16_bits(as_bits(lo))

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
    pairs = codec == _BF16X2  # each element is a word of two values
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

    _, _, flat_thread, check_words = trailer_functions(RAW_BITS[codec].itemsize == 2)

    u64 = np.uint64
    u_group, u_step, u_one, u_two = u64(group), u64(step), u64(1), u64(2)
    u_words, u_status = u64(WORDS), u64(STATUS_WORDS)

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
        t, t_step = flat_thread()
        count = np.int64(0)
        if signed and t == u64(0):
            count = state[1]
        ours = theirs = np.uint32(0)
        if t < checks:
            ours, theirs = check_words(bits, tokens, t)
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
        if signed and t == u64(0):
            state[0] = count + 1  # the next call's number (see pack_launch)
        while t < checks:
            if ours != theirs:
                at = (t + u_words) * u_status  # (peer p, field f): t + WORDS = p * WORDS + f
                status[at + u_one] = ours
                status[at + u_two] = theirs
                cuda.threadfence_system()  # the words before the flag, for the host
                status[at] = 1
            t += t_step
            if t < checks:
                ours, theirs = check_words(bits, tokens, t)

    return combine


def combine_codec(dtype, pairs=False):
    """The codec (how the kernels decode and encode values) for output ``dtype``,
    and the dtype it sees values as.

    ``pairs``: bfloat16 read and written as uint32 words of two values (when
    ``D`` is even and the output's rows are contiguous and 4-byte aligned).
    """
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return _F32, dtype
    if dtype == np.float16:
        return _F16, dtype
    if not is_bfloat16(dtype):
        raise TypeError(f"output dtype must be float16, bfloat16 or float32 (got {dtype})")
    if pairs:
        return _BF16X2, np.dtype(np.uint32)
    return _BF16, np.dtype(np.uint16)


@functools.cache
def combine_kernel(dtype, pairs=False, group=WARP):
    """The combine kernel specialised for output ``dtype`` (and bfloat16 pairs) and
    ``group`` lanes per row."""
    codec, value = combine_codec(dtype, pairs)
    bits = np.dtype(np.uint32 if value.itemsize == 4 else np.uint16)
    i64 = types.int64
    argtypes = (array_type(value, 4, True), array_type(bits, 4, True),
                array_type(value, 3, False), array_type(np.float32, 2, False), i64, i64,
                array_type(np.int64, 1, True), array_type(np.int64, 1, True))
    return SpecializedKernel(_combine_kernel(codec, group), argtypes)


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
    ``out_lse``; bfloat16 goes in pairs (uint32 words) where both buffers allow it.

    ``signed``: a plan's ``(status, state)``, int64 device arrays: ``recv_bits``
    then holds ``B + k`` token rows per chunk (``B = out.shape[0]``), the
    trailers of ``_trailer``; the kernel compares every peer's with rank 0's and
    marks each differing word in ``status`` (``N * WORDS * STATUS_WORDS`` words,
    host-mapped memory in a plan); it sets ``state[0]`` to ``state[1] + 1``.
    """
    codec, value = combine_codec(dtype)
    recv_bits.require_c_contiguous("recv")
    recv_vals = recv_bits.view(value)
    if codec == _BF16:
        recv_words, out_words = recv_bits.as_words(), out.as_words()
        if recv_words is not None and out_words is not None:
            codec, recv_vals, recv_bits, out = _BF16X2, recv_words, recv_words, out_words
    write_lse = out_lse is not None
    if not write_lse:  # never read: a placeholder of the right type
        out_lse = DeviceArray(out.ptr, (0, 0), (4, 4), np.float32, out.owner)
    status, state = (dummy_index(), dummy_index()) if signed is None else signed
    group = lanes_per_row(out.shape[2])
    grid, block = row_grid(out.shape[0] * out.shape[1], group)
    kernel = combine_kernel(dtype, codec == _BF16X2, group)
    return kernel, grid, block, (recv_vals, recv_bits, out, out_lse, int(write_lse),
                                 int(bool(is_lse_base_on_e)), status, state)
