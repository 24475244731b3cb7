"""The pack's rows of uint32 words, stored as 16-byte quads aligned in the packed buffer.

A packed row of ``D`` words and its LSE word starts at word ``(D + 1) * row`` of
its chunk, so three rows in four start off a 16-byte boundary and a lane that
stores the row's words one at a time needs an instruction per word. Here
each row is cut where the buffer's alignment cuts it: up to three words
before its first 16-byte boundary (the lead), whole quads, up to three words
after them (the rest), and the LSE word. Lane ``l`` of the row's ``group``
stores quads ``l, l + group, ...`` in one 16-byte store each; lanes 0-2 store
the lead and the rest, one word each, and the last lane the LSE word. A
quad's source words are read as widely as their alignment in the input
allows: one 16-byte load, two 8-byte loads, or four words. Every load of a
trip is issued before its first store.

The caller vouches that the flat input (``data.span()``, not empty) and both
flat buffers start 16-byte aligned; the input's strides are any (a row's
source alignment is found from its offset). The words are the float32 values
or pairs of 16-bit values: the same bits as the pack's word-at-a-time rows.
"""

import functools

import numpy as np
from numba import cuda

from ._vector import QUAD, vector_functions

__all__ = ["quad_row_packer"]


@functools.cache
def quad_row_packer(group, quads, lse_fetch, lse_of, row_start):
    """Device function ``pack_quad_rows(data, data_flat, unit, s0, s1, lse_bits,
    seq_lens, query_start_loc, num_seqs, dst, r, h, b, b_count, tokens, hn, width,
    d_count, lane, buf)`` with the arguments of the pack's own rows function
    (``data``, ``unit`` unused: the rows are read through ``data_flat``): this
    lane's share of the rows ``(r, b, h)`` of tokens ``b, b + Z, ...`` (``Z`` the
    grid's z) into the flat chunks ``dst``, ``quads`` quads a lane a trip (``buf``
    holds their ``4 * quads`` words).

    ``lse_fetch(lse_bits, b, head, seq_lens, query_start_loc, num_seqs)`` issues the
    loads of a row's LSE (and a mask's words); ``lse_of(fetched, b, seq_lens,
    query_start_loc, num_seqs)`` gives the bits its LSE word carries, once the
    first quads' loads are issued and before their stores; ``row_start(r, b, h, tokens,
    hn, width)`` gives the flat index of row ``(r, b, h)``'s first word in ``dst``."""
    v = vector_functions()
    load_quad, load_duo, store_quad = v["load_quad"], v["load_duo"], v["store_quad"]
    u32, u64 = np.uint32, np.uint64
    u_last, u_trip, u_three = u32(group - 1), u32(group * quads), u64(QUAD - 1)
    jit = cuda.jit(device=True)

    @jit
    def load_trip(src, at, align, left, buf):
        """This lane's quads of a trip, ``src[at + k * group * 4:][:4]`` for each ``k``
        with ``k * group < left``, into ``buf``: as wide as the source's alignment
        ``align`` (``at % 4``, the same for every quad) allows, the choice made once."""
        if align == u32(0):
            for k in range(quads):
                if u32(k * group) < left:
                    w0, w1, w2, w3 = load_quad(src, at + u64(k * group * QUAD))
                    buf[QUAD * k], buf[QUAD * k + 1] = w0, w1
                    buf[QUAD * k + 2], buf[QUAD * k + 3] = w2, w3
        elif align == u32(2):
            for k in range(quads):
                if u32(k * group) < left:
                    w0, w1 = load_duo(src, at + u64(k * group * QUAD))
                    w2, w3 = load_duo(src, at + u64(k * group * QUAD + 2))
                    buf[QUAD * k], buf[QUAD * k + 1] = w0, w1
                    buf[QUAD * k + 2], buf[QUAD * k + 3] = w2, w3
        else:
            for k in range(quads):
                if u32(k * group) < left:
                    for i in range(QUAD):
                        buf[QUAD * k + i] = src[at + u64(k * group * QUAD + i)]

    @jit
    def pack_quad_rows(data, data_flat, unit, s0, s1, lse_bits, seq_lens, query_start_loc,
                       num_seqs, dst, r, h, b, b_count, tokens, hn, width, d_count, lane, buf):
        head = u32(u32(r * hn) + h)
        z = u32(cuda.gridDim.z)
        while b < b_count:
            at = row_start(r, b, h, tokens, hn, width)
            src = u64(b) * u64(s0) + u64(head) * u64(s1)
            lead = u32((u64(QUAD) - (at & u_three)) & u_three)
            if lead > d_count:
                lead = d_count
            count = u32(u32(d_count - lead) >> u32(2))  # whole quads
            rest = u32(lead + u32(count * u32(QUAD)))  # the first word after them
            align = u32((src + u64(lead)) & u_three)
            first, last = lane < lead, lane < u32(d_count - rest)
            word_first = word_last = u32(0)
            if first:
                word_first = data_flat[src + u64(lane)]
            if last:
                word_last = data_flat[src + u64(rest + lane)]
            fetched = lse_fetch(lse_bits, b, head, seq_lens, query_start_loc, num_seqs)
            bits = u32(0)
            # 64-bit indices of this lane's first quad: its others are constant offsets
            read = src + u64(lead) + u64(lane) * u64(QUAD)
            write = at + u64(lead) + u64(lane) * u64(QUAD)
            left = u32(count - lane) if lane < count else u32(0)  # quads from this lane's on
            trips = u32(0)
            while True:
                load_trip(data_flat, read, align, left, buf)
                if trips == u32(0):  # the mask is judged with the first loads in flight, so
                    # that only its bits, not its words, are held across the stores
                    bits = lse_of(fetched, b, seq_lens, query_start_loc, num_seqs)
                trips = u32(trips + u32(1))
                for k in range(quads):
                    if u32(k * group) < left:
                        store_quad(dst, write + u64(k * group * QUAD), buf[QUAD * k],
                                   buf[QUAD * k + 1], buf[QUAD * k + 2], buf[QUAD * k + 3])
                if left <= u_trip:
                    break
                left = u32(left - u_trip)
                read += u64(u_trip * QUAD)
                write += u64(u_trip * QUAD)
            if first:
                dst[at + u64(lane)] = word_first
            if last:
                dst[at + u64(rest + lane)] = word_last
            if lane == u_last:
                dst[at + u64(d_count)] = bits
            b = u32(b + z)

    return pack_quad_rows
