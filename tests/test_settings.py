"""The switches: arguments first, the environment only their default (read in one
module), a plan's settings resolved once and agreed across ranks."""

import dataclasses
import pathlib
import re
import sys

import numpy as np
import pytest
from mpi4py import MPI

import cupy_dcp
from _helpers import job_results, mpiexec_env, run_bounded
from cupy_dcp import _settings
from cupy_dcp.direct import DirectSettings, resolve_pdl
from cupy_dcp.kernels import _launch
from cupy_dcp.plan import PlanSettings
from gpu import gpu_count

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKER = str(pathlib.Path(__file__).resolve().parent / "settings_worker.py")
EVERY = ("tiles", "words", "lines")
OWN = ["0000:19:00", "0000:3b:00"]  # two ranks, each on a GPU of its own
HOPPER = ((9, 0), 12080)


def test_only_the_settings_module_reads_the_environment():
    readers = sorted(str(path.relative_to(ROOT))
                     for folder in ("cupy_dcp", "kernels") for path in (ROOT / folder).rglob("*.py")
                     if re.search(r"\benviron\b|\bgetenv\b", path.read_text()))
    assert readers == ["cupy_dcp/_settings.py"]


@pytest.mark.parametrize("value, env, resolved", [
    (None, {}, None), (None, {"CUPY_DCP_PDL": "1"}, None), (None, {"CUPY_DCP_PDL": "0"}, False),
    (True, {"CUPY_DCP_PDL": "0"}, True), (False, {}, False),
    (False, {"CUPY_DCP_PDL": "on"}, False),  # an argument given: the variable is not read
    (np.True_, {}, True), (np.False_, {"CUPY_DCP_PDL": "1"}, False),  # NumPy's bools too
])
def test_pdl(value, env, resolved):
    assert _settings.pdl(value, env) is resolved


@pytest.mark.parametrize("value, env, resolved", [
    (None, {}, EVERY), (None, {"CUPY_DCP_LINES": "1"}, EVERY),
    (None, {"CUPY_DCP_LINES": "0"}, ("tiles", "words")),
    (["lines", "tiles"], {}, ("tiles", "lines")),  # in the order of PROTOCOLS
    ({"tiles"}, {}, ("tiles",)), (EVERY, {"CUPY_DCP_LINES": "0"}, EVERY),
    (("tiles", "words"), {"CUPY_DCP_LINES": "bad"}, ("tiles", "words")),
])
def test_protocols(value, env, resolved):
    assert _settings.protocols(value, env) == resolved


@pytest.mark.parametrize("value, env, resolved", [
    (None, {}, None), (None, {"CUPY_DCP_LAUNCHER": ""}, None),
    (None, {"CUPY_DCP_LAUNCHER": "driver"}, "driver"), ("cupy", {"CUPY_DCP_LAUNCHER": "x"}, "cupy"),
])
def test_launcher(value, env, resolved):
    assert _settings.launcher(value, env) == resolved


@pytest.mark.parametrize("call, error, match", [
    (lambda: _settings.pdl("yes"), TypeError, r"^pdl must be True, False or None \(got 'yes'\)$"),
    (lambda: _settings.pdl(1), TypeError, r"^pdl must be True, False or None \(got 1\)$"),
    (lambda: _settings.pdl(None, {"CUPY_DCP_PDL": ""}), ValueError,
     r"^CUPY_DCP_PDL must be 0 or 1 \(got ''\)$"),
    (lambda: _settings.protocols("lines"), TypeError,
     r"^protocols must be a collection of protocol names such as \('tiles', 'words'\) "
     r"\(got 'lines'\)$"),
    (lambda: _settings.protocols(3), TypeError, r"^protocols must be a collection .* \(got 3\)$"),
    (lambda: _settings.protocols(("tiles", "ll128")), ValueError,
     r"^protocols must be among \('tiles', 'words', 'lines'\) \(got 'll128'\)$"),
    (lambda: _settings.protocols(("words", "lines")), ValueError,
     r"^protocols must include 'tiles': a call too large for words and lines goes in tiles "
     r"\(got \('words', 'lines'\)\)$"),
    (lambda: _settings.protocols(None, {"CUPY_DCP_LINES": "no"}), ValueError,
     r"^CUPY_DCP_LINES must be 0 or 1 \(got 'no'\)$"),
    (lambda: _settings.launcher("ctypes"), ValueError,
     r"^launcher must be one of \('driver', 'core', 'cupy', 'numba'\) or None \(got 'ctypes'\)$"),
    (lambda: _settings.launcher(None, {"CUPY_DCP_LAUNCHER": "ctypes"}), ValueError,
     r"^CUPY_DCP_LAUNCHER must be one of \('driver', 'core', 'cupy', 'numba'\) "
     r"\(got 'ctypes'\)$"),
], ids=["pdl_str", "pdl_int", "pdl_env_empty", "protocols_str", "protocols_int",
        "protocols_unknown", "protocols_no_tiles", "lines_env", "launcher", "launcher_env"])
def test_bad_settings(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(pdl="auto"), TypeError, r"^pdl must be True, False or None \(got 'auto'\)$"),
    (dict(protocols=("words",)), ValueError, r"^protocols must include 'tiles'"),
    (dict(protocols="tiles"), TypeError, r"^protocols must be a collection"),
], ids=["pdl", "protocols_no_tiles", "protocols_str"])
def test_bad_switches_are_plan_argument_errors(kwargs, error, match):
    """Raised where bad arguments are (every rank raises together), not later."""
    with pytest.raises(error, match=match):
        cupy_dcp.dcp_plan(MPI.COMM_SELF, 4, 8, 16, "float32", strategy="direct", **kwargs)
    with pytest.raises(error, match=match):
        cupy_dcp.DcpDirectPlan(MPI.COMM_SELF, 4, 8, 16, "float32", **kwargs)


@pytest.mark.skipif(gpu_count() > 0, reason="tells the two errors apart where there is no GPU")
def test_an_argument_given_leaves_its_variable_unread(monkeypatch):
    monkeypatch.setenv("CUPY_DCP_PDL", "on")
    monkeypatch.setenv("CUPY_DCP_LINES", "on")
    with pytest.raises(RuntimeError, match=r"Plan needs CuPy and a GPU"):  # past the settings
        cupy_dcp.DcpDirectPlan(MPI.COMM_SELF, 4, 8, 16, "float32", pdl=False, protocols=EVERY)


def test_resolve_pdl():
    assert resolve_pdl(None, OWN, [HOPPER, HOPPER]) is True
    assert resolve_pdl(True, OWN, [HOPPER, HOPPER]) is True
    assert resolve_pdl(False, OWN, [HOPPER, HOPPER]) is False
    # where one rank's GPU cannot, no rank launches dependents: every rank's answer is the same
    assert resolve_pdl(None, OWN, [HOPPER, ((8, 0), 12080)]) is False
    assert resolve_pdl(None, OWN, [HOPPER, ((9, 0), 12020)]) is False
    assert resolve_pdl(None, [OWN[0], OWN[0]], [HOPPER, HOPPER]) is False  # a shared GPU
    assert resolve_pdl(False, [OWN[0], OWN[0]], [HOPPER, HOPPER]) is False
    with pytest.raises(RuntimeError, match=r"^pdl=True needs every rank on a GPU of its own, of "
                                           r"compute capability 9\.0 or later, with a CUDA 12\.3 "
                                           r"or later driver \(got GPUs \['0000:19:00', "
                                           r"'0000:19:00'\]"):
        resolve_pdl(True, [OWN[0], OWN[0]], [HOPPER, HOPPER])


def _settings_of(**own):
    base = dict(world_size=2, max_tokens=4, num_heads=8, head_dim=16,
                dtype=np.dtype(np.float16), return_lse=False, is_lse_base_on_e=True,
                strategy="direct", launcher="driver")
    return DirectSettings(**base, **own)


def test_settings_are_frozen_and_agreed_as_plain_values():
    settings = _settings_of(timeout=30.0, pdl=None, protocols=EVERY)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.timeout = 1.0
    assert settings.local_heads == 4
    assert list(settings.fields()) == [
        "world_size", "max_tokens", "num_heads", "head_dim", "dtype", "return_lse",
        "is_lse_base_on_e", "strategy", "launcher", "timeout", "pdl", "protocols"]
    assert settings.fields()["dtype"] == "float16"
    assert isinstance(settings, PlanSettings)
    assert settings == _settings_of(timeout=30.0, pdl=None, protocols=EVERY)
    assert settings != _settings_of(timeout=30.0, pdl=None, protocols=EVERY[:2])


@pytest.fixture
def fresh_launcher(monkeypatch):
    """This process's launcher not yet chosen (restored afterwards)."""
    monkeypatch.setattr(_launch, "_CHOSEN", [])


def test_the_launcher_is_chosen_once(fresh_launcher):
    assert _launch.choose_launcher("driver") == "driver"
    assert _launch.choose_launcher() == "driver" and _launch.choose_launcher("driver") == "driver"
    with pytest.raises(RuntimeError, match=r"^this process launches kernels through 'driver', "
                                           r"chosen before \(got launcher 'numba'\)$"):
        _launch.choose_launcher("numba")


def test_the_first_available_launcher(fresh_launcher):
    chosen = _launch.choose_launcher()
    assert chosen in _launch.LAUNCHERS and _launch.choose_launcher() == chosen


@pytest.mark.parametrize("make", [
    lambda: _launch.choose_launcher("ctypes"),
    lambda: _launch.SpecializedKernel(None, (), launcher="ctypes"),
], ids=["choose", "kernel"])
def test_a_bad_launcher(fresh_launcher, make):
    with pytest.raises(ValueError, match=r"^launcher must be one of \('driver', 'core', 'cupy', "
                                         r"'numba'\) or None \(got 'ctypes'\)$"):
        make()
    assert _launch._CHOSEN == []  # nothing chosen by a bad request


def test_a_kernel_takes_the_process_launcher_unless_given_one(fresh_launcher):
    _launch.choose_launcher("numba")
    assert _launch.SpecializedKernel(None, ()).launcher == "numba"
    assert _launch.SpecializedKernel(None, (), launcher="numba", dependent=True).launcher == "numba"


def _job(mpiexec, *cases):
    proc = run_bounded(mpiexec(2, sys.executable, WORKER, *cases), 240, env=mpiexec_env())
    report = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    outcomes = {(record["rank"], name): outcome for record in job_results(proc, 2)
                for name, outcome in record["outcomes"].items()}
    return outcomes, report


def test_plans_agree_on_the_resolved_settings(mpiexec, monkeypatch):
    for name in ("CUPY_DCP_PDL", "CUPY_DCP_LINES", "CUPY_DCP_LAUNCHER"):
        monkeypatch.delenv(name, raising=False)
    outcomes, report = _job(mpiexec)
    disagree = {
        "lines": "protocols (rank 0: ('tiles', 'words', 'lines'); rank 1: ('tiles', 'words'))",
        "protocols": "protocols (rank 0: ('tiles', 'lines'); rank 1: ('tiles', 'words', 'lines'))",
        "pdl": "pdl (rank 0: False; rank 1: None)",
        "timeout": "timeout (rank 0: 60.0; rank 1: 5.0)",
    }
    for case, what in disagree.items():
        for rank in (0, 1):
            assert outcomes[rank, case] == f"ValueError: DcpDirectPlan: ranks disagree on {what}", \
                report
    agreed = r"^agreed timeout=60\.0 pdl={} protocols={} launcher=(core|driver|cupy|numba)$"
    for case, pdl, protocols in (("agreed", "None", r"\('tiles', 'words'\)"),
                                 ("pdl_env", "False", r"\('tiles', 'words', 'lines'\)")):
        assert re.match(agreed.format(pdl, protocols), outcomes[0, case]), report
        assert outcomes[0, case] == outcomes[1, case], report
    again = "this process launches kernels through"
    assert outcomes[0, "launcher_again"].startswith(f"RuntimeError: {again}"), report
    assert outcomes[1, "launcher_again"].startswith(  # rank 0's error type on every rank
        f"RuntimeError: DcpDirectPlan: rank 0 failed its checks: {again}"), report


def test_plans_agree_on_the_launcher(mpiexec, monkeypatch):
    monkeypatch.delenv("CUPY_DCP_LAUNCHER", raising=False)
    outcomes, report = _job(mpiexec, "launcher")
    for rank in (0, 1):
        assert outcomes[rank, "launcher"] == ("ValueError: DcpDirectPlan: ranks disagree on "
                                              "launcher (rank 0: 'driver'; rank 1: 'numba')"), report
