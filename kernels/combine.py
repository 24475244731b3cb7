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

Three kernels, giving the same bits. For N from 2 to :data:`MAX_STATIC_SHARDS`,
two built for their N (every loop over the shards unrolled, every shard's
loads issued before any is weighed, a row's LSEs and weights held in
registers): ``_blocks``, a block of up to 128 threads per row with no loop, where
:func:`by_blocks` allows (few rows, or rows long enough that each thread
moves several values); else ``_slices``, each row split over the grid's y,
each lane moving as many values as :func:`combine_unroll` gives (about
:data:`LANE_LOADS` in all, fewer for few rows, more from N = 8 on for many),
rows mapped to the grid by ``_rows.tile_grid``. For any other N (past
:data:`MAX_STATIC_SHARDS`), one that walks the shards two at a time, each pair's
loads after the previous pair's sums: correct at any N, but several times slower.
"""

import functools

import numpy as np
from numba import cuda

from numba.core import types

from ._arrays import dummy_index, kernel_array, output_array, stream_ptr
from ._codecs import _BF16, _F16, PAIRS, RAW, RAW_BITS, codec_functions, combine_codec
from ._device import device_functions, inline_device, row_weights_of
from ._launch import DeviceArray, SpecializedKernel, array_type
from ._blocks import BLOCK_THREADS, blocks_kernel
from ._rows import MAX_GRID_Z, MAX_REGISTERS, UNROLL, WARP, lanes_per_row, tile_cursor, tile_grid
from ._slices import slices_kernel
from ._format import WRITES_BOTH, WRITES_WHILE_READING, check_apart, check_flag
from ._specs import check_combine_args
from ._trailer import WORDS, combine_checks

__all__ = ["BLOCK_LOADS", "BLOCK_ROWS", "FEW_WARPS", "FULL_BLOCK", "LANE_LOADS", "MANY_WARPS",
           "MAX_STATIC_SHARDS", "NARROW", "SLICED_UNROLL", "SPREAD_FROM", "SPREAD_WARPS",
           "STREAM_LOADS", "STREAM_UNROLL",
           "block_threads", "block_values", "block_warps", "by_blocks", "capped",
           "codec_functions", "combine_codec", "combine_kernel", "combine_launch",
           "combine_unroll", "combine_variants", "lane_weights", "row_accumulator",
           "static_shards", "unpack_combine", "whole_slices"]


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
def _combine_kernel(codec, group=WARP, unroll=UNROLL):
    f = device_functions()
    accumulators = 2 * unroll  # low and high value of each word in pairs mode
    lse_lanes, load_lse = codec_functions(codec)[:2]
    load_two, add_weighted, store_row = row_accumulator(codec, group, unroll)
    raw = RAW[codec]
    row_weights = lane_weights(codec)
    global_lse, shard_weight, zero = f["global_lse"], f["shard_weight"], f["zero"]
    step = group * unroll
    cursor = tile_cursor()

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
        # A plan's trailer rows: did every peer sign as rank 0? Threads 0 .. (N-1) * WORDS
        # - 1 of the first token's blocks compare a word each; they load both before their
        # rows and compare after, so that no row waits on those loads.
        signed = cuda.blockIdx.z == 0 and u64(vals.shape[1]) > tokens
        checks = (n - u_one) * u_words if signed else u64(0)
        t, t_step, count, ours, theirs = begin_checks(bits, state, tokens, signed, checks)
        width = u64(vals.shape[3])
        d_count = u64(out.shape[2])
        lane, h, b, b_step = cursor(u_group)
        acc = cuda.local.array(accumulators, np.float32)
        first = cuda.local.array(unroll, raw)
        second = cuda.local.array(unroll, raw)
        while h < hn and b < tokens:  # a lane group per (token, head) row; no synchronisation
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
            b += b_step
        finish_checks(bits, status, state, tokens, signed, checks, t, t_step, count, ours,
                      theirs)

    return combine


MAX_STATIC_SHARDS = 32  # up to this N the combine is built for its N (every shard loaded first)
SLICED_UNROLL = 2  # the fewest values a lane and shard of the combine for its N
LANE_LOADS = 16  # the values a lane of the combine for its N loads, over every shard
FEW_WARPS = 256  # a combine for its N launched as fewer warps moves fewer values a lane
MANY_WARPS = 4096  # a combine for its N launched as this many warps or more streams
STREAM_UNROLL = 4  # the fewest values a lane and shard of a combine that streams,
STREAM_LOADS = 64  # where a lane's loads over every shard stay within this many
SPREAD_FROM = 64  # a combine for its N of this many warps, up to FEW_WARPS, runs in
SPREAD_WARPS = 2  # blocks of this many warps (more SMs share few warps)
BLOCK_LOADS = 32  # the most values a thread of a block a row loads, over every shard
BLOCK_ROWS = 512  # up to this many rows a combine for its N runs a block a row,
FULL_BLOCK = 4  # and beyond, where each thread moves at least this many values a shard
NARROW = 2 ** 32  # a block a row runs where the buffer and output span fewer elements


def static_shards(n):
    """The ``shards`` of the combine kernel for ``n`` ranks: ``n`` from 2 to
    :data:`MAX_STATIC_SHARDS`, else 0 (the kernel for any N)."""
    return int(n) if 2 <= int(n) <= MAX_STATIC_SHARDS else 0


def capped(codec, shards, unroll):
    """Whether the combine for exactly ``shards`` ranks, ``unroll`` values a lane and
    shard of ``codec``, is linked with at most :data:`MAX_REGISTERS` registers a
    thread: float32 values within :data:`LANE_LOADS` a lane (a loaded value and
    an accumulator each: N = 2 at 8 values a shard takes 72 registers uncapped, 64
    capped with no spill, and 8 blocks of 4 warps then fit an SM, not 7). 16-bit
    values decode into two accumulators a word, and spill at 64."""
    return codec == "float32" and shards * unroll <= LANE_LOADS


def whole_slices(elements, group, unroll):
    """Whether rows of ``elements`` values (words in pairs), split into slices of
    ``group`` lanes moving ``unroll`` values each, fill every slice: the combine for
    exactly N then tests no load or store against the row's end (the test costs it
    registers: ``benchmarks/NOTES.md``)."""
    return int(elements) % (int(group) * int(unroll)) == 0


@functools.cache
def combine_kernel(dtype, pairs=False, group=WARP, shards=0, unroll=UNROLL, blocks=False,
                   signed=False, whole=False):
    """The combine kernel specialised for output ``dtype`` (and 16-bit pairs),
    ``group`` lanes per row and, where ``shards`` (2 to :data:`MAX_STATIC_SHARDS`),
    for exactly that many ranks (0: any) with ``unroll`` values per lane and shard
    (:func:`combine_unroll`); the kernel for exactly N (``_slices``) splits rows
    over its grid's y, takes flat views of the received buffer too, and is linked
    with at most :data:`MAX_REGISTERS` registers where :func:`capped`.

    ``whole``: the kernel for exactly N for rows that fill every slice
    (:func:`whole_slices`), with no test against a row's end.

    ``blocks``: the kernel for exactly ``shards`` ranks with a block of ``group``
    threads a row (``_blocks``; ``unroll`` the values a thread and shard:
    :func:`block_threads`, :func:`block_values`), checking a plan's trailer where
    ``signed``; its arguments are ``_blocks.blocks_kernel``'s."""
    codec, value = combine_codec(dtype, pairs)
    bits = np.dtype(np.uint32 if value.itemsize == 4 else np.uint16)
    i64 = types.int64
    if blocks:
        argtypes = (array_type(value, 1, True), array_type(bits, 1, True),
                    array_type(value, 1, True), array_type(np.float32, 2, False),
                    i64, i64, i64, i64, i64, i64, i64, i64)
        if signed:
            argtypes += (array_type(bits, 4, True), array_type(np.int64, 1, True),
                         array_type(np.int64, 1, True))
        return SpecializedKernel(blocks_kernel(codec, shards, unroll, signed, group), argtypes)
    argtypes = (array_type(value, 4, True), array_type(bits, 4, True),
                array_type(value, 3, False), array_type(np.float32, 2, False), i64, i64,
                array_type(np.int64, 1, True), array_type(np.int64, 1, True))
    if shards:
        cap = MAX_REGISTERS if capped(codec, shards, unroll) else 0
        return SpecializedKernel(slices_kernel(codec, shards, group, unroll, cap, bool(whole)),
                                 argtypes + (array_type(value, 1, True),
                                             array_type(bits, 1, True)))
    return SpecializedKernel(_combine_kernel(codec, group), argtypes)


def _unrolls(shards):
    """The values a lane and shard that the combine for ``shards`` ranks can move
    (:func:`combine_unroll`), most first: powers of two down to
    :data:`SLICED_UNROLL`, from the most that keeps a lane's loads within
    :data:`LANE_LOADS`, or :data:`STREAM_UNROLL` if more and its loads over every shard
    stay within :data:`STREAM_LOADS`."""
    most = SLICED_UNROLL
    while most * 2 * shards <= LANE_LOADS:
        most *= 2
    streams = STREAM_UNROLL * shards <= STREAM_LOADS
    unrolls = [max(most, STREAM_UNROLL) if streams else most]
    while unrolls[-1] > SLICED_UNROLL:
        unrolls.append(unrolls[-1] // 2)
    return unrolls


def _slicing(elements, unroll):
    """``(group, slices)``: the lanes of a row slice of ``unroll`` values a lane, and the
    slices that cover ``elements``."""
    group = lanes_per_row(elements, unroll)
    return group, -(-elements // (group * unroll))


def _warps(elements, rows, unroll):
    """The warps of a combine of ``rows`` rows of ``elements`` values, ``unroll`` a lane."""
    group, slices = _slicing(elements, unroll)
    return -(-rows * slices * group // WARP)


def combine_unroll(elements, rows, shards):
    """The values a lane and shard of the combine for exactly ``shards`` ranks, for
    ``rows`` rows of ``elements`` values (words in pairs).

    The most that keeps a lane's loads within :data:`LANE_LOADS` (N = 2: 8,
    N = 4: 4, N = 8: 2; past 8, :data:`SLICED_UNROLL`, beyond them), halved (to :data:`SLICED_UNROLL` at least) while the
    launch would have fewer than :data:`FEW_WARPS` warps, so that few rows
    spread over more lanes; but where it would have :data:`MANY_WARPS` or
    more, the combine streams, and each lane moves at least
    :data:`STREAM_UNROLL` values a shard (N = 8: 4), up to :data:`STREAM_LOADS` loads a
    lane (to N = 16; past it a lane keeps :data:`SLICED_UNROLL`). The figures behind these
    constants: ``benchmarks/NOTES.md``, from ``benchmarks/kernel_shapes.py``.
    """
    unrolls = _unrolls(shards)
    within = [u for u in unrolls if u * shards <= LANE_LOADS] or unrolls[-1:]
    if _warps(elements, rows, within[0]) >= MANY_WARPS:
        return unrolls[0]
    for unroll in within:
        if _warps(elements, rows, unroll) >= FEW_WARPS:
            return unroll
    return within[-1]


def block_warps(warps):
    """The warps a block of a combine for its N that launches ``warps`` warps in all:
    :data:`SPREAD_WARPS` from :data:`SPREAD_FROM` to :data:`FEW_WARPS` (so that more
    SMs share them), else ``_rows.WARPS_PER_BLOCK`` (``None``). The figures behind
    it: ``benchmarks/NOTES.md``."""
    return SPREAD_WARPS if SPREAD_FROM <= warps <= FEW_WARPS else None


def _combine_shape(elements, rows, shards):
    """``(group, unroll, slices)`` of the combine of ``rows`` rows of ``elements`` values
    (words in pairs) by the kernel for ``shards`` (:func:`static_shards`): each row
    split into ``slices`` along the grid's y (the kernel for exactly N,
    :func:`combine_unroll`); or whole rows (``slices`` 0: the kernel for any N), also
    where the slices would be more than a grid's y holds (rows of millions of values:
    the kernel for any N walks a row in steps)."""
    if shards:
        unroll = combine_unroll(elements, rows, shards)
        group, slices = _slicing(elements, unroll)
        if slices <= MAX_GRID_Z:
            return group, unroll, slices
    return lanes_per_row(elements), UNROLL, 0


def block_threads(elements):
    """The threads of a block of the combine with a block a row, for rows of
    ``elements`` values (words in pairs): the fewest warps that give each value a
    thread, at most ``_blocks.BLOCK_THREADS`` (rows of 64 words run in blocks of 64
    threads, not of 128 with half idle; the figures behind it:
    ``benchmarks/NOTES.md``)."""
    return min(BLOCK_THREADS, WARP * -(-int(elements) // WARP))


def block_values(elements):
    """The values a thread and shard of the combine with a block a row moves, for rows
    of ``elements`` values (words in pairs)."""
    return -(-int(elements) // block_threads(elements))


def by_blocks(elements, tokens, rows, shards):
    """Whether the combine of ``tokens`` tokens, ``rows`` rows in all, of ``elements``
    values (words in pairs) for ``shards`` ranks (:func:`static_shards`) runs a block
    a row (``_blocks``): for its N, a row in one step of at most :data:`BLOCK_LOADS`
    loads a thread, the tokens within a grid's y, and at most :data:`BLOCK_ROWS`
    rows or :data:`FULL_BLOCK` values a thread and shard (many short rows run
    faster split over warps). The figures behind it: ``benchmarks/NOTES.md``."""
    per = block_values(elements)
    return bool(shards) and per * shards <= BLOCK_LOADS and tokens <= MAX_GRID_Z and \
        (rows <= BLOCK_ROWS or per >= FULL_BLOCK)


def _sliced(elements, group, shards, unroll):
    """The arguments of :func:`combine_kernel` after its ``dtype`` and ``pairs`` of the
    combine for exactly ``shards`` ranks on slices of ``group`` lanes and ``unroll``
    values, for rows of ``elements`` values (words in pairs): with ``whole`` where
    :func:`whole_slices`. The launch and :func:`combine_variants` both take them from
    here, so that a plan's warm-up builds the very kernel (the same cache key) that
    the launch asks for."""
    if whole_slices(elements, group, unroll):
        return group, shards, unroll, False, False, True
    return group, shards, unroll


def combine_variants(elements, shards, signed=False):
    """The combine kernels that a combine of rows of ``elements`` values (words in pairs)
    can launch (:func:`combine_launch`), as the arguments of :func:`combine_kernel`
    after its ``dtype`` and ``pairs``: whole rows, or for ``shards`` ranks built for
    their N one per :func:`combine_unroll` choice (with no test against a row's end
    where :func:`whole_slices`) and, where a row fits a block's
    step, the one with a block a row (checking a plan's trailer where ``signed``); the
    one for any N also where a choice would split rows into more slices than a grid's
    y holds (:func:`_combine_shape`)."""
    any_n = (lanes_per_row(elements), 0, UNROLL)
    if not shards:
        return [any_n]
    unrolls = _unrolls(shards)
    slicings = [(unroll, *_slicing(elements, unroll)) for unroll in unrolls]
    found = [_sliced(elements, group, shards, unroll) for unroll, group, slices in slicings
             if slices <= MAX_GRID_Z]
    if len(found) < len(unrolls):
        found.append(any_n)
    if by_blocks(elements, 1, 1, shards):
        found.append((block_threads(elements), shards, block_values(elements), True,
                      bool(signed)))
    return found


def unpack_combine(recv, out, out_lse=None, is_lse_base_on_e=True, stream=None):
    """Combine the received partials exactly, on ``stream``.

    Args:
        recv: ``[N, B, H/N, D + P]`` device array in the output dtype (or its
            unsigned-integer twin), C-contiguous; ``recv[r]`` came from rank r.
        out: ``[B, H/N, D]`` float16, bfloat16 or float32 device array, any
            strides (token-major, or head-major storage ``[H/N, B, D]`` seen as
            ``[B, H/N, D]``) but none whose elements share memory
            (``ValueError``); written.
        out_lse: optional ``[B, H/N]`` float32 device array; receives the
            global LSE (-inf where every shard is empty).
        is_lse_base_on_e: natural-log LSEs; ``False`` for base 2.
        stream: the stream to run on; ``None`` is CuPy's current stream.

    ``out`` and ``out_lse`` share no byte with ``recv`` nor with each other
    (``ValueError``).
    """
    spec = check_combine_args(recv, out, out_lse)
    is_lse_base_on_e = check_flag(is_lse_base_on_e, "is_lse_base_on_e")
    if spec.tokens == 0:
        return
    _, value = combine_codec(spec.dtype)
    lse_arr = None if out_lse is None else output_array(out_lse, np.float32, "out_lse")
    recv_arr, out_arr = kernel_array(recv, spec.bits, "recv"), output_array(out, value, "out")
    check_apart(dict(out=out_arr, out_lse=lse_arr), dict(recv=recv_arr),
                WRITES_WHILE_READING)
    check_apart(dict(out_lse=lse_arr), dict(out=out_arr), WRITES_BOTH)
    kernel, grid, block, args = combine_launch(spec.dtype, recv_arr, out_arr, lse_arr,
                                               is_lse_base_on_e)
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

    For N from 2 to :data:`MAX_STATIC_SHARDS`, a combine that :func:`by_blocks`
    allows, whose output has a flat view (``DeviceArray.span``: rows unit-stride)
    and whose buffers hold fewer than :data:`NARROW` elements (its offsets are 32-bit),
    runs a block of :func:`block_threads` threads a row, on grid ``(H/N, B, 1)``
    with one block more along x where ``signed`` (the first: it checks the trailer)
    and one more where there is an output LSE (the last: it writes the token's
    LSEs; ``_blocks``); the others run on ``_rows.tile_grid``.
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
    out_flat = out.span()
    if by_blocks(out.shape[2], out.shape[0], rows, shards) and \
            0 < out_flat.shape[0] < NARROW and recv_vals.size < NARROW:
        _, chunk_tokens, heads, width = recv_vals.shape
        threads = block_threads(out.shape[2])
        kernel = combine_kernel(dtype, codec in PAIRS, threads, shards,
                                block_values(out.shape[2]), True, signed is not None)
        args = (recv_vals.flat(), recv_bits.flat(), out_flat, out_lse, int(write_lse),
                int(bool(is_lse_base_on_e)), heads, width, chunk_tokens * heads * width,
                out.shape[2], *out.element_strides())
        if signed is not None:
            args += (recv_bits, status, state)
        return kernel, (out.shape[1] + (signed is not None) + write_lse, out.shape[0], 1), \
            (threads, 1), args
    group, unroll, slices = _combine_shape(out.shape[2], rows, shards)
    shards = shards if slices else 0
    warps = block_warps(_warps(out.shape[2], rows, unroll)) if slices else None
    grid, block = tile_grid(out.shape[1], out.shape[0], group, slices, warps)
    variant = _sliced(out.shape[2], group, shards, unroll) if shards else \
        (group, shards, unroll)
    kernel = combine_kernel(dtype, codec in PAIRS, *variant)
    args = (recv_vals, recv_bits, out, out_lse, int(write_lse), int(bool(is_lse_base_on_e)),
            status, state)
    if shards:  # the kernel for exactly N reads the buffer through flat views
        args += (recv_vals.flat(), recv_bits.flat())
    return kernel, grid, block, args
