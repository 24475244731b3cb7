"""The simulator suite's split: a quick check of each kernel, and the rest marked ``slow``.

``QUICK`` names one test of each kernel (pack, combine, the AG+RS kernels, the
direct kernel on all three of its paths, a direct call whose peer never comes,
the bfloat16 pair rounding): ``tests/test_simulator.py`` runs them in the
default test run, and every other test here (the fuzzing included) under the
``slow`` marker, which CI runs too. Every test runs in exactly one of the two.

``CUPY_DCP_SIM_SHARD=i/n`` keeps every n-th selected test from the i-th (0-based), so
that n processes, one a core, share a run: the simulator runs a kernel's threads in
one process under one interpreter lock, so a process uses a core at most.
"""

import os

import pytest

SHARD_VARIABLE = "CUPY_DCP_SIM_SHARD"

QUICK = frozenset({
    "test_kernels_sim.py::test_pack_bit_exact[N2B2H4D3-bfloat16]",
    "test_kernels_sim.py::test_zero_tokens_is_a_no_op",
    "test_kernels_sim.py::test_combine_matches_reference[base_e-N2B2H4D3-bfloat16]",
    "test_kernels_sim.py::test_agrs_kernels_match_reference[few_rows-base_e-N2B2Hn2D8-bfloat16]",
    "test_kernels_sim.py::test_mask_kernel_copies_the_lse_with_empty_tokens_at_minus_inf",
    "test_kernels_sim.py::test_direct_in_lines[N2D3-bfloat16]",
    "test_kernels_sim.py::test_direct_missing_peer[blocks_push_and_combine-float32]",
    "test_kernels_sim.py::test_pack_bf16x2_rounds_as_the_integer_path",
})


def parse_shard(spec):
    """``(i, n)`` of a shard's ``"i/n"``; ``ValueError`` unless ``0 <= i < n``."""
    try:
        index, count = (int(v) for v in spec.split("/"))
    except ValueError:
        raise ValueError(f"{SHARD_VARIABLE} must be i/n, e.g. 0/2 (got {spec!r})") from None
    if not 0 <= index < count:
        raise ValueError(f"{SHARD_VARIABLE} needs 0 <= i < n (got {spec!r})")
    return index, count


def in_shard(items, index, count):
    """The items of shard ``index`` of ``count``: every ``count``-th from ``index``, so
    that tests of one kind, which sit together, spread over the shards."""
    return items[index::count]


def _name(item):
    return f"{item.path.name}::{item.name}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    names = {_name(item) for item in items}
    files = {item.path.name for item in items}
    whole_files = all("::" not in str(arg) for arg in config.args)
    missing = sorted(q for q in QUICK - names if q.split("::")[0] in files)
    if whole_files and missing:  # a renamed test would silently leave the quick run
        raise pytest.UsageError(f"QUICK names tests that were not collected: {missing}")
    for item in items:
        if _name(item) not in QUICK:
            item.add_marker(pytest.mark.slow)


class _Shard:
    """Keeps shard ``index`` of ``count`` of the tests that the markers selected."""

    def __init__(self, index, count):
        self.index, self.count = index, count

    @pytest.hookimpl(trylast=True)  # after ``-m`` has deselected its tests
    def pytest_collection_modifyitems(self, config, items):
        kept = in_shard(items, self.index, self.count)
        keep = set(map(id, kept))
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in keep])
        items[:] = kept


def pytest_configure(config):
    spec = os.environ.get(SHARD_VARIABLE)
    if spec:
        try:
            config.pluginmanager.register(_Shard(*parse_shard(spec)), "cudasim_shard")
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
