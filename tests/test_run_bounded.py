"""The mpirun tests' runner: a job that hangs ends as a failure with its output,
and leaves no process behind."""

import os
import sys
import time

import pytest

from _helpers import run_bounded


def test_a_job_that_ends_gives_its_output():
    code = "import sys; print('out'); print('err', file=sys.stderr)"
    proc = run_bounded([sys.executable, "-c", code], 30)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "out\n", "err\n")


def test_a_job_past_its_time_is_stopped_with_its_children():
    marker = f"sleeping child {time.time_ns()}"
    child = f"import time; time.sleep(120)  # {marker}"
    code = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); "
            "print('started', flush=True); time.sleep(120)")
    start = time.monotonic()
    with pytest.raises(AssertionError, match="did not end within 2 s; the output it had written:\nstarted"):
        run_bounded([sys.executable, "-c", code], 2)
    assert time.monotonic() - start < 30
    assert not _running(marker), "the job's child outlived it"


def _running(text):
    """Whether a process whose command line holds ``text`` is alive (Linux /proc)."""
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    return True
        except (OSError, ValueError):
            continue
    return False


def test_worker_records_are_read_past_terminal_colour_codes():
    from _helpers import RESULT_TAG, worker_results

    # as seen on a GPU machine: a coloured warning's reset code on either side of a record
    out = (f"a warning\n{RESULT_TAG}" '{"rank": 0, "size": 2, "checked": {"tokens": "x"}}\x1b[0m\n'
           f"\x1b[0m{RESULT_TAG}" '{"rank": 1, "size": 2}\n' "the end\n")
    assert worker_results(out) == [{"rank": 0, "size": 2, "checked": {"tokens": "x"}},
                                   {"rank": 1, "size": 2}]
    assert worker_results("no record here\n") == []
