"""Device functions shared by the CUDA kernels: the row math in float32 and bit casts.

Compiled CUDA reinterprets bits with libdevice's ``int_as_float`` and
``float_as_int``; the CUDA simulator has no libdevice, so there a one-element
local array is viewed as the other type. Both give the same bits.
"""

import functools

import numpy as np
from numba import config, cuda, float32, int32, uint32

from ._math import build_bits, build_math, build_mask

__all__ = ["device_functions"]


@functools.cache
def device_functions():
    """Compile (once) and return the device functions used by the kernels."""
    jit = cuda.jit(device=True)
    if config.ENABLE_CUDASIM:
        @jit
        def as_float(bits):
            scratch = cuda.local.array(1, np.uint32)
            scratch[0] = bits
            return scratch.view(np.float32)[0]

        @jit
        def as_bits(value):
            scratch = cuda.local.array(1, np.float32)
            scratch[0] = value
            return scratch.view(np.uint32)[0]
    else:
        from numba.cuda import libdevice

        @jit
        def as_float(bits):
            return libdevice.int_as_float(int32(uint32(bits)))

        @jit
        def as_bits(value):
            return uint32(libdevice.float_as_int(float32(value)))

    math = build_math(np.float32, jit)
    bits = build_bits(jit)
    funcs = dict(vars(math))
    funcs.update(vars(bits))
    funcs.update(as_float=as_float, as_bits=as_bits, row_is_empty=build_mask(jit))
    return funcs
