"""Device functions for kernels that synchronise with kernels on other GPUs.

- ``load_acquire(flags, i)``: ``ld.acquire.sys`` of one int64: a load that
  later loads of this thread cannot overtake, and that sees a store made by
  any GPU of the system.
- ``load_relaxed(flags, i)``: ``ld.relaxed.sys`` of one int64: sees a store
  made by any GPU of the system, but orders nothing (no wait for it).
- ``store_release(flags, i, value)``: ``st.release.sys`` of one int64: no
  earlier load or store of this thread may be seen after it, from any GPU.
- ``load_pair(words, i)``: ``ld.relaxed.sys.v2.b64`` of the 16 bytes at
  ``words[i]`` and ``words[i + 1]`` (uint64, ``i`` even, 16-byte aligned): two
  words in one access, each single-copy atomic, so a word never mixes two stores.
- ``store_pair(words, i, a, b)``: ``st.relaxed.sys.v2.b64`` of two such words.
- ``now_ns()``: the GPU's global nanosecond timer, for bounded waits.
- ``pause()``: ``nanosleep`` for a short while between two polls.
- ``vote_all(ok)``, ``vote_any(ok)``: whether ``ok`` holds for every (for
  some) lane of the calling thread's warp; every lane of the warp must make
  the same call (a full-warp ``all_sync`` / ``any_sync``).
- ``grid_dependency_wait()``: ``griddepcontrol.wait``: in a kernel launched as
  a programmatic dependent (it may start before its predecessor on the
  stream ends), wait until that predecessor has completed and its memory is
  visible; at once otherwise. Hopper (sm_90) and later only.
- ``launch_dependents()``: ``griddepcontrol.launch_dependents``: the kernel
  launched after this one as a programmatic dependent may start now (it
  waits for this one's end itself). Hopper and later only.

Under the CUDA simulator (one Python process, blocks run one after another)
they are plain loads and stores, ``time.monotonic_ns`` and a sleep of zero,
and the two ``griddepcontrol`` functions do nothing; the votes gather the
warp's lanes (threads of the simulator) at a barrier, which breaks, failing
the kernel, if a lane does not come within :data:`SIMULATED_VOTE_TIMEOUT`.
"""

import functools
import threading

from numba import config, cuda, types

__all__ = ["FULL_WARP", "SIMULATED_VOTE_TIMEOUT", "sync_functions"]

FULL_WARP = 0xFFFFFFFF  # the lanes a vote takes: all of them
SIMULATED_VOTE_TIMEOUT = 60.0  # seconds


@functools.cache
def sync_functions():
    """Compile (once) and return the device functions above, by name."""
    if config.ENABLE_CUDASIM:
        return _simulated()
    return _compiled()


def _simulated():
    import time

    jit = cuda.jit(device=True)

    @jit
    def load_acquire(flags, i):
        return flags[i]

    @jit
    def store_release(flags, i, value):
        flags[i] = value

    load_relaxed = load_acquire

    @jit
    def load_pair(words, i):
        return words[i], words[i + 1]

    @jit
    def store_pair(words, i, a, b):
        words[i] = a
        words[i + 1] = b

    @jit
    def now_ns():
        return time.monotonic_ns()

    @jit
    def pause():
        time.sleep(0)

    @jit
    def grid_dependency_wait():
        pass

    warps = {}  # (block, warp) -> (barrier of its lanes, their votes)
    lock = threading.Lock()

    def vote(ok, gather):
        block, thread = cuda.blockIdx, cuda.threadIdx
        key = (block.x, block.y, block.z, thread.y, thread.z)  # blocks are (32, warps)
        with lock:
            if key not in warps:
                warps[key] = threading.Barrier(32, timeout=SIMULATED_VOTE_TIMEOUT), [False] * 32
            barrier, votes = warps[key]
        votes[thread.x] = bool(ok)
        try:
            barrier.wait()  # every lane's vote is in
            result = gather(votes)
            barrier.wait()  # every lane has read them: the next vote may overwrite
        except threading.BrokenBarrierError:
            with lock:  # a later launch starts afresh, not on a broken barrier
                if warps.get(key, (None,))[0] is barrier:
                    del warps[key]
            raise
        return result

    @jit
    def vote_all(ok):
        return vote(ok, all)

    @jit
    def vote_any(ok):
        return vote(ok, any)

    return dict(load_acquire=load_acquire, load_relaxed=load_relaxed,
                store_release=store_release, load_pair=load_pair, store_pair=store_pair,
                now_ns=now_ns, pause=pause, grid_dependency_wait=grid_dependency_wait,
                launch_dependents=grid_dependency_wait, vote_all=vote_all, vote_any=vote_any)


def element_pointer(context, builder, array_type, array, index, index_type):
    """In an intrinsic's code generation: the pointer to ``array[index]`` (1-d)."""
    from numba.core import cgutils

    array = context.make_array(array_type)(context, builder, value=array)
    index = context.cast(builder, index, index_type, types.intp)
    return cgutils.get_item_pointer(context, builder, array_type, array, [index],
                                    wraparound=False)


def _compiled():
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    i64 = ir.IntType(64)

    def check(array):
        if not (isinstance(array, types.Array) and array.ndim == 1
                and array.dtype in (types.int64, types.uint64)):
            raise TypeError(f"flags must be a 1-d int64 or uint64 array (got {array})")

    def system_load(instruction):
        def load(typingctx, flags, index):
            check(flags)

            def codegen(context, builder, sig, args):
                ptr = element_pointer(context, builder, sig.args[0], args[0], args[1],
                                      sig.args[1])
                asm = ir.InlineAsm(ir.FunctionType(i64, [ptr.type]),
                                   f"{instruction} $0, [$1];", "=l,l,~{memory}",
                                   side_effect=True)
                return builder.call(asm, [ptr])

            return flags.dtype(flags, index), codegen

        load.__name__ = f"load_{instruction.split('.')[1]}"
        return intrinsic(load)

    load_acquire = system_load("ld.acquire.sys.global.b64")
    load_relaxed = system_load("ld.relaxed.sys.global.b64")

    @intrinsic
    def store_release(typingctx, flags, index, value):
        check(flags)

        def codegen(context, builder, sig, args):
            ptr = element_pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            value = context.cast(builder, args[2], sig.args[2], sig.args[0].dtype)
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [ptr.type, i64]),
                               "st.release.sys.global.b64 [$0], $1;", "l,l,~{memory}",
                               side_effect=True)
            builder.call(asm, [ptr, value])
            return context.get_dummy_value()

        return types.void(flags, index, value), codegen

    pair = types.UniTuple(types.uint64, 2)

    @intrinsic
    def load_pair(typingctx, words, index):
        check(words)

        def codegen(context, builder, sig, args):
            ptr = element_pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            both = ir.LiteralStructType([i64, i64])
            asm = ir.InlineAsm(ir.FunctionType(both, [ptr.type]),
                               "ld.relaxed.sys.global.v2.b64 {$0, $1}, [$2];", "=l,=l,l,~{memory}",
                               side_effect=True)
            got = builder.call(asm, [ptr])
            return context.make_tuple(builder, pair, [builder.extract_value(got, 0),
                                                      builder.extract_value(got, 1)])

        return pair(words, index), codegen

    @intrinsic
    def store_pair(typingctx, words, index, a, b):
        check(words)

        def codegen(context, builder, sig, args):
            ptr = element_pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            first = context.cast(builder, args[2], sig.args[2], types.uint64)
            second = context.cast(builder, args[3], sig.args[3], types.uint64)
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [ptr.type, i64, i64]),
                               "st.relaxed.sys.global.v2.b64 [$0], {$1, $2};", "l,l,l,~{memory}",
                               side_effect=True)
            builder.call(asm, [ptr, first, second])
            return context.get_dummy_value()

        return types.void(words, index, a, b), codegen

    @intrinsic
    def now_ns(typingctx):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(i64, []), "mov.u64 $0, %globaltimer;", "=l",
                               side_effect=True)
            return builder.call(asm, [])

        return types.int64(), codegen

    @cuda.jit(device=True)
    def pause():
        cuda.nanosleep(64)

    def grid_control(instruction):
        def control(typingctx):
            def codegen(context, builder, sig, args):
                asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), f"{instruction};",
                                   "~{memory}", side_effect=True)
                builder.call(asm, [])
                return context.get_dummy_value()

            return types.void(), codegen

        control.__name__ = instruction.replace(".", "_")
        return intrinsic(control)

    @cuda.jit(device=True)
    def vote_all(ok):
        return cuda.all_sync(FULL_WARP, ok) != 0

    @cuda.jit(device=True)
    def vote_any(ok):
        return cuda.any_sync(FULL_WARP, ok) != 0

    return dict(load_acquire=load_acquire, load_relaxed=load_relaxed,
                store_release=store_release, load_pair=load_pair, store_pair=store_pair,
                now_ns=now_ns, pause=pause, vote_all=vote_all, vote_any=vote_any,
                grid_dependency_wait=grid_control("griddepcontrol.wait"),
                launch_dependents=grid_control("griddepcontrol.launch_dependents"))
