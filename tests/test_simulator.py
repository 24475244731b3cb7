"""Runs the CUDA-kernel suite under the Numba CUDA simulator, in its own process.

The simulator replaces ``numba.cuda`` when NUMBA_ENABLE_CUDASIM=1 is set before
Numba is imported, so it cannot share a process with the rest of the suite. The
default run checks each kernel once (``tests/cudasim/conftest.py``'s ``QUICK``);
the rest of the suite, fuzzing included, runs under the ``slow`` marker, in one process
a core (the simulator's threads share one interpreter lock, so a process uses a core).
"""

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


# A bound against a hang, not a benchmark: the slow part took 40-45 minutes in one process
# on a 2-core machine, where one of its tests once stalled for over half an hour; CI's
# whole slow phase took 17 minutes with a process a core.
SIMULATOR_TIMEOUT = 3000  # seconds, for the whole run however many processes share it


def _cores():
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _simulator_pytest(*args, shard=None):
    """``(command, environment)`` of a pytest run of ``tests/cudasim`` with ``args``, under
    the simulator, as shard ``shard`` (``"i/n"``) or whole."""
    variable = _split().SHARD_VARIABLE
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env.pop(variable, None)
    if shard is not None:
        env[variable] = shard
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args,
               str(HERE / "cudasim")]
    return command, env


def _simulator_suite(marker, shards=1):
    """The simulator suite's tests of ``marker`` (a ``-m`` expression), in ``shards``
    processes of their own at once (``CUPY_DCP_SIM_SHARD``: each runs every
    ``shards``-th test): their outputs, once every one of them has passed."""
    deadline = time.monotonic() + SIMULATOR_TIMEOUT
    runs = []
    for index in range(shards):
        command, env = _simulator_pytest("-m", marker,
                                         shard=f"{index}/{shards}" if shards > 1 else None)
        log = tempfile.TemporaryFile(mode="w+")
        proc = subprocess.Popen(command, cwd=HERE, env=env, stdout=log,
                                stderr=subprocess.STDOUT, text=True)
        runs.append((proc, log))
    outs = []
    try:
        for proc, log in runs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            log.seek(0)
            out = log.read()
            tail = out[-4000:]
            assert proc.returncode == 0, tail
            assert " passed" in out and " failed" not in out, tail
            outs.append(out)
    finally:
        for proc, log in runs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    return outs


def _split():
    """``tests/cudasim/conftest.py`` (that module imports nothing of Numba)."""
    spec = importlib.util.spec_from_file_location("cudasim_split", HERE / "cudasim" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _quick():
    """``tests/cudasim/conftest.py``'s ``QUICK``."""
    return _split().QUICK


def _count(pattern, out):
    found = re.findall(rf"(\d+) {pattern}", out.splitlines()[-1] if out.strip() else "")
    return int(found[-1]) if found else 0


def test_shards_split_the_tests_exactly_once():
    split = _split()
    items = [f"t{k}" for k in range(11)]
    for count in range(1, 6):
        shards = [split.in_shard(items, index, count) for index in range(count)]
        assert sorted(sum(shards, []), key=items.index) == items  # each test once
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
    assert split.parse_shard("1/3") == (1, 3)
    for bad in ("3/3", "-1/2", "1", "a/b", "0/0"):
        with pytest.raises(ValueError, match="CUPY_DCP_SIM_SHARD"):
            split.parse_shard(bad)


def test_each_kernel_once_under_the_simulator():
    (out,) = _simulator_suite("not slow")
    assert f"\n{len(_quick())} passed, " in out, out[-4000:]


@pytest.mark.slow
def test_every_kernel_check_under_the_simulator():
    shards = max(1, min(_cores(), 4))
    outs = _simulator_suite("slow", shards)
    command, env = _simulator_pytest("--collect-only", "-m", "slow")
    listed = subprocess.run(command, cwd=HERE, env=env, capture_output=True, text=True,
                            timeout=600)
    selected = re.search(r"(\d+)/\d+ tests collected", listed.stdout)
    assert selected, listed.stdout[-2000:]
    ran = sum(_count("passed", out) + _count("skipped", out) for out in outs)
    assert ran == int(selected.group(1)), (ran, selected.group(0))  # none lost to the shards
