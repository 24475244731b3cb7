"""Device functions shared by the CUDA kernels: the row math in float32 and bit casts.

Compiled CUDA reinterprets bits with libdevice's ``int_as_float`` and
``float_as_int``; the CUDA simulator has no libdevice, so there a one-element
local array is viewed as the other type. Both give the same bits.

``pack_bf16x2(low, high)`` rounds two float32 values to bfloat16 (to nearest
even) in one uint32, ``low`` in its low half: one ``cvt.rn.bf16x2.f32`` when
compiled, the integer rounding of ``f32_to_bf16_bits`` under the simulator.
They agree bit for bit but on a NaN's payload (the instruction gives the
canonical ``0x7FFF``): callers pass sums that the GPU computed, whose NaN is
always the canonical float32 one, which both turn into ``0x7FFF``.
"""

import functools
from types import SimpleNamespace

import numpy as np
from numba import config, cuda, float32, int32, types, uint32

from ._math import build_bits, build_held_weights, build_math, build_mask, build_row_weights

__all__ = ["device_functions", "held_weights", "inline_device", "row_weights_of"]

inline_device = cuda.jit(device=True, inline="always")  # inlined at Numba's IR level


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
    if config.ENABLE_CUDASIM:
        f32_to_bf16_bits, sixteen = bits.f32_to_bf16_bits, np.uint32(16)

        @jit
        def pack_bf16x2(low, high):
            return uint32(f32_to_bf16_bits(as_bits(low))
                          | (f32_to_bf16_bits(as_bits(high)) << sixteen))
    else:
        pack_bf16x2 = _pack_bf16x2()
    funcs = dict(vars(math))
    funcs.update(vars(bits))
    funcs.update(as_float=as_float, as_bits=as_bits, pack_bf16x2=pack_bf16x2,
                 row_is_empty=build_mask(jit))
    return funcs


def row_weights_of(lse_of, own_first=False):
    """The float32 weights of a row whose shard k's LSE is ``lse_of(lses, k)`` (an
    :data:`inline_device` function): :func:`_math.build_row_weights`, inlined."""
    return build_row_weights(SimpleNamespace(**device_functions()), inline_device, lse_of,
                             own_first)


@functools.cache
def held_weights():
    """The float32 weights of a row whose LSEs are held in a local array, each
    ``exp`` once: :func:`_math.build_held_weights`, inlined."""
    return build_held_weights(SimpleNamespace(**device_functions()), inline_device)


def _pack_bf16x2():
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    f32, i32 = ir.FloatType(), ir.IntType(32)

    @intrinsic
    def pack_bf16x2(typingctx, low, high):
        def codegen(context, builder, sig, args):
            low, high = (context.cast(builder, a, t, types.float32)
                         for a, t in zip(args, sig.args))
            asm = ir.InlineAsm(ir.FunctionType(i32, [f32, f32]),
                               "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f")
            return builder.call(asm, [high, low])  # the first operand: the high half

        return types.uint32(low, high), codegen

    return pack_bf16x2
