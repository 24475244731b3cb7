"""``import cupy_dcp`` is light: it loads neither NumPy, nor Numba, nor CuPy, nor MPI;
its names and submodules come on first use (a fresh process each)."""

import subprocess
import sys

LIGHT = """
import sys
import cupy_dcp
heavy = [m for m in ("numpy", "numba", "numba.cuda", "cupy", "mpi4py", "ml_dtypes")
         if m in sys.modules]
assert heavy == [], heavy
assert cupy_dcp.lse_weighted_combine.__module__ == "cupy_dcp.reference"
assert cupy_dcp.layout.lse_pack_dim is cupy_dcp.lse_pack_dim  # a submodule, bound on use
assert "numba.cuda" not in sys.modules  # the host kernels' package needs no CUDA target
assert callable(cupy_dcp.kernels.pack_host) and "numba.cuda" not in sys.modules
for missing in ("no_such_name", "no_such_module"):
    try:
        getattr(cupy_dcp, missing)
    except AttributeError as exc:
        assert missing in str(exc)
    else:
        raise SystemExit(f"cupy_dcp.{missing} did not raise")
print("light")
"""


def test_import_is_light_and_names_come_on_use():
    proc = subprocess.run([sys.executable, "-c", LIGHT], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.split() == ["light"], proc.stderr[-3000:]
