"""dcp_a2a_lse_reduce: pack, ONE all-to-all, exact combine."""

import numpy as np

from . import _checks
from .comm import as_communicator
from .layout import as_dtype, bits_dtype, send_buffer_shape
from .kernels import combine_host, pack_host
from .reference import unpack_reference

__all__ = ["dcp_a2a_lse_reduce"]


def _is_host_array(x):
    return isinstance(x, np.ndarray)


def dcp_a2a_lse_reduce(cp_attn_out, cp_attn_lse, comm, return_lse=False,
                       is_lse_base_on_e=True, out=None, seq_lens=None,
                       query_start_loc=None, stream=None, check_consistency=False):
    """Combine the partial attention outputs of a DCP group; rank r keeps heads r*H/N ... (r+1)*H/N-1.

    Collective: every rank of ``comm`` calls it with the same B, H, D and dtype.

    Args:
        cp_attn_out: ``[B, H, D]`` float16, bfloat16 or float32, any strides;
            this rank's partial attention output for all H heads of B tokens.
        cp_attn_lse: ``[B, H]`` float; the LSE of the scores this rank saw
            (converted to float32; NaN and +inf mean "empty").
        comm: a :class:`Communicator` or an mpi4py communicator of N ranks.
        return_lse: also return the global LSE.
        is_lse_base_on_e: natural-log LSEs; ``False`` for base 2.
        out: optional ``[B, H/N, D]`` array of ``cp_attn_out``'s dtype that
            receives the result (any strides).
        seq_lens: optional ``[S]`` integers, this rank's KV length of each
            sequence; a sequence of length 0 contributes nothing.
        query_start_loc: ``[S+1]`` integers, the first token of each sequence;
            tokens at or past ``query_start_loc[-1]`` are padding and contribute
            nothing. Given together with ``seq_lens``.
        stream: device arrays only: the stream of the whole call (pack,
            exchange, combine); ``None`` is CuPy's current stream. The call
            never synchronises the host.
        check_consistency: first check, with one small MPI exchange, that
            every rank called with the same B, H, D, dtype and options (and
            passed its own checks): a mismatch raises the same ``ValueError``
            on every rank instead of hanging or mixing data. Off by default:
            it costs a host round trip per call.

    Host (NumPy) arrays are exchanged with MPI; device arrays (CuPy, Numba,
    or any array with ``__cuda_array_interface__`` or DLPack: PyTorch, JAX)
    are read in place and exchanged with NCCL, through a cached
    :class:`DcpA2APlan` (use a plan directly in decode loops and CUDA graphs).

    Returns:
        ``[B, H/N, D]`` in ``cp_attn_out``'s dtype (``out`` when given; a NumPy
        array for host inputs, a CuPy array for device inputs): the exact
        attention output of this rank's heads; with ``return_lse``, also the
        global LSE ``[B, H/N]`` float32. A group of one returns its inputs.

    Raises:
        ValueError, TypeError: bad shapes or dtypes, before anything is exchanged
            (with ``check_consistency``, on every rank alike).
    """
    comm = as_communicator(comm)
    try:
        B, H, D, dtype, on_host = _check_call(cp_attn_out, cp_attn_lse, comm.world_size, out,
                                              seq_lens, query_start_loc)
    except (ValueError, TypeError) as exc:
        if check_consistency:  # every rank raises, none is left waiting in the exchange
            comm.agree("dcp_a2a_lse_reduce", dict(error=exc))
        raise
    if check_consistency:
        comm.agree("dcp_a2a_lse_reduce", dict(
            tokens=B, num_heads=H, head_dim=D, dtype=dtype.name, return_lse=bool(return_lse),
            is_lse_base_on_e=bool(is_lse_base_on_e), masked=seq_lens is not None,
            arrays="host" if on_host else "device"))
    hn = H // comm.world_size
    if not on_host:
        return _reduce_device(cp_attn_out, cp_attn_lse, comm, return_lse, is_lse_base_on_e,
                              out, seq_lens, query_start_loc, stream, (B, hn, D))
    return _reduce_host(cp_attn_out, cp_attn_lse, comm, return_lse, is_lse_base_on_e,
                        out, seq_lens, query_start_loc, dtype)


def _check_call(x, lse, world_size, out, seq_lens, query_start_loc):
    """The local checks of a call: ``(B, H, D, dtype, on_host)``."""
    B, H, D, dtype = _checks.check_inputs(x, lse, world_size)
    if out is not None:
        _checks.check_out(out, (B, H // world_size, D), dtype)
    _checks.check_mask(seq_lens, query_start_loc)
    on_host = _is_host_array(x), _is_host_array(lse)
    if on_host[0] != on_host[1]:
        raise TypeError("cp_attn_out and cp_attn_lse must both be host (NumPy) or both be "
                        f"device arrays (got {type(x).__name__} and {type(lse).__name__})")
    return B, H, D, dtype, on_host[0]


def _reduce_host(x, lse, comm, return_lse, base_e, out, seq_lens, query_start_loc, dtype):
    B, H, D = x.shape
    n = comm.world_size
    lse32 = np.asarray(lse, dtype=np.float32)
    if n == 1:
        if out is not None:
            out[...] = x
            x = out
        return (x, lse32) if return_lse else x
    ubits = bits_dtype(dtype)
    send = np.empty(send_buffer_shape(n, B, H, D, dtype), dtype=ubits)
    recv = np.empty_like(send)
    if seq_lens is not None:
        seq_lens = np.asarray(seq_lens)
        query_start_loc = np.asarray(query_start_loc)
    pack_host(x.view(ubits), lse32.view(np.uint32), send, seq_lens, query_start_loc)
    comm.alltoall_host(send, recv)
    parts, lses = unpack_reference(recv.view(dtype), D)
    acc = np.empty((B, H // n, D), dtype=np.float64)
    global_lse = np.empty((B, H // n), dtype=np.float64)
    combine_host(parts.astype(np.float32), lses, acc, global_lse, base_e)
    result = acc.astype(np.float32).astype(dtype)
    if out is not None:
        out[...] = result
        result = out
    return (result, global_lse.astype(np.float32)) if return_lse else result


_PLANS = {}
_RETIRED = []  # outgrown plans: a CUDA graph may still replay on their buffers


def _reduce_device(x, lse, comm, return_lse, base_e, out, seq_lens, query_start_loc,
                   stream, result_shape):
    import cupy

    from .plan import DcpA2APlan

    B, hn, D = result_shape
    H = hn * comm.world_size
    dtype = as_dtype(x.dtype)
    if comm.world_size == 1:
        if out is not None:
            out[...] = cupy.asarray(x)
            x = out
        return (x, cupy.asarray(lse).astype(cupy.float32, copy=False)) if return_lse else x
    key = (id(comm), H, D, dtype, bool(return_lse), bool(base_e))
    plan = _PLANS.get(key)
    if plan is None or plan.max_tokens < B:
        if plan is not None:
            _RETIRED.append(plan)
        size = 1 << max(B - 1, 0).bit_length()  # grow in powers of two
        plan = _PLANS[key] = DcpA2APlan(comm, max(size, 1), H, D, dtype, return_lse, base_e)
    with cupy.cuda.Device(comm.device):
        result = cupy.empty(result_shape, dtype=dtype) if out is None else out
        result_lse = cupy.empty((B, hn), dtype=cupy.float32) if return_lse else None
    return plan(x, lse, out=result, out_lse=result_lse, seq_lens=seq_lens,
                query_start_loc=query_start_loc, stream=stream)
