"""Multi-rank GPU check of dcp_a2a_lse_reduce and DcpA2APlan (NCCL), against the oracle.

Run: mpirun -n 2 python tests/gpu_reduce_worker.py [nccl|mpi]

With ``mpi`` the exchanges are staged through host memory over MPI (ranks
may then share one GPU) and the CUDA-graph cases are left out: that
transport synchronises and cannot be captured.

Every rank uses its own GPU, draws its own inputs, and checks its head slice
against ``lse_weighted_combine`` of ALL ranks' inputs (gathered with MPI):
the functional API over every dtype, base, return_lse, mask and ``out=``
layout; a plan called three times with changing inputs; and a plan call
captured in a CUDA graph and replayed three times with changing inputs. Any
failure aborts the job; on success each rank reports what ran (``run_worker``).
"""

import itertools
import os
import sys

import numpy as np
from mpi4py import MPI

import cupy_dcp
from cupy_dcp.kernels._arrays import kernel_array, pointer_device
from cupy_dcp.plan import _repeat_key
from _helpers import assert_lse_close, run_worker, ulp
from host_reduce_worker import B, DTYPES, HN, QUERY_START_LOC, gathered, rank_inputs, seq_lens_of


def expected(world, x, lse, base_e, masked):
    rank = world.Get_rank()
    xs, lses = gathered(world, x, lse, masked)
    with np.errstate(invalid="ignore"):
        ref, ref_lse = cupy_dcp.lse_weighted_combine(
            xs.astype(np.float64), lses, return_lse=True, is_lse_base_on_e=base_e)
        magnitude = cupy_dcp.lse_weighted_combine(np.abs(xs.astype(np.float64)), lses,
                                                  is_lse_base_on_e=base_e)
    heads = slice(rank * HN, (rank + 1) * HN)
    return ref[:, heads], ref_lse[:, heads], magnitude[:, heads]


def check_rank_result(got, got_lse, ref, ref_lse, magnitude, where):
    """Within 1 ulp of the output dtype plus the float32 accumulation bound (16 float32
    ulps of sum_r w_r |x_r|: the GPU sums in float32, the oracle in float64); rows
    with every shard empty exactly 0; the LSE within 1e-5."""
    dtype = np.dtype(got.dtype)
    got64 = got.astype(np.float64)
    assert np.isfinite(got64).all(), f"{where}: non-finite output"
    tol = ulp(ref, dtype) + 16.0 * 2.0 ** -24 * magnitude
    bad = np.abs(got64 - ref) > tol
    assert not bad.any(), f"{where}: {int(bad.sum())} outputs off, e.g. {got64[bad][:3]} vs {ref[bad][:3]}"
    np.testing.assert_array_equal(got64[np.isneginf(ref_lse)], 0.0, err_msg=where)
    if got_lse is not None:
        assert_lse_close(got_lse, ref_lse, where)


def host(a, dtype):
    import cupy
    return cupy.asnumpy(a.view(np.uint16) if dtype.itemsize == 2 else a).view(dtype)


def call_kwargs(rank, masked, head_major, tokens, D, dtype):
    """The call's optional device arguments: this rank's masks, and a head-major
    ``out=`` (``[H/N, B, D]`` storage seen as ``[B, H/N, D]``, NaN-filled)."""
    import cupy
    kw = {}
    if masked:
        kw = dict(seq_lens=cupy.asarray(seq_lens_of(rank)),
                  query_start_loc=cupy.asarray(QUERY_START_LOC))
    if head_major:
        kw["out"] = cupy.full((HN, tokens, D), np.nan, dtype=dtype).transpose(1, 0, 2)
    return kw


def misaligned(a):
    """A copy of the device array ``a`` whose data starts one element past an aligned
    address: 16-bit rows then cannot be seen as 4-byte words (a plan stages them)."""
    import cupy
    flat = cupy.empty(a.size + 1, dtype=a.dtype)
    view = flat[1:].reshape(a.shape)
    view[...] = a
    return view


def kernel_counts():
    """This process's kernels compiled and loaded so far (``_cache.stats``)."""
    from cupy_dcp.kernels import _cache

    counts = _cache.stats()
    return counts["compiled"], counts["loaded"]


def functional_cases(world, comm):
    import cupy
    rank = world.Get_rank()
    combos = itertools.product((cupy_dcp.dcp_a2a_lse_reduce, cupy_dcp.dcp_ag_rs_lse_reduce), DTYPES,
                               (True, False), (True, False), (False, True), (False, True))
    for case, (reduce, dtype, base_e, return_lse, masked, head_major) in enumerate(combos):
        D = (5, 72, 576)[case % 3]
        where = f"rank {rank} functional case {case} {reduce.__name__} {dtype} D={D}"
        x, lse = rank_inputs(rank, case, dtype, D, HN * world.Get_size())
        dx, dl = cupy.asarray(x), cupy.asarray(lse)
        kw = call_kwargs(rank, masked, head_major, B, D, dtype)
        res = reduce(dx, dl, comm, return_lse=return_lse, is_lse_base_on_e=base_e, **kw)
        got, got_lse = res if return_lse else (res, None)
        if head_major:
            assert got is kw["out"], where
        assert isinstance(got, cupy.ndarray) and got.shape == (B, HN, D), where
        ref, ref_lse, scale = expected(world, x, lse, base_e, masked)
        check_rank_result(host(got, dtype), None if got_lse is None else cupy.asnumpy(got_lse),
                          ref, ref_lse, scale, where)
    # a call made while another GPU is current runs on the rank's own, all the same
    dtype = DTYPES[1]
    x, lse = rank_inputs(rank, 400, dtype, 64, HN * world.Get_size())
    dx, dl = cupy.asarray(x), cupy.asarray(lse)
    with cupy.cuda.Device((comm.device + 1) % cupy.cuda.runtime.getDeviceCount()):
        got = cupy_dcp.dcp_a2a_lse_reduce(dx, dl, comm)
    ref, ref_lse, scale = expected(world, x, lse, True, False)
    check_rank_result(host(got, dtype), None, ref, ref_lse, scale,
                      f"rank {rank} functional call with another GPU current")


def interop_cases(world, comm):
    """Inputs handed over from PyTorch (bfloat16, by DLPack) and JAX, where installed."""
    import cupy
    rank, n = world.Get_rank(), world.Get_size()
    dtype = DTYPES[1]  # bfloat16
    x, lse = rank_inputs(rank, 300, dtype, 64, HN * n)
    ref, ref_lse, magnitude = expected(world, x, lse, True, False)
    try:
        import torch
        have_torch = torch.cuda.is_available()
    except ImportError:
        have_torch = False
    if have_torch:
        device = f"cuda:{comm.device}"  # this rank's GPU, not torch's default one
        tx = torch.from_numpy(x.view(np.int16).copy()).to(device).view(torch.bfloat16)
        got, got_lse = cupy_dcp.dcp_a2a_lse_reduce(tx, torch.from_numpy(lse).to(device), comm,
                                                   return_lse=True)
        torch.cuda.synchronize()
        assert isinstance(got, cupy.ndarray), type(got)
        check_rank_result(host(got, dtype), cupy.asnumpy(got_lse), ref, ref_lse, magnitude,
                          f"rank {rank} torch inputs")
    # JAX would otherwise take 75% of every GPU in each rank's process
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import jax
        gpus = jax.devices("gpu")
    except Exception:  # no JAX, or JAX without a GPU
        gpus = []
    if gpus:
        x32, lse32 = rank_inputs(rank, 301, np.dtype(np.float32), 64, HN * n)
        ref, ref_lse, magnitude = expected(world, x32, lse32, True, False)
        # this rank's GPU, and the copies complete: the library reads arrays in place
        # and orders nothing on JAX's streams
        # JAX's device id need not be the CUDA ordinal (under mpirun it can number the
        # GPUs of every process); its local hardware id is
        gpu = next(g for g in gpus if getattr(g, "local_hardware_id", g.id) == comm.device)
        jx = jax.device_put(x32, gpu).block_until_ready()
        jl = jax.device_put(lse32, gpu).block_until_ready()
        where = pointer_device(kernel_array(jx, np.float32).ptr)
        assert where == comm.device, f"rank {rank}: JAX put its array on GPU {where}, " \
            f"not on this rank's GPU {comm.device} (a test set-up problem, not the library's)"
        got, got_lse = cupy_dcp.dcp_a2a_lse_reduce(jx, jl, comm, return_lse=True)
        check_rank_result(cupy.asnumpy(got), cupy.asnumpy(got_lse), ref, ref_lse, magnitude,
                          f"rank {rank} JAX inputs")
    return have_torch, bool(gpus)


def refused_before_staging(world, plan, dtype, D):
    """A fresh plan refuses an ``out_lse`` that shares memory with ``out`` before it
    stages the partials as words: 16-bit partials it would copy into a buffer of
    its own leave that buffer unmade. Then the same call with the two apart runs."""
    import cupy
    rank, n = world.Get_rank(), world.Get_size()
    x, lse = rank_inputs(rank, 99, dtype, D, HN * n)
    dx, dl = misaligned(cupy.asarray(x)), cupy.asarray(lse)
    out = cupy.empty((B, HN, D), dtype=dtype)
    store = cupy.empty(B * HN + 1, dtype=cupy.float32)
    for out_lse, refused in ((out.view(cupy.uint8)[:, 0, :4 * HN].view(cupy.float32), True),
                             (store[1:].reshape(B, HN), False)):
        if refused:
            try:
                plan(dx, dl, out=out, out_lse=out_lse.reshape(B, HN))
            except ValueError as e:
                assert str(e).startswith("out_lse shares memory with out"), e
            else:
                raise AssertionError("out_lse on out's memory was not refused")
            staged = getattr(plan, "_x_words", None)
            assert staged is None, f"{type(plan).__name__} staged the partials first"
        else:
            got, got_lse = plan(dx, dl, out=out, out_lse=out_lse)
            assert got is out and got_lse is out_lse
            ref, ref_lse, scale = expected(world, x, lse, True, False)
            check_rank_result(host(got, dtype), cupy.asnumpy(got_lse), ref, ref_lse, scale,
                              f"rank {rank} {type(plan).__name__} {dtype} after a refusal")


def plan_cases(world, comm):
    import cupy
    rank, n = world.Get_rank(), world.Get_size()
    for plan_type, dtype in itertools.product((cupy_dcp.DcpA2APlan, cupy_dcp.DcpAgRsPlan), DTYPES):
        D = 128
        plan = plan_type(comm, B, HN * n, D, dtype, return_lse=True)
        built = kernel_counts()  # a call builds no kernel: the plan built what it launches
        refused_before_staging(world, plan, dtype, D)
        # the last call is made while another GPU is current (as JAX leaves it): the plan
        # still runs on its own GPU, stream=None meaning that GPU's current stream
        other = (comm.device + 1) % cupy.cuda.runtime.getDeviceCount()
        for call in range(3):  # buffer reuse with changing inputs and sizes
            tokens = B - call
            x, lse = rank_inputs(rank, 100 + call, dtype, D, HN * n)
            x, lse = x[:tokens], lse[:tokens]
            dx, dl = cupy.asarray(x), cupy.asarray(lse)
            kw = {}
            if call == 1:  # partials and result that 16-bit kernels cannot see as words
                dx = misaligned(dx)
                kw["out"] = misaligned(cupy.full((tokens, HN, D), np.nan, dtype=dtype))
            with cupy.cuda.Device(other if call == 2 else comm.device):
                got, got_lse = plan(dx, dl, **kw)
                assert cupy.cuda.runtime.getDevice() == (other if call == 2 else comm.device)
            assert kernel_counts() == built, (plan_type.__name__, dtype, call)
            if kw:
                assert got is kw["out"]
            ref, ref_lse, scale = expected(world, x, lse, True, False)
            check_rank_result(host(got, dtype), cupy.asnumpy(got_lse), ref, ref_lse, scale,
                              f"rank {rank} {plan_type.__name__} {dtype} call {call}")
        # a decode loop: the same arrays at every call, refilled in place (the plan then
        # replays the call it remembered, checks and all), with and without out=
        x_buf = cupy.empty((B, HN * n, D), dtype=dtype)
        lse_buf = cupy.empty((B, HN * n), dtype=cupy.float32)
        out = cupy.empty((B, HN, D), dtype=dtype)
        for call in range(4):
            x, lse = rank_inputs(rank, 300 + call, dtype, D, HN * n)
            x_buf[...] = cupy.asarray(x)
            lse_buf[...] = cupy.asarray(lse)
            out.fill(np.nan)
            kw = dict(out=out) if call % 2 else {}
            got, got_lse = plan(x_buf, lse_buf, **kw)
            assert (got is out) == bool(kw) and kernel_counts() == built
            ref, ref_lse, scale = expected(world, x, lse, True, False)
            check_rank_result(host(got, dtype), cupy.asnumpy(got_lse), ref, ref_lse, scale,
                              f"rank {rank} {plan_type.__name__} {dtype} same arrays {call}")
        assert all(_repeat_key(x_buf, lse_buf, o, None, None, None) in plan._repeats
                   for o in (None, out))  # with and without out=


def graph_cases(world, comm):
    import cupy
    rank, n = world.Get_rank(), world.Get_size()
    for plan_type, dtype in itertools.product((cupy_dcp.DcpA2APlan, cupy_dcp.DcpAgRsPlan), DTYPES):
        D = 512
        plan = plan_type(comm, B, HN * n, D, dtype, return_lse=True)
        stream = cupy.cuda.Stream(non_blocking=True)
        x_buf = cupy.zeros((B, HN * n, D), dtype=dtype)
        lse_buf = cupy.zeros((B, HN * n), dtype=cupy.float32)
        with stream:
            plan(x_buf, lse_buf, stream=stream)  # NCCL connects peers lazily: once eagerly
            stream.synchronize()
            world.Barrier()
            stream.begin_capture()
            got, got_lse = plan(x_buf, lse_buf, stream=stream)
            graph = stream.end_capture()
        for replay in range(3):
            x, lse = rank_inputs(rank, 200 + replay, dtype, D, HN * n)
            x_buf[...] = cupy.asarray(x)
            lse_buf[...] = cupy.asarray(lse)
            cupy.cuda.get_current_stream().synchronize()
            graph.launch(stream)
            stream.synchronize()
            ref, ref_lse, scale = expected(world, x, lse, True, False)
            check_rank_result(host(got, dtype), cupy.asnumpy(got_lse), ref, ref_lse, scale,
                              f"rank {rank} graph {plan_type.__name__} {dtype} replay {replay}")


def main(backend):
    world = MPI.COMM_WORLD
    comm = cupy_dcp.Communicator.from_mpi(world, backend=backend)
    comm.select_device()  # the "mpi" backend leaves the device to us: arrays go on the rank's GPU
    functional_cases(world, comm)
    plan_cases(world, comm)
    if backend == "nccl":
        graph_cases(world, comm)
    torch_ran, jax_ran = interop_cases(world, comm)
    world.Barrier()
    return {"backend": backend, "graphs": backend == "nccl", "torch_inputs": torch_ran,
            "jax_inputs": jax_ran}


if __name__ == "__main__":
    run_worker(main, sys.argv[1] if len(sys.argv) > 1 else "nccl")
