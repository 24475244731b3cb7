"""The pack kernel: partials and LSE bits into the packed send buffer.

``send[r, b, h, :D] = out[b, r*H/N + h, :]`` and the trailing ``P`` lanes carry
the float32 LSE's bits (see ``_format``). The kernel copies bit
patterns (uint16 or uint32), so one kernel serves every dtype.

A group of lanes per (rank, token, head) row (see ``_rows``), which writes it
with :func:`packed_row_writer`.
"""

import functools

import numpy as np
from numba import config, cuda

from numba.core import types

from ._arrays import dummy_index, kernel_array, stream_ptr
from ._device import device_functions
from ._format import LSE_HALF_BITS, LSE_HALF_MASK
from ._launch import SpecializedKernel, array_type
from ._math import NEG_INF_BITS
from ._rows import UNROLL, WARP, lanes_per_row, row_cursor, row_grid
from ._specs import check_pack_args
from ._trailer import CALL, TOKENS, WORDS, trailer_functions
from ._vector import QUAD, vector_functions

__all__ = ["MAX_REGISTERS", "pack_kernel", "pack_launch", "pack_send", "wide_rows"]

MAX_REGISTERS = 64  # a pack thread's (at 78, as NVVM left it, 6 blocks fit an SM, not 8)


@functools.cache
def lse_bits_reader():
    """Device function ``row_lse_bits(lse_bits, b, head, seq_lens, query_start_loc,
    num_seqs)``: the uint32 bits that a packed row carries for its LSE:
    ``lse_bits[b, head]``, or ``-inf``'s for an empty or padding token ``b``."""
    row_is_empty = device_functions()["row_is_empty"]
    neg_inf_bits = np.uint32(NEG_INF_BITS)

    @cuda.jit(device=True)
    def row_lse_bits(lse_bits, b, head, seq_lens, query_start_loc, num_seqs):
        if row_is_empty(np.int64(b), seq_lens, query_start_loc, num_seqs):
            return neg_inf_bits
        return np.uint32(lse_bits[b, head])

    return row_lse_bits


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
    stores need not wait for loads issued here; and ``write_packed_row_early(src,
    dst, lse_bits, b, head, seq_lens, query_start_loc, num_seqs, lane, d_count,
    width, buf)``: the same row, whose first step's loads are issued before lane 0
    reads the LSE (and searches a mask), so that those loads overlap (the pack's;
    ``vector`` False).

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

    @jit
    def write_packed_row_early(src, dst, lse_bits, b, head, seq_lens, query_start_loc,
                               num_seqs, lane, d_count, width, buf):
        load_first_step(src, buf, lane, d_count, False)
        bits = np.uint32(0)
        if lane == 0:  # the LSE (and a mask's search) loads while the first step's do
            bits = row_lse_bits(lse_bits, b, head, seq_lens, query_start_loc, num_seqs)
        write_row_data(src, dst, lane, d_count, buf, True, False)
        if lane == 0:
            write_lse_lanes(dst, bits, d_count, width)

    return load_first_step, write_packed_row_from, write_packed_row_early


@functools.cache
def packed_row_writer(group=WARP):
    """Device function ``write_packed_row(src, dst, lse_bits, b, head, seq_lens,
    query_start_loc, num_seqs, lane, d_count, width)``: this lane's share of one
    packed row (:func:`packed_row_steps`), loaded here. Used by the pack kernel."""
    write_packed_row_early = packed_row_steps(group)[2]

    @cuda.jit(device=True)
    def write_packed_row(src, dst, lse_bits, b, head, seq_lens, query_start_loc, num_seqs,
                         lane, d_count, width):
        buf = cuda.local.array(UNROLL, dst.dtype)
        write_packed_row_early(src, dst, lse_bits, b, head, seq_lens, query_start_loc,
                               num_seqs, lane, d_count, width, buf)

    return write_packed_row


@functools.cache
def wide_row_writer(group=WARP):
    """Device function ``write_packed_row`` of :func:`packed_row_writer`, for rows of
    more than one step (``D > group * UNROLL`` elements: float32 at D = 512, 16-bit
    words at D = 576): each lane loads two steps, then stores them, so that a
    row costs one memory round trip for every two steps instead of one a step."""
    row_lse_bits = lse_bits_reader()
    lse_mask, lse_shift = np.uint32(LSE_HALF_MASK), np.uint32(LSE_HALF_BITS)
    u64 = np.uint64
    u_group, u_step, u_one = u64(group), u64(group * UNROLL), u64(1)
    held = 2 * UNROLL  # two steps' elements a lane: lane, lane + group, ...

    @cuda.jit(device=True)
    def write_packed_row(src, dst, lse_bits, b, head, seq_lens, query_start_loc, num_seqs,
                         lane, d_count, width):
        buf = cuda.local.array(held, dst.dtype)
        bits = np.uint32(0)
        base = lane
        while base < d_count:
            for k in range(held):
                d = base + u64(k) * u_group
                if d < d_count:
                    buf[k] = src[d]
            if lane == 0 and base == u64(0):  # the LSE (and a mask's search) loads meanwhile
                bits = row_lse_bits(lse_bits, b, head, seq_lens, query_start_loc, num_seqs)
            for k in range(held):
                d = base + u64(k) * u_group
                if d < d_count:
                    dst[d] = buf[k]
            base += u_step + u_step
        if lane == 0:
            if width - d_count == u_one:
                dst[d_count] = bits
            else:
                dst[d_count] = bits & lse_mask
                dst[d_count + u_one] = (bits >> lse_shift) & lse_mask

    return write_packed_row


@functools.cache
def _pack_kernel(group=WARP, half=False, wide=False):
    write_packed_row = wide_row_writer(group) if wide else packed_row_writer(group)
    cursor = row_cursor()
    put_word, _, flat_thread, _ = trailer_functions(half)

    u64 = np.uint64
    u_group, u_words, u_tokens, u_call = u64(group), u64(WORDS), u64(TOKENS), u64(CALL)
    low32 = np.int64(0xFFFFFFFF)

    # At most 64 registers (the linker's cap; the PTX is the same): 8 blocks of 128
    # threads fit an SM instead of 6, so that 1024 blocks (B = 32 at H = 128) run in
    # one wave. The simulator takes no such option.
    limits = {} if config.ENABLE_CUDASIM else {"max_registers": MAX_REGISTERS}

    # Indices are unsigned so that Numba emits no negative-index wraparound.
    @cuda.jit(**limits)
    def pack(data, lse_bits, seq_lens, query_start_loc, num_seqs, send, recv, self_rank,
             signature, state):
        b_count = u64(data.shape[0])
        hn = u64(send.shape[2])
        # A plan's trailer rows: threads 0 .. N * WORDS - 1 sign every chunk. They load
        # what they write before their rows and write it after, so that no row waits on
        # those loads. state[0] is read here and written only by the combine, state[1]
        # the reverse: no thread of a kernel reads a word another of its threads writes.
        words = u64(send.shape[0]) * u_words if u64(send.shape[1]) > b_count else u64(0)
        t, t_step = flat_thread()
        count = np.int64(0)
        word = np.uint32(0)
        if t < words:
            count = state[0]
            word = np.uint32(signature[t % u_words])
        rows = u64(send.shape[0]) * b_count * hn
        width = u64(send.shape[3])
        d_count = u64(data.shape[2])
        lane, row, row_step = cursor(u_group)
        while row < rows:
            h = row % hn
            b = (row // hn) % b_count
            r = row // (b_count * hn)
            head = r * hn + h
            # our own chunk skips the exchange: it goes straight to the receive buffer
            dst = recv[r, b, h] if self_rank >= 0 and r == u64(self_rank) else send[r, b, h]
            write_packed_row(data[b, head], dst, lse_bits, b, head, seq_lens, query_start_loc,
                             num_seqs, lane, d_count, width)
            row += row_step
        if t < words:
            if t == u64(0):
                state[1] = count
            call = np.uint32(count & low32)
            while True:
                r, f = t // u_words, t % u_words
                value = word
                if f == u_tokens:
                    value = np.uint32(b_count)
                elif f == u_call:
                    value = call
                if self_rank >= 0 and r == u64(self_rank):
                    put_word(recv, r, b_count, f, value)
                else:
                    put_word(send, r, b_count, f, value)
                t += t_step
                if t >= words:
                    break
                word = np.uint32(signature[t % u_words])

    return pack


@functools.cache
def pack_kernel(bits, group=WARP, wide=False):
    """The pack kernel specialised for element bits ``bits`` (uint16 or uint32),
    ``group`` lanes per row and rows of more than one step (``wide``: see
    :func:`wide_row_writer`; :func:`pack_launch` picks it for ``D > group *
    UNROLL``)."""
    i64 = types.int64
    argtypes = (array_type(bits, 3, False), array_type(np.uint32, 2, False),
                array_type(np.int64, 1, True), array_type(np.int64, 1, True), i64,
                array_type(bits, 4, True), array_type(bits, 4, True), i64,
                array_type(np.int64, 1, True), array_type(np.int64, 1, True))
    return SpecializedKernel(_pack_kernel(group, np.dtype(bits).itemsize == 2, bool(wide)),
                             argtypes)


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
            unsigned-integer twin), C-contiguous; written.
        recv, self_rank: optional receive buffer shaped like ``send``
            (C-contiguous) and this rank's index: chunk ``self_rank`` is written
            straight to ``recv[self_rank]`` (it never needs to cross the
            exchange) instead of ``send[self_rank]``.
        stream: the stream to run on; ``None`` is CuPy's current stream.
        seq_lens, query_start_loc: optional ``[S]`` and ``[S+1]`` integer device
            arrays; tokens of sequences with no KV here, and padding tokens
            (before ``query_start_loc[0]`` or at or past ``query_start_loc[-1]``),
            get LSE -inf. Other than contiguous int64, they are converted into
            temporaries first, as ``lse`` is.
    """
    spec = check_pack_args(out, lse, send, seq_lens, query_start_loc, recv)
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
    send_arr = kernel_array(send, spec.bits, "send")
    recv_arr = send_arr if recv is None else kernel_array(recv, spec.bits, "recv")
    if recv is None:
        self_rank = -1
    kernel, grid, block, args = pack_launch(
        kernel_array(out, spec.bits, "out"), kernel_array(lse, np.uint32, "lse"),
        seq_arr, qsl_arr, num_seqs, send_arr, recv_arr, self_rank)
    kernel(grid, block, ptr, args)


def pack_launch(data, lse_bits, seq_lens, query_start_loc, num_seqs, send, recv, self_rank,
                signed=None):
    """``(kernel, grid, block, args)`` of one pack: :class:`DeviceArray` arguments in,
    moved as uint32 words where the 16-bit data and both buffers allow it (the
    LSE's two lanes are then one word).

    ``signed``: a plan's ``(signature, state)``, int64 device arrays: ``send``
    and ``recv`` then hold ``B + k`` token rows per chunk, and the kernel writes
    the trailer of ``_trailer`` after each chunk's ``B = data.shape[0]`` rows
    (``signature``: the :data:`~._trailer.FIELDS` words, its tokens and call
    number ignored; the call number is ``state[0]``, copied into ``state[1]``
    for the combine, which advances ``state[0]``).
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
    grid, block = row_grid(send.shape[0] * data.shape[0] * send.shape[2], group)
    return pack_kernel(data.dtype, group, wide_rows(data.shape[2])), grid, block, (
        data, lse_bits, seq_lens, query_start_loc, int(num_seqs), send, recv, int(self_rank),
        signature, state)
