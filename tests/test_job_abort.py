"""The README's launch style, ``mpiexec -n 2 python -m mpi4py script.py``, ends the whole
job when one rank raises while another waits in the all-to-all: non-zero exit, no hang."""

import sys
import textwrap
import time

from _helpers import mpiexec_env, run_bounded

TIMEOUT_S = 120
PROMPT_S = 60

SCRIPT = textwrap.dedent("""
    import numpy as np
    from mpi4py import MPI

    import cupy_dcp

    comm = cupy_dcp.Communicator.from_mpi()  # collective: both ranks get here
    rank = comm.rank
    x = np.ones((2, 4, 8), dtype=np.float32)
    lse = np.zeros((2, 4), dtype=np.float32)
    cupy_dcp.dcp_a2a_lse_reduce(x, lse, comm)  # one call together: the path works
    if rank == 1:
        raise RuntimeError("rank 1 fails before the reduce")
    cupy_dcp.dcp_a2a_lse_reduce(x, lse, comm)  # rank 0 waits in the all-to-all for rank 1
    print("rank", rank, "returned from the reduce", flush=True)
""")


def _run_job(argv):
    """``(returncode, stdout, stderr, seconds)``; a job still running after TIMEOUT_S
    is stopped with its ranks and fails (``run_bounded``)."""
    start = time.monotonic()
    proc = run_bounded(argv, TIMEOUT_S, env=mpiexec_env())
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start


def test_uncaught_exception_on_one_rank_aborts_the_job(mpiexec, tmp_path):
    script = tmp_path / "one_rank_raises.py"
    script.write_text(SCRIPT)

    returncode, out, err, seconds = _run_job(mpiexec(2, sys.executable, "-m", "mpi4py", str(script)))

    report = f"exit {returncode} after {seconds:.1f} s\nstdout:\n{out}\nstderr:\n{err}"
    assert returncode != 0, report
    assert seconds < PROMPT_S, report
    assert "RuntimeError: rank 1 fails before the reduce" in err, report
    assert "returned from the reduce" not in out, report
