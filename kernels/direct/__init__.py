"""The direct kernels: each call pushes its packed rows straight into the peers'
windows (CUDA IPC memory) and combines what the peers pushed into its own.

Contracts. Every rank owns a window (:func:`window_layout`: flags, two receive
slots, the word-by-word region, the lines region) and a private ``state``
(:data:`STATE_WORDS` int64, zeroed once). Call ``e`` (``e = state[0] + 1``,
advanced by the kernel itself, so a CUDA graph's replay advances it too)
uses slot and region parity ``e % 2``. :func:`call_grid` picks, from the
call's rows per rank pair, one :class:`Protocol` and its cut, the same on
every rank; :func:`direct_launch` launches that protocol's kernel
(:mod:`.tiles`, :mod:`.words`, :mod:`.lines`). The calls of one plan must be
ordered on each rank (one stream, or synchronised) and made alike on every
rank, as with any collective. A wait lasts at most ``timeout_ns``; a failed
one records the peer in ``status`` (:data:`TIMED_OUT`, :data:`PEER_FAILED`),
kills the plan (``state[2]``), tells every peer, and leaves NaN in every
row it did not combine. The host sizes the grid so that every block of every
rank sharing a GPU is resident at once. ``docs/direct-kernels.md`` gives the
protocols and the argument why no call overwrites data that is still read.
"""

import functools

import numpy as np
from numba import types

from .._format import c_strides, is_bfloat16
from .._launch import DeviceArray, SpecializedKernel, array_type
from .._rows import WARP, lanes_per_row
from .._vector import QUAD
from .._codecs import _BF16, _BF16X2, combine_codec
from ._peers import (CHECK_EVERY, COMBINE, PEER_FAILED, PUSH, STATE_WORDS, TIMED_OUT,
                     TRACE_STAMPS)
from ._window import (BLOCKS_PER_SM, LINE_BYTES, LINE_CHUNKS, LINE_MAX_ROWS, LINE_TILE_ROWS,
                      LINE_WORDS, LL_MAX_ROWS, LL_TILE_ROWS, MIN_TILE_ROWS, PUSH_SHARE,
                      SMALL_TILE_ROWS, SPLIT_TILE_ROWS, TILES_PER_BLOCK, WARPS, CallGrid,
                      Protocol, WindowLayout, call_grid, flag_words, line_items, line_rows,
                      line_tile_rows, line_words, ll_grid, ll_rows, ll_words, region_grid,
                      row_stride, tile_grid, window_layout)
from .lines import lines_kernel
from .tiles import tiles_kernel
from .words import words_kernel

__all__ = ["BLOCKS_PER_SM", "CHECK_EVERY", "COMBINE", "LINE_BYTES", "LINE_CHUNKS",
           "LINE_MAX_ROWS", "LINE_TILE_ROWS", "LINE_WORDS", "LL_MAX_ROWS", "LL_TILE_ROWS",
           "MIN_TILE_ROWS", "PEER_FAILED", "PUSH", "PUSH_SHARE", "SMALL_TILE_ROWS",
           "SPLIT_TILE_ROWS", "STATE_WORDS", "TILES_PER_BLOCK", "TIMED_OUT", "TRACE_STAMPS",
           "WARPS", "CallGrid", "Protocol", "WindowLayout", "call_grid", "call_kernels",
           "direct_kernel", "direct_launch", "flag_words", "line_items", "line_rows",
           "line_tile_rows", "line_words", "ll_grid", "ll_rows", "ll_words", "region_grid",
           "row_stride", "tile_grid", "window_layout"]


def _protocol_kernel(protocol, codec, n, push_group, group, halves, dependent, trace):
    if protocol is Protocol.WORDS:
        return words_kernel(codec, n, halves, dependent, trace)
    if protocol is Protocol.LINES:
        return lines_kernel(codec, n, halves, dependent, trace)
    return tiles_kernel(codec, n, push_group, group, halves, dependent, trace=trace)


@functools.cache  # one SpecializedKernel each: loading a module may wait for running kernels
def direct_kernel(dtype, n, push_bits, pairs=False, push_group=WARP, group=WARP,
                  dependent=False, trace=False, protocol=Protocol.TILES):
    """The direct kernel of ``protocol`` for output ``dtype`` (bfloat16 ``pairs``:
    uint32 words in the combine), ``n`` ranks, the push's element bits ``push_bits``
    (uint16 or uint32) and the push's and combine's lanes per row. Every protocol's
    kernel takes the same arguments (:func:`direct_launch`); the lines' kernel takes
    the lines region where the others take the word-by-word region. ``dependent``:
    launched as a programmatic dependent of the kernel before it on its stream
    (Hopper and later): it may start while that kernel ends, and lets the next one
    do so. ``trace``: for measurement only, each block's first thread stores the
    global timer at the call's milestones into ``state``, after its
    :data:`STATE_WORDS`: ``[2][blocks][TRACE_STAMPS]`` by call parity, ``blocks`` as
    many as the rest of ``state`` holds."""
    codec, value = combine_codec(dtype, pairs)
    bits = np.dtype(np.uint32 if value.itemsize == 4 else np.uint16)
    i64 = types.int64
    flag = array_type(np.int64, 1, True)
    argtypes = (i64, array_type(push_bits, 3, False), array_type(value, 3, False),
                array_type(np.uint32, 2, False), array_type(np.float32, 2, False),
                array_type(np.int64, 1, True), array_type(np.int64, 1, True), i64,
                types.UniTuple(array_type(push_bits, 5, False), n),
                array_type(value, 5, False), array_type(bits, 5, False),
                types.UniTuple(flag, n), flag, flag,
                array_type(value, 3, False), array_type(np.float32, 2, False),
                i64, i64, i64, i64, i64, i64,
                types.UniTuple(array_type(np.uint64, 4, True), n), i64)
    kernel = _protocol_kernel(Protocol(protocol), codec, n, push_group, group,
                              np.dtype(push_bits).itemsize == 2, dependent, trace)
    return SpecializedKernel(kernel, argtypes, dependent=dependent)


def call_kernels(dtype, n, bits, head_dim, dependent=False, protocol=Protocol.TILES):
    """The kernels of ``protocol`` that the calls of a plan (output ``dtype``, element
    ``bits``, ``head_dim``) may launch: their residency bounds the grid
    (``resident_blocks``)."""
    D = head_dim
    kernels = [direct_kernel(dtype, n, bits, False, lanes_per_row(D), lanes_per_row(D),
                             dependent, protocol=protocol)]
    if np.dtype(bits).itemsize == 2 and D % 2 == 0:  # the usual case: 16-bit data as words
        kernels.append(direct_kernel(dtype, n, np.dtype(np.uint32), False, lanes_per_row(D // 2),
                                     lanes_per_row(D), dependent, protocol=protocol))
        if is_bfloat16(np.dtype(dtype)):  # and combined in pairs, where the output allows
            kernels.append(direct_kernel(dtype, n, np.dtype(np.uint32), True,
                                         lanes_per_row(D // 2), lanes_per_row(D // 2), dependent,
                                         protocol=protocol))
    return kernels


def direct_launch(dtype, data, lse, seq_lens, query_start_loc, num_seqs, windows, flags, lls,
                  state, status, out, out_lse, is_lse_base_on_e, self_rank, timeout_ns,
                  max_blocks, phases=PUSH | COMBINE, warps=WARPS, dependent=False,
                  ll_max_blocks=None, lines=None, line_max_blocks=None):
    """``(kernel, grid, block, args)`` of one direct call, :class:`DeviceArray`
    arguments in.

    ``data``: this rank's ``[B, H, D]`` partials seen as bits (uint16 or
    uint32), ``lse`` its float32 ``[B, H]``; ``windows``: every rank's
    ``[2, N, max_tokens, H/N, D + P]`` bits view (rows may be padded);
    ``flags``: every rank's int64 flags (:func:`flag_words`); ``lls``: every
    rank's word-by-word region, uint64 ``[2, N, R, ll_words]`` (``R`` rows, may
    be 0); ``out`` ``[B, H/N, D]`` seen as bits (``None`` for ``phases ==
    PUSH``); ``lines``: every rank's lines region, uint64 ``[2, N, R',
    line_words]`` (``None``: none); ``max_blocks``, ``ll_max_blocks`` and
    ``line_max_blocks`` (by default the first): the
    most blocks of the tiled, of the word-by-word and of the lines kernel that are sure to be
    resident at once beside those of the other ranks on this GPU (blocks of
    ``warps`` warps, at most :data:`WARPS`: the kernels' launch bounds;
    :func:`call_grid` picks the protocol's kernel); ``dependent``: launch
    as a programmatic dependent (see
    :func:`direct_kernel`; never where ranks share a GPU: a call's blocks that
    start early could take the places a peer's blocks need). 16-bit data
    moves as uint32 words where the arrays allow, and bfloat16 is combined in pairs.
    The pushes load and store 16 bytes at a time (``vector``, the last argument)
    where the words allow it: a whole number of 4-word quads per row, and every
    row of the input and of the windows 16-byte aligned; else a word (or a
    16-bit element) at a time.
    """
    if not 1 <= warps <= WARPS:  # the launch would fail, less clearly
        raise ValueError(f"a direct call's blocks have 1 to {WARPS} warps (got {warps}): "
                         "the kernels are built for no more")
    codec, value = combine_codec(dtype)
    n = len(windows)
    me = int(self_rank)
    push_data, push_windows = data, tuple(windows)
    if data.dtype.itemsize == 2:
        words = [data.as_words()] + [w.as_words() for w in windows]
        if None not in words:
            push_data, push_windows = words[0], tuple(words[1:])
    if out is None:  # push alone: never written, shaped like the result
        shape = (data.shape[0], windows[0].shape[3], data.shape[2])
        out = DeviceArray(data.ptr, shape, c_strides(shape, data.dtype.itemsize), data.dtype,
                          data.owner)
    vals_data, vals, bits, vals_out = data.view(value), windows[me].view(value), windows[me], \
        out.view(value)
    if codec == _BF16:
        words = data.as_words(), windows[me].as_words(), out.as_words()
        if None not in words:
            codec = _BF16X2
            vals_data, vals, vals_out = words
            bits = vals
    write_lse = out_lse is not None
    if not write_lse:  # never read: a placeholder of the right type
        out_lse = DeviceArray(out.ptr, (0, 0), (4, 4), np.float32, out.owner)
    # 16-byte pushes where the words allow: whole quads, every row aligned at both ends
    vector = (push_data.dtype.itemsize == 4 and push_data.shape[2] % QUAD == 0
              and all(a.rows_aligned(16) for a in (push_data,) + push_windows))
    rows = data.shape[0] * windows[0].shape[3]
    if lines is not None and lines[me].shape[2]:
        for region in lines:  # lines stored whole: 128-byte aligned, whole lines a row
            if (region.ptr % LINE_BYTES or not region.is_c_contiguous()
                    or region.shape[3] % (LINE_BYTES // 8)):
                raise ValueError("a lines region must be C-contiguous, 128-byte aligned, "
                                 "with whole 128-byte lines per row")
    grid = region_grid(n, rows, lls[me].shape, None if lines is None else lines[me].shape,
                       max_blocks, ll_max_blocks, line_max_blocks, WARP * warps)
    for ll in lls:  # stored and loaded 16 bytes at a time: a misaligned pair faults
        if ll.shape[2] and (ll.ptr % 16 or not ll.is_c_contiguous() or ll.shape[3] % 2):
            raise ValueError("a word-by-word region must be C-contiguous, 16-byte aligned, "
                             "with an even number of words per row")
    kernel = direct_kernel(dtype, n, push_data.dtype, codec == _BF16X2,
                           lanes_per_row(push_data.shape[2]), lanes_per_row(vals_out.shape[2]),
                           dependent, protocol=grid.protocol)
    return kernel, (grid.blocks,), (WARP, warps), (
        int(phases), push_data, vals_data, lse.view(np.uint32), lse, seq_lens, query_start_loc,
        int(num_seqs), push_windows, vals, bits, tuple(flags), state, status, vals_out, out_lse,
        int(write_lse), int(bool(is_lse_base_on_e)), me, int(timeout_ns),
        int(grid.tile_rows), int(grid.push_blocks),
        tuple(lines if grid.protocol is Protocol.LINES else lls), int(vector))
