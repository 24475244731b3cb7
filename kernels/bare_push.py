"""The bare push: a direct call's packed rows exchanged in one kernel per call, and
nothing else. A baseline for the bench, not part of any plan.

Every rank stores the bytes it owes each peer (as many as a direct call of the
same size pushes) into that peer's window, 16 bytes at a time; then each
block raises its flag at every peer (``st.release.sys``, after a barrier) and
waits for every peer's flag of the same block (``ld.acquire.sys``, bounded by
``timeout_ns``; a wait that runs out records ``TIMED_OUT`` for the peer in
``status``). Nothing is packed, unpacked or combined. Call ``e`` raises its
flags to ``e``; the epoch lives in ``state[0]`` and the last block to arrive
(``state[1]`` counts them) advances it, as in the direct kernel. What a
direct call of the same size costs beyond the bare push is what its packing,
its combine and their synchronisation add (a direct call of at most
``LL_MAX_ROWS`` rows per rank pair goes word by word instead: twice the
bytes, no flag).
"""

import functools

import numpy as np
from numba import cuda, types

from ._launch import SpecializedKernel, array_type
from ._sync import sync_functions
from .direct import CHECK_EVERY, TIMED_OUT

__all__ = ["bare_push_kernel"]


@functools.cache
def _bare_push_kernel(n):
    s = sync_functions()
    load_acquire, store_release, store_pair, now_ns = (s["load_acquire"], s["store_release"],
                                                        s["store_pair"], s["now_ns"])
    u64 = np.uint64
    u_n, u_two = u64(n), u64(2)
    timed_out = np.int64(TIMED_OUT)

    @cuda.jit
    def bare_push(src, dsts, flags, state, status, self_rank, timeout_ns):
        me = u64(self_rank)
        epoch = state[0] + 1
        tid = u64(cuda.threadIdx.x)
        threads = u64(cuda.blockDim.x)
        block = u64(cuda.blockIdx.x)
        step = u64(cuda.gridDim.x) * threads * u_two
        words = u64(src.shape[1])
        max_tiles = (u64(flags[0].shape[0]) - u_n) // u_n
        for k in range(n):
            if u64(k) != me:
                dst = dsts[k]
                i = (block * threads + tid) * u_two
                while i < words:
                    store_pair(dst, i, src[k, i], src[k, i + u64(1)])
                    i += step
        cuda.syncthreads()  # the block's stores, before its flags' release
        if tid < u_n and tid != me:
            store_release(flags[tid], u_n + me * max_tiles + block, epoch)
            mine = flags[me]
            at = u_n + tid * max_tiles + block
            start = now_ns()
            spins = 1
            while load_acquire(mine, at) < epoch:
                if spins % CHECK_EVERY == 0 and now_ns() - start > timeout_ns:
                    status[tid] = timed_out
                    break
                spins += 1
        cuda.syncthreads()
        if tid == u64(0):  # every thread read the epoch; the last block advances it
            cuda.threadfence()
            if cuda.atomic.add(state, 1, 1) == cuda.gridDim.x - 1:
                state[1] = 0
                state[0] = epoch

    return bare_push


@functools.cache
def bare_push_kernel(n):
    """The bare push for ``n`` ranks. Arguments: ``src`` uint64 ``[n, words]`` (C, an
    even number of words: row ``k`` goes to rank ``k``), ``dsts``: per rank ``k``, the
    uint64 ``[words]`` region of rank ``k``'s window that this rank writes (C, 16-byte
    aligned), ``flags``: every rank's int64 flags (``n + n * max_tiles`` words; the
    grid may not exceed ``max_tiles``), ``state`` int64 ``[2]`` (zeroed before the
    first call), ``status`` int64 ``[n]``, ``self_rank``, ``timeout_ns``."""
    flag = array_type(np.int64, 1, True)
    argtypes = (array_type(np.uint64, 2, True),
                types.UniTuple(array_type(np.uint64, 1, True), n), types.UniTuple(flag, n),
                flag, flag, types.int64, types.int64)
    return SpecializedKernel(_bare_push_kernel(n), argtypes)
