"""Floor kernels for the kernel bench: what a launch and a plain copy cost in a given grid.

- ``floor_empty``: does nothing. Launched with a measured kernel's grid and
  block, its time is the launch floor that kernel cannot go below.
- ``floor_copy(src, dst)``: reads every uint32 word of ``src`` once and writes
  every word of ``dst`` once, in 16-byte quads: dst quad ``q`` is the XOR of src
  quads ``q, q + Q, q + 2Q, ...`` (``Q`` = dst's quads), so that no load is dead
  and a ``src`` longer than ``dst`` (a combine reads N rows per row it writes) is
  still read in full; dst quads past the end of ``src`` are written as zeros.
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

__all__ = ["copy_kernel", "empty_kernel", "floor_argtypes", "quad_words"]


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
def _copy():
    v = vector_functions()
    load_quad, store_quad = v["load_quad"], v["store_quad"]
    u64 = np.uint64
    u_quad = u64(QUAD)

    @cuda.jit
    def floor_copy(src, dst):
        threads = u64(cuda.blockDim.x) * u64(cuda.blockDim.y)
        q = (u64(cuda.blockIdx.x) * u64(cuda.blockDim.y) + u64(cuda.threadIdx.y)) \
            * u64(cuda.blockDim.x) + u64(cuda.threadIdx.x)
        stride = u64(cuda.gridDim.x) * threads
        read_quads = u64(src.shape[0]) // u_quad
        write_quads = u64(dst.shape[0]) // u_quad
        while q < write_quads:
            a = b = c = d = np.uint32(0)
            s = q
            while s < read_quads:
                w0, w1, w2, w3 = load_quad(src, s * u_quad)
                a ^= w0
                b ^= w1
                c ^= w2
                d ^= w3
                s += write_quads
            store_quad(dst, q * u_quad, a, b, c, d)
            q += stride

    return floor_copy


@functools.cache
def empty_kernel():
    """The launch-floor kernel, specialised once."""
    return SpecializedKernel(_empty(), floor_argtypes())


@functools.cache
def copy_kernel():
    """The copy-floor kernel, specialised once."""
    return SpecializedKernel(_copy(), floor_argtypes())
