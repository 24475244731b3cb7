"""Every CUDA kernel compiles for Hopper without a GPU (``compile_kernels.py``, its own
process): a typing error in a kernel fails here, not first on a GPU machine."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def test_every_kernel_compiles_to_ptx_for_sm90():
    proc = subprocess.run([sys.executable, str(HERE / "compile_kernels.py"), "9", "0"],
                          cwd=HERE, capture_output=True, text=True, timeout=1200)
    out = proc.stdout + proc.stderr
    if proc.returncode == 77:
        pytest.skip(out.strip().splitlines()[-1])  # no NVVM here: CI installs it
    assert proc.returncode == 0, out[-4000:]
    lines = dict(line.rsplit(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    assert re.search(r"compiled (\d+) kernels for sm_90", proc.stdout), out[-2000:]
    assert len(lines) == int(re.search(r"compiled (\d+)", proc.stdout).group(1))
    stores = {name: int(re.search(r"(\d+) 16-byte stores", v).group(1)) for name, v in lines.items()}
    direct = {name: n for name, n in stores.items() if name.startswith("direct ")}
    assert len(direct) == 37  # 36 that plans launch, and one traced
    for name, n in direct.items():
        if " words" in name or " lines" in name:  # words two at a time; a line's chunks
            assert n > 0, name
        elif name.endswith("pushes uint32"):  # the tiles' pushes move 16-byte quads
            assert n > 0, name
        else:  # 16-bit elements one at a time: no quads
            assert n == 0, name
    pair_loads = {name: int(re.search(r"(\d+) 8-byte loads", v).group(1))
                  for name, v in lines.items() if name.startswith("direct ")}
    for name, n in pair_loads.items():  # in lines, a chunk of data words: two 8-byte loads
        assert (n > 0) == (" lines" in name and name.endswith("uint32")), name
    assert all(stores[f"bare push N={n}"] > 0 for n in (2, 3))
    # the lines kernel rounds its bfloat16 pairs in hardware, one instruction a pair
    # (call_kernels' third bfloat16 kernel); every other kernel in integer arithmetic
    roundings = {name: int(re.search(r"(\d+) bf16x2 roundings", v).group(1))
                 for name, v in lines.items()}
    for name, n in roundings.items():
        assert (n > 0) == (name.startswith("direct bfloat16") and " lines" in name
                           and " #2 " in name), name
    # word by word and in lines a block counts its arrival (a fence and an atomic) at
    # its first barrier, before its loads and stores, not before its combine
    for name, v in lines.items():
        if name.startswith("direct ") and (" words" in name or " lines" in name):
            assert v.endswith("arrives first True"), name
