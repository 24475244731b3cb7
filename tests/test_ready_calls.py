"""A plan's ready calls (pure host logic, no GPU): the key a call's launches are kept
by, and how launches and exchanges become steps of a call."""

import numpy as np
import pytest

from _helpers import device_array
from cupy_dcp.kernels._launch import SpecializedKernel
from cupy_dcp.layout import c_strides
from cupy_dcp import plan
from cupy_dcp.plan import _ready_key, _ready_steps


arr = device_array


def call(**change):
    args = dict(x=arr((2, 4, 8)), lse=arr((2, 4), np.float32, 2 << 20),
                seq=arr((1,), np.int64, 3 << 20), qsl=arr((2,), np.int64, 4 << 20), count=1,
                out=arr((2, 2, 8), ptr=5 << 20), out_lse=arr((2, 2), np.float32, 6 << 20))
    args.update(change)
    return _ready_key(args["x"], args["lse"], (args["seq"], args["qsl"], args["count"]),
                      args["out"], args["out_lse"])


def test_the_key_changes_with_anything_a_launch_reads():
    base = call()
    assert call() == base  # the same arrays again: the ready launches serve
    head_major = arr((2, 2, 8), ptr=5 << 20, strides=(16, 32, 2))  # [H/N, B, D] storage
    changed = [call(x=arr((2, 4, 8), ptr=7 << 20)), call(x=arr((1, 4, 8))),
               call(x=arr((2, 4, 8), strides=(128, 16, 2))),
               call(lse=arr((2, 4), np.float32, 8 << 20)), call(seq=arr((1,), np.int64, 9 << 20)),
               call(qsl=arr((2,), np.int64, 10 << 20)), call(count=-1), call(out=head_major),
               call(out=arr((2, 2, 8), ptr=11 << 20)), call(out_lse=None),
               call(out_lse=arr((2, 2), np.float32, 6 << 20, strides=(4, 8)))]
    assert len({base, *changed}) == len(changed) + 1


class _Kernel:
    def __init__(self, ready):
        self.ready, self.calls = ready, []

    def prepare(self, grid, block, args):
        if not self.ready:
            return None
        return lambda ptr: self.calls.append(("ready", ptr, args))

    def __call__(self, grid, block, ptr, args):
        self.calls.append(("now", ptr, args))


def test_steps_run_in_order_and_are_kept_only_without_the_callers_arrays():
    order = []
    first, last = _Kernel(True), _Kernel(True)
    steps, keep = _ready_steps((first, (1,), (32,), ("a",)), lambda ptr: order.append(ptr),
                               (last, (1,), (32,), ("b",)))
    assert keep
    for step in steps:
        step(7)
    assert first.calls == [("ready", 7, ("a",))] and order == [7]
    assert last.calls == [("ready", 7, ("b",))]
    numba_launched = _Kernel(False)  # Numba's launcher: its arguments hold the arrays
    steps, keep = _ready_steps((first, (1,), (32,), ("a",)), (numba_launched, (1,), (32,), ("c",)))
    assert not keep
    for step in steps:
        step(9)
    assert numba_launched.calls == [("now", 9, ("c",))]


def test_numba_launcher_prepares_nothing():
    kernel = SpecializedKernel(None, (), launcher="numba")
    assert kernel.prepare((1,), (32,), ()) is None


class _FakeCupyArray:
    """What a remembered call's key reads of a CuPy array."""

    class _Memory:
        def __init__(self, ptr):
            self.ptr = ptr

    def __init__(self, shape, dtype=np.uint16, ptr=1 << 20, strides=None):
        self.dtype = np.dtype(dtype)
        self.shape = shape
        self.strides = strides or c_strides(shape, self.dtype.itemsize)
        self.data = self._Memory(ptr)


def test_a_remembered_call_is_keyed_by_every_array_it_was_checked_with(monkeypatch):
    fake_cupy = type("FakeCupy", (), {"ndarray": _FakeCupyArray})
    monkeypatch.setattr(plan, "_cupy", lambda: fake_cupy)
    a = _FakeCupyArray

    def key(**change):
        args = dict(x=a((2, 4, 8)), lse=a((2, 4), np.float32, 2 << 20), out=None,
                    out_lse=None, seq=None, qsl=None)
        args.update(change)
        return plan._repeat_key(*args.values())

    base = key()
    assert key() == base and base is not None  # equal arrays, other objects: one call
    changed = [key(x=a((2, 4, 8), ptr=7 << 20)), key(x=a((1, 4, 8))),
               key(x=a((2, 4, 8), strides=(128, 16, 2))), key(x=a((2, 4, 8), np.float16)),
               key(lse=a((2, 4), np.float16, 2 << 20)), key(lse=a((2, 4), np.float32, 9 << 20)),
               key(out=a((2, 2, 8), ptr=5 << 20)), key(out_lse=a((2, 2), np.float32, 6 << 20)),
               key(seq=a((1,), np.int64, 3 << 20), qsl=a((2,), np.int64, 4 << 20)),
               key(seq=a((1,), np.int64, 3 << 20), qsl=a((2,), np.int32, 4 << 20))]
    assert len({base, *changed}) == len(changed) + 1
    # another kind of array (a Numba array, a DLPack capsule's owner): never remembered
    assert key(x=np.zeros((2, 4, 8), np.uint16)) is None
    assert key(out=np.zeros((2, 2, 8), np.uint16)) is None


def test_an_extent_reaches_from_the_lowest_element_to_past_the_highest():
    assert arr((2, 4, 8)).extent() == (1 << 20, (1 << 20) + 2 * 4 * 8 * 2)
    head_major = arr((2, 2, 8), strides=(16, 32, 2))  # [H/N, B, D] storage
    assert head_major.extent() == (1 << 20, (1 << 20) + 64)
    flipped = arr((3, 4), np.float32, ptr=1000, strides=(-16, 4))  # rows in reverse
    assert flipped.extent() == (1000 - 32, 1000 + 16)
    assert arr((0, 4)).extent() == (1 << 20, 1 << 20)  # empty: no bytes


def test_results_that_cross_an_input_are_refused_by_name():
    from cupy_dcp._checks import check_apart

    x = arr((4, 8, 16))  # 1024 bytes from 1 MiB
    lse = arr((4, 8), np.float32, 2 << 20)
    why = "the kernel writes while it reads"
    check_apart(dict(out=arr((4, 4, 16), ptr=3 << 20), out_lse=None),
                dict(cp_attn_out=x, cp_attn_lse=lse), why)  # apart: nothing raised
    check_apart(dict(out=arr((4, 4, 16), ptr=(1 << 20) + 1024)), dict(cp_attn_out=x), why)
    crossing = [(dict(out=arr((4, 4, 16), ptr=(1 << 20) + 512)), "out", "cp_attn_out"),
                (dict(out=arr((4, 4, 16), ptr=(1 << 20) - 511)), "out", "cp_attn_out"),
                (dict(out=None, out_lse=arr((4, 4), np.float32, (2 << 20) + 124)), "out_lse",
                 "cp_attn_lse"),
                (dict(out=arr((4, 4, 16), strides=(256, 32, 2))), "out", "cp_attn_out")]
    for written, out_name, in_name in crossing:
        with pytest.raises(ValueError, match=f"{out_name} shares memory with {in_name}.*"
                                             f"{why}"):
            check_apart(written, dict(cp_attn_out=x, cp_attn_lse=lse), why)
    # an empty result writes nothing, so it crosses nothing
    check_apart(dict(out=arr((0, 4, 16))), dict(cp_attn_out=x), why)


def test_interleaved_results_apart_from_the_inputs_pass():
    """Extents that cross with no byte in common (the partials and the result side by
    side in each token's row of one buffer, or every other element) are apart; a
    result on a byte of the partials is not."""
    from cupy_dcp._checks import check_apart

    # one [B, H + H/N, D] buffer: the partials its first H heads, the result the rest
    row = (8 + 4) * 16 * 2
    x = arr((4, 8, 16), strides=(row, 32, 2))
    out = arr((4, 4, 16), ptr=(1 << 20) + 8 * 32, strides=(row, 32, 2))
    check_apart(dict(out=out), dict(cp_attn_out=x), "why")
    evens = arr((4, 8, 8), strides=(512, 64, 4))  # every other element of [4, 8, 16]
    odds = arr((4, 8, 8), ptr=(1 << 20) + 2, strides=(512, 64, 4))
    check_apart(dict(out=odds), dict(cp_attn_out=evens), "why")
    one_byte_in = arr((4, 4, 16), ptr=(1 << 20) + 8 * 32 - 1, strides=(row, 32, 2))
    with pytest.raises(ValueError, match="out shares memory with cp_attn_out"):
        check_apart(dict(out=one_byte_in), dict(cp_attn_out=x), "why")
    with pytest.raises(ValueError, match="out shares memory with cp_attn_out"):
        check_apart(dict(out=evens), dict(cp_attn_out=evens), "why")
