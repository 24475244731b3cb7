"""dcp_a2a_lse_reduce: pack, ONE all-to-all, exact combine."""

import numpy as np

from . import _checks
from ._host_arrays import host_view, is_device_array
from ._signed import TRAILER_BYTES
from .comm import as_communicator, require_cupy
from .layout import bits_dtype, c_strides, round_from_float64, send_buffer_shape
from .kernels import (agrs_correct_host, agrs_lse_host, combine_host, mask_lse_host,
                      pack_host)
from .kernels._format import split_packed

__all__ = ["dcp_a2a_lse_reduce", "dcp_ag_rs_lse_reduce"]


def dcp_a2a_lse_reduce(cp_attn_out, cp_attn_lse, comm, return_lse=False,
                       is_lse_base_on_e=True, out=None, seq_lens=None,
                       query_start_loc=None, stream=None, check_consistency=False):
    """Combine the partial attention outputs of a DCP group; rank r keeps heads r*H/N ... (r+1)*H/N-1.

    Collective: every rank of ``comm`` calls it with the same B, H, D and dtype, and
    with masks of the same number of sequences S, or none (on device arrays a plan
    sized by B and S is made, collectively, where the cached one is too small).

    Args:
        cp_attn_out: ``[B, H, D]`` float16, bfloat16 or float32, any strides;
            this rank's partial attention output for all H heads of B tokens.
        cp_attn_lse: ``[B, H]`` float; the LSE of the scores this rank saw
            (converted to float32; NaN and +inf mean "empty"; a host value
            beyond the float32 range is a ``ValueError``).
        comm: a :class:`Communicator` or an mpi4py communicator of N ranks.
        return_lse: also return the global LSE.
        is_lse_base_on_e: ``True`` for natural-log LSEs, ``False`` for base 2
            (anything else is a ``TypeError``).
        out: optional ``[B, H/N, D]`` writeable array of ``cp_attn_out``'s
            dtype that receives the result (any strides; no two elements in
            the same memory: ``ValueError``).
        seq_lens: optional ``[S]`` integers >= 0, this rank's KV length of each
            sequence; a sequence of length 0 contributes nothing.
        query_start_loc: ``[S+1]`` non-decreasing integers, the first token of
            each sequence; tokens before ``query_start_loc[0]`` or at or past
            ``query_start_loc[-1]`` are padding and contribute nothing. Given
            together with ``seq_lens``. Host masks are checked (a negative
            length, a decreasing start or a uint64 >= 2**63 is a
            ``ValueError``); device masks are not (that would synchronise the
            host): there a negative length reads as 0.
        stream: device arrays only: the stream of the whole call (pack,
            exchange, combine); ``None`` is CuPy's current stream. The call
            never synchronises the host.
        check_consistency: first check, with one small MPI exchange, that
            every rank called with the same strategy, B, H, D, dtype and
            options (and passed its own checks): a mismatch raises the same
            ``ValueError`` on every rank before any data moves. Off by
            default: it costs a host round trip per call. Host calls check
            the same fields without it, for free: each chunk carries its
            sender's signature (strategy, B, H, D, dtype, base, call number),
            which every receiver compares with its own.

    Host arrays (NumPy, or any array whose DLPack device is the CPU: a
    PyTorch CPU tensor, a JAX array on the CPU; bfloat16 too) are read in
    place and exchanged with MPI; every array of a host call (``out`` and
    the masks too) must be a host array. Device arrays (CuPy, Numba, or any
    array with ``__cuda_array_interface__`` or DLPack: PyTorch, JAX) are read
    in place and exchanged with NCCL, through a cached :class:`DcpA2APlan`
    (use a plan directly in decode loops and CUDA graphs).

    Returns:
        ``[B, H/N, D]`` in ``cp_attn_out``'s dtype (``out`` itself when given;
        else a NumPy array for host inputs, a CuPy array for device inputs): the exact
        attention output of this rank's heads; with ``return_lse``, also the
        global LSE ``[B, H/N]`` float32. A group of one applies the same
        rules as a larger group (masks, NaN and +inf LSEs mean "empty":
        output 0, LSE -inf; every other row is its input).

    Raises:
        ValueError, TypeError: bad shapes, dtypes or values, before anything
            is exchanged. On the host path, a rank that fails its own checks
            still takes part in the exchange, so that every rank raises the
            same exception type (the failing rank its own error, the others
            ``"rank r failed its checks: ..."``); so does every rank of a
            call whose ranks disagree (``ValueError`` naming the field and
            the ranks). On the device path that needs ``check_consistency``.
        RuntimeError: a host wait did not complete within the
            communicator's timeout (ten minutes by default), the
            communicator was freed, or a peer gave up waiting for this rank.
    """
    return _reduce("a2a", cp_attn_out, cp_attn_lse, comm, return_lse, is_lse_base_on_e, out,
                   seq_lens, query_start_loc, stream, check_consistency)


def dcp_ag_rs_lse_reduce(cp_attn_out, cp_attn_lse, comm, return_lse=False,
                         is_lse_base_on_e=True, out=None, seq_lens=None,
                         query_start_loc=None, stream=None, check_consistency=False):
    """The same combine as :func:`dcp_a2a_lse_reduce`, by all-gather + reduce-scatter.

    Every rank all-gathers the LSEs ``[N, B, H]``, scales each of its heads
    by its exact weight, and a reduce-scatter sums the ranks' terms (float64
    on the host, float32 on the GPU), rounded once to the output dtype. Same
    arguments, contract and errors as :func:`dcp_a2a_lse_reduce`, within the
    same error bound, though not always to the bit: MPI and NCCL sum the
    ranks' terms in an order of their own (seen at N = 4: one output ulp). It
    moves about twice the bytes, and is the baseline the all-to-all is
    measured against (``python -m cupy_dcp.bench``).
    """
    return _reduce("ag_rs", cp_attn_out, cp_attn_lse, comm, return_lse, is_lse_base_on_e, out,
                   seq_lens, query_start_loc, stream, check_consistency)


def _reduce(strategy, x, lse, comm, return_lse, base_e, out, seq_lens, query_start_loc,
            stream, check_consistency):
    comm = as_communicator(comm)
    comm.check_usable()
    name = f"dcp_{strategy}_lse_reduce"
    # a host call unless both are device arrays: a rank that passes something else (a
    # list, None) takes part in the host exchange to fail with its peers, instead of
    # leaving them to pair this call with its next one
    host_call = not (is_device_array(x) and is_device_array(lse))
    if host_call:  # an 'nccl' communicator takes no host call: every such rank raises at once
        if comm.backend == "nccl":
            _refuse_on_nccl(x, lse)
        comm._check_host()
    call = comm.next_call() if host_call else None
    given_out = out
    try:
        check_consistency = _checks.check_flag(check_consistency, "check_consistency")
        return_lse = _checks.check_flag(return_lse, "return_lse")
        base_e = _checks.check_flag(base_e, "is_lse_base_on_e")
        if host_call:  # another framework's host arrays as NumPy views (bfloat16 too)
            x, lse = host_view(x, "cp_attn_out"), host_view(lse, "cp_attn_lse")
            out, seq_lens = host_view(out, "out"), host_view(seq_lens, "seq_lens")
            query_start_loc = host_view(query_start_loc, "query_start_loc")
        B, H, D, dtype, on_host = _check_call(x, lse, comm.world_size, out, seq_lens,
                                              query_start_loc)
        if on_host:  # (a device call's plan checks it as it is made)
            _checks.check_cache_setting()
    except Exception as exc:
        # every rank raises, none is left waiting in the exchange (whatever failed here)
        if check_consistency is True:  # (not when it is the bad argument)
            comm.agree(name, dict(error=exc))
        elif host_call and comm.world_size > 1:
            comm.fail_together(name, exc)
        raise
    if check_consistency:
        comm.agree(name, dict(
            strategy=strategy, tokens=B, num_heads=H, head_dim=D, dtype=_dtype_tag(dtype),
            return_lse=return_lse, is_lse_base_on_e=base_e,
            masked=seq_lens is not None, arrays="host" if on_host else "device",
            call_number=call))
    if on_host:
        if seq_lens is not None:
            seq_lens, query_start_loc = np.asarray(seq_lens), np.asarray(query_start_loc)
        # A group of one runs the same combine: masks and empty shards mean what they
        # mean in a group of two.
        run = _a2a_host if strategy == "a2a" or comm.world_size == 1 else _ag_rs_host
        signature = dict(strategy=strategy, tokens=B, num_heads=H, head_dim=D,
                         dtype=_dtype_tag(dtype), is_lse_base_on_e=base_e, call_number=call)
        result, result_lse = run(x, np.asarray(lse, dtype=np.float32), comm, base_e, seq_lens,
                                 query_start_loc, dtype, (name, signature))
        if out is not None:
            out[...] = result
            result = given_out
        return (result, result_lse) if return_lse else result
    if comm.world_size == 1:
        return _single_device(x, lse, out, return_lse, seq_lens, query_start_loc, stream, dtype)
    return _reduce_device(strategy, x, lse, comm, return_lse, base_e, out, seq_lens,
                          query_start_loc, stream, (B, H // comm.world_size, D), dtype)


def _dtype_tag(dtype):
    """The dtype as the ranks compare it: its name, after its byte order where that is
    not the machine's (the host path moves raw bytes: ranks of other byte orders would
    read each other's values wrong)."""
    return dtype.name if dtype.isnative else dtype.byteorder + dtype.name


def _single_device(x, lse, out, return_lse, seq_lens, query_start_loc, stream, dtype):
    """A group of one on the device, on ``stream``: the rules of a larger group
    (:mod:`cupy_dcp._single`), in ``out`` when given."""
    from ._single import single_device
    from .kernels._arrays import cupy_stream, stream_ptr

    require_cupy("a call on device arrays")
    bits, result_lse = single_device(x, lse, bits_dtype(dtype), seq_lens, query_start_loc, stream)
    result = bits.view(dtype)
    if out is not None:
        with cupy_stream(stream_ptr(stream)):
            out[...] = result
        result = out
    return (result, result_lse) if return_lse else result


def _refuse_on_nccl(x, lse):
    """A call that is not on two device arrays, on an 'nccl' communicator: the error
    of its arguments, where they are not two host arrays."""
    for name, arr in (("cp_attn_out", x), ("cp_attn_lse", lse)):
        _checks.check_array(arr, name)
    if is_device_array(x) or is_device_array(lse):
        raise TypeError(_mixed_arrays(x, lse))


def _mixed_arrays(x, lse):
    return ("cp_attn_out and cp_attn_lse must both be host (NumPy, or on the CPU by DLPack) "
            f"or both be device arrays (got {type(x).__name__} and {type(lse).__name__})")


def _check_call(x, lse, world_size, out, seq_lens, query_start_loc):
    """The local checks of a call: ``(B, H, D, dtype, on_host)``."""
    B, H, D, dtype = _checks.check_inputs(x, lse, world_size)
    if out is not None:
        _checks.check_out(out, (B, H // world_size, D), dtype)
    _checks.check_mask(seq_lens, query_start_loc)
    on_host = isinstance(x, np.ndarray), isinstance(lse, np.ndarray)
    if on_host[0] != on_host[1]:
        raise TypeError(_mixed_arrays(x, lse))
    if on_host[0] and out is not None and not isinstance(out, np.ndarray):
        raise TypeError(f"host inputs take a host out (got {type(out).__name__})")
    if on_host[0] and seq_lens is not None and not (
            isinstance(seq_lens, np.ndarray) and isinstance(query_start_loc, np.ndarray)):
        raise TypeError("host inputs take host seq_lens and query_start_loc (got "
                        f"{type(seq_lens).__name__} and {type(query_start_loc).__name__})")
    _checks.check_lse_range(lse)
    return B, H, D, dtype, on_host[0]


def _rows(count, nbytes):
    """``[count, nbytes + TRAILER_BYTES]`` uint8: a signed message a row."""
    return np.empty((count, nbytes + TRAILER_BYTES), dtype=np.uint8)


def _in_rows(rows, shape, dtype):
    """``shape`` (first axis: the rows) of ``dtype``, C order within each row of ``rows``."""
    dtype = np.dtype(dtype)
    inner = c_strides(shape[1:], dtype.itemsize)
    return np.ndarray(shape, dtype, buffer=rows, strides=(rows.strides[0],) + inner)


def _a2a_host(x, lse32, comm, base_e, seq_lens, query_start_loc, dtype, signed):
    """Pack, one signed all-to-all, combine; ``(result [B, H/N, D], lse [B, H/N] float32)``."""
    B, H, D = x.shape
    n = comm.world_size
    ubits = bits_dtype(dtype)
    shape = send_buffer_shape(n, B, H, D, dtype)
    chunk = int(np.prod(shape[1:])) * ubits.itemsize
    send_rows = _rows(n, chunk)
    send = _in_rows(send_rows, shape, ubits)
    pack_host(x.view(ubits), lse32.view(np.uint32), send, seq_lens, query_start_loc)
    recv = send
    if n > 1:
        recv_rows = _rows(n, chunk)
        comm.exchange_signed(send_rows, recv_rows, signed[1], signed[0])
        recv_rows[comm.rank, :chunk] = send_rows[comm.rank, :chunk]
        recv = _in_rows(recv_rows, shape, ubits)
    parts, lses = split_packed(recv.view(dtype), D)
    acc = np.empty((B, H // n, D), dtype=np.float64)
    global_lse = np.empty((B, H // n), dtype=np.float64)
    combine_host(parts.astype(np.float32), lses, acc, global_lse, base_e)
    return round_from_float64(acc, dtype), global_lse.astype(np.float32)


def _ag_rs_host(x, lse32, comm, base_e, seq_lens, query_start_loc, dtype, signed):
    """All-gather the LSEs (signed), correct, reduce-scatter (float64); the results of
    ``_a2a_host`` within its error bound (MPI sums the ranks' terms in its own order)."""
    B, H, D = x.shape
    n = comm.world_size
    nbytes = B * H * 4
    send_rows, recv_rows = _rows(1, nbytes), _rows(n, nbytes)
    mine = _in_rows(send_rows, (1, B, H), np.float32)[0]
    mine[...] = lse32  # a private C-ordered copy (any strides in): masking writes it
    mask_lse_host(mine, seq_lens, query_start_loc)
    comm.exchange_signed(send_rows, recv_rows, signed[1], signed[0])
    recv_rows[comm.rank, :nbytes] = send_rows[0, :nbytes]
    lses = _in_rows(recv_rows, (n, B, H), np.float32)
    corrected = np.empty((n, B, H // n, D), dtype=np.float64)
    agrs_correct_host(x.astype(np.float32), lses, comm.rank, corrected, base_e)
    summed = np.empty((B, H // n, D), dtype=np.float64)
    comm.reduce_scatter_host(corrected, summed)
    global_lse = np.empty((B, H // n), dtype=np.float64)
    agrs_lse_host(lses, comm.rank, H // n, global_lse, base_e)
    return round_from_float64(summed, dtype), global_lse.astype(np.float32)


def _plan_size(tokens, seq_lens):
    """The ``max_tokens`` of the functional API's plan for a call: a power of two (plans
    grow by doubling) of at least the call's tokens and sequences (a plan bounds both)."""
    need = tokens if seq_lens is None else max(tokens, int(seq_lens.shape[0]))
    return 1 << max(need - 1, 0).bit_length()


def _reduce_device(strategy, x, lse, comm, return_lse, base_e, out, seq_lens, query_start_loc,
                   stream, result_shape, dtype):
    from .kernels._arrays import stream_ptr
    from .plan import DcpA2APlan, DcpAgRsPlan

    B, hn, D = result_shape
    H = hn * comm.world_size
    kind = DcpA2APlan if strategy == "a2a" else DcpAgRsPlan
    try:
        import cupy
    except ImportError:  # every rank raises alike: a plan's creation agrees on it
        kind(comm, _plan_size(B, seq_lens), H, D, dtype, return_lse, base_e)
        raise
    with cupy.cuda.Device(comm.device):  # stream=None: the current stream of the rank's GPU
        ptr = stream_ptr(stream)
    # One cached plan per stream: calls on one stream are ordered, so they may
    # share buffers; calls on two streams must not.
    key = (ptr, strategy, H, D, dtype, bool(return_lse), bool(base_e))
    plans = comm.cached_plans
    plan = plans.get(key)
    size = _plan_size(B, seq_lens)
    if plan is None or plan.max_tokens < size:
        if plan is not None:  # a CUDA graph may still replay on its buffers: keep it
            plans.setdefault("retired", []).append(plan)
        plan = plans[key] = kind(comm, size, H, D, dtype, return_lse, base_e)
    with cupy.cuda.Device(comm.device):
        result = cupy.empty(result_shape, dtype=dtype) if out is None else out
        result_lse = cupy.empty((B, hn), dtype=cupy.float32) if return_lse else None
    return plan(x, lse, out=result, out_lse=result_lse, seq_lens=seq_lens,
                query_start_loc=query_start_loc, stream=ptr)
