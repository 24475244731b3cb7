"""The pack kernel: partials and LSE bits into the packed send buffer.

``send[r, b, h, :D] = out[b, r*H/N + h, :]`` and the trailing ``P`` lanes carry
the float32 LSE's bits (see ``_format``). The kernel copies bit
patterns (uint16 or uint32), so one kernel serves every dtype.

A group of lanes per (rank, token, head) row, found from the grid alone
(``_rows.tile_grid``: heads along x, ranks along y, tokens along z); it writes
its row through a flat view of the buffer, and reads it through a flat view of
the input (``DeviceArray.span``) where the input's rows are unit-stride: one
base address and constant offsets, where a strided read computes an address
per element (a masked kernel's trips of two rows read through the strides:
with both rows' mask words held, flat reads would spill).
:func:`packed_row_steps` holds the row steps that the direct path's tiles
kernel shares. Rows of words of more than one step go as aligned 16-byte quads
where the arrays allow (:func:`quad_rows`, ``_quad_rows``). Rows of one step read
through a flat view take a kernel of a block row per token with no loop and
scalar arguments at decode sizes (``_pack_tokens``, picked by :func:`pack_launch`).
"""

import functools

import numpy as np
from numba import config, cuda

from numba.core import types

from ._arrays import dummy_index, kernel_array, output_array, stream_ptr
from ._device import device_functions
from ._format import (LSE_HALF_BITS, LSE_HALF_MASK, WRITES_WHILE_READING, check_apart,
                      check_rank)
from ._launch import SpecializedKernel, array_type
from ._math import NEG_INF_BITS
from ._pack_tokens import (by_tokens, can_load_quads, can_stage, fits_a_warp, loads_quads,
                           signs_ahead, stages, token_block_grid, tokens_a_block,
                           tokens_kernel)
from ._quad_rows import quad_row_packer
from ._rows import MAX_GRID_Z, MAX_REGISTERS, UNROLL, WARP, lanes_per_row, tile_grid
from ._specs import check_pack_args
from ._trailer import CALL, TOKENS, WORDS, trailer_functions
from ._vector import QUAD, vector_functions

__all__ = ["MAX_REGISTERS", "pack_kernel", "pack_launch", "pack_send", "quad_rows", "wide_rows"]


@functools.cache
def lse_bits_reader():
    """Device function ``row_lse_bits(lse_bits, b, head, seq_lens, query_start_loc,
    num_seqs)``: the uint32 bits that a packed row carries for its LSE:
    ``lse_bits[b, head]``, or ``-inf``'s for an empty or padding token ``b``. The
    LSE loads beside the mask's loads (it is read either way), not after them."""
    row_is_empty = device_functions()["row_is_empty"]
    neg_inf_bits = np.uint32(NEG_INF_BITS)

    @cuda.jit(device=True)
    def row_lse_bits(lse_bits, b, head, seq_lens, query_start_loc, num_seqs):
        bits = np.uint32(lse_bits[b, head])
        empty = row_is_empty(np.int64(b), seq_lens, query_start_loc, num_seqs)
        return neg_inf_bits if empty else bits

    return row_lse_bits


@functools.cache
def lse_bits_steps():
    """Device functions ``row_lse_fetch(lse_bits, b, head, seq_lens, query_start_loc,
    num_seqs) -> fetched`` (the loads of a packed row's LSE lanes: ``lse_bits[b,
    head]`` and the mask's, issued together) and ``row_lse_of(fetched, b, seq_lens,
    query_start_loc, num_seqs)``: what :func:`lse_bits_reader` gives, in two steps,
    so that a kernel holding two rows can fetch both before its stores and take
    each row's bits after them."""
    f = device_functions()
    mask_fetch, mask_decide = f["mask_fetch"], f["mask_decide"]
    neg_inf_bits = np.uint32(NEG_INF_BITS)

    @cuda.jit(device=True)
    def row_lse_fetch(lse_bits, b, head, seq_lens, query_start_loc, num_seqs):
        return np.uint32(lse_bits[b, head]), mask_fetch(np.int64(b), seq_lens, query_start_loc,
                                                        num_seqs)

    @cuda.jit(device=True)
    def row_lse_of(fetched, b, seq_lens, query_start_loc, num_seqs):
        bits, words = fetched
        empty = mask_decide(np.int64(b), words, seq_lens, query_start_loc, num_seqs)
        return neg_inf_bits if empty else bits

    return row_lse_fetch, row_lse_of


@functools.cache
def packed_row_steps(group=WARP, quads=False):
    """Device functions ``load_first_step(src, buf, lane, d_count, vector)``
    (this lane's first step of a row into the local array ``buf``: every load
    issued before any is used) and ``write_packed_row_from(src, dst, lse_bits,
    b, head, seq_lens, query_start_loc, num_seqs, lane, d_count, width, buf,
    loaded, vector)``: this lane's share of one packed row, ``dst[:D] = src``
    and the bits of ``lse_bits[b, head]`` (``-inf`` for an empty or padding
    token ``b``) in ``dst[D:]``, for rows of ``group`` lanes; ``loaded``:
    ``buf`` already holds the lane's first step (``load_first_step``), so its
    stores need not wait for loads issued here. Used by the direct path's tiles
    kernel.

    Each lane moves ``UNROLL`` elements per step, loading them all before it
    stores any, so that enough loads are in flight to run at memory bandwidth.
    ``vector`` (only in functions built with ``quads``, for uint32 words):
    they move as 16-byte quads of words (``_vector``), lane ``l`` taking quads
    ``l, l + group, ...`` of the step's ``group * UNROLL`` words; the caller
    vouches that ``D`` is a multiple of four and both rows are 16-byte aligned.
    """
    row_lse_bits = lse_bits_reader()
    lse_mask, lse_shift = np.uint32(LSE_HALF_MASK), np.uint32(LSE_HALF_BITS)
    u64 = np.uint64
    u_group, u_step, u_one = u64(group), u64(group * UNROLL), u64(1)
    u_quad, u_quad_stride = u64(QUAD), u64(QUAD * group)
    jit = cuda.jit(device=True)

    if quads:
        v = vector_functions()
        load_quad, store_quad = v["load_quad"], v["store_quad"]

        @jit
        def load_quads(src, buf, base, d_count):
            for k in range(UNROLL // QUAD):
                d = base + u64(k) * u_quad_stride
                if d < d_count:
                    w0, w1, w2, w3 = load_quad(src, d)
                    buf[QUAD * k] = w0
                    buf[QUAD * k + 1] = w1
                    buf[QUAD * k + 2] = w2
                    buf[QUAD * k + 3] = w3

        @jit
        def store_quads(dst, buf, base, d_count):
            for k in range(UNROLL // QUAD):
                d = base + u64(k) * u_quad_stride
                if d < d_count:
                    store_quad(dst, d, buf[QUAD * k], buf[QUAD * k + 1], buf[QUAD * k + 2],
                               buf[QUAD * k + 3])
    else:  # never called: ``vector`` is always False
        @jit
        def load_quads(src, buf, base, d_count):
            pass

        store_quads = load_quads

    @jit
    def load_step(src, buf, base, d_count, vector):
        if vector:
            load_quads(src, buf, base, d_count)
            return
        for k in range(UNROLL):
            d = base + u64(k) * u_group
            if d < d_count:
                buf[k] = src[d]

    @jit
    def step_start(lane, vector):
        """The first element of a lane's first step."""
        return lane * u_quad if vector else lane

    @jit
    def load_first_step(src, buf, lane, d_count, vector):
        load_step(src, buf, step_start(lane, vector), d_count, vector)

    @jit
    def write_row_data(src, dst, lane, d_count, buf, loaded, vector):
        base = step_start(lane, vector)
        while base < d_count:
            if not loaded:
                load_step(src, buf, base, d_count, vector)
            loaded = False
            if vector:
                store_quads(dst, buf, base, d_count)
            else:
                for k in range(UNROLL):
                    d = base + u64(k) * u_group
                    if d < d_count:
                        dst[d] = buf[k]
            base += u_step

    @jit
    def write_lse_lanes(dst, bits, d_count, width):
        if width - d_count == u_one:
            dst[d_count] = bits
        else:
            dst[d_count] = bits & lse_mask
            dst[d_count + u_one] = (bits >> lse_shift) & lse_mask

    @jit
    def write_packed_row_from(src, dst, lse_bits, b, head, seq_lens, query_start_loc, num_seqs,
                              lane, d_count, width, buf, loaded, vector):
        write_row_data(src, dst, lane, d_count, buf, loaded, vector)
        if lane == 0:
            write_lse_lanes(dst, row_lse_bits(lse_bits, b, head, seq_lens, query_start_loc,
                                              num_seqs), d_count, width)

    return load_first_step, write_packed_row_from


@functools.cache
def _pack_kernel(group=WARP, half=False, wide=False, masked=True, quads=False):
    row_lse_fetch, row_lse_of = lse_bits_steps()
    if masked:
        row_lse_bits = lse_bits_reader()
    else:  # no mask code at all: fewer registers for the rows
        @cuda.jit(device=True)
        def row_lse_bits(lse_bits, b, head, seq_lens, query_start_loc, num_seqs):
            return np.uint32(lse_bits[b, head])

        @cuda.jit(device=True)
        def row_lse_as_fetched(fetched, b, seq_lens, query_start_loc, num_seqs):
            return fetched
    put_word, _, flat_thread, _ = trailer_functions(half)
    lse_mask, lse_shift = np.uint32(LSE_HALF_MASK), np.uint32(LSE_HALF_BITS)

    u32, u64 = np.uint32, np.uint64
    u_group, u_words, u_tokens, u_call = u64(group), u64(WORDS), u64(TOKENS), u64(CALL)
    u_item = u64(2 if half else 4)  # the bytes of an element
    per_warp, u_one = u32(WARP // group), u32(1)
    held = 2 * UNROLL  # the elements a lane loads before it stores: two steps, or two rows
    u_held_step = u32(held * group)
    low32 = np.int64(0xFFFFFFFF)
    jit = cuda.jit(device=True)

    # Offsets within a row are uint32, a row's first element uint64 (Numba widens
    # integer arithmetic to 64 bits: each uint32 result is cast back, and NVVM then
    # computes it in 32 bits).
    @jit
    def row_start(r, b, h, tokens, hn, width):
        return u64(u32(u32(u32(r * tokens) + b) * hn) + h) * u64(width)

    @jit
    def put_lse(dst, at, bits, d_count, width):
        end = at + u64(d_count)
        if u32(width - d_count) == u_one:
            dst[end] = bits
        else:
            dst[end] = bits & lse_mask
            dst[end + u64(1)] = (bits >> lse_shift) & lse_mask

    def loader(count):
        """``load(data, data_flat, unit, s0, s1, b, head, buf, at, first, d_count)``:
        elements ``first + k * group`` (``k < count``, each below ``d_count``) of
        row ``data[b, head]`` into ``buf[at + k]``. ``unit``: read through the flat
        view ``data_flat`` (``data.span()``; ``s0``, ``s1`` its strides in
        elements), so that every load is one base address and a constant offset;
        otherwise through ``data``'s strides, an address computed per element."""
        last = (count - 1) * group

        @jit
        def load(data, data_flat, unit, s0, s1, b, head, buf, at, first, d_count):
            if unit:
                src_at = u64(b) * u64(s0) + u64(head) * u64(s1) + u64(first)
                if u32(first + u32(last)) < d_count:  # every element in the row: no tests
                    for k in range(count):
                        buf[at + k] = data_flat[src_at + u64(k * group)]
                else:
                    for k in range(count):
                        if u32(first + u32(k * group)) < d_count:
                            buf[at + k] = data_flat[src_at + u64(k * group)]
            else:
                src = data[b, head]
                for k in range(count):
                    d = u32(first + u32(k * group))
                    if d < d_count:
                        buf[at + k] = src[d]

        return load

    def storer(count):
        """``store(dst, at, buf, offset, first, d_count)``: ``buf[offset + k]`` into
        ``dst[at + first + k * group]`` (``k < count``, ``first + k * group`` below
        ``d_count``): one base address, constant offsets."""
        last = (count - 1) * group

        @jit
        def store(dst, at, buf, offset, first, d_count):
            to = at + u64(first)
            if u32(first + u32(last)) < d_count:  # every element in the row: no tests
                for k in range(count):
                    dst[to + u64(k * group)] = buf[offset + k]
            else:
                for k in range(count):
                    if u32(first + u32(k * group)) < d_count:
                        dst[to + u64(k * group)] = buf[offset + k]

        return store

    load_row, store_row = loader(UNROLL), storer(UNROLL)
    load_held, store_held = loader(held), storer(held)

    @jit
    def pack_rows(data, data_flat, unit, s0, s1, lse_bits, seq_lens, query_start_loc, num_seqs,
                  dst, r, h, b, b_count, tokens, hn, width, d_count, lane, buf):
        """This lane's share of the rows ``(r, b, h)`` of tokens ``b, b + Z, ...`` (``Z``
        the grid's z), into the flat chunks ``dst``. Every load of a trip is issued
        before its first store: a trip is two steps of one row (``wide``), or one step
        of two rows where the grid's z is below the tokens (of one otherwise), so
        that each lane has up to ``held`` loads in flight. Lane 0 loads the LSE bits
        and a mask's words meanwhile and judges each row's mask after that row's
        stores, so that no store waits on a mask and two rows' round trips overlap;
        a wide row's mask is judged before its stores (its words, held across
        sixteen stores, would spill)."""
        head = u32(u32(r * hn) + h)
        z = u32(cuda.gridDim.z)
        source = (data, data_flat, unit, s0, s1)
        while b < b_count:
            at = row_start(r, b, h, tokens, hn, width)
            bits = bits_two = np.uint32(0)
            fetched = fetched_two = (np.uint32(0), (np.int64(0), np.int64(0), np.int64(0)))
            if wide:
                base = lane
                while base < d_count:
                    load_held(*source, b, head, buf, 0, base, d_count)
                    if lane == u32(0) and base == u32(0):  # (held across the stores, a
                        # mask's words would spill: it is judged before them)
                        bits = row_lse_bits(lse_bits, b, head, seq_lens, query_start_loc,
                                            num_seqs)
                    store_held(dst, at, buf, 0, base, d_count)
                    base = u32(base + u_held_step)
                if lane == u32(0):
                    put_lse(dst, at, bits, d_count, width)
                b = u32(b + z)
            else:
                second = u32(b + z)
                two = second < b_count
                if masked and two:  # strided reads: with both rows' mask words flat ones spill
                    load_row(data, data_flat, False, s0, s1, b, head, buf, 0, lane, d_count)
                    load_row(data, data_flat, False, s0, s1, second, head, buf, UNROLL, lane,
                             d_count)
                else:
                    load_row(*source, b, head, buf, 0, lane, d_count)
                    if two:
                        load_row(*source, second, head, buf, UNROLL, lane, d_count)
                if lane == u32(0):
                    if masked:
                        fetched = row_lse_fetch(lse_bits, b, head, seq_lens, query_start_loc,
                                                num_seqs)
                        if two:
                            fetched_two = row_lse_fetch(lse_bits, second, head, seq_lens,
                                                        query_start_loc, num_seqs)
                    else:
                        bits = row_lse_bits(lse_bits, b, head, seq_lens, query_start_loc,
                                            num_seqs)
                        if two:
                            bits_two = row_lse_bits(lse_bits, second, head, seq_lens,
                                                    query_start_loc, num_seqs)
                store_row(dst, at, buf, 0, lane, d_count)
                if lane == u32(0):
                    if masked:
                        bits = row_lse_of(fetched, b, seq_lens, query_start_loc, num_seqs)
                    put_lse(dst, at, bits, d_count, width)
                if two:
                    at = row_start(r, second, h, tokens, hn, width)
                    store_row(dst, at, buf, UNROLL, lane, d_count)
                    if lane == u32(0):
                        if masked:
                            bits_two = row_lse_of(fetched_two, second, seq_lens,
                                                  query_start_loc, num_seqs)
                        put_lse(dst, at, bits_two, d_count, width)
                b = u32(second + z)

    rows = pack_rows
    if quads:  # the same rows, stored as aligned quads (``_quad_rows``): a lane holds
        # as many words a trip as the word-at-a-time wide rows do
        rows = quad_row_packer(group, held // QUAD,
                               *((row_lse_fetch, row_lse_of) if masked else
                                 (row_lse_bits, row_lse_as_fetched)), row_start)

    # At most 64 registers (the linker's cap; the PTX is the same): 8 blocks of 128
    # threads fit an SM instead of 6, so that 1024 blocks (B = 32 at H = 128) run in
    # one wave. The simulator takes no such option.
    limits = {} if config.ENABLE_CUDASIM else {"max_registers": MAX_REGISTERS}

    @cuda.jit(**limits)
    def pack(data, lse_bits, seq_lens, query_start_loc, num_seqs, send, recv, self_rank,
             signature, state, send_flat, recv_flat, data_flat):
        b_count = u32(data.shape[0])
        hn = u32(send.shape[2])
        # A plan's trailer rows: threads 0 .. N * WORDS - 1 of the blocks of the first rank
        # and token sign every chunk. They load what they write before their rows and
        # write it after, so that no row waits on those loads. state[0] is read here and
        # written only by the combine, state[1] the reverse: no thread of a kernel reads a
        # word another of its threads writes. The other blocks skip even the set-up.
        signs = cuda.blockIdx.y == 0 and cuda.blockIdx.z == 0 and \
            u64(send.shape[1]) > u64(b_count)
        words = u64(send.shape[0]) * u_words if signs else u64(0)
        t = t_step = u64(0)
        count = np.int64(0)
        word = np.uint32(0)
        if signs:
            t, t_step = flat_thread()
            if t < words:
                count = state[0]
                word = np.uint32(signature[t % u_words])
        tx = u32(cuda.threadIdx.x)
        lane = u32(tx % u_group)
        warp = u32(u32(cuda.blockIdx.x) * u32(cuda.blockDim.y) + u32(cuda.threadIdx.y))
        h = u32(u32(warp * per_warp) + u32(tx // u_group))
        r = u32(cuda.blockIdx.y)  # the grid's y: the rank a chunk goes to
        buf = cuda.local.array(held, send_flat.dtype)
        # Rows are read through data_flat where the host made it (data.span(): rows
        # unit-stride)
        unit = data_flat.shape[0] > 0
        s0 = s1 = u32(0)
        if unit:  # data's strides are then not negative, and below 2**32 elements
            s0, s1 = u32(u64(data.strides[0]) // u_item), u32(u64(data.strides[1]) // u_item)
        if h < hn:
            # our own chunk skips the exchange: it goes straight to the receive buffer.
            # One inlined copy of the rows for either buffer (two, one a buffer, cost
            # more code and registers than the generic stores they spare)
            dst = send_flat
            if self_rank >= 0 and r == u32(self_rank):
                dst = recv_flat
            rows(data, data_flat, unit, s0, s1, lse_bits, seq_lens, query_start_loc,
                 num_seqs, dst, r, h, u32(cuda.blockIdx.z), b_count, u32(send.shape[1]), hn,
                 u32(send.shape[3]), u32(data.shape[2]), lane, buf)
        if t < words:
            if t == u64(0):
                state[1] = count
            call = np.uint32(count & low32)
            while True:
                chunk, f = t // u_words, t % u_words
                value = word
                if f == u_tokens:
                    value = np.uint32(b_count)
                elif f == u_call:
                    value = call
                if self_rank >= 0 and chunk == u64(self_rank):
                    put_word(recv, chunk, u64(b_count), f, value)
                else:
                    put_word(send, chunk, u64(b_count), f, value)
                t += t_step
                if t >= words:
                    break
                word = np.uint32(signature[t % u_words])

    return pack


@functools.cache
def pack_kernel(bits, group=WARP, wide=False, masked=True, quads=False):
    """The pack kernel specialised for element bits ``bits`` (uint16 or uint32),
    ``group`` lanes per row and rows of more than one step (``wide``: each lane
    loads two steps, then stores them, so that a row costs one memory round trip
    for every two steps; :func:`pack_launch` picks it for ``D > group * UNROLL``:
    float32 at D = 512, 16-bit words at D = 576), with a mask or without one
    (``masked``: a kernel without reads no ``seq_lens`` and holds no mask's
    registers; :func:`pack_launch` picks it for ``num_seqs < 0``), and with its
    rows stored as aligned 16-byte quads (``quads``, wide rows of uint32 only: ``_quad_rows``;
    :func:`pack_launch` picks it where :func:`quad_rows` allows). Its arguments
    are :func:`pack_launch`'s, then flat (1-D) views of ``send`` and ``recv``, then
    ``data.span()`` (the rows are read through it where it is not empty)."""
    if quads and (np.dtype(bits).itemsize != 4 or not wide):
        raise ValueError(f"the quads pack moves wide rows of uint32 words (got "
                         f"{np.dtype(bits)}, wide={wide})")
    i64 = types.int64
    argtypes = (array_type(bits, 3, False), array_type(np.uint32, 2, False),
                array_type(np.int64, 1, True), array_type(np.int64, 1, True), i64,
                array_type(bits, 4, True), array_type(bits, 4, True), i64,
                array_type(np.int64, 1, True), array_type(np.int64, 1, True),
                array_type(bits, 1, True), array_type(bits, 1, True), array_type(bits, 1, True))
    return SpecializedKernel(_pack_kernel(group, np.dtype(bits).itemsize == 2, bool(wide),
                                          bool(masked), bool(quads)), argtypes)


def quad_rows(data, send, recv):
    """Whether a pack of ``data`` into ``send`` and ``recv`` (:class:`DeviceArray`, as
    :func:`pack_launch` moves them) stores its rows as aligned 16-byte quads
    (``_quad_rows``): rows of uint32 words of more than one step (:func:`wide_rows`:
    float32 at D = 512, 16-bit values at D = 576), unit-stride (:meth:`DeviceArray.span`
    not empty), the input and both buffers 16-byte aligned (as every CuPy allocation
    and a plan's buffers are). Otherwise the pack stores a word at a time: for rows
    of one step the quads' longer address and alignment arithmetic costs more than
    the stores it saves (``benchmarks/NOTES.md``)."""
    return data.dtype.itemsize == 4 and wide_rows(data.shape[2]) and \
        data.span().shape[0] > 0 and data.ptr % 16 == 0 and send.ptr % 16 == 0 and \
        recv.ptr % 16 == 0


def wide_rows(elements):
    """Whether rows of ``elements`` items take the pack's wide kernel (more than one
    step of ``lanes_per_row(elements)`` lanes)."""
    return elements > lanes_per_row(elements) * UNROLL


def pack_send(out, lse, send, stream=None, seq_lens=None, query_start_loc=None,
              recv=None, self_rank=-1):
    """Pack this rank's partials and LSEs into the send buffer, on ``stream``.

    Args:
        out: ``[B, H, D]`` float16, bfloat16 or float32 device array, any
            strides; the partial attention output for all H heads.
        lse: ``[B, H]`` float32 device array, any strides (another float dtype
            is first converted on ``stream`` into a temporary, which needs CuPy:
            to capture a call in a CUDA graph, pass float32, or use a plan).
        send: ``[N, B, H/N, D + P]`` device array of ``out``'s dtype (or its
            unsigned-integer twin), C-contiguous; written. It and ``recv``
            share no byte with ``out``, nor with ``lse`` and the masks where
            the kernel reads them in place (``ValueError``).
        recv, self_rank: optional receive buffer shaped like ``send``
            (C-contiguous) and this rank's index: chunk ``self_rank`` is written
            straight to ``recv[self_rank]`` (it never needs to cross the
            exchange) instead of ``send[self_rank]``. With ``recv``, ``self_rank``
            must be an integer in ``[0, N)``; without it, left at -1
            (``ValueError``, ``TypeError`` otherwise).
        stream: the stream to run on; ``None`` is CuPy's current stream.
        seq_lens, query_start_loc: optional ``[S]`` and ``[S+1]`` integer device
            arrays; tokens of sequences with no KV here, and padding tokens
            (before ``query_start_loc[0]`` or at or past ``query_start_loc[-1]``),
            get LSE -inf. Other than contiguous int64, they are converted into
            temporaries first, as ``lse`` is.
    """
    spec = check_pack_args(out, lse, send, seq_lens, query_start_loc, recv)
    if recv is not None:
        self_rank = check_rank(self_rank, spec.world_size)
    elif self_rank != -1:
        raise ValueError(f"self_rank names the chunk written to recv: pass recv with it "
                         f"(got self_rank={self_rank!r} and no recv)")
    if spec.tokens == 0:
        return
    ptr = stream_ptr(stream)
    lse = spec.lse_as_float32(lse, ptr)
    if seq_lens is None:
        seq_arr = qsl_arr = dummy_index()
        num_seqs = -1
    else:
        seq_arr = kernel_array(spec.index_as_int64(seq_lens, ptr), np.int64, "seq_lens")
        qsl_arr = kernel_array(spec.index_as_int64(query_start_loc, ptr), np.int64,
                               "query_start_loc")
        num_seqs = int(seq_lens.shape[0])
    send_arr = output_array(send, spec.bits, "send")
    recv_arr = send_arr if recv is None else output_array(recv, spec.bits, "recv")
    out_arr, lse_arr = kernel_array(out, spec.bits, "out"), kernel_array(lse, np.uint32, "lse")
    check_apart(dict(send=send_arr, recv=None if recv is None else recv_arr),
                dict(out=out_arr, lse=lse_arr, **({} if seq_lens is None else
                                                 dict(seq_lens=seq_arr, query_start_loc=qsl_arr))),
                WRITES_WHILE_READING)
    kernel, grid, block, args = pack_launch(out_arr, lse_arr, seq_arr, qsl_arr, num_seqs,
                                            send_arr, recv_arr, self_rank)
    kernel(grid, block, ptr, args)


def pack_launch(data, lse_bits, seq_lens, query_start_loc, num_seqs, send, recv, self_rank,
                signed=None, tokens=None, staged=None, quad_loads=None, block_tokens=None):
    """``(kernel, grid, block, args)`` of one pack: :class:`DeviceArray` arguments in,
    moved as uint32 words where the 16-bit data and both buffers allow it (the
    LSE's two lanes are then one word).

    ``signed``: a plan's ``(signature, state)``, int64 device arrays: ``send``
    and ``recv`` then hold ``B + k`` token rows per chunk, and the kernel writes
    the trailer of ``_trailer`` after each chunk's ``B = data.shape[0]`` rows
    (``signature``: the :data:`~._trailer.FIELDS` words, its tokens and call
    number ignored; the call number is ``state[0]``, copied into ``state[1]``
    for the combine, which advances ``state[0]``).

    Rows of one step take a block row per token (``_pack_tokens``) where
    ``_pack_tokens.by_tokens`` allows; ``tokens`` (``True`` or ``False``) overrides
    that choice, for the benchmarks and tests (``True`` requires rows of one step
    read through a flat view, and a grid whose z is ``B``). At many tokens, rows of
    words take it at any bytes, through shared memory (``_pack_tokens.stages``), on
    a grid of a block row for every token however many blocks that makes;
    ``staged`` overrides that choice likewise (``True`` requires what
    ``_pack_tokens.can_stage`` does). A staged pack reads its rows as 16-byte
    quads where ``_pack_tokens.loads_quads`` says so; ``quad_loads`` overrides
    that (``True`` requires a staged pack and what ``_pack_tokens.can_load_quads``
    does). Where a token's rows fit one warp, a pack by tokens takes several tokens a
    block as ``_pack_tokens.tokens_a_block`` says; ``block_tokens`` overrides that
    (more than 1 requires a pack by tokens whose rows fit a warp, of a multiple of
    ``block_tokens`` tokens). ``_pack_tokens.variant_of(kernel)`` names the pack by
    tokens picked (tokens a block, staged, quad loads), ``None`` for ``pack``'s kernels.
    """
    send.require_c_contiguous("send")
    recv.require_c_contiguous("recv")
    seq_lens.require_c_contiguous("seq_lens")
    query_start_loc.require_c_contiguous("query_start_loc")
    if data.dtype.itemsize == 2:
        words = data.as_words(), send.as_words(), recv.as_words()
        if None not in words:
            data, send, recv = words
    signature, state = (dummy_index(), dummy_index()) if signed is None else signed
    group = lanes_per_row(data.shape[2])
    grid, block = tile_grid(send.shape[2], data.shape[0], group, send.shape[0])
    wide = wide_rows(data.shape[2])
    together = int(block_tokens) if block_tokens is not None else \
        1 if tokens is False else tokens_a_block(data, send, recv, wide, staged)
    if together < 1:
        raise ValueError(f"a pack takes one token a block or more (got {together})")
    if together > 1:
        if wide or not fits_a_warp(send.shape[2], group) or data.shape[0] % together:
            raise ValueError(f"a pack of {together} tokens a block moves rows of one step "
                             f"that fit a warp a token, of a multiple of {together} tokens")
        grid, block = token_block_grid(send, data.shape[0], together)
    full = (grid[0], grid[1], data.shape[0] // together)  # every token, past MAX_BLOCKS
    stage = bool(staged) if staged is not None else \
        tokens is not False and stages(data, send, recv, full, block, wide, together)
    if stage and full[2] <= MAX_GRID_Z:
        grid = full
    if tokens is None:
        tokens = by_tokens(data, grid, wide, None, together) or stage
    if tokens and not by_tokens(data, grid, wide, MAX_GRID_Z, together):
        raise ValueError("a pack by tokens moves rows of one step, read through a flat "
                         "view, a token a block row")
    if together > 1 and not tokens:
        raise ValueError("a pack of several tokens a block is a pack by tokens")
    if tokens:
        signs = signed is not None and send.shape[1] > data.shape[0]
        lead = signs and together == 1 and signs_ahead(grid)
        if stage and not can_stage(data, send, recv, block):
            raise ValueError("a staged pack moves rows of uint32 words into 16-byte aligned "
                             "buffers, a block's rows within _pack_tokens.STAGE_WORDS")
        quads = bool(quad_loads) if quad_loads is not None else \
            stage and loads_quads(data, group)
        if quads and not (stage and can_load_quads(data)):
            raise ValueError("a pack reads its rows as quads where it is staged, its rows "
                             "are 16-byte aligned and their words a multiple of four")
        kernel = tokens_kernel(data.dtype, group, int(num_seqs) >= 0, signs, lead, stage,
                               quads, together)
        if lead:  # a plane of blocks before the rows': its first block signs
            grid = (grid[0], grid[1], grid[2] + 1)
        return kernel, grid, block, (
            data.span(), lse_bits, seq_lens, query_start_loc, int(num_seqs), send.flat(),
            recv.flat(), int(self_rank), send.shape[2], send.shape[3], data.shape[2],
            *data.element_strides(), send.shape[1]) + ((signature, state) if signs else ())
    if stage:
        raise ValueError("a staged pack is a pack by tokens (rows of one step, read "
                         "through a flat view, a token a block row)")
    if quad_loads:
        raise ValueError("a pack reads its rows as quads where it is staged, and a staged "
                         "pack is a pack by tokens")
    kernel = pack_kernel(data.dtype, group, wide, int(num_seqs) >= 0,
                         quad_rows(data, send, recv))
    return kernel, grid, block, (
        data, lse_bits, seq_lens, query_start_loc, int(num_seqs), send, recv, int(self_rank),
        signature, state, send.flat(), recv.flat(), data.span())
