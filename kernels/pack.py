"""The pack kernel: partials and LSE bits into the packed send buffer.

``send[r, b, h, :D] = out[b, r*H/N + h, :]`` and the trailing ``P`` lanes carry
the float32 LSE's bits (see ``cupy_dcp.layout``). The kernel copies bit
patterns (uint16 or uint32), so one kernel serves every dtype.

One warp per (rank, token, head) row; each lane moves ``UNROLL`` elements per
step, loading them all before it stores any, so that enough loads are in
flight to run at memory bandwidth.
"""

import functools

import numpy as np
from numba import cuda

from ._arrays import dummy_index, kernel_array, launch_stream
from ._device import device_functions
from ._math import NEG_INF_BITS
from ._specs import check_pack_args

__all__ = ["pack_send"]

WARP = 32
ROWS_PER_BLOCK = 4
UNROLL = 8
MAX_BLOCKS = 132 * 16


@functools.cache
def _pack_kernel():
    row_is_empty = device_functions()["row_is_empty"]
    neg_inf_bits = np.uint32(NEG_INF_BITS)
    low16, sixteen = np.uint32(0xFFFF), np.uint32(16)
    step = WARP * UNROLL

    @cuda.jit
    def pack(data, lse_bits, seq_lens, query_start_loc, num_seqs, send):
        n, b_count, hn, width = send.shape
        d_count = data.shape[2]
        per_rank = b_count * hn
        lane = cuda.threadIdx.x
        row = cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y
        while row < n * per_rank:
            r = row // per_rank
            b = (row // hn) % b_count
            h = row % hn
            head = r * hn + h
            buf = cuda.local.array(UNROLL, np.uint32)
            base = lane
            while base < d_count:
                for k in range(UNROLL):
                    d = base + k * WARP
                    if d < d_count:
                        buf[k] = data[b, head, d]
                for k in range(UNROLL):
                    d = base + k * WARP
                    if d < d_count:
                        send[r, b, h, d] = buf[k]
                base += step
            if lane == 0:
                bits = np.uint32(lse_bits[b, head])
                if row_is_empty(b, seq_lens, query_start_loc, num_seqs):
                    bits = neg_inf_bits
                if width - d_count == 1:
                    send[r, b, h, d_count] = bits
                else:
                    send[r, b, h, d_count] = bits & low16
                    send[r, b, h, d_count + 1] = (bits >> sixteen) & low16
            row += cuda.gridDim.x * cuda.blockDim.y

    return pack


def pack_send(out, lse, send, stream=None, seq_lens=None, query_start_loc=None):
    """Pack this rank's partials and LSEs into the send buffer, on ``stream``.

    Args:
        out: ``[B, H, D]`` float16, bfloat16 or float32 device array, any
            strides; the partial attention output for all H heads.
        lse: ``[B, H]`` float32 device array (another float dtype is converted
            first, which needs CuPy); the LSE of each (token, head).
        send: ``[N, B, H/N, D + P]`` device array of ``out``'s dtype (or its
            unsigned-integer twin), C-contiguous; written.
        stream: the stream to run on; ``None`` is CuPy's current stream.
        seq_lens, query_start_loc: optional ``[S]`` and ``[S+1]`` integer device
            arrays; tokens of sequences with no KV here, and padding tokens at
            or past ``query_start_loc[-1]``, get LSE -inf.
    """
    spec = check_pack_args(out, lse, send, seq_lens, query_start_loc)
    if spec.tokens == 0:
        return
    lse = spec.lse_as_float32(lse)
    if seq_lens is None:
        seq_lens = query_start_loc = dummy_index()
        num_seqs = -1
    else:
        seq_lens, query_start_loc = spec.index_as_int64(seq_lens), spec.index_as_int64(query_start_loc)
        num_seqs = int(seq_lens.shape[0])
    args = (kernel_array(out, spec.bits, "out"), kernel_array(lse, np.uint32, "lse"),
            kernel_array(seq_lens, np.int64, "seq_lens"),
            kernel_array(query_start_loc, np.int64, "query_start_loc"), num_seqs,
            kernel_array(send, spec.bits, "send"))
    rows = spec.world_size * spec.tokens * (spec.heads // spec.world_size)
    blocks = min(-(-rows // ROWS_PER_BLOCK), MAX_BLOCKS)
    _pack_kernel()[blocks, (WARP, ROWS_PER_BLOCK), launch_stream(stream)](*args)
