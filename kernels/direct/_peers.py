"""Peer synchronisation of the direct kernels: waits, give-up, arrival, trace stamps.

A rank's private ``state[STATE_WORDS]`` (int64, device memory) holds
``state[0]`` the epoch (the calls made so far: the last block of a call to
:func:`arrive` advances it), ``state[1]`` the blocks' arrival count and
``state[2]`` non-zero once a wait failed (the plan is then dead). A window's
flags ``flags[p]`` (``p < N``) are set to ``-1`` by peer ``p`` when it gave
up. A failed wait records :data:`TIMED_OUT` or :data:`PEER_FAILED` for the
peer in the host-visible ``status[N]`` and tells every peer
(``give_up``). Waits poll :data:`CHECK_EVERY` times between two looks at the
clock and the failure flags. A traced kernel's first thread of each block
stores the global timer at the call's milestones after the state's words:
``[2][blocks][TRACE_STAMPS]`` by call parity.

``PUSH`` and ``COMBINE`` are the phases a launch runs (both by default; one
alone lets one process play every rank in turn, under the simulator).
"""

import functools
from types import SimpleNamespace

import numpy as np
from numba import cuda

from .._sync import sync_functions

__all__ = ["CHECK_EVERY", "COMBINE", "PEER_FAILED", "PUSH", "STATE_WORDS", "TIMED_OUT",
           "TRACE_STAMPS", "call_start", "grid_dependency", "peer_functions", "rank_functions",
           "trace_functions"]

STATE_WORDS = 4
TRACE_STAMPS = 8  # per block and call parity, after ``state``, in a traced kernel
TIMED_OUT, PEER_FAILED = 1, 2
PUSH, COMBINE = 1, 2
CHECK_EVERY = 64  # polls between two looks at the clock and the failure flags

u64 = np.uint64
u_one = u64(1)


@functools.cache
def grid_dependency(dependent):
    """Device functions ``(await_predecessor, release_dependents)``: ``griddepcontrol``
    for a kernel launched as a programmatic dependent (Hopper and later), else
    nothing."""
    if dependent:
        s = sync_functions()
        return s["grid_dependency_wait"], s["launch_dependents"]

    @cuda.jit(device=True)
    def await_predecessor():
        pass

    return await_predecessor, await_predecessor


@functools.cache
def trace_functions(trace):
    """Device functions ``clock()``, ``stamp_at(state, epoch, k, value)`` and
    ``stamp(state, epoch, k)``: the timer and milestone ``k``'s stamp, or nothing
    where not ``trace``."""
    now_ns = sync_functions()["now_ns"]
    jit = cuda.jit(device=True)

    if trace:  # measurement only: each block's first thread notes the clock at milestones
        @jit
        def clock():
            return now_ns()

        @jit
        def stamp_at(state, epoch, k, value):
            if cuda.threadIdx.x == 0 and cuda.threadIdx.y == 0:
                blocks = (state.shape[0] - STATE_WORDS) // (2 * TRACE_STAMPS)  # per parity
                at = ((epoch & 1) * blocks + cuda.blockIdx.x) * TRACE_STAMPS + k
                if cuda.blockIdx.x < blocks:
                    state[STATE_WORDS + at] = value
    else:
        @jit
        def clock():
            return 0

        @jit
        def stamp_at(state, epoch, k, value):
            pass

    @jit
    def stamp(state, epoch, k):
        stamp_at(state, epoch, k, clock())

    return SimpleNamespace(clock=clock, stamp_at=stamp_at, stamp=stamp)


@functools.cache
def call_start(dependent, trace):
    """Device function ``begin_call(state, data, vals, tile_rows) -> (epoch, slot, hn,
    rows, tiles)``: how every direct kernel starts a call. It waits for the kernel
    before it (a dependent launch: before the first load of anything), stamps its
    entry and that wait (traced), and gives the call's epoch, its slot parity, the
    local heads, the (token, head) rows and the tiles of ``tile_rows`` rows."""
    await_predecessor = grid_dependency(dependent)[0]
    t = trace_functions(trace)
    clock, stamp_at = t.clock, t.stamp_at

    @cuda.jit(device=True)
    def begin_call(state, data, vals, tile_rows):
        entered = clock()
        await_predecessor()
        awaited = clock()
        epoch = state[0] + 1
        stamp_at(state, epoch, 0, entered)
        stamp_at(state, epoch, 1, awaited)
        slot = u64(epoch & 1)
        hn = u64(vals.shape[3])
        rows = u64(data.shape[0]) * hn
        return epoch, slot, hn, rows, (rows + u64(tile_rows) - u_one) // u64(tile_rows)

    return begin_call


@functools.cache
def rank_functions():
    """Device functions ``peer_rank(k, me)`` and ``shard_rank(k, me)``."""
    jit = cuda.jit(device=True)

    @jit
    def peer_rank(k, me):
        """The rank of peer k (0 <= k < N - 1): the ranks in order, this one skipped."""
        return k + u_one if k >= me else k

    @jit
    def shard_rank(k, me):
        """The rank of shard k of a combine: this one for k == 0, then the peers in order."""
        return me if k == 0 else peer_rank(u64(k - 1), me)

    return SimpleNamespace(peer_rank=peer_rank, shard_rank=shard_rank)


@functools.cache
def peer_functions(n):
    """Device functions of ``n`` ranks: ``give_up(flags, state, me)``,
    ``stopped(flags, state, status, p, me, start, timeout_ns)``, ``wait_for(flags,
    state, status, p, at, epoch, me, timeout_ns, doomed)`` and ``arrive(state,
    epoch, combining, tid, threads)``."""
    s = sync_functions()
    load_acquire, store_release = s["load_acquire"], s["store_release"]
    now_ns, pause = s["now_ns"], s["pause"]
    timed_out, peer_failed, gave_up = np.int64(TIMED_OUT), np.int64(PEER_FAILED), np.int64(-1)
    jit = cuda.jit(device=True)

    @jit
    def give_up(flags, state, me):
        """Mark the plan dead; the first block to do so tells every peer."""
        if cuda.atomic.exch(state, 2, 1) == 0:
            cuda.threadfence_system()
            for q in range(n):
                if q != me:
                    store_release(flags[q], me, gave_up)

    @jit
    def stopped(flags, state, status, p, me, start, timeout_ns):
        """Whether a wait for peer p must end: the plan is dead, p gave up, or the wait
        begun at ``start`` has run past ``timeout_ns`` (recorded, and the peers told)."""
        if load_acquire(state, 2) != 0:
            return True
        if load_acquire(flags[me], p) < 0:
            status[p] = peer_failed
            give_up(flags, state, me)
            return True
        if now_ns() - start > timeout_ns:
            status[p] = timed_out
            give_up(flags, state, me)
            return True
        return False

    @jit
    def wait_for(flags, state, status, p, at, epoch, me, timeout_ns, doomed):
        """Poll my flag ``at`` (peer ``p``'s tile) until it reaches ``epoch``; False
        when the wait failed (recorded, and the peers told) or the plan is dead.
        ``doomed``: p had given up before this call (its data may be partial)."""
        if doomed:
            status[p] = peer_failed
            give_up(flags, state, me)
            return False
        mine = flags[me]
        seen = load_acquire(mine, at)
        if seen >= epoch:
            return True
        start = now_ns()
        spins = 1  # the first look at the clock comes after CHECK_EVERY polls
        while seen < epoch:
            if spins % CHECK_EVERY == 0:
                if stopped(flags, state, status, p, me, start, timeout_ns):
                    return False
                pause()
            spins += 1
            seen = load_acquire(mine, at)
        return True

    @jit
    def arrive(state, epoch, combining, tid, threads):
        """The block's arrival, once every thread of it has read the epoch: the last
        block to arrive resets the count and, in a call that combines, advances it."""
        if tid == threads - u_one:  # the last thread (it has the least work)
            cuda.threadfence()
            if cuda.atomic.add(state, 1, 1) == cuda.gridDim.x - 1:  # every block has
                state[1] = 0
                if combining:
                    state[0] = epoch

    return SimpleNamespace(give_up=give_up, stopped=stopped, wait_for=wait_for, arrive=arrive)
