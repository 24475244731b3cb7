"""DcpA2APlan: persistent buffers and pre-bound launches for decode loops and CUDA graphs.

A plan owns its send and receive buffers (sized for ``max_tokens``), its
result buffers and its compiled kernels; a call packs, exchanges with one
grouped NCCL send/recv and combines, all on one stream, with no host
synchronisation, so a call can be captured in a CUDA graph and replayed.
Buffers never move or shrink while the plan lives: a graph that captured a
call stays valid as long as the plan (and the arrays the call read) do.
"""

import numpy as np

from . import _checks
from .comm import as_communicator
from .layout import BFLOAT16, as_dtype, bits_dtype, lse_pack_dim
from .kernels._arrays import as_cupy, dummy_index, kernel_array, stream_ptr
from .kernels._launch import DeviceArray
from .kernels._rows import lanes_per_row
from .kernels.combine import combine_kernel, combine_kind, combine_launch
from .kernels.pack import pack_kernel, pack_launch

__all__ = ["DcpA2APlan"]


def _c_strides(shape, itemsize):
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.insert(0, step)
        step *= extent
    return tuple(strides)


class DcpA2APlan:
    """The packed all-to-all combine of one layer shape, ready to call every step.

    Collective to build: every rank of ``comm`` builds it with the same
    arguments (it joins the NCCL communicator if that is not built yet).

    Args:
        comm: a :class:`Communicator` or an mpi4py communicator of N ranks.
        max_tokens: the largest B a call may have.
        num_heads: H, a multiple of N.
        head_dim: D.
        dtype: float16, bfloat16 (``"bfloat16"`` or ``ml_dtypes.bfloat16``) or
            float32: the dtype of the partials and the result.
        return_lse: calls also return the global LSE ``[B, H/N]`` float32.
        is_lse_base_on_e: natural-log LSEs; ``False`` for base 2.

    Calling ``plan(cp_attn_out [B, H, D], cp_attn_lse [B, H])`` returns
    ``[B, H/N, D]`` (and the LSE): a view of the plan's result buffer, valid
    until the next call, unless ``out=`` (and ``out_lse=``) are given.
    """

    def __init__(self, comm, max_tokens, num_heads, head_dim, dtype,
                 return_lse=False, is_lse_base_on_e=True):
        import cupy

        self.comm = comm = as_communicator(comm)
        n = comm.world_size
        try:  # a rank whose arguments are bad makes every rank raise, not wait
            dtype = _check_plan_args(n, max_tokens, num_heads, head_dim, dtype)
            fields = dict(world_size=n, max_tokens=int(max_tokens), num_heads=int(num_heads),
                          head_dim=int(head_dim), dtype=dtype.name, return_lse=bool(return_lse),
                          is_lse_base_on_e=bool(is_lse_base_on_e), strategy="a2a",
                          arrays="device")
        except (ValueError, TypeError) as exc:
            fields = dict(error=exc)
            comm.agree("DcpA2APlan", fields)
            raise
        comm.agree("DcpA2APlan", fields)
        self.dtype = dtype
        self.pack_dim = lse_pack_dim(dtype)
        self.max_tokens, self.num_heads, self.head_dim = int(max_tokens), int(num_heads), int(head_dim)
        self.local_heads = num_heads // n
        self.return_lse = bool(return_lse)
        self.base_e = bool(is_lse_base_on_e)
        self.bits = bits_dtype(dtype)
        self._value = combine_kind(dtype)[1]
        self._width = head_dim + self.pack_dim
        if n > 1:
            comm.nccl()
        itemsize = dtype.itemsize
        self._send = cupy.empty(n * max_tokens * self.local_heads * self._width * itemsize, cupy.uint8)
        self._recv = cupy.empty_like(self._send)
        self._result = cupy.empty((max_tokens, self.local_heads, head_dim), dtype=dtype)
        self._result_lse = cupy.empty((max_tokens, self.local_heads), dtype=cupy.float32)
        self._no_mask = dummy_index()
        self._warm_up()
        self._views = {}

    def _warm_up(self):
        """Compile and load now every kernel a call may pick, never inside a capture."""
        D = self.head_dim
        pack_kernel(self.bits, lanes_per_row(D))
        combine_kernel(self.dtype, False, lanes_per_row(D))
        if self.bits.itemsize == 2 and D % 2 == 0:  # the word-wide variants
            pack_kernel(np.dtype(np.uint32), lanes_per_row(D // 2))
            if self.dtype == BFLOAT16:
                combine_kernel(self.dtype, True, lanes_per_row(D // 2))

    def _buffers(self, tokens):
        """Send and receive views for ``tokens`` tokens, built once per size."""
        views = self._views.get(tokens)
        if views is None:
            n = self.comm.world_size
            shape = (n, tokens, self.local_heads, self._width)
            strides = _c_strides(shape, self.bits.itemsize)
            send = DeviceArray(self._send.data.ptr, shape, strides, self.bits, self._send)
            recv = DeviceArray(self._recv.data.ptr, shape, strides, self.bits, self._recv)
            chunk = tokens * self.local_heads * self._width * self.bits.itemsize
            views = self._views[tokens] = (send, recv, chunk)
        return views

    def __call__(self, cp_attn_out, cp_attn_lse, out=None, out_lse=None,
                 seq_lens=None, query_start_loc=None, stream=None):
        """Combine one step's partials; see the class docstring.

        Args:
            cp_attn_out: ``[B, H, D]`` device array of the plan's dtype, any
                strides, ``B <= max_tokens``.
            cp_attn_lse: ``[B, H]`` float device array (float32 is read in
                place; other float dtypes are converted).
            out: optional ``[B, H/N, D]`` result array, any strides.
            out_lse: optional ``[B, H/N]`` float32 array for the global LSE.
            seq_lens, query_start_loc: optional ``[S]``, ``[S+1]`` integer
                device arrays marking empty and padding tokens.
            stream: the stream of the whole call; ``None`` is CuPy's current
                stream.

        Returns:
            ``[B, H/N, D]`` (and ``[B, H/N]`` float32 when the plan returns the
            LSE). A group of one returns its inputs.
        """
        n = self.comm.world_size
        B, H, D, dtype = _checks.check_inputs(cp_attn_out, cp_attn_lse, n)
        if (H, D) != (self.num_heads, self.head_dim) or dtype != self.dtype:
            raise ValueError(
                f"this plan is for [B, {self.num_heads}, {self.head_dim}] {self.dtype} "
                f"(got [B, {H}, {D}] {dtype})")
        if B > self.max_tokens:
            raise ValueError(f"this plan takes at most {self.max_tokens} tokens (got B={B})")
        _checks.check_mask(seq_lens, query_start_loc)
        if n == 1:
            return self._identity(cp_attn_out, cp_attn_lse, out)
        result = self._result[:B] if out is None else out
        if out is not None:
            _checks.check_out(out, (B, self.local_heads, D), dtype)
        result_lse = None
        if self.return_lse:
            result_lse = self._result_lse[:B] if out_lse is None else out_lse
            if out_lse is not None:
                _checks.check_out(out_lse, (B, self.local_heads), np.dtype(np.float32))
        if B == 0:
            return (result, result_lse) if self.return_lse else result
        ptr = stream_ptr(stream)
        lse = cp_attn_lse
        if as_dtype(lse.dtype) != np.float32:
            import cupy
            lse = cupy.asarray(lse).astype(cupy.float32)
        send, recv, recv_values, chunk = self._buffers(B)
        if seq_lens is None:
            seq = qsl = self._no_mask
            num_seqs = -1
        else:
            seq = kernel_array(_as_int64(seq_lens), np.int64, "seq_lens")
            qsl = kernel_array(_as_int64(query_start_loc), np.int64, "query_start_loc")
            num_seqs = int(seq_lens.shape[0])
        kernel, grid, block, args = pack_launch(
            kernel_array(cp_attn_out, self.bits, "cp_attn_out"),
            kernel_array(lse, np.uint32, "cp_attn_lse"), seq, qsl, num_seqs, send, recv,
            self.comm.rank)
        kernel(grid, block, ptr, args)
        self.comm.alltoall_device(send.ptr, recv.ptr, chunk, ptr)
        lse_arr = None if result_lse is None else kernel_array(result_lse, np.float32, "out_lse")
        kernel, grid, block, args = combine_launch(
            self.dtype, recv, kernel_array(result, self._value, "out"), lse_arr, self.base_e)
        kernel(grid, block, ptr, args)
        return (result, result_lse) if self.return_lse else result

    def _identity(self, x, lse, out):
        if out is not None:
            out[...] = x
            x = out
        if not self.return_lse:
            return x
        return x, as_cupy(lse).astype(np.float32, copy=False)


def _check_plan_args(world_size, max_tokens, num_heads, head_dim, dtype):
    """Validate a plan's sizes and dtype; return the dtype as NumPy's."""
    dtype = as_dtype(dtype)
    lse_pack_dim(dtype)
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1 (got {max_tokens})")
    if head_dim < 1:
        raise ValueError(f"head_dim must be >= 1 (got {head_dim})")
    if num_heads % world_size:
        raise ValueError(
            f"num_heads must be divisible by world_size (got H={num_heads}, N={world_size})")
    return dtype


def _as_int64(x):
    if as_dtype(x.dtype) == np.int64:
        return x
    return as_cupy(x).astype(np.int64)
