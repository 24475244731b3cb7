"""The signature trailer of a plan's packed chunks (the plans' format: the packed
format of ``_format`` and the NumPy reference know nothing of it).

A plan's chunk for rank ``r`` is ``[B + k, H/N, W]`` elements: the ``B`` token
rows of the packed format, then ``k`` (:func:`trailer_rows`) rows whose first
:data:`WORDS` uint32 words, seen flat, are the sending call's signature (a
uint16 buffer holds word ``f`` as elements ``2f`` and ``2f + 1``, low half
first). The words are :data:`FIELDS`: a magic word, then the call's tokens,
heads, head size, dtype code, LSE base, strategy code and the low 32 bits of
the plan's call counter. The pack kernel writes them into every chunk; the
combine kernel compares every peer's with rank 0's and records the differences
in a status array (:data:`STATUS_WORDS` per (peer, field): flag, rank 0's word,
the peer's word). Kernels given no trailer rows write and read none.
"""

import functools

import numpy as np
from numba import cuda

__all__ = ["CALL", "DTYPE_CODES", "FIELDS", "MAGIC", "STATUS_WORDS", "TOKENS", "TRAILER_BYTES",
           "WORDS", "combine_checks", "trailer_functions", "trailer_rows"]

FIELDS = ("the signature", "tokens", "num_heads", "head_dim", "dtype", "is_lse_base_on_e",
          "strategy", "call_number")
WORDS = len(FIELDS)
TRAILER_BYTES = 4 * WORDS
MAGIC = 0x5DC9_7A11
TOKENS, CALL = FIELDS.index("tokens"), FIELDS.index("call_number")
STATUS_WORDS = 3
DTYPE_CODES = {"float16": 1, "bfloat16": 2, "float32": 3}


def trailer_rows(heads, width, itemsize):
    """The token rows ``k`` that hold a chunk's trailer, for rows of ``heads * width``
    elements of ``itemsize`` bytes."""
    return -(-TRAILER_BYTES // (heads * width * itemsize))


@functools.cache
def trailer_functions(half):
    """Device functions ``put_word(chunks, r, tokens, f, value)`` and ``get_word(chunks,
    r, tokens, f)``: word ``f`` of chunk ``r``'s trailer in ``chunks [N, B + k, H/N,
    W]`` (uint16 elements where ``half``, else uint32; ``tokens``: ``B``, uint64);
    ``flat_thread()``: the grid-stride cursor over single threads; ``check_words(chunks,
    tokens, t)``: the two words that the combine's check ``t`` compares."""
    u64 = np.uint64
    low, sixteen = np.uint32(0xFFFF), np.uint32(16)
    jit = cuda.jit(device=True)

    @jit
    def locate(chunks, tokens, e):
        width = u64(chunks.shape[3])
        if e < width:  # rows of 16 elements or more hold the whole trailer: no division
            return tokens, u64(0), e
        hn = u64(chunks.shape[2])
        return tokens + e // (hn * width), (e // width) % hn, e % width

    if half:
        @jit
        def put_word(chunks, r, tokens, f, value):
            b, h, c = locate(chunks, tokens, u64(2) * f)
            chunks[r, b, h, c] = value & low
            b, h, c = locate(chunks, tokens, u64(2) * f + u64(1))
            chunks[r, b, h, c] = value >> sixteen

        @jit
        def get_word(chunks, r, tokens, f):
            b, h, c = locate(chunks, tokens, u64(2) * f)
            lo = np.uint32(chunks[r, b, h, c])
            b, h, c = locate(chunks, tokens, u64(2) * f + u64(1))
            return lo | (np.uint32(chunks[r, b, h, c]) << sixteen)
    else:
        @jit
        def put_word(chunks, r, tokens, f, value):
            b, h, c = locate(chunks, tokens, f)
            chunks[r, b, h, c] = value

        @jit
        def get_word(chunks, r, tokens, f):
            b, h, c = locate(chunks, tokens, f)
            return np.uint32(chunks[r, b, h, c])

    @jit
    def flat_thread():
        """``(t, t_step)``: this thread's index among the grid's (2-D blocks) and
        their count."""
        per_block = u64(cuda.blockDim.x) * u64(cuda.blockDim.y)
        t = (u64(cuda.blockIdx.x) * u64(cuda.blockDim.y) + u64(cuda.threadIdx.y)) \
            * u64(cuda.blockDim.x) + u64(cuda.threadIdx.x)
        return t, u64(cuda.gridDim.x) * per_block

    u_words, u_one = u64(WORDS), u64(1)

    @jit
    def check_words(chunks, tokens, t):
        """Check ``t``'s two words: field ``t % WORDS`` of rank 0's trailer and of peer
        ``t // WORDS + 1``'s."""
        f = t % u_words
        return get_word(chunks, u64(0), tokens, f), get_word(chunks, t // u_words + u_one,
                                                             tokens, f)

    return put_word, get_word, flat_thread, check_words


@functools.cache
def combine_checks(half):
    """The combine kernels' trailer check, around their rows: ``begin_checks(chunks,
    state, tokens, signed, checks) -> (t, t_step, count, ours, theirs)`` (thread
    ``t`` of the grid-stride cursor loads its first two words, and thread 0 the
    call counter ``state[1]`` where ``signed``, before any row) and
    ``finish_checks(chunks, status, state, tokens, signed, checks, t, t_step, count,
    ours, theirs)`` (after the rows: thread 0 sets ``state[0] = count + 1``; each
    of the ``checks`` words that differs is marked in ``status``, its words before
    its flag)."""
    _, _, flat_thread, check_words = trailer_functions(half)
    u64 = np.uint64
    u_one, u_two, u_words, u_status = u64(1), u64(2), u64(WORDS), u64(STATUS_WORDS)
    jit = cuda.jit(device=True)

    @jit
    def begin_checks(chunks, state, tokens, signed, checks):
        t, t_step = flat_thread()
        count = np.int64(0)
        if signed and t == u64(0):
            count = state[1]
        ours = theirs = np.uint32(0)
        if t < checks:
            ours, theirs = check_words(chunks, tokens, t)
        return t, t_step, count, ours, theirs

    @jit
    def finish_checks(chunks, status, state, tokens, signed, checks, t, t_step, count, ours,
                      theirs):
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
                ours, theirs = check_words(chunks, tokens, t)

    return begin_checks, finish_checks
