"""Floor kernels for the kernel bench: what a launch and a plain copy cost in a given grid.

- ``floor_empty``: does nothing. Launched with a measured kernel's grid and
  block, its time is the launch floor that kernel cannot go below.
- ``floor_copy(src, dst)``: reads every uint32 word of ``src`` once and writes
  every word of ``dst`` once, in 16-byte quads: dst quad ``q`` is the XOR of src
  quads ``q, q + Q, q + 2Q, ...`` (``Q`` = dst's quads), so that no load is dead
  and a ``src`` longer than ``dst`` (a combine reads N rows per row it writes) is
  still read in full; dst quads past the end of ``src`` are written as zeros.
  Built for ``quads_in_flight`` (:func:`in_flight`: the source quads per
  destination quad, so N for a combine), a thread asks for that many quads
  before it uses any, as the combine for its N loads every shard's values
  before it weighs them: reading N rows then costs one round trip, not N
  (ptxas of CUDA 13 issues eight as two groups of four). One in flight is a
  plain copy, with none of the batching's instructions.
  Launched with a measured kernel's grid and block over buffers of the bytes
  that kernel reads and writes, its time is the copy floor of that grid.

Both are Numba kernels launched through :class:`SpecializedKernel`, the same
launcher as the pack and combine, so launch costs compare. Both take the same
arguments (two 1-d uint32 arrays of a multiple of four words, 16-byte aligned).
"""

import functools

import numpy as np
from numba import cuda

from .kernels._launch import SpecializedKernel, array_type
from .kernels._vector import QUAD, vector_functions

__all__ = ["MAX_IN_FLIGHT", "copy_kernel", "empty_kernel", "floor_argtypes", "in_flight",
           "quad_words"]

MAX_IN_FLIGHT = 8  # the most source quads a copy thread asks for before it uses any


def quad_words(nbytes):
    """The uint32 words of a floor buffer holding ``nbytes``: rounded up to whole quads."""
    words = -(-int(nbytes) // 4)
    return max(QUAD, -(-words // QUAD) * QUAD)


def floor_argtypes():
    """The Numba types of both floor kernels' arguments: ``(src, dst)``, uint32 1-d, C."""
    return (array_type(np.uint32, 1, True), array_type(np.uint32, 1, True))


@functools.cache
def _empty():
    @cuda.jit
    def floor_empty(src, dst):
        pass

    return floor_empty


@functools.cache
def _copy(in_flight):
    v = vector_functions()
    load_quad, store_quad = v["load_quad"], v["store_quad"]
    u64 = np.uint64
    u_quad, u_flight = u64(QUAD), u64(in_flight)
    held_words = in_flight * QUAD
    zero = np.uint32(0)

    @cuda.jit
    def floor_copy(src, dst):
        threads = u64(cuda.blockDim.x) * u64(cuda.blockDim.y)
        q = (u64(cuda.blockIdx.x) * u64(cuda.blockDim.y) + u64(cuda.threadIdx.y)) \
            * u64(cuda.blockDim.x) + u64(cuda.threadIdx.x)
        stride = u64(cuda.gridDim.x) * threads
        read_quads = u64(src.shape[0]) // u_quad
        write_quads = u64(dst.shape[0]) // u_quad
        held = cuda.local.array(held_words, np.uint32)
        while q < write_quads:
            a = b = c = d = zero
            s = q
            while s < read_quads:  # in_flight quads asked for before any is used
                for k in range(in_flight):
                    at = s + u64(k) * write_quads
                    w0 = w1 = w2 = w3 = zero
                    if k == 0 or at < read_quads:  # the first is below: s is
                        w0, w1, w2, w3 = load_quad(src, at * u_quad)
                    held[k * QUAD] = w0
                    held[k * QUAD + 1] = w1
                    held[k * QUAD + 2] = w2
                    held[k * QUAD + 3] = w3
                span = in_flight  # XOR in a tree: no partial sum waits on the first loads
                while span > 1:
                    span //= 2
                    for k in range(span * QUAD):
                        held[k] ^= held[k + span * QUAD]
                a ^= held[0]
                b ^= held[1]
                c ^= held[2]
                d ^= held[3]
                s += u_flight * write_quads
            store_quad(dst, q * u_quad, a, b, c, d)
            q += stride

    return floor_copy


def in_flight(read_bytes, written_bytes):
    """The copy floor's quads in flight for a kernel that reads ``read_bytes`` and writes
    ``written_bytes``: the source quads per destination quad (a combine's N), rounded
    up to a power of two, at most :data:`MAX_IN_FLIGHT`; 1 for a plain copy."""
    per_quad = -(-quad_words(read_bytes) // quad_words(written_bytes))
    count = 1
    while count < min(per_quad, MAX_IN_FLIGHT):
        count *= 2
    return count


@functools.cache
def empty_kernel():
    """The launch-floor kernel, specialised once."""
    return SpecializedKernel(_empty(), floor_argtypes())


@functools.cache
def copy_kernel(quads_in_flight=1):
    """The copy-floor kernel with ``quads_in_flight`` (a power of two, at most
    :data:`MAX_IN_FLIGHT`: :func:`in_flight`) source quads asked for at once, specialised
    once."""
    if quads_in_flight not in (1, 2, 4, 8):
        raise ValueError(f"quads_in_flight must be 1, 2, 4 or 8 (got {quads_in_flight!r})")
    return SpecializedKernel(_copy(quads_in_flight), floor_argtypes())
