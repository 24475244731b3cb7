"""Divergent calls of the packed all-to-all on the GPU, two ranks sharing one GPU over
the MPI transport (``backend="mpi"``: device arrays staged through host memory).

Run: mpiexec -n 2 python tests/gpu_divergence_worker.py SCENARIO [SCENARIO ...]

Each scenario asserts, on every rank, the exception type, its whole message, that
the caller's arrays are untouched, and that a consistent call afterwards gives the
host path's bits. Every rank prints ``rank {r} {scenario} OK: {message}``; anything
else aborts the job.
"""

import sys

import numpy as np
from mpi4py import MPI

import cupy_dcp
from _helpers import run_worker
from cupy_dcp.layout import BFLOAT16, bits_dtype, lse_pack_dim
from cupy_dcp.kernels._trailer import trailer_rows

WORLD = MPI.COMM_WORLD
RANK, N = WORLD.rank, WORLD.size
HN, D, MAX_TOKENS = 2, 8, 8


def inputs(tokens, dtype, seed=0):
    rng = np.random.default_rng([RANK, seed])
    return (rng.standard_normal((tokens, HN * N, D)).astype(np.float32).astype(dtype),
            rng.uniform(-4.0, 4.0, (tokens, HN * N)).astype(np.float32))


def device(*arrays):
    import cupy
    return [cupy.asarray(a) for a in arrays]


def expect_raise(kind, message, call, *arrays):
    """``call()`` raises ``kind`` with exactly ``message``; the device ``arrays`` are
    as they were."""
    import cupy

    before = [cupy.asnumpy(a).view(np.uint8).copy() for a in arrays]
    try:
        call()
    except kind as exc:
        got = str(exc)
        assert type(exc) is kind, f"rank {RANK}: {type(exc).__name__} {got!r}"
        assert got == message, f"rank {RANK}:\n got  {got!r}\n want {message!r}"
    else:
        raise AssertionError(f"rank {RANK}: no {kind.__name__}; wanted {message!r}")
    for a, b in zip(arrays, before):
        assert np.array_equal(cupy.asnumpy(a).view(np.uint8), b), f"rank {RANK}: an input changed"
    return got


def still_works(comm, plan, dtype):
    """A consistent call of ``plan`` gives the host path's bits on every rank."""
    import cupy

    x, lse = inputs(3, dtype, seed=5)
    got, got_lse = plan(*device(x, lse))
    plan.synchronize()
    want, want_lse = cupy_dcp.dcp_a2a_lse_reduce(x, lse, comm, return_lse=True)
    bits = bits_dtype(dtype)
    assert np.array_equal(cupy.asnumpy(got).view(bits), want.view(bits)), f"rank {RANK}"
    # the global LSE: the device's exp2/log2 against the host's, within 16 float32 ulps
    got_lse = cupy.asnumpy(got_lse)
    finite = np.isfinite(want_lse)
    assert np.array_equal(got_lse[~finite], want_lse[~finite]), f"rank {RANK}"
    np.testing.assert_array_max_ulp(got_lse[finite], want_lse[finite], maxulp=16)


def fresh():
    return cupy_dcp.Communicator.from_mpi(WORLD, backend="mpi", timeout=60.0)


def by_plan_field(field, first, last, make):
    """Both ranks build both plans; rank 0 calls the first, rank 1 the second (the
    same bytes): the combine's record raises on each rank's ``synchronize``, once.
    Each plan counts its own calls, so the first plan's next call on both ranks is
    out of step (rank 1 never made its first), and says so; a new plan works.
    ``make(odd)`` gives ``(plan kwargs, dtype)``."""
    comm = fresh()
    plans = [cupy_dcp.DcpA2APlan(comm, MAX_TOKENS, HN * N, D, return_lse=True, **make(odd)[0])
             for odd in (False, True)]
    odd = RANK == N - 1
    plan, dtype = plans[odd], make(odd)[1]
    x, lse = device(*inputs(3, dtype))
    plan(x, lse)
    message = (f"DcpA2APlan: ranks disagree on {field} (rank 0: {first!r}; rank {N - 1}: "
               f"{last!r}) in an earlier call: its result is void")
    got = expect_raise(ValueError, message, plan.synchronize, x, lse)
    plan.check()  # reported once
    x, lse = device(*inputs(3, make(False)[1]))
    plans[0](x, lse)
    expect_raise(ValueError, "DcpA2APlan: ranks disagree on call_number (rank 0: 1; rank "
                 f"{N - 1}: 0) in an earlier call: its result is void", plans[0].synchronize,
                 x, lse)
    for p in plans:
        p.close()
    with cupy_dcp.DcpA2APlan(comm, MAX_TOKENS, HN * N, D, np.float16, return_lse=True) as p:
        still_works(comm, p, np.dtype(np.float16))
    return got


def by_dtype():
    return by_plan_field("dtype", "float16", "bfloat16", lambda odd: (
        dict(dtype=BFLOAT16 if odd else np.float16), BFLOAT16 if odd else np.dtype(np.float16)))


def by_base():
    return by_plan_field("is_lse_base_on_e", True, False, lambda odd: (
        dict(dtype=np.float16, is_lse_base_on_e=not odd), np.dtype(np.float16)))


def by_tokens():
    """Rank 1 calls with B = 4, rank 0 with B = 3: the chunks differ in size, and the
    staged exchange says so on both ranks before anything reaches the device."""
    comm = fresh()
    plan = cupy_dcp.DcpA2APlan(comm, MAX_TOKENS, HN * N, D, np.float16, return_lse=True)
    odd = RANK == N - 1
    x, lse = device(*inputs(4 if odd else 3, np.float16))
    width = D + lse_pack_dim(np.float16)
    k = trailer_rows(HN, width, 2)
    sizes = [(b + k) * HN * width * 2 for b in (3, 4)]
    message = (f"the staged all-to-all of device arrays: ranks disagree on chunk_bytes "
               f"(rank 0: {sizes[0]}; rank {N - 1}: {sizes[1]})")
    got = expect_raise(ValueError, message, lambda: plan(x, lse), x, lse)
    still_works(comm, plan, np.dtype(np.float16))
    plan.close()
    return got


SCENARIOS = {"dtype": by_dtype, "base": by_base, "tokens": by_tokens}


def main(*scenarios):
    import warnings

    warnings.simplefilter("ignore", RuntimeWarning)  # the MPI transport says it is slow
    WORLD.Barrier()
    checked = {}
    for scenario in scenarios:
        checked[scenario] = SCENARIOS[scenario]()  # the message every rank raised
        WORLD.Barrier()
    return {"checked": checked}


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])
