"""What a plan compiles, and how the ranks of a node share a cold compile.

A plan compiles, when it is built, every kernel that its calls can launch and
no other: one variant of each kernel, the one its dtype and head size allow
(16-bit data of an even head size moved as words, and combined in pairs; a
plan stages arrays that cannot be seen as words, so it never launches the
kernels that move 16 bits at a time there; the pack of rows of more than one
step in two, for partials aligned to 16 bytes and for others), and for the
direct plan only the paths (word by word, in lines, in tiles) that some call
of at most ``max_tokens`` tokens takes on the blocks that every rank can hold
(:func:`direct_paths`).

The kernels are listed as *tasks* (functions of no argument that build one
kernel: compiled, or loaded from the kernel cache). :func:`build_shared`
splits them among the ranks of a node: each builds its share, which lands in
the cache, and after one collective every rank builds the rest, which it then
loads (or compiles, where an entry is missing).
"""

import functools
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .layout import is_bfloat16, lse_pack_dim
from .kernels._rows import WARP, lanes_per_row

__all__ = ["a2a_tasks", "agrs_tasks", "build_shared", "direct_paths", "direct_residency",
           "direct_tasks", "run_tasks", "share_compiles"]

PATHS = ("tiles", "words", "lines")  # the order of a direct plan's residency list


def a2a_tasks(dtype, head_dim, world_size=0, standalone=False, max_tokens=0, local_heads=0):
    """The pack and combine kernels of a :class:`DcpA2APlan` of ``world_size`` ranks
    (0: the combine for any N); with ``standalone``, also those that ``pack_send`` and
    ``unpack_combine`` launch outside a plan (the pack a block row per token and the
    combine a block a row, without a plan's trailer). Calls of ``max_tokens`` tokens
    or fewer: from ``_pack_tokens.STAGED_TOKENS_LEAST`` on, rows of words of one step
    also take the pack by tokens staged through shared memory (and, where
    ``_pack_tokens.may_load_quads``, its twin that reads them as quads); from
    ``_pack_tokens.BLOCK_TOKENS_LEAST`` on, where ``local_heads`` rows (0: any number)
    fit one warp, the pack by tokens of ``_pack_tokens.BLOCK_TOKENS`` tokens a block."""
    from .kernels.combine import combine_kernel, combine_variants, static_shards
    from .kernels import _pack_tokens
    from .kernels._pack_tokens import STAGED_TOKENS_LEAST, may_load_quads, tokens_kernel
    from .kernels.pack import pack_kernel, wide_rows

    dtype, D = np.dtype(dtype), int(head_dim)
    shards = static_shards(world_size) if world_size else 0
    bits = np.dtype(np.uint32 if dtype.itemsize == 4 else np.uint16)

    def combines(pairs, elements):
        variants = combine_variants(elements, shards, True)
        if standalone:
            variants += [v for v in combine_variants(elements, shards) if v not in variants]
        return [functools.partial(combine_kernel, dtype, pairs, *variant)
                for variant in variants]

    def pack(bits, elements):  # with a mask and without one; wide rows of words as
        # aligned quads (a plan's buffers are aligned, and so is any CuPy allocation),
        # and word by word for partials that are not (quad_rows: a 16-byte aligned
        # pointer, a unit-stride last axis); rows of one step also a block row per
        # token, signed in a plan (not outside)
        wide, group = wide_rows(elements), lanes_per_row(elements)
        stores = (True, False) if wide and np.dtype(bits).itemsize == 4 else (False,)
        tasks = [functools.partial(pack_kernel, np.dtype(bits), group, wide, masked, quads)
                 for quads in stores for masked in (True, False)]
        if not wide:  # (signed: the rows' blocks sign, or a lead plane of blocks does;
            # staged: reading rows of 4k words as quads where the partials are aligned)
            staged = [()]
            if np.dtype(bits).itemsize == 4 and max_tokens >= STAGED_TOKENS_LEAST:
                staged.append((True,))
                if may_load_quads(elements, group):
                    staged.append((True, True))
            tasks += [functools.partial(tokens_kernel, np.dtype(bits), group, masked, *signs,
                                        *stage)
                      for stage in staged for masked in (True, False)
                      for signs in (((True, False), (True, True), (False, False)) if standalone
                                    else ((True, False), (True, True)))]
            together = _pack_tokens.BLOCK_TOKENS  # several tokens a block: no lead plane
            if together > 1 and max_tokens >= _pack_tokens.BLOCK_TOKENS_LEAST and \
                    (not local_heads or _pack_tokens.fits_a_warp(local_heads, group)):
                full = [stage + (False,) * (2 - len(stage)) for stage in staged]
                tasks += [functools.partial(tokens_kernel, np.dtype(bits), group, masked,
                                            signed, False, *stage, together)
                          for stage in full for masked in (True, False)
                          for signed in ((True, False) if standalone else (True,))]
        return tasks

    if bits.itemsize == 2 and D % 2 == 0:  # words, and bfloat16 and float16 in pairs
        return pack(np.uint32, D // 2) + combines(True, D // 2)
    return pack(bits, D) + combines(False, D)


def agrs_tasks(dtype, num_heads, head_dim):
    """The kernels of a :class:`DcpAgRsPlan`."""
    from .kernels._vector import QUAD
    from .kernels.agrs import (agrs_shapes, correct_kernel, finish_kernel, flat_finish_kernel,
                               mask_kernel, vector_correct_kernel)

    shapes = agrs_shapes(int(head_dim))  # for few rows, and for many (they stream)
    return [functools.partial(correct_kernel, np.dtype(dtype), *shape)
            for shape in shapes["correct"]] + \
        [functools.partial(vector_correct_kernel, np.dtype(dtype), *shape)
         for shape in shapes["correct"] if int(head_dim) % QUAD == 0] + \
        [functools.partial(flat_finish_kernel, np.dtype(dtype))] + \
        [functools.partial(finish_kernel, np.dtype(dtype), *shape)
         for shape in shapes["finish"]] + \
        [functools.partial(mask_kernel, lanes_per_row(int(num_heads), 1))]


def direct_tasks(dtype, n, bits, head_dim, dependent, path):
    """The direct kernel of one ``path`` (one of :data:`PATHS`) that a plan launches, as
    a one-task list: the last of ``call_kernels`` (which lists every variant that
    ``direct_launch`` may pick for a call's arrays; a plan's allow words where
    16-bit data of an even head size can be)."""
    from .kernels.direct import Protocol, direct_kernel

    dtype, bits, D = np.dtype(dtype), np.dtype(bits), int(head_dim)
    push_bits, pairs, push_group, group = bits, False, lanes_per_row(D), lanes_per_row(D)
    if bits.itemsize == 2 and D % 2 == 0:  # 16-bit data as words, and bfloat16 in pairs
        push_bits, pairs, push_group = np.dtype(np.uint32), is_bfloat16(dtype), \
            lanes_per_row(D // 2)
        group = lanes_per_row(D // 2) if pairs else lanes_per_row(D)
    return [functools.partial(direct_kernel, dtype, n, push_bits, pairs, push_group, group,
                              bool(dependent), protocol=Protocol(path))]


def direct_paths(n, max_tokens, local_heads, width, itemsize, max_blocks, ll_max_blocks,
                 line_max_blocks, protocols=PATHS):
    """The paths that the calls of a direct plan take, of its ``protocols`` (names of
    :data:`PATHS`): those that :func:`region_grid <cupy_dcp.kernels.direct.region_grid>`
    picks for some call of 1 to ``max_tokens`` tokens, on the windows' regions
    for these sizes and on these blocks (the fewest that every rank holds;
    ``None``: not known yet, so that a path's kernels are counted in wherever
    its region takes a row)."""
    from .kernels.direct import line_rows, region_grid, window_layout

    words, lines = "words" in protocols, "lines" in protocols
    unknown = None in (ll_max_blocks, line_max_blocks)
    rows = line_rows(n, max_tokens, local_heads, width, itemsize, line_max_blocks or 1) \
        if lines and not unknown else 0
    layout = window_layout(n, max_tokens, local_heads, width, itemsize,
                           rows=None if words else 0, line_rows=rows)
    if unknown:
        found = set(PATHS)
        if not words or local_heads > layout.ll_shape[2]:
            found.discard("words")
        if not lines or not line_rows(n, max_tokens, local_heads, width, itemsize, 1):
            found.discard("lines")
        return found
    found = set()
    for tokens in range(1, int(max_tokens) + 1):
        found.add(region_grid(n, tokens * local_heads, layout.ll_shape, layout.line_shape,
                              max_blocks or 1, ll_max_blocks, line_max_blocks).protocol.value)
        if len(found) == len(PATHS):
            break
    return found


def direct_residency(comm, dtype, bits, head_dim, max_tokens, local_heads, dependent,
                     protocols, sharing):
    """Collective: build the direct kernels that the plan's calls can take and return
    the blocks of each path's kernel that fit at once, in :data:`PATHS` order; a path
    that no call takes gets the most of the others (it bounds nothing). ``protocols``:
    the plan's (agreed by every rank); ``sharing``: the ranks on this rank's GPU."""
    from .kernels.direct import LL_MAX_ROWS, WARPS

    n = comm.world_size
    width = int(head_dim) + lse_pack_dim(dtype)
    sizes = (n, int(max_tokens), int(local_heads), width, np.dtype(bits).itemsize)
    threads = WARP * WARPS

    built = {}  # path: its kernels

    def build(paths):  # collective: every rank builds the same paths
        tasks = [(p, t) for p in paths for t in direct_tasks(dtype, n, bits, head_dim,
                                                            dependent, p)]
        for (p, _), kernel in zip(tasks, build_shared(comm, [t for _, t in tasks])):
            built.setdefault(p, []).append(kernel)

    def resident(path):
        return min(k.resident_blocks(threads) for k in built[path])

    first = [p for p in ("words", "lines")
             if p in direct_paths(*sizes, None, None, None, protocols)]
    # these paths' kernels in one build, so that a cold one makes them all at once, shared
    # among the ranks; with them the tiles' where some call has more rows than the words
    # take (the tiles are then all but sure to be needed)
    build(first + (["tiles"] if not first or int(max_tokens) * int(local_heads) > LL_MAX_ROWS
                   else []))
    found = {p: resident(p) for p in first}
    # the blocks every rank can count on, as the plan reckons them: ranks that share a
    # GPU bound every kernel by the fewest of any (the kernels of no call's path aside)
    counted = {p: min(found.values()) if sharing > 1 else r for p, r in found.items()}
    caps = [max(1, counted.get(p, 0) // sharing) for p in ("words", "lines")]
    caps = [min(c) for c in zip(*_gather(comm, "building the direct plan", caps))]
    needed = direct_paths(*sizes, None, caps[0], caps[1], ("tiles",) + tuple(first))
    if "tiles" in needed or not found:
        if "tiles" not in built:  # every rank decides alike: the caps are everyone's
            build(["tiles"])
        found["tiles"] = resident("tiles")
    placeholder = max(found.values())
    return [found.get(p, placeholder) for p in PATHS]


_sharing = [True]


def share_compiles(enabled):
    """Whether :func:`build_shared` splits the first runs among a node's ranks (on by
    default; off, each rank runs every task itself: for measurements)."""
    _sharing[0] = bool(enabled)


def build_shared(comm, tasks):
    """Collective over ``comm`` (a :class:`~cupy_dcp.comm.Communicator`, whose
    exchanges are bounded by its timeout; an mpi4py communicator; ``None``: this
    process alone): run every task and return their results in order, the node's
    ranks sharing the first run of each.

    Rank ``i`` of the node's ``k`` (the ranks of one processor name) runs tasks
    ``i, i + k, ...`` first (what it compiles lands in the kernel cache); after
    every rank of ``comm`` has (one exchange, which also carries failures: a task
    that raised on any rank raises ``RuntimeError`` on every rank), each runs all
    of them, loading the others' from the cache, and a last exchange does the
    same for that round. A rank whose cache is off takes part in the same rounds
    (the ranks' settings may differ, and a rank that skipped an exchange would
    leave the others waiting), compiling what it finds nowhere. A rank runs its
    tasks through :func:`run_tasks` (one links while the next compiles).
    """
    tasks = list(tasks)
    if comm is None or _size(comm) == 1 or not _sharing[0]:
        return run_tasks(tasks)
    from mpi4py import MPI

    names = _gather(comm, "building kernels", MPI.Get_processor_name())
    me = _rank(comm)
    node = [r for r, name in enumerate(names) if name == names[me]]
    _together(comm, lambda: run_tasks(tasks[node.index(me)::len(node)]))
    return _together(comm, lambda: run_tasks(tasks))


def _together(comm, run):
    """``run()`` on every rank, then one exchange: where it raised on any rank,
    ``RuntimeError`` on every rank, naming the lowest such rank."""
    error, result = None, None
    try:
        result = run()
    except Exception as exc:  # the others must not wait for this rank
        error = f"{type(exc).__name__}: {exc}"
    failed = [(rank, e) for rank, e in enumerate(_gather(comm, "building kernels", error)) if e]
    if failed:
        rank, detail = failed[0]
        raise RuntimeError(f"rank {rank} failed to compile a kernel: {detail}")
    return result


def _bounded(comm):
    """Whether ``comm`` is a :class:`~cupy_dcp.comm.Communicator` (not an mpi4py one)."""
    return hasattr(comm, "allgather_object")


def _gather(comm, what, value):
    """Every rank's ``value``, in rank order: through :meth:`Communicator.allgather_object`
    (bounded by its timeout; ``what`` names the step in its errors) where ``comm`` is
    one, else MPI's ``allgather``."""
    return comm.allgather_object(what, value) if _bounded(comm) else comm.allgather(value)


def _size(comm):
    return comm.world_size if _bounded(comm) else comm.Get_size()


def _rank(comm):
    return comm.rank if _bounded(comm) else comm.Get_rank()


def run_tasks(tasks):
    """Run ``tasks`` and return their results in order. Several run on two threads:
    each starts once the one before it has finished or begun to link its cubin (the
    CUDA driver's work, which leaves Python to the other thread), so that one kernel
    links while the next compiles; nothing else of two tasks overlaps. The threads
    work in the caller's CUDA context. The first task that raised raises here,
    after every task has run."""
    from .kernels import _cache

    tasks = list(tasks)
    if len(tasks) < 2:
        return [task() for task in tasks]
    context = _cuda_context()
    free = [threading.Event() for _ in tasks]  # the next task may start

    def run(i):
        if i:
            free[i - 1].wait()
        try:
            if context is not None:
                context[0].cuCtxSetCurrent(context[1])
            with _cache.on_link(free[i].set):
                return tasks[i]()
        finally:
            free[i].set()

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(run, i) for i in range(len(tasks))]
    return [future.result() for future in futures]


def _cuda_context():
    """``(cuda.bindings.driver, context)`` of this thread's current CUDA context, or
    ``None`` (no driver, none current)."""
    try:
        from cuda.bindings import driver

        err, context = driver.cuCtxGetCurrent()
    except Exception:  # no CUDA bindings, or no driver: the tasks need no context
        return None
    return (driver, context) if not err and int(context) else None
