"""What a plan compiles (``cupy_dcp._compile``): the direct plan's paths, and the
node's ranks sharing a cold compile."""

import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from _helpers import job_results, mpiexec_env

from cupy_dcp._compile import PATHS, a2a_tasks, build_shared, direct_paths, run_tasks
from cupy_dcp.kernels.direct import line_rows, region_grid, window_layout
from cupy_dcp.layout import as_dtype

HERE = Path(__file__).resolve().parent
BF16 = as_dtype("bfloat16")
WIDTH = 512 + 2  # D = 512 and the LSE's two 16-bit lanes


def paths_taken(n, max_tokens, hn, width, itemsize, ll_blocks, line_blocks, protocols):
    """The paths of every call of 1..max_tokens tokens, one by one (the plan's layout)."""
    rows = line_rows(n, max_tokens, hn, width, itemsize, line_blocks) \
        if "lines" in protocols else 0
    layout = window_layout(n, max_tokens, hn, width, itemsize,
                           rows=None if "words" in protocols else 0, line_rows=rows)
    taken = set()
    for tokens in range(1, max_tokens + 1):
        taken.add(region_grid(n, tokens * hn, layout.ll_shape, layout.line_shape, 7, ll_blocks,
                              line_blocks).protocol.value)
    return taken


def test_a_small_plan_needs_no_tiles():
    assert direct_paths(2, 4, 64, WIDTH, 2, None, 132, 132) == {"words"}
    assert direct_paths(2, 8, 64, WIDTH, 2, None, 132, 132) == {"words", "lines"}
    assert direct_paths(2, 8, 64, WIDTH, 2, None, 132, 132, ("tiles", "words")) == \
        {"words", "tiles"}
    assert direct_paths(2, 8, 64, WIDTH, 2, None, 132, 132, ("tiles", "lines")) == \
        {"lines"}  # without words, lines take every call


def test_a_large_plan_or_few_blocks_needs_tiles():
    assert direct_paths(2, 64, 64, WIDTH, 2, None, 132, 132) == set(PATHS)
    # two blocks: even one token's 64 rows make tiles of 32, past words' and lines' most
    assert direct_paths(2, 8, 64, WIDTH, 2, None, 2, 2) == {"tiles"}


def test_paths_match_every_call():
    for n, max_tokens, hn, blocks in ((2, 16, 64, 132), (4, 40, 8, 20), (8, 3, 128, 66),
                                      (3, 100, 1, 5)):
        for protocols in (PATHS, ("tiles", "words"), ("tiles", "lines"), ("tiles",)):
            want = paths_taken(n, max_tokens, hn, WIDTH, 2, blocks, blocks, protocols)
            assert direct_paths(n, max_tokens, hn, WIDTH, 2, None, blocks, blocks,
                                protocols) == want, (n, max_tokens, hn, blocks, protocols)


def test_unknown_blocks_count_every_reachable_path():
    assert direct_paths(2, 64, 64, WIDTH, 2, None, None, None) == set(PATHS)
    assert direct_paths(2, 64, 64, WIDTH, 2, None, None, None, ("tiles", "words")) == \
        {"words", "tiles"}
    assert direct_paths(2, 64, 64, WIDTH, 2, None, None, None, ("tiles", "lines")) == \
        {"lines", "tiles"}
    assert "words" not in direct_paths(2, 4, 300, WIDTH, 2, None, None, None)  # 300 rows > 256


def test_a2a_variants(monkeypatch):
    from cupy_dcp.kernels import _pack_tokens
    from cupy_dcp.kernels._pack_tokens import STAGED_TOKENS_LEAST, tokens_kernel
    from cupy_dcp.kernels.combine import combine_kernel

    monkeypatch.setattr(_pack_tokens, "BLOCK_TOKENS", 1)  # (set below where it counts)
    # the pack with a mask and without one, and one combine: 16-bit data of an even D by
    # words and combined in pairs (the plan stages arrays that cannot be seen so), else by
    # values; rows of one step (bf16 and fp16 at D = 512: 256 words) also the pack a block
    # row per token, signed two ways, with a mask and without
    assert len(a2a_tasks(BF16, 512)) == 7
    assert len(a2a_tasks(np.dtype(np.float16), 512)) == 7
    assert len(a2a_tasks(np.dtype(np.float16), 511)) == 3  # an odd D: by 16 bits, wide
    assert len(a2a_tasks(np.dtype(np.float32), 512)) == 5  # wide rows: as quads and not
    # N from 2 to 32: the combine for its N, one for each number of values a lane that
    # it can move (combine_unroll: N = 2: 8, 4, 2; N = 8: 4, 2), and where a row fits
    # a block's step (at most 32 loads a thread) the signed one with a block a row
    assert len(a2a_tasks(BF16, 512, 2)) == 10
    assert len(a2a_tasks(np.dtype(np.float32), 512, 8)) == 7  # 4 values a thread, 8 shards
    assert len(a2a_tasks(np.dtype(np.float32), 1024, 8)) == 6  # 8 a thread: no block a row
    tasks = a2a_tasks(BF16, 512, 2)
    tokens = [c.args for c in tasks if c.func is tokens_kernel]
    assert tokens == [(np.uint32, 32, masked, True, lead) for masked in (True, False)
                      for lead in (False, True)]  # signed by rows' blocks or a lead plane
    alone = [c.args for c in a2a_tasks(BF16, 512, 2, standalone=True) if c.func is tokens_kernel]
    assert sorted(alone) == sorted(tokens + [(np.uint32, 32, True, False, False),
                                             (np.uint32, 32, False, False, False)])
    # calls of STAGED_TOKENS_LEAST tokens or more: the same packs by tokens staged too
    least = STAGED_TOKENS_LEAST
    staged = [c.args for c in a2a_tasks(BF16, 512, 2, max_tokens=least) if c.func is tokens_kernel]
    assert staged == tokens + [args + (True,) for args in tokens]
    # rows of 4k words in groups of at most QUAD_LOADS_GROUP_MOST lanes (64 words: 8):
    # staged reading quads too, for partials aligned for it
    for most in (8, 4):
        monkeypatch.setattr(_pack_tokens, "QUAD_LOADS_GROUP_MOST", most)
        short = [c.args for c in a2a_tasks(BF16, 128, 2, max_tokens=least)
                 if c.func is tokens_kernel]
        plain = [args for args in short if len(args) == 5]
        assert plain and plain[0][1] == 8  # lanes a row
        assert short == plain + [args + (True,) for args in plain] + \
            ([args + (True, True) for args in plain] if most == 8 else [])
    # 34 words, not quads: staged alone
    assert [c.args for c in a2a_tasks(BF16, 68, 2, max_tokens=least) if
            c.func is tokens_kernel and len(c.args) == 7] == []
    assert not [c for c in a2a_tasks(BF16, 512, 2, max_tokens=least - 1) if len(c.args) == 6 and
                c.func is tokens_kernel]
    assert len(a2a_tasks(np.dtype(np.float16), 511, max_tokens=4096)) == 3  # 16-bit: none
    # several tokens a block (none while BLOCK_TOKENS is 1): the packs by tokens of a
    # plan, signed by the rows' blocks (no lead plane), where a token's rows fit a warp
    monkeypatch.setattr(_pack_tokens, "QUAD_LOADS_GROUP_MOST", 8)
    for together in (1, 2, 4):
        monkeypatch.setattr(_pack_tokens, "BLOCK_TOKENS", together)
        first = _pack_tokens.BLOCK_TOKENS_LEAST
        for heads, calls, alone, built in ((4, first, False, together > 1),
                                           (0, first, False, together > 1),
                                           (5, first, False, False),  # 5 rows of 8 lanes
                                           (4, first - 1, False, False),
                                           (4, first, True, together > 1)):
            found = [c.args for c in a2a_tasks(BF16, 128, 8, alone, calls, heads)
                     if c.func is tokens_kernel and len(c.args) == 8]
            signs = (True, False) if alone else (True,)
            staged = ((False, False), (True, False), (True, True)) if calls >= least else \
                ((False, False),)
            assert found == ([(np.uint32, 8, masked, signed, False, *stage, together)
                              for stage in staged for masked in (True, False)
                              for signed in signs] if built else []), (together, heads, calls)
    tasks = [c for c in tasks if c.func is not tokens_kernel]
    sliced = [c for c in tasks[2:] if len(c.args) == 5 or not c.args[5]]  # not a block a row
    assert sorted(c.args[4] for c in sliced) == [2, 4, 8]
    # 256 words fill every slice of each (combine.whole_slices): no test against a row's end
    assert all(c.args[5:] == (False, False, True) for c in sliced)
    blocks = [c.args[2:] for c in tasks[2:] if len(c.args) > 5 and c.args[5]]
    assert blocks == [(128, 2, 2, True, True)]  # 256 words: 2 a thread; signed, as plans call
    assert len(a2a_tasks(BF16, 512, 16)) == 9  # N = 16: 4 and 2 a lane, 2 a thread of a block
    # N = 17 to 32: 2 a lane only (STREAM_LOADS: 4 a lane would not stream faster) and
    # no block a row at 256 words; past 32: the combine for any N
    combines = {n: [c.args[3:5] for c in a2a_tasks(BF16, 512, n) if c.func is combine_kernel]
                for n in (17, 32, 33)}
    assert combines == {17: [(17, 2)], 32: [(32, 2)], 33: [(0, 8)]}
    masked, unmasked, *combines = tasks  # functools.partial: their arguments
    assert masked.args[3] and not unmasked.args[3]
    assert masked.args[0] == unmasked.args[0] == np.uint32 and all(c.args[1] for c in combines)
    assert not masked.args[4] and not unmasked.args[4]  # rows of one step: word by word
    for wide in (a2a_tasks(np.dtype(np.float32), 512, 2), a2a_tasks(BF16, 1152, 2)):
        # wide rows of words: as aligned quads, and word by word (unaligned partials)
        packs = [c.args for c in wide[:4]]
        assert packs == [(np.uint32, 32, True, masked, quads) for quads in (True, False)
                         for masked in (True, False)]
    masked, unmasked, *combines = a2a_tasks(BF16, 511, 2)
    assert masked.args[0] == unmasked.args[0] == np.uint16
    assert not masked.args[4] and not unmasked.args[4]  # 16-bit values: one at a time
    assert not any(c.args[1] for c in combines)


@pytest.mark.parametrize("bits, group, wide", [(np.uint16, 32, True), (np.uint32, 8, False)])
def test_the_quads_pack_is_built_for_wide_rows_of_words_only(bits, group, wide):
    from cupy_dcp.kernels.pack import pack_kernel

    with pytest.raises(ValueError, match="wide rows of uint32 words"):
        pack_kernel(bits, group, wide, True, True)


CALL_KERNELS = """
from cupy_dcp.kernels._launch import choose_launcher
choose_launcher("numba")  # building a wrapper compiles nothing
import numpy as np
from cupy_dcp._compile import PATHS, direct_tasks
from cupy_dcp.kernels.direct import Protocol, call_kernels
from cupy_dcp.layout import as_dtype
checked = 0
for dtype, bits, d in (("bfloat16", np.uint16, 512), ("float16", np.uint16, 72),
                       ("float16", np.uint16, 33), ("float32", np.uint32, 300)):
    for n in (2, 3):
        for path in PATHS:
            for dependent in (False, True):
                # the plan's arrays are seen as words where they can be: the last variant
                want = call_kernels(as_dtype(dtype), n, np.dtype(bits), d, dependent,
                                    Protocol(path))[-1:]
                got = [task() for task in direct_tasks(as_dtype(dtype), n, bits, d, dependent,
                                                       path)]
                assert [(k._dispatcher, k.argtypes, k.dependent) for k in got] == \
                    [(k._dispatcher, k.argtypes, k.dependent) for k in want], \
                    (dtype, d, n, path, dependent)
                checked += 1
print("checked", checked)
"""


def test_direct_tasks_are_call_kernels_one_by_one():
    proc = subprocess.run([sys.executable, "-c", CALL_KERNELS], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["checked", "48"]


PACK_KERNELS = """
from cupy_dcp.kernels._launch import DeviceArray, choose_launcher
choose_launcher("numba")  # building a wrapper compiles nothing
import numpy as np
from cupy_dcp._compile import a2a_tasks
from cupy_dcp.kernels._format import send_buffer_shape
from cupy_dcp.kernels._trailer import trailer_rows
from cupy_dcp.kernels.pack import pack_launch
from cupy_dcp.layout import as_dtype

def array(ptr, shape, dtype, strides=None, pad=0):
    dtype = np.dtype(dtype)
    if strides is None:
        strides, step = [], dtype.itemsize
        for extent in reversed(shape):
            strides.insert(0, step)
            step *= extent
        strides[-1] *= 1 + pad  # pad: a last axis of every (1 + pad)-th value
    return DeviceArray(ptr, shape, strides, dtype, None)

index = array(1 << 20, (1,), np.int64)
checked = 0
for name, d in (("float32", 512), ("float32", 1024), ("bfloat16", 1152), ("bfloat16", 512),
                ("float16", 64)):
    dtype = as_dtype(name)
    bits = np.dtype(np.uint32 if dtype.itemsize == 4 else np.uint16)
    built = {(k._dispatcher, k.argtypes) for k in (t() for t in a2a_tasks(dtype, d, 2))}
    n, b, h = 2, 8, 16
    shape = send_buffer_shape(n, b, h, d, dtype)
    rows = trailer_rows(shape[2], shape[3], dtype.itemsize)
    shape = (n, b + rows) + tuple(shape[2:])
    # the partials a plan passes to its pack (16-bit ones are seen as words, else staged):
    # aligned; 4 bytes past an alignment; every other value of a wider array (float32)
    layouts = [(1 << 30, 0), ((1 << 30) + 4, 0)] + ([(1 << 30, 1)] if bits.itemsize == 4 else [])
    for ptr, pad in layouts:
        data = array(ptr, (b, h, d), bits, pad=pad)
        for masked in (-1, 3):
            send = array(1 << 32, shape, bits)
            recv = array(1 << 34, shape, bits)
            kernel = pack_launch(data, array(1 << 36, (b, h), np.uint32), index, index, masked,
                                 send, recv, 0, signed=(index, index))[0]
            assert (kernel._dispatcher, kernel.argtypes) in built, (name, d, ptr, pad, masked)
            checked += 1
print("checked", checked)
"""


def test_a2a_tasks_hold_every_pack_a_plan_launches():
    """A plan compiles at its start the pack that any of its calls launches: the wide
    rows' pack as aligned quads and word by word (partials not 16-byte aligned)."""
    proc = subprocess.run([sys.executable, "-c", PACK_KERNELS], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["checked", "24"]


def test_build_shared_alone_runs_every_task_once():
    runs = []
    assert build_shared(None, [lambda i=i: runs.append(i) or i for i in range(3)]) == [0, 1, 2]
    assert runs == [0, 1, 2]


def test_run_tasks_lets_the_next_build_start_only_at_a_link():
    """Tasks start in order; the next starts once the one before it begins to link its
    cubin (``_cache._linking``, as a cold build does), while that link runs."""
    from cupy_dcp.kernels import _cache

    events, lock = [], threading.Lock()

    def note(kind, i):
        with lock:
            events.append((kind, i))

    def task(i):
        def run():
            note("start", i)
            time.sleep(0.05)  # compiling
            note("link", i)
            _cache._linking()
            time.sleep(0.3)  # linking: the next task compiles meanwhile
            note("end", i)
            return i * i
        return run

    assert run_tasks([task(i) for i in range(3)]) == [0, 1, 4]
    assert [i for kind, i in events if kind == "start"] == [0, 1, 2]
    at = events.index
    assert at(("link", 0)) < at(("start", 1)) < at(("end", 0))
    assert at(("link", 1)) < at(("start", 2))


def test_run_tasks_raises_the_first_failure_after_every_task_ran():
    runs = []

    def task(i):
        def run():
            runs.append(i)
            if i in (1, 2):
                raise ValueError(f"task {i}")
            return i
        return run

    with pytest.raises(ValueError, match="task 1"):
        run_tasks([task(i) for i in range(4)])
    assert runs == [0, 1, 2, 3]


@pytest.mark.parametrize("mode", ["plain", "mixed", "bounded"])
def test_ranks_share_the_first_run(tmp_path, mpiexec, mode):
    """Over an mpi4py communicator; with one rank's cache off; over a Communicator,
    whose exchanges end in RuntimeError within its timeout when a rank is missing."""
    proc = subprocess.run(mpiexec(3) + [sys.executable, str(HERE / "build_shared_worker.py"),
                                        mode],
                          env=mpiexec_env(CUPY_DCP_CACHE_DIR=str(tmp_path)),
                          capture_output=True, text=True, timeout=300)
    records = job_results(proc, 3)
    assert all(record["tasks"] == 7 for record in records), proc.stdout  # 2 * 3 + 1
    if mode == "bounded":
        assert all(r["waited"] < 4.5 for r in records if "waited" in r), records
