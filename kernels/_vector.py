"""16-byte (and 8-byte) loads and stores of uint32 words, for rows aligned for them.

- ``load_quad(words, i)``: the four uint32 words ``words[i:i + 4]`` in one
  16-byte access (``words`` 1-d, ``&words[i]`` 16-byte aligned).
- ``load_duo(words, i)``: the two words ``words[i:i + 2]`` in one 8-byte access
  (``&words[i]`` 8-byte aligned).
- ``store_quad(words, i, a, b, c, d)``: ``words[i:i + 4] = a, b, c, d`` in one.
- ``store_duo(words, i, a, b)``: ``words[i:i + 2] = a, b`` in one 8-byte access.

A warp then moves 512 bytes per instruction instead of 128: the same bytes in
flight with a quarter of the instructions, and whole 16-byte stores where they
cross NVLink. The caller checks the alignment (a misaligned access faults).
Under the CUDA simulator they are plain element accesses that raise where the
address is misaligned, as the GPU would fault.
"""

import functools

from numba import config, cuda, types

__all__ = ["QUAD", "vector_functions"]

QUAD = 4  # uint32 words per access


@functools.cache
def vector_functions():
    """Compile (once) and return ``load_quad``, ``load_duo``, ``store_quad`` and
    ``store_duo``, by name."""
    return (_simulated if config.ENABLE_CUDASIM else _compiled)()


def _simulated():
    jit = cuda.jit(device=True)

    def aligned(words, i, size):
        """Raise where the GPU would fault: ``&words[i]`` off a ``size``-byte boundary."""
        address = words.ctypes.data + int(i) * words.strides[0]
        if address % size:
            raise ValueError(f"a {size}-byte access at an address {address % size} bytes "
                             f"past a {size}-byte boundary")

    @jit
    def load_quad(words, i):
        aligned(words, i, 16)
        return words[i], words[i + 1], words[i + 2], words[i + 3]

    @jit
    def load_duo(words, i):
        aligned(words, i, 8)
        return words[i], words[i + 1]

    @jit
    def store_quad(words, i, a, b, c, d):
        aligned(words, i, 16)
        words[i] = a
        words[i + 1] = b
        words[i + 2] = c
        words[i + 3] = d

    @jit
    def store_duo(words, i, a, b):
        aligned(words, i, 8)
        words[i] = a
        words[i + 1] = b

    return dict(load_quad=load_quad, load_duo=load_duo, store_quad=store_quad,
                store_duo=store_duo)


def _compiled():
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    from ._sync import element_pointer

    i32 = ir.IntType(32)

    def check(words):
        if not (isinstance(words, types.Array) and words.ndim == 1
                and words.dtype == types.uint32):
            raise TypeError(f"vector accesses take a 1-d uint32 array (got {words})")

    def vector_pointer(context, builder, sig, args, vector):
        ptr = element_pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        return builder.bitcast(ptr, vector.as_pointer())

    def vector_load(name, count):
        """The intrinsic ``name`` that loads ``count`` uint32 words in one access of
        ``4 * count`` bytes (so aligned)."""
        vector, words = ir.VectorType(i32, count), types.UniTuple(types.uint32, count)

        def load(typingctx, array, index):
            check(array)

            def codegen(context, builder, sig, args):
                got = builder.load(vector_pointer(context, builder, sig, args, vector),
                                   align=4 * count)
                return context.make_tuple(builder, words, [
                    builder.extract_element(got, ir.Constant(i32, k)) for k in range(count)])

            return words(array, index), codegen

        load.__name__ = load.__qualname__ = name
        return intrinsic(load)

    load_quad, load_duo = vector_load("load_quad", QUAD), vector_load("load_duo", 2)

    def vector_store(count, context, builder, sig, args):
        """Store ``args[2:]`` (``count`` words) in one access of ``4 * count`` bytes."""
        vector = ir.VectorType(i32, count)
        value = ir.Constant(vector, ir.Undefined)
        for k in range(count):
            word = context.cast(builder, args[2 + k], sig.args[2 + k], types.uint32)
            value = builder.insert_element(value, word, ir.Constant(i32, k))
        builder.store(value, vector_pointer(context, builder, sig, args, vector),
                      align=4 * count)
        return context.get_dummy_value()

    @intrinsic
    def store_quad(typingctx, words, index, a, b, c, d):
        check(words)
        return types.void(words, index, a, b, c, d), functools.partial(vector_store, QUAD)

    @intrinsic
    def store_duo(typingctx, words, index, a, b):
        check(words)
        return types.void(words, index, a, b), functools.partial(vector_store, 2)

    return dict(load_quad=load_quad, load_duo=load_duo, store_quad=store_quad,
                store_duo=store_duo)
