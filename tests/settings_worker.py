"""Worker of tests/test_settings.py: ``mpiexec -n 2 python tests/settings_worker.py [CASE...]``.

Every rank builds a :class:`cupy_dcp.DcpDirectPlan` once per case, with its own
arguments and environment, and reports what each construction ended in: the
resolved settings when the ranks agreed (the build is stopped right after the
agreement, before any device work, so no GPU is needed), else the error; each
rank's ``outcomes`` by case, in one JSON line (``run_worker``). The cases are run
in the order given (by default every case of :data:`CASES` but ``launcher``).
"""

import os
import sys

from mpi4py import MPI

import cupy_dcp
from _helpers import run_worker
from cupy_dcp import direct, plan


class Agreed(Exception):
    """Raised where a plan's build would first touch a device: the ranks agreed."""


def stop_after_agreement(self, settings):
    raise Agreed(settings)


# (name, {rank: environment}, {rank: arguments}). A process chooses its launcher once:
# "launcher" must come first in its job, "launcher_again" after a plan was built
CASES = [
    ("launcher", {0: {"CUPY_DCP_LAUNCHER": "driver"}, 1: {"CUPY_DCP_LAUNCHER": "numba"}}, {}),
    ("agreed", {0: {"CUPY_DCP_LINES": "0"}, 1: {"CUPY_DCP_LINES": "0"}}, {}),
    ("lines", {1: {"CUPY_DCP_LINES": "0"}}, {}),
    ("protocols", {}, {0: dict(protocols=("tiles", "lines"))}),
    ("pdl", {}, {0: dict(pdl=False)}),
    ("pdl_env", {0: {"CUPY_DCP_PDL": "0"}}, {1: dict(pdl=False)}),
    ("timeout", {}, {1: dict(timeout=5.0)}),
    ("launcher_again", {0: {"CUPY_DCP_LAUNCHER": "numba"}}, {}),
]


def main():
    world = MPI.COMM_WORLD
    rank = world.rank
    comm = cupy_dcp.Communicator.from_mpi(world, backend="mpi", timeout=60)
    plan._cupy_problem = lambda: None  # the check of this machine's GPU is not under test
    direct.DcpDirectPlan._prepare_device = stop_after_agreement
    names = sys.argv[1:] or [case[0] for case in CASES if case[0] != "launcher"]
    outcomes = {}
    for name, envs, kwargs in sorted((c for c in CASES if c[0] in names),
                                     key=lambda c: names.index(c[0])):
        saved = dict(os.environ)
        os.environ.update(envs.get(rank, {}))
        try:
            cupy_dcp.DcpDirectPlan(comm, 4, 8, 16, "float16", **kwargs.get(rank, {}))
            outcome = "built"
        except Agreed as reached:
            s = reached.args[0]
            outcome = (f"agreed timeout={s.timeout} pdl={s.pdl} protocols={s.protocols} "
                       f"launcher={s.launcher}")
        except (ValueError, TypeError, RuntimeError) as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        finally:
            os.environ.clear()
            os.environ.update(saved)
        outcomes[name] = outcome
    comm.free()
    return {"outcomes": outcomes}


if __name__ == "__main__":
    run_worker(main)
