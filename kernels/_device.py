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
``pack_f16x2(low, high)`` is its float16 twin (``cvt.rn.f16x2.f32``; NumPy's
float16 rounding under the simulator, also to nearest even), and
``f16_low(word)`` / ``f16_high(word)`` give the float32 value of a word's
low / high float16 half (``cvt.f32.f16``, exact; the integer conversion
``f16_to_f32_bits`` under the simulator).
"""

import functools
from types import SimpleNamespace

import numpy as np
from numba import config, cuda, float32, int32, types, uint32

from ._math import (build_bits, build_held_weights, build_mask, build_mask_steps, build_math,
                    build_row_weights)

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
        f16_to_f32_bits, low16 = bits.f16_to_f32_bits, np.uint32(0xFFFF)

        @jit
        def pack_f16x2(low, high):
            return uint32(np.float16(low).view(np.uint16)) \
                | (uint32(np.float16(high).view(np.uint16)) << sixteen)

        @jit
        def f16_low(word):
            return as_float(f16_to_f32_bits(uint32(word) & low16))

        @jit
        def f16_high(word):
            return as_float(f16_to_f32_bits(uint32(word) >> sixteen))
    else:
        pack_bf16x2, pack_f16x2 = _pack_x2("bf16x2"), _pack_x2("f16x2")
        f16_low, f16_high = _f16_half(0), _f16_half(1)
    steps = build_mask_steps(jit)  # row_is_empty, and the pack's two-row trips, in two steps
    funcs = dict(vars(math))
    funcs.update(vars(bits))
    funcs.update(as_float=as_float, as_bits=as_bits, pack_bf16x2=pack_bf16x2,
                 pack_f16x2=pack_f16x2, f16_low=f16_low, f16_high=f16_high,
                 mask_fetch=steps[0], mask_decide=steps[1], row_is_empty=build_mask(jit, steps))
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


def _pack_x2(kind):
    """The intrinsic that rounds two float32 values into one uint32 of two ``kind``
    (``bf16x2`` or ``f16x2``) halves, the first argument in the low half."""
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    f32, i32 = ir.FloatType(), ir.IntType(32)

    def pack(typingctx, low, high):
        def codegen(context, builder, sig, args):
            low, high = (context.cast(builder, a, t, types.float32)
                         for a, t in zip(args, sig.args))
            asm = ir.InlineAsm(ir.FunctionType(i32, [f32, f32]),
                               f"cvt.rn.{kind}.f32 $0, $1, $2;", "=r,f,f")
            return builder.call(asm, [high, low])  # the first operand: the high half

        return types.uint32(low, high), codegen

    pack.__name__ = pack.__qualname__ = f"pack_{kind.replace('x2', '')}x2"
    return intrinsic(pack)


def _f16_half(half):
    """The intrinsic that gives the float32 value of the float16 in the low (``half``
    0) or high (1) half of a uint32 word."""
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    f32, i32 = ir.FloatType(), ir.IntType(32)

    def unpack(typingctx, word):
        def codegen(context, builder, sig, args):
            word = context.cast(builder, args[0], sig.args[0], types.uint32)
            asm = ir.InlineAsm(ir.FunctionType(f32, [i32]),
                               "{.reg .b16 l, h; mov.b32 {l, h}, $1; "
                               f"cvt.f32.f16 $0, {'lh'[half]};}}", "=f,r")
            return builder.call(asm, [word])

        return types.float32(word), codegen

    unpack.__name__ = unpack.__qualname__ = ("f16_low", "f16_high")[half]
    return intrinsic(unpack)
