"""Kernels of the AG+RS strategy: all-gather the LSEs, correct, reduce-scatter.

Every rank scales its own partial of every head by its exact weight
``w_self = exp(l_self - m) / s`` (``_math``: the same weights as the combine;
0 for an empty shard, whose NaN partial then adds exactly 0), writes it in
float32 laid out by destination rank ``[N, B, H/N, D]``, and a float32
reduce-scatter sums the N ranks' terms. ``finish`` rounds the sum once to the
output dtype and computes the global LSE of the local heads.

At decode sizes each kernel is a chain of round trips, so neither lets a load
wait on arithmetic: ``correct`` issues a row's values before its weights need
the gathered LSEs (one round trip for both), and ``finish``'s lane 0 loads the
row's LSEs with its values and weighs them after the row's stores. Each lane
moves ``unroll`` values a trip (:func:`agrs_shape`: a row of D = 512 in one
trip; each trip's loads wait on the stores before them). Launches of many rows
stream instead (:func:`correct_shape`, :func:`finish_shape`): ``correct`` moves
twice the values a lane, so that each lane weighs the gathered LSEs once for
more of them, and ``finish`` moves a warp's values a trip, in more warps.

Where the input's rows are unit-stride and aligned for a quad of values (D a
multiple of four), ``correct`` moves values in quads (:func:`vector_correct_kernel`):
lane k of a row loads quads k, k + group, ... (two words of 16-bit values, or one
16-byte quad of float32) and stores each as one 16-byte quad, so that each load
and store of a warp is whole. Where the output is C-contiguous (and the sums and
it aligned), ``finish`` is flat instead (:func:`flat_finish_kernel`): rounding
the sums is then elementwise over ``B * H/N * D`` values, so each thread moves
one 16-byte quad of sums (two words of 16-bit values, or the float32 bits as they
are) and thread t computes row t's LSE: no lane waits on a row's LSEs, and no
row's length sets the lanes. Both give the same bits as the kernels of values one
by one, which serve any other input and output.
"""

import functools

import numpy as np
from numba import cuda, float32
from numba.core import types

from ._format import (WRITES_BOTH, WRITES_WHILE_READING, as_dtype, check_apart, check_flag,
                      check_heads, check_rank)
from ._arrays import kernel_array, output_array, stream_ptr
from ._device import device_functions, inline_device, row_weights_of
from ._launch import DeviceArray, SpecializedKernel, array_type
from ._rows import UNROLL, WARP, lanes_per_row, row_cursor, row_grid, tile_cursor, tile_grid
from ._codecs import PAIRS, RAW, codec_functions, combine_codec
from ._vector import QUAD, vector_functions

__all__ = ["CORRECT_STREAMS", "FINISH_STREAMS", "MAX_HELD", "agrs_correct", "agrs_finish",
           "agrs_shape", "agrs_shapes", "correct_kernel", "correct_launch", "correct_shape",
           "finish_kernel", "finish_launch", "finish_shape", "flat_finish_kernel",
           "mask_kernel", "mask_launch", "vector_correct_kernel"]


MAX_HELD = 8  # gathered LSEs that finish's lane 0 loads with its row's values (N up to 8)
CORRECT_STREAMS = 4096  # a correct of this many warps (at agrs_shape) streams
FINISH_STREAMS = 2048  # a finish of this many warps (at agrs_shape) streams
FLAT_BLOCK = 256  # threads a block of the flat finish


@functools.cache
def _gathered_weights():
    """Device function ``weigh(lses, count, base_e) -> (m, inv_total, total)`` of a row
    whose shard k's LSE is ``lses[k]`` (a strided column of the gathered ``[N, B, H]``
    LSEs, or a local array holding them)."""
    @inline_device
    def gathered(lses, r):
        return lses[r]

    return row_weights_of(gathered)


def agrs_shape(elements):
    """``(group, unroll)`` of the AG+RS kernels for rows of ``elements`` values: lanes of
    :data:`UNROLL` values, twice that for rows longer than a warp's :data:`UNROLL`
    (D = 512 in one trip: each trip's loads wait on the stores before them)."""
    unroll = UNROLL if elements <= WARP * UNROLL else 2 * UNROLL
    return lanes_per_row(elements, unroll), unroll


def _warps(rows, group):
    return -(-rows * group // WARP)


def correct_shape(elements, rows):
    """``(group, unroll)`` of a correcting launch of ``rows`` rows (``B * H``) of
    ``elements`` values: :func:`agrs_shape`, or where that launches at least
    :data:`CORRECT_STREAMS` warps, twice its values a lane (each lane weighs the
    row's N gathered LSEs, N exponentials, once for twice the values)."""
    group, unroll = agrs_shape(elements)
    if _warps(rows, group) >= CORRECT_STREAMS:
        return lanes_per_row(elements, 2 * unroll), 2 * unroll
    return group, unroll


def finish_shape(elements, rows):
    """``(group, unroll)`` of a finishing launch of ``rows`` rows (``B * H/N``) of
    ``elements`` values: :func:`agrs_shape`, or where that moves more than a warp's
    :data:`UNROLL` values a lane and launches at least :data:`FINISH_STREAMS`
    warps, :data:`UNROLL` a lane (two trips a row of D = 512, in 60 registers
    instead of 94: more warps an SM)."""
    group, unroll = agrs_shape(elements)
    if unroll > UNROLL and _warps(rows, group) >= FINISH_STREAMS:
        return lanes_per_row(elements, UNROLL), UNROLL
    return group, unroll


def agrs_shapes(elements):
    """``{"correct": [(group, unroll)], "finish": [...]}``: every shape the launches
    for rows of ``elements`` values can pick (:func:`correct_shape`,
    :func:`finish_shape`), few rows first."""
    many = 1 << 40
    return {"correct": sorted({correct_shape(elements, 1), correct_shape(elements, many)},
                              key=lambda shape: shape[1]),
            "finish": sorted({finish_shape(elements, 1), finish_shape(elements, many)},
                             key=lambda shape: -shape[1])}


@functools.cache
def _correct_kernel(codec, group, unroll):
    f = device_functions()
    _, _, decode, _, _ = codec_functions(codec)
    weigh, shard_weight, zero = _gathered_weights(), f["shard_weight"], f["zero"]
    raw = RAW[codec]
    u64 = np.uint64
    u_group, u_step = u64(group), u64(group * unroll)
    cursor = tile_cursor()

    @cuda.jit
    def correct(data, lses, self_rank, base_e, corrected):
        # data [B, H, D] (values), lses [N, B, H] f32, corrected [N, B, H/N, D] f32
        b_count = u64(data.shape[0])
        d_count = u64(data.shape[2])
        hn = u64(corrected.shape[2])
        n = u64(lses.shape[0])
        lane, h, b, b_step = cursor(u_group)
        r = u64(cuda.blockIdx.y)  # the grid's y: the rank the corrected row goes to
        head = r * hn + h
        buf = cuda.local.array(unroll, raw)
        while h < hn and b < b_count:
            column = lses[:, b, head]
            src = data[b, head]
            dst = corrected[r, b, h]
            w = zero
            weighed = False
            base = lane
            while base < d_count:
                for k in range(unroll):  # the values load before the weights need the LSEs:
                    d = base + u64(k) * u_group  # one round trip for both
                    if d < d_count:
                        buf[k] = src[d]
                if not weighed:
                    m, inv_total, _ = weigh(column, n, base_e)
                    w = shard_weight(column[self_rank], m, inv_total, base_e)
                    weighed = True
                for k in range(unroll):
                    d = base + u64(k) * u_group
                    if d < d_count:
                        # an empty shard adds exactly 0, even NaN
                        dst[d] = w * decode(buf[k]) if w != zero else zero
                base += u_step
            b += b_step

    return correct


@functools.cache
def _vector_correct_kernel(codec, group, unroll):
    f = device_functions()
    _, _, decode_lo, decode_hi, _ = codec_functions(codec)
    weigh, shard_weight, zero = _gathered_weights(), f["shard_weight"], f["zero"]
    as_float, as_bits = f["as_float"], f["as_bits"]
    v = vector_functions()
    load_quad, load_duo, store_quad = v["load_quad"], v["load_duo"], v["store_quad"]
    pairs = codec in PAIRS
    quads = unroll // QUAD  # a lane's quads of values a trip
    u64 = np.uint64
    u_quad, u_stride = u64(QUAD), u64(group * QUAD)  # quad k of a lane: k * group quads on
    u_step = u64(group * unroll)
    cursor = tile_cursor()

    @cuda.jit
    def correct_vectors(words, s0, s1, d_count, lses, self_rank, base_e, corrected):
        # words: data's words (16-bit values two a word, or float32 bits), row (b, head)
        # at b * s0 + head * s1 words, 8-byte (16-bit) or 16-byte aligned; lses [N, B, H]
        # f32; corrected: the [N, B, H/N, D] float32 terms' bits, flat. A lane moves quads
        # of values `group` quads apart, so that each load and store of a warp is whole.
        b_count, n = u64(lses.shape[1]), u64(lses.shape[0])
        hn = u64(lses.shape[2]) // n
        d_values = u64(d_count)
        lane, h, b, b_step = cursor(u64(group))
        r = u64(cuda.blockIdx.y)  # the grid's y: the rank the corrected row goes to
        head = r * hn + h
        buf = cuda.local.array(unroll, np.uint32)
        while h < hn and b < b_count:
            column = lses[:, b, head]
            src = b * u64(s0) + head * u64(s1)
            dst = ((r * b_count + b) * hn + h) * d_values
            w = zero
            weighed = False
            base = lane * u_quad
            while base < d_values:
                for k in range(quads):  # the values load before the weights need the LSEs
                    at = base + u64(k) * u_stride
                    if at < d_values:
                        if pairs:
                            w0, w1 = load_duo(words, src + at // u64(2))
                            buf[QUAD * k] = w0
                            buf[QUAD * k + 1] = w1
                        else:
                            w0, w1, w2, w3 = load_quad(words, src + at)
                            buf[QUAD * k] = w0
                            buf[QUAD * k + 1] = w1
                            buf[QUAD * k + 2] = w2
                            buf[QUAD * k + 3] = w3
                if not weighed:
                    m, inv_total, _ = weigh(column, n, base_e)
                    w = shard_weight(column[self_rank], m, inv_total, base_e)
                    weighed = True
                live = w != zero  # an empty shard adds exactly 0, even NaN
                for k in range(quads):
                    at = base + u64(k) * u_stride
                    if at < d_values:
                        if pairs:
                            x0, x1 = decode_lo(buf[QUAD * k]), decode_hi(buf[QUAD * k])
                            x2 = decode_lo(buf[QUAD * k + 1])
                            x3 = decode_hi(buf[QUAD * k + 1])
                        else:
                            x0, x1 = as_float(buf[QUAD * k]), as_float(buf[QUAD * k + 1])
                            x2, x3 = as_float(buf[QUAD * k + 2]), as_float(buf[QUAD * k + 3])
                        store_quad(corrected, dst + at,
                                   as_bits(w * x0 if live else zero),
                                   as_bits(w * x1 if live else zero),
                                   as_bits(w * x2 if live else zero),
                                   as_bits(w * x3 if live else zero))
                base += u_step
            b += b_step

    return correct_vectors


@functools.cache
def _finish_kernel(codec, group, unroll):
    f = device_functions()
    _, _, _, _, encode = codec_functions(codec)
    weigh, global_lse, neg_inf = _gathered_weights(), f["global_lse"], f["neg_inf"]
    u64 = np.uint64
    u_group, u_step = u64(group), u64(group * unroll)
    cursor = tile_cursor()

    @cuda.jit
    def finish(summed, lses, self_rank, base_e, write_lse, out, out_lse):
        # summed [B, H/N, D] f32, lses [N, B, H] f32 -> out [B, H/N, D], out_lse [B, H/N]
        b_count = u64(summed.shape[0])
        hn = u64(summed.shape[1])
        d_count = u64(summed.shape[2])
        n = u64(lses.shape[0])
        lane, h, b, b_step = cursor(u_group)
        # lane 0 loads the row's LSEs with its values and weighs them after its stores, so
        # that no store waits on them (N up to MAX_HELD; more are read when weighed)
        weighs = write_lse and lane == 0
        held = n <= u64(MAX_HELD)
        lse_row = cuda.local.array(MAX_HELD, float32)
        buf = cuda.local.array(unroll, float32)
        while h < hn and b < b_count:
            column = lses[:, b, u64(self_rank) * hn + h]
            if weighs and held:
                for k in range(MAX_HELD):  # past N: -inf, which adds exactly 0 to the sums
                    lse_row[k] = column[k] if u64(k) < n else neg_inf
            src = summed[b, h]
            dst = out[b, h]
            base = lane
            while base < d_count:
                for k in range(unroll):
                    d = base + u64(k) * u_group
                    if d < d_count:
                        buf[k] = src[d]
                for k in range(unroll):
                    d = base + u64(k) * u_group
                    if d < d_count:
                        dst[d] = encode(buf[k], buf[k])
                base += u_step
            if weighs:
                if held:
                    m, _, total = weigh(lse_row, MAX_HELD, base_e)
                else:
                    m, _, total = weigh(column, n, base_e)
                out_lse[b, h] = global_lse(total, m, base_e)
            b += b_step

    return finish


@functools.cache
def _flat_finish_kernel(codec):
    f = device_functions()
    _, _, _, _, encode = codec_functions(codec)
    weigh, global_lse, neg_inf = _gathered_weights(), f["global_lse"], f["neg_inf"]
    as_float = f["as_float"]
    v = vector_functions()
    load_quad, store_quad, store_duo = v["load_quad"], v["store_quad"], v["store_duo"]
    pairs = codec in PAIRS
    u64 = np.uint64
    u_quad = u64(QUAD)

    @cuda.jit
    def finish_flat(summed, lses, self_rank, base_e, write_lse, out, out_lse):
        # summed: the B * H/N * D float32 sums as uint32 words, a multiple of four, 16-byte
        # aligned; out: the output's words, C-contiguous (float32: 16-byte aligned; 16-bit
        # values: two a word, 8-byte aligned); lses [N, B, H] f32 -> out_lse [B, H/N]
        t = u64(cuda.blockIdx.x) * u64(cuda.blockDim.x) + u64(cuda.threadIdx.x)
        i = t * u_quad
        moves = i < u64(summed.shape[0])
        if moves:  # a quad of sums a thread, loaded before any LSE
            w0, w1, w2, w3 = load_quad(summed, i)
        hn = u64(out_lse.shape[1])
        weighs = write_lse and t < u64(out_lse.shape[0]) * hn  # the row t's LSE
        n = u64(lses.shape[0])
        held = n <= u64(MAX_HELD)
        lse_row = cuda.local.array(MAX_HELD, float32)
        b, h = u64(0), u64(0)
        if weighs:
            b = t // hn
            h = t - b * hn
            column = lses[:, b, u64(self_rank) * hn + h]
            if held:
                for k in range(MAX_HELD):  # past N: -inf, which adds exactly 0 to the sums
                    lse_row[k] = column[k] if u64(k) < n else neg_inf
        if moves:
            if pairs:
                store_duo(out, t * u64(2), encode(as_float(w0), as_float(w1)),
                          encode(as_float(w2), as_float(w3)))
            else:  # float32 out: the sums' bits
                store_quad(out, i, w0, w1, w2, w3)
        if weighs:
            if held:
                m, _, total = weigh(lse_row, MAX_HELD, base_e)
            else:
                m, _, total = weigh(lses[:, b, u64(self_rank) * hn + h], n, base_e)
            out_lse[b, h] = global_lse(total, m, base_e)

    return finish_flat


@functools.cache
def _mask_kernel(group):
    row_is_empty = device_functions()["row_is_empty"]
    neg_inf = np.float32(-np.inf)
    u64 = np.uint64
    u_group = u64(group)
    cursor = row_cursor()

    @cuda.jit
    def mask(lse, seq_lens, query_start_loc, num_seqs, out):
        # lse [B, H] f32 (any strides) -> out [B, H] f32: a copy, -inf on empty tokens
        b_count = u64(lse.shape[0])
        heads = u64(lse.shape[1])
        lane, row, row_step = cursor(u_group)
        while row < b_count:
            empty = row_is_empty(np.int64(row), seq_lens, query_start_loc, num_seqs)
            src = lse[row]
            dst = out[row]
            h = lane
            while h < heads:
                dst[h] = neg_inf if empty else src[h]
                h += u_group
            row += row_step

    return mask


@functools.cache
def mask_kernel(group):
    """The LSE masking copy, specialised for ``group`` lanes per token."""
    i64 = types.int64
    return SpecializedKernel(_mask_kernel(group), (
        array_type(np.float32, 2, False), array_type(np.int64, 1, True),
        array_type(np.int64, 1, True), i64, array_type(np.float32, 2, True)))


def mask_launch(lse, seq_lens, query_start_loc, num_seqs, out):
    """``(kernel, grid, block, args)``: copy ``lse [B, H]`` float32 into ``out [B, H]``
    (C-contiguous), with -inf for the tokens the mask marks empty."""
    out.require_c_contiguous("out")
    seq_lens.require_c_contiguous("seq_lens")
    query_start_loc.require_c_contiguous("query_start_loc")
    group = lanes_per_row(lse.shape[1], 1)
    grid, block = row_grid(lse.shape[0], group)
    return mask_kernel(group), grid, block, (lse, seq_lens, query_start_loc, int(num_seqs), out)


@functools.cache
def correct_kernel(dtype, group, unroll=UNROLL):
    """The correcting kernel for ``dtype``, ``group`` lanes a row and ``unroll`` values a
    lane and trip (:func:`correct_shape`)."""
    codec, value = combine_codec(dtype)
    i64 = types.int64
    return SpecializedKernel(_correct_kernel(codec, group, unroll), (
        array_type(value, 3, False), array_type(np.float32, 3, True), i64, i64,
        array_type(np.float32, 4, True)))


@functools.cache
def finish_kernel(dtype, group, unroll=UNROLL):
    """The finishing kernel for ``dtype``, ``group`` lanes a row and ``unroll`` values a
    lane and trip (:func:`finish_shape`)."""
    codec, value = combine_codec(dtype)
    i64 = types.int64
    return SpecializedKernel(_finish_kernel(codec, group, unroll), (
        array_type(np.float32, 3, True), array_type(np.float32, 3, True), i64, i64, i64,
        array_type(value, 3, False), array_type(np.float32, 2, False)))


@functools.cache
def vector_correct_kernel(dtype, group, unroll=UNROLL):
    """The correcting kernel that moves values in quads (a warp's loads and stores
    whole): ``group`` lanes a row, ``unroll`` values a lane and trip
    (:func:`correct_vectors`)."""
    codec, _ = combine_codec(dtype, pairs=True)
    i64 = types.int64
    return SpecializedKernel(_vector_correct_kernel(codec, group, unroll), (
        array_type(np.uint32, 1, True), i64, i64, i64, array_type(np.float32, 3, True), i64,
        i64, array_type(np.uint32, 1, True)))


def correct_vectors(data, corrected):
    """Can :func:`vector_correct_kernel` correct ``data`` (``[B, H, D]`` values) into
    ``corrected``? D a multiple of four, rows unit-stride, every row aligned for a
    quad of values (8 bytes of 16-bit values, 16 of float32) and ``corrected``
    16-byte aligned."""
    item = data.dtype.itemsize
    align = QUAD * item
    return (item in (2, 4) and data.shape[2] % QUAD == 0 and data.span().shape[0] > 0
            and data.ptr % align == 0 and corrected.ptr % 16 == 0
            and all(stride % align == 0 for extent, stride in zip(data.shape[:2], data.strides[:2])
                    if extent > 1))


@functools.cache
def flat_finish_kernel(dtype):
    """The flat finishing kernel for ``dtype``: a quad of sums a thread, its values
    in pairs (16-bit) or as they are (float32), and the row t's LSE in thread t."""
    codec, _ = combine_codec(dtype, pairs=True)
    i64 = types.int64
    return SpecializedKernel(_flat_finish_kernel(codec), (
        array_type(np.uint32, 1, True), array_type(np.float32, 3, True), i64, i64, i64,
        array_type(np.uint32, 1, True), array_type(np.float32, 2, False)))


def finishes_flat(summed, out):
    """Can the flat finish write ``out`` from ``summed``? Both C-contiguous, a multiple
    of four values, ``summed`` 16-byte aligned and ``out`` 16-byte (float32) or 8-byte
    (16-bit values) aligned."""
    return (summed.size % QUAD == 0 and summed.ptr % 16 == 0 and out.is_c_contiguous()
            and out.ptr % (16 if out.dtype.itemsize == 4 else 8) == 0)


def _words(flat):
    """A 1-D unit-stride array as the uint32 words the vector kernels move: 16-bit
    values two a word (:meth:`DeviceArray.as_words`), float32 values as their bits."""
    return flat.as_words() if flat.dtype.itemsize == 2 else flat.view(np.uint32)


def correct_launch(dtype, data, lses, self_rank, is_lse_base_on_e, corrected):
    """``(kernel, grid, block, args)``: ``data [B, H, D]`` (seen as the codec's values),
    gathered ``lses [N, B, H]`` float32 -> ``corrected [N, B, H/N, D]`` float32."""
    lses.require_c_contiguous("lses")
    corrected.require_c_contiguous("corrected")
    n, b, h = lses.shape
    if (b, h) != tuple(data.shape[:2]) or corrected.shape != (n, b, h // n, data.shape[2]):
        raise ValueError(f"lses must be [N, B, H] and corrected [N, B, H/N, D] for data "
                         f"{tuple(data.shape)} (got {lses.shape} and {corrected.shape})")
    group, unroll = correct_shape(data.shape[2], b * h)
    grid, block = tile_grid(h // n, b, group, n)
    if correct_vectors(data, corrected):
        s0, s1 = (stride // 4 if extent > 1 else 0
                  for extent, stride in zip(data.shape[:2], data.strides[:2]))
        return vector_correct_kernel(dtype, group, unroll), grid, block, (
            _words(data.span()), s0, s1, data.shape[2], lses, int(self_rank),
            int(bool(is_lse_base_on_e)), _words(corrected.flat()))
    return correct_kernel(dtype, group, unroll), grid, block, (
        data, lses, int(self_rank), int(bool(is_lse_base_on_e)), corrected)


def finish_launch(dtype, summed, lses, self_rank, is_lse_base_on_e, out, out_lse=None):
    """``(kernel, grid, block, args)``: ``summed [B, H/N, D]`` float32 -> ``out`` (seen as
    the codec's values, any strides), and the global LSE into ``out_lse`` if given."""
    summed.require_c_contiguous("summed")
    lses.require_c_contiguous("lses")
    if tuple(out.shape) != tuple(summed.shape) or lses.shape[1] != summed.shape[0] or \
            lses.shape[2] != lses.shape[0] * summed.shape[1]:
        raise ValueError(f"summed and out must be [B, H/N, D] and lses [N, B, H] "
                         f"(got {summed.shape}, {out.shape} and {lses.shape})")
    write_lse = out_lse is not None
    if write_lse and tuple(out_lse.shape) != tuple(summed.shape[:2]):
        raise ValueError(f"out_lse must be [B, H/N] = {summed.shape[:2]} (got {out_lse.shape})")
    if not write_lse:  # never written: a placeholder of the right type
        out_lse = DeviceArray(out.ptr, (0, 0), (4, 4), np.float32, out.owner)
    if finishes_flat(summed, out):
        rows = summed.shape[0] * summed.shape[1] if write_lse else 0
        threads = max(summed.size // QUAD, rows, 1)  # a quad a thread, a row's LSE a thread
        grid, block = (-(-threads // FLAT_BLOCK), 1, 1), (FLAT_BLOCK, 1, 1)
        return flat_finish_kernel(dtype), grid, block, (
            _words(summed.flat()), lses, int(self_rank), int(bool(is_lse_base_on_e)),
            int(write_lse), _words(out.flat()), out_lse)
    group, unroll = finish_shape(summed.shape[2], summed.shape[0] * summed.shape[1])
    grid, block = tile_grid(summed.shape[1], summed.shape[0], group)
    return finish_kernel(dtype, group, unroll), grid, block, (
        summed, lses, int(self_rank), int(bool(is_lse_base_on_e)), int(write_lse), out, out_lse)


def _float32s(**arrays):
    for name, arr in arrays.items():
        if as_dtype(arr.dtype) != np.float32:
            raise TypeError(f"{name} must be float32 (got {arr.dtype})")


def agrs_correct(data, lses, self_rank, corrected, is_lse_base_on_e=True, stream=None):
    """Scale this rank's partials by its exact weights, laid out by destination rank.

    Args:
        data: ``[B, H, D]`` float16, bfloat16 or float32 device array, any strides.
        lses: ``[N, B, H]`` float32 device array, C-contiguous: every rank's LSEs.
        self_rank: this rank's index in ``lses`` (an integer in ``[0, N)``).
        corrected: ``[N, B, H/N, D]`` float32 device array, C-contiguous; written;
            it shares no byte with ``data`` or ``lses`` (``ValueError``).
        stream: the stream to run on; ``None`` is CuPy's current stream.
    """
    dtype = as_dtype(data.dtype)
    _, value = combine_codec(dtype)
    _float32s(lses=lses, corrected=corrected)
    if len(lses.shape) != 3 or len(data.shape) != 3:
        raise ValueError(f"data must be [B, H, D] and lses [N, B, H] (got shapes "
                         f"{tuple(data.shape)} and {tuple(lses.shape)})")
    check_heads(int(data.shape[1]), int(lses.shape[0]))
    self_rank = check_rank(self_rank, int(lses.shape[0]))
    is_lse_base_on_e = check_flag(is_lse_base_on_e, "is_lse_base_on_e")
    data_arr, lses_arr = kernel_array(data, value, "data"), kernel_array(lses, np.float32, "lses")
    corrected_arr = output_array(corrected, np.float32, "corrected")
    check_apart(dict(corrected=corrected_arr), dict(data=data_arr, lses=lses_arr),
                WRITES_WHILE_READING)
    kernel, grid, block, args = correct_launch(dtype, data_arr, lses_arr, self_rank,
                                               is_lse_base_on_e, corrected_arr)
    if data.shape[0]:
        kernel(grid, block, stream_ptr(stream), args)


def agrs_finish(summed, lses, self_rank, out, out_lse=None, is_lse_base_on_e=True, stream=None):
    """Round the reduce-scattered sums ``summed [B, H/N, D]`` (float32) into ``out``
    (``[B, H/N, D]``, any strides whose elements do not share memory) and the global
    LSE of this rank's heads into ``out_lse [B, H/N]`` (float32), from every rank's
    ``lses [N, B, H]``; neither output shares a byte with ``summed``, ``lses`` or
    the other output (``ValueError``). A C-contiguous ``out`` takes the flat kernel
    (:func:`finishes_flat`), the same bits faster."""
    dtype = as_dtype(out.dtype)
    _, value = combine_codec(dtype)
    _float32s(summed=summed, lses=lses, **({} if out_lse is None else dict(out_lse=out_lse)))
    if len(lses.shape) != 3:
        raise ValueError(f"lses must be [N, B, H] (got shape {tuple(lses.shape)})")
    self_rank = check_rank(self_rank, int(lses.shape[0]))
    is_lse_base_on_e = check_flag(is_lse_base_on_e, "is_lse_base_on_e")
    lse_arr = None if out_lse is None else output_array(out_lse, np.float32, "out_lse")
    summed_arr, lses_arr = kernel_array(summed, np.float32, "summed"), \
        kernel_array(lses, np.float32, "lses")
    out_arr = output_array(out, value, "out")
    check_apart(dict(out=out_arr, out_lse=lse_arr), dict(summed=summed_arr, lses=lses_arr),
                WRITES_WHILE_READING)
    check_apart(dict(out_lse=lse_arr), dict(out=out_arr), WRITES_BOTH)
    kernel, grid, block, args = finish_launch(dtype, summed_arr, lses_arr, self_rank,
                                              is_lse_base_on_e, out_arr, lse_arr)
    if summed.shape[0]:
        kernel(grid, block, stream_ptr(stream), args)
