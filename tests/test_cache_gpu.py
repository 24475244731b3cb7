"""The kernel cache on a GPU: cubins kept across processes, a corrupt entry rebuilt,
and the PTX that ``python -m cupy_dcp.warmup --cc`` stores without a GPU linked on
one. Each case runs fresh processes on one folder; the counts come from the cache's
own counters (``cupy_dcp.kernels._cache.stats``), not from timing."""

import json
import os
import subprocess
import sys

import pytest

from gpu import requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]

# One process's pack and combine (bfloat16, N = 2, D = 128: the word-wide and pair
# variants) against the NumPy reference, bit for bit, and the cache's counts.
CHILD = """
import hashlib, json, warnings
import numpy as np, cupy
from cupy_dcp import reference
from cupy_dcp.kernels import _cache, pack_send, unpack_combine
from cupy_dcp.layout import as_dtype, send_buffer_shape

caught = []
warnings.showwarning = lambda message, *rest: caught.append(str(message))
dtype, n, B, H, D = as_dtype("bfloat16"), 2, 3, 8, 128
rng = np.random.default_rng(7)
x = rng.standard_normal((B, H, D)).astype(np.float32).astype(dtype)
lse = rng.uniform(-4, 4, (B, H)).astype(np.float32)
send = cupy.zeros(send_buffer_shape(n, B, H, D, dtype), np.uint16).view(dtype)
pack_send(cupy.asarray(x.view(np.uint16)).view(dtype), cupy.asarray(lse), send)
want = reference.pack_reference(x, lse, n)
assert (cupy.asnumpy(send.view(np.uint16)) == want.view(np.uint16)).all(), "pack differs"
out = cupy.zeros((B, H // n, D), np.uint16).view(dtype)
unpack_combine(send, out)  # the two chunks as the two ranks' partials of heads 0 .. H/N - 1
partials, lses = reference.unpack_reference(want, D)
ref = reference.lse_weighted_combine(partials.astype(np.float64), lses)
got = cupy.asnumpy(out.view(np.uint16)).view(dtype)
np.testing.assert_allclose(got.astype(np.float64), ref, rtol=1e-2, atol=1e-2)
digest = hashlib.sha256(got.view(np.uint16).tobytes()).hexdigest()
print("record " + json.dumps({**_cache.stats(), "warnings": caught, "digest": digest}))
"""


def _child(folder, extra_env=None):
    env = dict(os.environ, CUPY_DCP_CACHE_DIR=str(folder), **(extra_env or {}))
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("record ")]
    assert len(lines) == 1, proc.stdout[-3000:]
    return json.loads(lines[0][len("record "):])


def test_a_second_gpu_process_compiles_nothing(tmp_path):
    first = _child(tmp_path)
    assert first["compiled"] > 0 and first["stored"] == first["compiled"], first
    second = _child(tmp_path)
    assert second["compiled"] == 0 and second["loaded"] == first["compiled"], second
    assert second["digest"] == first["digest"]  # the same machine code, the same bits


def test_a_corrupt_cubin_is_rebuilt_with_a_warning(tmp_path):
    first = _child(tmp_path)
    entries = sorted(tmp_path.glob("*.bin"))
    assert len(entries) == first["stored"] > 0
    for entry in entries:  # truncated, as a crash mid-write without the rename would leave
        entry.write_bytes(entry.read_bytes()[: len(entry.read_bytes()) // 2])
    again = _child(tmp_path)
    assert again["rebuilt"] == len(entries) and again["compiled"] == len(entries), again
    assert any("corrupt" in w for w in again["warnings"]), again
    assert _child(tmp_path)["compiled"] == 0  # the rebuilt entries serve the next process


def test_warmup_ptx_made_without_a_gpu_links_on_one(tmp_path):
    import cupy

    major, minor = divmod(int(cupy.cuda.Device().compute_capability), 10)
    env = dict(os.environ, CUPY_DCP_CACHE_DIR=str(tmp_path), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, "-m", "cupy_dcp.warmup", "--dtype", "bfloat16", "--heads", "8",
         "--head-dim", "128", "--world-size", "2", "--max-tokens", "3", "--plans", "a2a",
         "--cc", f"{major}.{minor}"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    loaded = _child(tmp_path)  # links the stored PTX here, and keeps the cubins
    assert loaded["compiled"] == 0 and loaded["loaded"] > 0, loaded
    assert not [w for w in loaded["warnings"] if "did not link" in w], loaded
    assert _child(tmp_path)["compiled"] == 0
