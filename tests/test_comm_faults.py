"""Faults at the communicator and at the public boundary: the same exception type on
every rank, clear errors for freed or null communicators, bounded waits, and a group
of one that follows the rules of a larger group."""

import math
import re

import numpy as np
import pytest
from mpi4py import MPI

import cupy_dcp
from cupy_dcp._single import single_combine
from cupy_dcp.comm import DEFAULT_TIMEOUT, _describe_sharing
from cupy_dcp.layout import BFLOAT16, bits_dtype
from gpu import gpu_count
from test_reliability_divergence import run_worker

FAILURES = ["lse_dtype", "read_only_out", "negative_seq_lens", "decreasing_starts",
            "uint64_length", "lse_range", "base_none"]


@pytest.mark.parametrize("strategy", ["a2a", "ag_rs"])
def test_a_rank_failing_its_checks_fails_every_rank_alike(mpiexec, strategy):
    """Under the default options and with check_consistency: rank 1's own error on
    rank 1, the same type naming rank 1 elsewhere; then a consistent call works."""
    run_worker(mpiexec, 2, [f"fails_{name}_{strategy}{checked}" for name in FAILURES
                            for checked in ("", "_checked")])


def test_transposed_lse_freed_and_null_communicators(mpiexec):
    run_worker(mpiexec, 2, ["f_ordered_a2a", "f_ordered_ag_rs", "freed_a2a", "freed_ag_rs",
                            "null_comm"])


@pytest.mark.skipif(gpu_count() > 0, reason="checks the errors raised where there is no GPU")
def test_plans_without_a_gpu_raise_runtime_error_on_every_rank(mpiexec):
    run_worker(mpiexec, 2, ["plans_without_a_gpu"])


def test_a_late_rank_ends_in_errors_on_both_sides(mpiexec):
    """Rank 0 raises after its 1 s timeout (with check_consistency too), rank 1 when it
    arrives; both communicators are unusable afterwards. Building one is bounded too."""
    run_worker(mpiexec, 2, ["late", "late_checked", "late_from_mpi"])


@pytest.mark.parametrize("timeout, error, match", [
    ("5", TypeError, r"^timeout must be a number of seconds or None \(got str '5'\)$"),
    (True, TypeError, r"^timeout must be a number of seconds or None \(got bool True\)$"),
    (float("nan"), ValueError, r"^timeout must be > 0 seconds or None \(got nan\)$"),
    (-1, ValueError, r"^timeout must be > 0 seconds or None \(got -1\)$"),
], ids=["str", "bool", "nan", "negative"])
def test_timeout_is_checked(timeout, error, match):
    with pytest.raises(error, match=match):
        cupy_dcp.Communicator.from_mpi(MPI.COMM_SELF, timeout=timeout)
    with pytest.raises(error, match=match):
        cupy_dcp.Communicator(MPI.COMM_SELF, timeout=timeout)
    # a wait's own timeout, and the attribute set later: refused before anything is
    # posted, so the communicator stays usable
    comm = cupy_dcp.Communicator.from_mpi(MPI.COMM_SELF, backend="mpi")
    try:
        for wait in (lambda: comm.barrier(timeout=timeout), lambda: comm.limit(timeout),
                     lambda: comm.agree("step", {"a": 1}, timeout=timeout),
                     lambda: comm.synchronize(timeout=timeout)):
            with pytest.raises(error, match=match):
                wait()
        comm.timeout = timeout
        with pytest.raises(error, match=match.replace("^timeout", "^this Communicator's timeout")):
            comm.barrier()
        comm.timeout = 5.0
        comm.barrier()
        comm.check_usable()
    finally:
        comm.free()


def test_the_default_timeout_is_finite():
    comm = cupy_dcp.Communicator.from_mpi(MPI.COMM_SELF)
    assert comm.timeout is None and comm.limit() == DEFAULT_TIMEOUT == 600.0
    comm.timeout = 2.5
    assert comm.limit() == 2.5 and comm.limit(7) == 7
    comm.free()
    assert cupy_dcp.Communicator(MPI.COMM_SELF, timeout=math.inf).limit() == math.inf


@pytest.mark.parametrize("max_tokens, error, match", [
    ("8", TypeError, r"^max_tokens must be an integer \(got str '8'\)$"),
    (None, TypeError, r"^max_tokens must be an integer \(got NoneType None\)$"),
    (2.0, TypeError, r"^max_tokens must be an integer \(got float 2.0\)$"),
    (0, ValueError, r"^max_tokens must be >= 1 \(got 0\)$"),
], ids=["str", "none", "float", "zero"])
def test_plan_sizes_are_checked(max_tokens, error, match):
    with pytest.raises(error, match=match):
        cupy_dcp.DcpA2APlan(MPI.COMM_SELF, max_tokens, 8, 16, "float32")


@pytest.mark.parametrize("name, value", [("is_lse_base_on_e", v) for v in (None, "e", 1)] +
                         [("return_lse", v) for v in ("False", 1, None)])
def test_the_flags_are_bools(name, value):
    x, lse = np.ones((2, 4, 8), np.float32), np.zeros((2, 4), np.float32)
    match = rf"^{name} must be True or False \(got {value!r}\)$"
    with pytest.raises(TypeError, match=match):
        cupy_dcp.dcp_a2a_lse_reduce(x, lse, MPI.COMM_SELF, **{name: value})
    with pytest.raises(TypeError, match=match):
        cupy_dcp.DcpA2APlan(MPI.COMM_SELF, 4, 8, 16, "float32", **{name: value})


@pytest.mark.parametrize("dtype, shown", [(None, "None"), ("float64", "'float64'"),
                                          (np.int8, "<class 'numpy.int8'>"),
                                          ("nonsense", "'nonsense'")])
def test_a_plans_bad_dtype_is_named_as_given(dtype, shown):
    match = rf"^dtype must be float16, bfloat16 or float32 \(got {re.escape(shown)}\)$"
    with pytest.raises(TypeError, match=match):
        cupy_dcp.DcpA2APlan(MPI.COMM_SELF, 4, 8, 16, dtype)


def test_a_freed_communicator_is_a_clear_error():
    comm = cupy_dcp.Communicator.from_mpi(MPI.COMM_SELF)
    comm.free()
    x, lse = np.ones((2, 4, 8), np.float32), np.zeros((2, 4), np.float32)
    for call in (lambda: cupy_dcp.dcp_ag_rs_lse_reduce(x, lse, comm),
                 lambda: cupy_dcp.dcp_a2a_lse_reduce(x, lse, comm),
                 lambda: comm.agree("step", dict(a=1)),
                 lambda: comm.barrier()):
        with pytest.raises(RuntimeError, match=r"^this Communicator \(rank 0 of 1\) was freed: "
                                               r"build a new one with Communicator.from_mpi$"):
            call()


def test_a_null_communicator_is_a_clear_error():
    match = r"^comm must be a live mpi4py communicator \(got MPI.COMM_NULL: a null or freed"
    with pytest.raises(ValueError, match=match):
        cupy_dcp.Communicator.from_mpi(MPI.COMM_NULL)
    with pytest.raises(ValueError, match=match):
        cupy_dcp.dcp_a2a_lse_reduce(np.ones((2, 4, 8), np.float32), np.zeros((2, 4), np.float32),
                                    MPI.COMM_NULL)


@pytest.mark.parametrize("strategy", ["a2a", "ag_rs"])
def test_a_group_of_one_follows_the_rules_of_a_larger_group(strategy):
    """Masked tokens, NaN and +inf LSEs are empty rows (output 0, LSE -inf), as in a
    group of two; the rest is the input itself."""
    reduce = {"a2a": cupy_dcp.dcp_a2a_lse_reduce, "ag_rs": cupy_dcp.dcp_ag_rs_lse_reduce}[strategy]
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 4, 8)).astype(np.float16)
    x[1, 2] = np.nan  # under a NaN LSE: must not leak
    lse = rng.uniform(-3, 3, (6, 4)).astype(np.float32)
    lse[1, 2], lse[2, 0] = np.nan, np.inf
    seq_lens, starts = np.array([3, 0, 1], np.int64), np.array([0, 2, 4, 5], np.int64)
    before = x.copy(), lse.copy()
    out, out_lse = reduce(x, lse, MPI.COMM_SELF, return_lse=True, seq_lens=seq_lens,
                          query_start_loc=starts)
    empty = np.zeros((6, 4), bool)
    empty[1, 2] = empty[2, 0] = True
    empty[[2, 3, 5]] = True  # sequence 1 has no KV; token 5 is padding
    masked = np.where(empty, -np.inf, lse)
    ref, ref_lse = cupy_dcp.lse_weighted_combine(x[None].astype(np.float64), masked[None],
                                                 return_lse=True)
    np.testing.assert_array_equal(out[empty], 0)
    np.testing.assert_array_equal(out_lse, np.where(empty, -np.inf, lse))
    np.testing.assert_array_equal(out[~empty], x[~empty])
    np.testing.assert_array_equal(out.astype(np.float64), ref.astype(np.float16).astype(np.float64))
    np.testing.assert_array_equal(ref_lse.astype(np.float32), out_lse)
    np.testing.assert_array_equal(x.view(np.uint16), before[0].view(np.uint16))
    np.testing.assert_array_equal(lse, before[1])


def test_ranks_sharing_a_gpu_are_named():
    assert _describe_sharing(["h 0000:19:00", "h 0000:3b:00", "h 0000:19:00"]) == (
        "ranks 0, 2 share GPU h 0000:19:00")
    assert _describe_sharing(["a 0000:19:00", "b 0000:19:00"]) == ""


@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16, np.float32], ids=str)
def test_the_device_group_of_one_is_the_host_combine(dtype):
    """The array-API function a device group of one runs, on NumPy arrays, gives the
    host combine's bits (-0.0 included, empty sequences with equal starts too)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((9, 4, 6)).astype(np.float32).astype(dtype)
    x[0, 1, :3] = -0.0
    lse = rng.uniform(-3, 3, (9, 4)).astype(np.float32)
    lse[1, 2], lse[4, 0], lse[6, 3] = np.nan, np.inf, -np.inf
    seq_lens = np.array([2, 0, 0, 3, 1], np.int32)
    starts = np.array([1, 3, 5, 5, 7, 8], np.int64)  # token 0 and 8 are padding
    bits = bits_dtype(dtype)
    for masks in ((), (seq_lens, starts)):
        want, want_lse = cupy_dcp.dcp_a2a_lse_reduce(x, lse, MPI.COMM_SELF, return_lse=True,
                                                     **dict(zip(("seq_lens", "query_start_loc"),
                                                                masks)))
        got, got_lse = single_combine(np, x.view(bits), lse, *masks)
        np.testing.assert_array_equal(got, want.view(bits))
        np.testing.assert_array_equal(got_lse, want_lse)
    assert (got.reshape(9, -1)[[0, 3, 4, 8]] == 0).all() and not (got[1:3] == 0).all()


def test_a_plan_of_more_rows_than_the_kernels_number_is_refused():
    with pytest.raises(ValueError, match=r"^max_tokens \* num_heads must be below 2\*\*31 "
                                         r"\(got 33554432 \* 64\)$"):
        cupy_dcp.DcpA2APlan(MPI.COMM_SELF, 2 ** 25, 64, 1, "float32")
