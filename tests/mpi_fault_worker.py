"""Faults and divergent calls on the host path: the same error on every rank, no hang.

Run: mpiexec -n N python tests/mpi_fault_worker.py SCENARIO [SCENARIO ...]

Each scenario runs on a communicator of its own (timeout 10 s, so that a bug
ends in an error, not a hang; the kernels are compiled first, so that no rank
waits for another's compiler) and asserts, on every rank, the exception type,
its whole message and that the caller's arrays are untouched; most then make
one consistent call on the same communicator and check it against the
oracle (nothing was left behind). Every rank reports each scenario's message,
in order, in one JSON line (``run_worker``); anything else aborts the job.
"""

import sys
import time

import numpy as np
from mpi4py import MPI

import cupy_dcp
from _helpers import check_rank_result, row_scale, run_worker
from cupy_dcp.layout import BFLOAT16

WORLD = MPI.COMM_WORLD
RANK, N = WORLD.rank, WORLD.size
HN, D = 2, 8
REDUCE = {"a2a": cupy_dcp.dcp_a2a_lse_reduce, "ag_rs": cupy_dcp.dcp_ag_rs_lse_reduce}


def inputs(tokens, dtype=np.float32, seed=0):
    rng = np.random.default_rng([RANK, seed])
    return (rng.standard_normal((tokens, HN * N, D)).astype(np.float32).astype(dtype),
            rng.uniform(-4.0, 4.0, (tokens, HN * N)).astype(np.float32))


def expect_raise(kind, message, call, *arrays):
    """``call()`` raises ``kind`` with exactly ``message``, and leaves ``arrays`` as they were."""
    before = [a.copy() for a in arrays]
    try:
        call()
    except kind as exc:
        got = str(exc)
        assert type(exc) is kind, f"rank {RANK}: {type(exc).__name__} {got!r}, not {kind.__name__}"
        assert got == message, f"rank {RANK}:\n got  {got!r}\n want {message!r}"
    else:
        raise AssertionError(f"rank {RANK}: no {kind.__name__}; wanted {message!r}")
    for a, b in zip(arrays, before):
        assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8)), \
            f"rank {RANK}: an input changed"
    return got


def still_works(comm, strategy="a2a", tokens=3, **kwargs):
    """One consistent call on ``comm``, checked against the gathered oracle."""
    x, lse = inputs(tokens, seed=7)
    out, out_lse = REDUCE[strategy](x, lse, comm, return_lse=True, **kwargs)
    xs, lses = np.stack(WORLD.allgather(x)), np.stack(WORLD.allgather(lse))
    heads = slice(RANK * HN, (RANK + 1) * HN)
    ref, ref_lse = cupy_dcp.lse_weighted_combine(xs.astype(np.float64), lses, return_lse=True)
    check_rank_result(out, out_lse, ref[:, heads], ref_lse[:, heads],
                      row_scale(xs, lses)[:, heads], f"rank {RANK} after the error")


def fresh(timeout=10.0):
    return cupy_dcp.Communicator.from_mpi(WORLD, timeout=timeout)


def disagree(what, field, mine, others_rank, theirs):
    return (f"{what}: ranks disagree on {field} (rank 0: {mine!r}; "
            f"rank {others_rank}: {theirs!r})")


def diverge(field, strategy, check, make):
    """Rank N-1 calls differently from the others (``make(odd)`` gives the call's
    ``(x, lse, kwargs, strategy, value)``); every rank raises the same ValueError."""
    comm = fresh()
    odd = RANK == N - 1
    x, lse, kwargs, own_strategy, _ = make(odd)
    first, last = make(False)[4], make(True)[4]
    what = f"dcp_{own_strategy}_lse_reduce"
    msg = expect_raise(ValueError, disagree(what, field, first, N - 1, last),
                       lambda: REDUCE[own_strategy](x, lse, comm, check_consistency=check,
                                                    **kwargs), x, lse)
    still_works(comm, strategy)
    return msg


def by_tokens(strategy, check):
    return diverge("tokens", strategy, check,
                   lambda odd: (*inputs(4 if odd else 3), {}, strategy, 4 if odd else 3))


def by_dtype(strategy, check):
    def make(odd):
        dtype = BFLOAT16 if odd else np.dtype(np.float16)  # the same bytes
        return (*inputs(3, dtype), {}, strategy, dtype.name)
    return diverge("dtype", strategy, check, make)


def by_strategy(check):
    return diverge("strategy", "a2a", check,
                   lambda odd: (*inputs(3), {}, "ag_rs" if odd else "a2a",
                                "ag_rs" if odd else "a2a"))


def by_base(strategy):
    return diverge("is_lse_base_on_e", strategy, False,
                   lambda odd: (*inputs(3), dict(is_lse_base_on_e=not odd), strategy, not odd))


def by_call_number():
    """Rank N-1 counts one call more (as if it had made a call the others missed)."""
    comm = fresh()
    if RANK == N - 1:
        comm.next_call()
    x, lse = inputs(3)
    return expect_raise(ValueError, disagree("dcp_a2a_lse_reduce", "call_number", 1, N - 1, 2),
                        lambda: cupy_dcp.dcp_a2a_lse_reduce(x, lse, comm), x, lse)


def by_check_consistency():
    """Rank N-1 checks consistency, the others do not: the steps differ."""
    comm = fresh()
    x, lse = inputs(3)
    check = RANK == N - 1
    msg = disagree("dcp_a2a_lse_reduce", "the step", "exchange", N - 1, "consistency check")
    return expect_raise(ValueError, msg, lambda: cupy_dcp.dcp_a2a_lse_reduce(
        x, lse, comm, check_consistency=check), x, lse)


def one_rank_fails(strategy, check, kind, own_message, spoil):
    """Rank 1 fails its own checks (``spoil(x, lse)`` gives its call's arguments);
    every rank raises ``kind``: rank 1 ``own_message``, the others naming rank 1."""
    comm = fresh()
    x, lse = inputs(3)
    args = dict(cp_attn_out=x, cp_attn_lse=lse)
    if RANK == 1:
        args = spoil(x, lse)
    what = f"dcp_{strategy}_lse_reduce"
    message = own_message if RANK == 1 else f"{what}: rank 1 failed its checks: {own_message}"
    arrays = [a for a in args.values() if isinstance(a, np.ndarray)]
    msg = expect_raise(kind, message, lambda: REDUCE[strategy](
        comm=comm, check_consistency=check, **args), *arrays)
    still_works(comm, strategy)
    return msg


def spoil_lse_dtype(x, lse):
    return dict(cp_attn_out=x, cp_attn_lse=lse.astype(np.int32))


def spoil_read_only_out(x, lse):
    out = np.zeros((x.shape[0], HN, D), x.dtype)
    out.flags.writeable = False
    return dict(cp_attn_out=x, cp_attn_lse=lse, out=out)


def spoil_mask(seq_lens, query_start_loc):
    return lambda x, lse: dict(cp_attn_out=x, cp_attn_lse=lse, seq_lens=seq_lens,
                               query_start_loc=query_start_loc)


def spoil_lse_range(x, lse):
    wide = lse.astype(np.float64)
    wide[1, 2] = 1e39
    return dict(cp_attn_out=x, cp_attn_lse=wide)


def spoil_base(x, lse):
    return dict(cp_attn_out=x, cp_attn_lse=lse, is_lse_base_on_e=None)


FAILURES = {
    "lse_dtype": (TypeError, "cp_attn_lse must be a float array (got dtype int32)",
                  spoil_lse_dtype),
    "read_only_out": (ValueError, "out must be writeable (got a read-only array)",
                      spoil_read_only_out),
    "negative_seq_lens": (ValueError, "seq_lens must be >= 0 (got -1 at index 1)", spoil_mask(
        np.array([2, -1], np.int64), np.array([0, 1, 3], np.int64))),
    "decreasing_starts": (ValueError, "query_start_loc must be non-decreasing (got 1 after 2 at "
                          "index 2)", spoil_mask(np.array([2, 1], np.int64),
                                                 np.array([0, 2, 1], np.int64))),
    "uint64_length": (ValueError, "seq_lens must be < 2**63 (got 18446744073709551615 at index 0)",
                      spoil_mask(np.array([2**64 - 1, 1], np.uint64),
                                 np.array([0, 1, 3], np.uint64))),
    "lse_range": (ValueError, "cp_attn_lse must fit float32: 1e+39 at (1, 2) is beyond "
                  "+-3.40282e+38 (got dtype float64)", spoil_lse_range),
    "base_none": (TypeError, "is_lse_base_on_e must be True or False (got None)", spoil_base),
}


def f_ordered_lse(strategy):
    """An LSE in transposed storage (rank 1 only, then every rank) gives exact results."""
    comm = fresh()
    x, lse = inputs(5)
    xs, lses = np.stack(WORLD.allgather(x)), np.stack(WORLD.allgather(lse))
    heads = slice(RANK * HN, (RANK + 1) * HN)
    ref, ref_lse = cupy_dcp.lse_weighted_combine(xs.astype(np.float64), lses, return_lse=True)
    for f_ranks in ({1}, set(range(N))):
        arg = np.asfortranarray(lse) if RANK in f_ranks else lse
        out, out_lse = REDUCE[strategy](x, arg, comm, return_lse=True)
        check_rank_result(out, out_lse, ref[:, heads], ref_lse[:, heads],
                          row_scale(xs, lses)[:, heads], f"rank {RANK} F-ordered on {f_ranks}")
    return "exact"


def freed(strategy):
    comm = fresh()
    comm.free()
    x, lse = inputs(3)
    message = (f"this Communicator (rank {RANK} of {N}) was freed: build a new one with "
               "Communicator.from_mpi")
    expect_raise(RuntimeError, message, lambda: REDUCE[strategy](x, lse, comm), x, lse)
    expect_raise(RuntimeError, message, lambda: cupy_dcp.DcpA2APlan(comm, 4, HN * N, D, "float32"))
    return message


def null_comm():
    x, lse = inputs(3)
    message = ("comm must be a live mpi4py communicator (got MPI.COMM_NULL: a null or freed "
               "communicator)")
    expect_raise(ValueError, message, lambda: cupy_dcp.dcp_ag_rs_lse_reduce(x, lse, MPI.COMM_NULL),
                 x, lse)
    return expect_raise(ValueError, message, lambda: cupy_dcp.Communicator.from_mpi(MPI.COMM_NULL))


def plans_without_a_gpu():
    """Every rank raises RuntimeError (rank 0 its own), so the fallback is reached together."""
    message = None
    for kind in (cupy_dcp.DcpDirectPlan, cupy_dcp.DcpA2APlan):
        try:
            kind(WORLD, 4, HN * N, D, "float16")
        except RuntimeError as exc:
            message = str(exc)
            name = kind.__name__
            own = f"{name} needs CuPy and a GPU: "
            assert message.startswith(own if RANK == 0 else f"{name}: rank 0 failed its checks: "
                                      + own), message
        else:
            raise AssertionError(f"rank {RANK}: {kind.__name__} built without a GPU")
    return message


def late_rank(check):
    """Rank 1 is 3 s late against a 1 s timeout: rank 0 raises in time, rank 1 on arrival."""
    comm = fresh()  # built within 10 s: the ranks may arrive far apart from the warm-up
    comm.timeout = 1.0
    x, lse = inputs(3)
    WORLD.Barrier()
    call = lambda: cupy_dcp.dcp_a2a_lse_reduce(x, lse, comm, check_consistency=check)  # noqa: E731
    if RANK == 0:
        start = time.monotonic()
        msg = expect_raise(RuntimeError, "MPI dcp_a2a_lse_reduce did not complete within 1.0 s on "
                           "rank 0 (no message from rank 1: a peer rank is missing or stuck); "
                           "the communicator is unusable: abort the job", call, x, lse)
        waited = time.monotonic() - start
        assert waited < 2.5, waited
    else:
        time.sleep(3.0)
        msg = expect_raise(RuntimeError, "rank 0 gave up waiting for rank 1 (it arrived after the "
                           "timeout): this call's result is void and the communicator is "
                           "unusable: abort the job", call, x, lse)
    later = (f"this Communicator is unusable since an earlier failure ({msg})")
    expect_raise(RuntimeError, later, call, x, lse)
    return msg


def late_from_mpi():
    """Rank 1 builds its communicator 3 s late against a 1 s timeout: rank 0 raises
    in time; rank 1's duplicate completes against rank 0's pending one, and its next
    step, bounded too, raises."""
    WORLD.Barrier()
    if RANK == 0:
        start = time.monotonic()
        msg = expect_raise(RuntimeError, "Communicator.from_mpi did not complete within 1.0 s on "
                           "rank 0: not every rank of the communicator called it (a peer rank "
                           "is missing or stuck)", lambda: cupy_dcp.Communicator.from_mpi(
                               WORLD, timeout=1.0))
        assert time.monotonic() - start < 2.5
    else:
        time.sleep(3.0)
        msg = expect_raise(RuntimeError, "MPI finding the ranks' nodes did not complete within "
                           "1.0 s on rank 1 (no message from rank 0: a peer rank is missing or "
                           "stuck); the communicator is unusable: abort the job",
                           lambda: cupy_dcp.Communicator.from_mpi(WORLD, timeout=1.0))
    return msg


SCENARIOS = {
    "tokens_a2a": lambda: by_tokens("a2a", False),
    "tokens_ag_rs": lambda: by_tokens("ag_rs", False),
    "tokens_a2a_checked": lambda: by_tokens("a2a", True),
    "dtype_a2a": lambda: by_dtype("a2a", False),
    "dtype_ag_rs": lambda: by_dtype("ag_rs", False),
    "dtype_checked": lambda: by_dtype("ag_rs", True),
    "strategy": lambda: by_strategy(False),
    "strategy_checked": lambda: by_strategy(True),
    "base": lambda: by_base("a2a"),
    "call_number": by_call_number,
    "check_consistency": by_check_consistency,
    "f_ordered_a2a": lambda: f_ordered_lse("a2a"),
    "f_ordered_ag_rs": lambda: f_ordered_lse("ag_rs"),
    "freed_a2a": lambda: freed("a2a"),
    "freed_ag_rs": lambda: freed("ag_rs"),
    "null_comm": null_comm,
    "plans_without_a_gpu": plans_without_a_gpu,
    "late": lambda: late_rank(False),
    "late_checked": lambda: late_rank(True),
    "late_from_mpi": late_from_mpi,
}
for _name, (_kind, _message, _spoil) in FAILURES.items():
    for _strategy in ("a2a", "ag_rs"):
        for _check in (False, True):
            SCENARIOS[f"fails_{_name}_{_strategy}{'_checked' if _check else ''}"] = (
                lambda s=_strategy, c=_check, k=_kind, m=_message, f=_spoil:
                one_rank_fails(s, c, k, m, f))


def warm_up():
    """Compile every host kernel the scenarios run (on ``COMM_SELF``: no peer waits)."""
    for dtype in (np.float32, np.float16):
        x, lse = inputs(3, dtype)
        for reduce in REDUCE.values():
            for lse_arg in (lse, np.asfortranarray(lse)):
                reduce(x, lse_arg, MPI.COMM_SELF, seq_lens=np.array([1, 2], np.int64),
                       query_start_loc=np.array([0, 1, 3], np.int64))


def main(*scenarios):
    warm_up()
    WORLD.Barrier()  # the ranks start the scenarios together, whatever their compile times
    messages = {}
    for scenario in scenarios:
        messages[scenario] = SCENARIOS[scenario]()
        WORLD.Barrier()
    return {"messages": messages}


if __name__ == "__main__":
    run_worker(main, *sys.argv[1:])
