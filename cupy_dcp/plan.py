"""Plans: persistent buffers and pre-bound launches for decode loops and CUDA graphs.

A plan owns its exchange buffers (sized for ``max_tokens``), its result
buffers and its compiled kernels; a call launches its kernels and NCCL
collectives on one stream, with no host synchronisation, so a call can be
captured in a CUDA graph and replayed (a plan of one rank excepted: see
``__call__``). Buffers never move or shrink while the
plan lives: a graph that captured a call stays valid as long as the plan (and
the arrays the call read) do.

- :class:`DcpA2APlan`: pack, ONE all-to-all (grouped send/recv; this rank's
  own chunk never crosses it), exact combine; every chunk carries its call's
  signature, so that divergent calls raise (see the class).
- :class:`DcpAgRsPlan`: all-gather of the LSEs, correction of every head by
  this rank's exact weight (float32), reduce-scatter (sum, float32), rounding.
"""

import dataclasses
import functools

import numpy as np

from . import _checks, _settings
from ._compile import a2a_tasks, agrs_tasks, build_shared
from ._divergence import A2A_CODE, MappedWords, divergence_message
from .kernels import _trailer
from .comm import _cupy_problem, as_communicator
from .layout import as_dtype, bits_dtype, c_strides, check_heads, lse_pack_dim
from .kernels._arrays import (_cupy, as_cupy, cupy_stream, cupy_view, dummy_index,
                               kernel_array, output_array, pointer_device, stream_ptr)
from .kernels._format import WRITES_BOTH
from .kernels._launch import DeviceArray, choose_launcher
from .kernels.agrs import correct_launch, finish_launch, mask_launch
from .kernels.combine import combine_codec, combine_launch
from .kernels.pack import pack_launch

__all__ = ["DcpA2APlan", "DcpAgRsPlan"]

_READY_KEPT = 64  # calls a plan keeps ready, by their arrays


def _flat_view(buffer, shape, dtype):
    """A C-contiguous :class:`DeviceArray` of ``shape`` at the start of a CuPy ``buffer``."""
    dtype = np.dtype(dtype)
    return DeviceArray(buffer.data.ptr, shape, c_strides(shape, dtype.itemsize), dtype, buffer)


@dataclasses.dataclass(frozen=True)
class PlanSettings:
    """A plan's arguments, checked and resolved: what every rank agrees on
    (:meth:`fields`) before anything is built, and what the construction hooks
    of :class:`_Plan` build from."""

    world_size: int
    max_tokens: int
    num_heads: int
    head_dim: int
    dtype: np.dtype  # NumPy's
    return_lse: bool
    is_lse_base_on_e: bool
    strategy: str
    launcher: str  # the process's (``kernels._launch.choose_launcher``)

    @property
    def local_heads(self):
        return self.num_heads // self.world_size

    def fields(self):
        """The settings as plain values, in the order ranks compare them."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields["dtype"] = self.dtype.name
        return fields


class _Plan:
    """What every plan shares: collective creation, result buffers, call checks.

    A plan is built in one order, each step from what the steps before it
    return (none hands state to another through ``self``):
    :meth:`_own_settings` (a subclass's own arguments, checked) makes the
    plan's :class:`PlanSettings` (``settings_type``) with the shared ones; the
    ranks agree on them; then :meth:`_prepare_device` (collective, only with
    peers), :meth:`_warm_up` and :meth:`_allocate` (collective) build the plan.
    The plan keeps its settings as :attr:`settings`.
    """

    strategy = None
    settings_type = PlanSettings
    _closed = False
    _stages_words = True  # see _word_arrays (AG+RS reads 16-bit values one by one)
    # Does one kernel write the results while its other blocks still read the inputs?
    # Then a result that shares memory with an input is refused (``_checks.check_apart``)
    _writes_while_reading = False

    def __init__(self, comm, max_tokens, num_heads, head_dim, dtype,
                 return_lse=False, is_lse_base_on_e=True, **options):
        self.comm = comm = as_communicator(comm)
        name = type(self).__name__
        try:  # a rank whose arguments are bad makes every rank raise, not wait
            settings = self.settings_type(
                **_plan_settings(comm.world_size, max_tokens, num_heads, head_dim, dtype,
                                 return_lse, is_lse_base_on_e, self.strategy),
                **self._own_settings(comm, **options))
            problem = _cupy_problem()
            if problem is not None:
                raise RuntimeError(f"{name} needs CuPy and a GPU: {problem}")
            _checks.check_cache_setting()
        except (ValueError, TypeError, RuntimeError) as exc:
            comm.agree(name, dict(error=exc))
            raise
        comm.agree(name, settings.fields())
        self.settings = settings
        self.dtype = settings.dtype
        self.max_tokens, self.num_heads, self.head_dim = (
            settings.max_tokens, settings.num_heads, settings.head_dim)
        self.local_heads = settings.local_heads
        self.return_lse = settings.return_lse
        self.base_e = settings.is_lse_base_on_e
        self.bits = bits_dtype(settings.dtype)
        self._value = combine_codec(settings.dtype)[1]
        # the plan's kernels move 16-bit data of an even D as uint32 words, and only so
        # (their one variant): arrays that cannot be seen as words are staged
        self._words = self._stages_words and self.bits.itemsize == 2 and self.head_dim % 2 == 0
        self._x_words = None  # the staged partials, [max_tokens, H, D], made on first need
        device = self._prepare_device(settings) if comm.world_size > 1 else None
        import cupy

        with cupy.cuda.Device(comm.device):
            # the plan's GPU: the communicator's (None in a group of one over MPI: the
            # current one, where the plan's buffers are made)
            self._device = cupy.cuda.runtime.getDevice()
            T = settings.max_tokens
            self._result = cupy.empty((T, self.local_heads, self.head_dim), dtype=self.dtype)
            self._result_lse = cupy.empty((T, self.local_heads), dtype=cupy.float32)
            self._lse32 = cupy.empty((T, self.num_heads), dtype=cupy.float32)
            self._seq = cupy.empty(T, dtype=cupy.int64)
            self._qsl = cupy.empty(T + 1, dtype=cupy.int64)
            self._no_mask = dummy_index()
            self._views = {}
            self._ready = {}
            self._repeats = {}  # the caller's arrays -> a call made ready (_remember)
            self._results = {}  # B -> the result buffers' [:B] views that calls return
            self._on_device = set()  # addresses _check_device found in this GPU's memory
            # compiled before any exchange buffer exists: nothing to undo
            kernels = self._warm_up(settings, device)
            self._allocate(cupy, settings, device, kernels)

    def _own_settings(self, comm):
        """Check a subclass's own arguments (its ``__init__``'s, passed on as keywords)
        and resolve them: the fields its ``settings_type`` adds to :class:`PlanSettings`
        (a dict). Raises ``ValueError`` or ``TypeError`` for a bad one. None here."""
        return {}

    def _prepare_device(self, settings):
        """Collective, only where the plan has peers: make the communicator ready for
        this plan's exchanges; return what the later steps need to know of the
        devices (here ``None``)."""
        self.comm.prepare_device()

    def _warm_up(self, settings, device):
        """Compile and load now every kernel a call may pick, never inside a capture;
        return what :meth:`_allocate` needs to know of them (or ``None``). ``device``
        is :meth:`_prepare_device`'s answer (``None`` in a group of one)."""
        raise NotImplementedError

    def _allocate(self, cupy, settings, device, kernels):
        """Collective: allocate the exchange buffers; ``kernels`` is :meth:`_warm_up`'s
        answer."""
        raise NotImplementedError

    def __call__(self, cp_attn_out, cp_attn_lse, out=None, out_lse=None,
                 seq_lens=None, query_start_loc=None, stream=None):
        """Combine one step's partials; see the class docstring.

        Args:
            cp_attn_out: ``[B, H, D]`` device array of the plan's dtype, any
                strides, ``B <= max_tokens``.
            cp_attn_lse: ``[B, H]`` float device array (float32 is read in
                place; other float dtypes are converted).
            out: optional ``[B, H/N, D]`` result array, any strides (no two
                elements in the same memory: ``ValueError``), in memory of its
                own: a direct plan refuses one that shares a byte with an input
                its kernel reads in place (``ValueError``).
            out_lse: optional ``[B, H/N]`` float32 array for the global LSE
                (only for a plan with ``return_lse``: ``ValueError`` otherwise),
                in memory of its own as ``out`` is, and sharing no byte with
                ``out`` (``ValueError``).
            seq_lens, query_start_loc: optional ``[S]``, ``[S+1]`` integer
                device arrays marking empty and padding tokens (``S <=
                max_tokens``).
            stream: the stream of the whole call; ``None`` is CuPy's current
                stream.

        A float32 LSE and contiguous int64 masks are read in place; other
        dtypes or strides are converted, on ``stream``, into buffers the plan
        owns. So are, in the A2A and direct plans, 16-bit partials and results
        (even ``D``) whose rows are not contiguous and 4-byte aligned: their
        kernels move such data as 32-bit words. The first call with such
        partials allocates the plan's ``[max_tokens, H, D]`` buffer for them,
        so it must not be captured in a graph (``RuntimeError``); make a call
        with each such layout of partials or result once before a capture
        (its copies are CuPy kernels, built on first use). A plan of one rank
        (no exchange: CuPy operations on the call's stream) is not capturable
        (``RuntimeError``). Calls of one plan must be ordered: on one stream, or
        synchronised by the caller (they share the plan's buffers).

        A decode loop passes the same arrays again and again: a call whose
        arguments are all CuPy arrays (or ``None``) read in place is remembered
        by their addresses, shapes, strides and dtypes, and a later call with
        arrays equal in all four replays it: it checks and converts nothing
        again, and only launches (on ``stream``, on the plan's GPU).

        Returns:
            ``[B, H/N, D]`` (and ``[B, H/N]`` float32 when the plan returns the
            LSE). A group of one follows the rules of a larger group: masked
            tokens and empty rows (a NaN or infinite LSE) give 0 and LSE -inf.
        """
        if self._closed:
            raise RuntimeError(f"this {type(self).__name__} is closed")
        key = _repeat_key(cp_attn_out, cp_attn_lse, out, out_lse, seq_lens, query_start_loc)
        repeat = None if key is None else self._repeats.get(key)
        if repeat is not None:  # a decode loop's call again: its checks all passed before
            steps, result, result_lse = repeat
            self._replay(steps, stream)
            result = result if out is None else out
            if not self.return_lse:
                return result
            return result, (result_lse if out_lse is None else out_lse)
        n = self.comm.world_size
        B, H, D, dtype = _checks.check_inputs(cp_attn_out, cp_attn_lse, n)
        if (H, D) != (self.num_heads, self.head_dim) or dtype != self.dtype:
            raise ValueError(
                f"this plan is for [B, {self.num_heads}, {self.head_dim}] {self.dtype} "
                f"(got [B, {H}, {D}] {dtype})")
        if B > self.max_tokens:
            raise ValueError(f"this plan takes at most {self.max_tokens} tokens (got B={B})")
        _checks.check_mask(seq_lens, query_start_loc)
        if seq_lens is not None and seq_lens.shape[0] > self.max_tokens:
            raise ValueError(f"this plan takes at most {self.max_tokens} sequences "
                             f"(got {seq_lens.shape[0]})")
        if out is not None:
            _checks.check_out(out, (B, self.local_heads, D), dtype)
        if out_lse is not None:
            if not self.return_lse:
                raise ValueError("out_lse is for a plan that returns the LSE (return_lse=True); "
                                 "this one does not, and would leave it unwritten")
            _checks.check_out(out_lse, (B, self.local_heads), np.dtype(np.float32), "out_lse")
        if n == 1:
            return self._single(cp_attn_out, cp_attn_lse, out, out_lse, seq_lens,
                                query_start_loc, stream)
        views = result, result_lse = self._result_views(B)
        result = result if out is None else out
        result_lse = (result_lse if out_lse is None else out_lse) if self.return_lse else None
        if B > 0:
            import cupy

            # The launches go to the current GPU, and stream=None means its current stream:
            # make it the plan's, whatever the caller's is (JAX, for one, changes it).
            with cupy.cuda.Device(self.comm.device):
                ptr = stream_ptr(stream)
                x_bits = kernel_array(cp_attn_out, self.bits, "cp_attn_out")
                result_arr = (kernel_array if out is None else output_array)(result, self._value,
                                                                            "out")
                lse, mask, in_place = self._stage_inputs(B, cp_attn_lse, seq_lens,
                                                         query_start_loc, ptr)
                masks = {} if seq_lens is None else dict(seq_lens=mask[0],
                                                         query_start_loc=mask[1])
                lse_arr = None if result_lse is None else (
                    kernel_array if out_lse is None else output_array)(result_lse, np.float32,
                                                                       "out_lse")
                self._check_given(cp_attn_out=x_bits, cp_attn_lse=lse, **masks,
                                  **({} if out is None else dict(out=result_arr)),
                                  **({} if out_lse is None else dict(out_lse=lse_arr)))
                copy_out = None
                if self._words:
                    given = x_bits
                    x_bits, result_arr, copy_out = self._word_arrays(B, x_bits, result_arr, ptr)
                    in_place = in_place and x_bits is given and copy_out is None
                if self._writes_while_reading:  # the arrays the kernel itself reads and writes
                    _checks.check_apart(
                        dict(out=result_arr, out_lse=lse_arr),
                        dict(cp_attn_out=x_bits, cp_attn_lse=lse, **masks),
                        f"a {type(self).__name__} call writes its results while its "
                        "kernel still reads the inputs (pass results in memory of their own)")
                steps = self._run(B, x_bits, lse, mask, result_arr, lse_arr, ptr)
                if copy_out is not None:
                    copy_out()
            if key is not None and in_place and steps is not None:
                self._remember(key, (steps,) + views)
        return (result, result_lse) if self.return_lse else result

    def _run(self, tokens, x_bits, lse, mask, result, result_lse, ptr):
        """Enqueue the call on ``ptr``; return its ready steps, or ``None`` where they
        are not kept. A decode loop calls with the same few arrays again and again:
        a call's steps are made ready once, by its arrays' addresses, shapes and
        strides (their dtypes are the plan's)."""
        key = _ready_key(x_bits, lse, mask, result, result_lse)
        steps = self._ready.get(key)
        keep = True
        if steps is None:
            steps, keep = self._steps(tokens, x_bits, lse, mask, result, result_lse)
            if keep:
                if len(self._ready) >= _READY_KEPT:
                    del self._ready[next(iter(self._ready))]  # the oldest
                self._ready[key] = steps
        self._launch(steps, ptr)
        return steps if keep else None

    def _launch(self, steps, ptr):
        """Enqueue a call's ready steps on ``ptr`` (a plan whose kernels record failures
        checks them first)."""
        for step in steps:
            step(ptr)

    def _remember(self, key, repeat):
        """Keep ``repeat`` (a call's ready steps and the result views it returns) for
        the caller's arrays ``key`` (:func:`_repeat_key`): the same call again skips
        every check and conversion, which depend on nothing else."""
        if len(self._repeats) >= _READY_KEPT:
            del self._repeats[next(iter(self._repeats))]  # the oldest
        self._repeats[key] = repeat

    def _replay(self, steps, stream):
        """Enqueue a remembered call's steps on ``stream``, on the plan's GPU (made
        current only where another is)."""
        device = self.comm.device
        cupy = _cupy()
        if cupy.cuda.runtime.getDevice() == device:
            self._launch(steps, stream_ptr(stream))
            return
        with cupy.cuda.Device(device):
            self._launch(steps, stream_ptr(stream))

    def _steps(self, tokens, x_bits, lse, mask, result, result_lse):
        """``(steps, keep)``: the call as functions of the stream, and whether they may
        be kept (they then hold no array of the caller's)."""
        raise NotImplementedError

    def _word_arrays(self, tokens, x_bits, out_arr, ptr):
        """``(x_bits, out_arr, copy_out)``: the partials and the result as arrays the
        plan's kernels can see as uint32 words. The caller's where they allow it
        (:meth:`DeviceArray.as_words`: rows contiguous and 4-byte aligned);
        else buffers the plan owns: the partials are copied in now, on ``ptr``,
        and ``copy_out()`` (else ``None``) copies the result out after the call.
        So a plan compiles one variant of each kernel, not one per layout."""
        import cupy

        if x_bits.as_words() is None:
            if self._x_words is None:
                if cupy_stream(ptr).is_capturing():
                    raise RuntimeError(
                        "cp_attn_out's rows are not 4-byte aligned with a contiguous last "
                        "axis, and this plan has no buffer yet to copy such partials into; "
                        "it cannot make one while a graph is captured: make one such call "
                        "before the capture, or pass aligned partials")
                self._x_words = cupy.empty((self.max_tokens, self.num_heads, self.head_dim),
                                           dtype=self.bits)
            staged = self._x_words[:tokens]
            with cupy_stream(ptr):
                staged[...] = cupy_view(x_bits)
            x_bits = kernel_array(staged, self.bits)
        if out_arr.as_words() is not None:
            return x_bits, out_arr, None
        own = self._result[:tokens]
        target = cupy_view(out_arr.view(self.bits))

        def copy_out():
            with cupy_stream(ptr):
                target[...] = own.view(self.bits)

        return x_bits, kernel_array(own, self._value), copy_out

    def _result_views(self, tokens):
        """``(result, result_lse)``: the plan's result buffers' views of ``tokens`` rows,
        made once per ``tokens`` (a decode loop asks for the same few again and again)."""
        views = self._results.get(tokens)
        if views is None:
            if len(self._results) >= _READY_KEPT:
                self._results.clear()
            views = self._results[tokens] = (self._result[:tokens], self._result_lse[:tokens])
        return views

    def _check_given(self, **arrays):
        """The checks of a call's arrays, made before its partials or result are
        staged as words: every array in this GPU's memory (:meth:`_check_device`),
        and the caller's ``out`` and ``out_lse`` apart where ``arrays`` holds both
        (name them only where the caller passed them)."""
        self._check_device(**arrays)
        if "out" in arrays and "out_lse" in arrays:
            _checks.check_apart(dict(out_lse=arrays["out_lse"]), dict(out=arrays["out"]),
                                WRITES_BOTH)

    def _check_device(self, **arrays):
        """Raise ``ValueError`` for an array in another GPU's memory: the kernels
        would fault on it (or, with peer access, read it from afar). An address
        found in this GPU's memory (or in none's) is not asked about again: a decode
        loop passes the same few arrays at every call."""
        for name, arr in arrays.items():
            if arr.ptr in self._on_device:
                continue
            device = pointer_device(arr.ptr)
            if device is not None and device != self._device:
                raise ValueError(
                    f"{name} is in the memory of GPU {device}, but this plan runs on GPU "
                    f"{self._device} (make that GPU current before creating the rank's "
                    f"arrays: cupy.cuda.Device({self._device}).use())")
            if len(self._on_device) >= _READY_KEPT * 4:
                self._on_device.clear()
            self._on_device.add(arr.ptr)

    def _stage_inputs(self, tokens, lse, seq_lens, query_start_loc, ptr):
        """``(lse, mask, in_place)``: the LSE as float32 and the masks as contiguous
        int64, on the call's stream, and whether all were read in place.

        Inputs that already are so are read in place; others are converted into
        buffers the plan owns (so a captured graph reads them at fixed
        addresses, and the conversion is captured with the call).
        """
        import cupy

        lse_arr = None
        in_place = True
        if as_dtype(lse.dtype) == np.float32:
            lse_arr = kernel_array(lse, np.float32, "cp_attn_lse")
        mask = (self._no_mask, self._no_mask, -1)
        if seq_lens is not None:
            count = int(seq_lens.shape[0])
            seq = kernel_array(seq_lens, as_dtype(seq_lens.dtype), "seq_lens")
            qsl = kernel_array(query_start_loc, as_dtype(query_start_loc.dtype), "query_start_loc")
            if not (_contiguous_int64(seq) and _contiguous_int64(qsl)):
                in_place = False
                with cupy_stream(ptr):
                    cupy.copyto(self._seq[:count], as_cupy(seq_lens), casting="unsafe")
                    cupy.copyto(self._qsl[:count + 1], as_cupy(query_start_loc), casting="unsafe")
                seq = kernel_array(self._seq[:count], np.int64)
                qsl = kernel_array(self._qsl[:count + 1], np.int64)
            mask = (seq, qsl, count)
        if lse_arr is None:
            in_place = False
            staged = self._lse32[:tokens]
            with cupy_stream(ptr):
                cupy.copyto(staged, as_cupy(lse), casting="unsafe")
            lse_arr = kernel_array(staged, np.float32)
        return lse_arr, mask, in_place

    def synchronize(self, stream=None, timeout=None):
        """Wait for this plan's work on ``stream``, within ``timeout`` seconds (see
        :meth:`Communicator.synchronize`): a stuck peer becomes a ``RuntimeError``."""
        self.comm.synchronize(stream, timeout)

    def close(self):
        """Close the plan: later calls raise. Its host-mapped status words (the A2A
        plan's) and the windows (the direct plan's) are released now, once its work
        is done; its device buffers go with the plan object (drop it, and graphs that
        captured a call must not replay afterwards). Idempotent; also the end of a
        ``with`` block."""
        self._closed = True
        self._forget()

    def _forget(self):
        """Drop the calls made ready and the views and staging buffer made for them."""
        self._views = {}
        self._ready = {}
        self._repeats = {}
        self._results = {}
        self._x_words = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _single(self, x, lse, out, out_lse, seq_lens, query_start_loc, stream):
        """A group of one: the rules of a larger group (:mod:`cupy_dcp._single`: masked
        and empty rows give 0 and LSE -inf), written on ``stream`` into the plan's
        result buffers, or ``out`` / ``out_lse`` when given."""
        import cupy

        from ._single import single_device

        result, result_lse = self._result_views(x.shape[0])
        result = result if out is None else out
        result_lse = (result_lse if out_lse is None else out_lse) if self.return_lse else None
        with cupy.cuda.Device(self._device):
            given = dict(cp_attn_out=kernel_array(x, self.bits, "cp_attn_out"),
                         cp_attn_lse=kernel_array(lse, as_dtype(lse.dtype), "cp_attn_lse"))
            if seq_lens is not None:
                given.update(seq_lens=kernel_array(seq_lens, as_dtype(seq_lens.dtype), "seq_lens"),
                             query_start_loc=kernel_array(query_start_loc,
                                                          as_dtype(query_start_loc.dtype),
                                                          "query_start_loc"))
            if out is not None:
                given["out"] = output_array(out, self._value, "out")
            if out_lse is not None:
                given["out_lse"] = output_array(out_lse, np.float32, "out_lse")
            self._check_given(**given)
            if cupy_stream(stream_ptr(stream)).is_capturing():
                raise RuntimeError(
                    f"a {type(self).__name__} of one rank cannot be captured in a CUDA graph: "
                    "its call makes temporary CuPy arrays, whose memory the pool hands out "
                    "again while a replay would still write it; call it eagerly")
            bits, lse32 = single_device(x, lse, self.bits, seq_lens, query_start_loc, stream)
            with cupy_stream(stream_ptr(stream)):
                as_cupy(result).view(self.bits)[...] = bits
                if result_lse is not None:
                    as_cupy(result_lse)[...] = lse32
        return (result, result_lse) if self.return_lse else result


class DcpA2APlan(_Plan):
    """The packed all-to-all combine of one layer shape, ready to call every step.

    Divergent calls are caught by default, at no extra exchange and no host
    synchronisation: every chunk carries a trailer with its call's signature
    (tokens, heads, head size, dtype, LSE base, strategy and the plan's call
    number, counted on the device so that graph replays count too; the format
    is ``cupy_dcp.kernels._trailer``'s). The combine kernel compares every
    peer's with rank 0's, on every rank alike, and marks differences in
    host-mapped memory; the next call, :meth:`check` or :meth:`synchronize`
    reads that memory (no synchronisation) and raises the same ``ValueError``
    on every rank, naming the first field that differs and the ranks. That
    call's result (and that of any call enqueued before the check ran) is
    void, and the group cannot go on: a rank whose host ran ahead may have
    launched the next call's all-to-all before its check saw the record, while
    its peers raised first, so the ranks' collectives are out of step. After
    this error, call :meth:`synchronize` on every rank (its bounded wait ends
    an unmatched exchange and aborts NCCL), then build a new communicator and
    plan. Calls whose byte counts differ (tokens, heads or head size) feed NCCL
    mismatched sizes, which it cannot report: :meth:`synchronize`'s bounded
    wait ends it and names the likely cause.

    Collective to build: every rank of ``comm`` builds it with the same
    arguments (checked: a mismatch raises the same ``ValueError`` on every
    rank); it joins the NCCL communicator if that is not built yet.

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

    strategy = "a2a"

    def _allocate(self, cupy, settings, device, kernels):
        n = self.comm.world_size
        self._width = self.head_dim + lse_pack_dim(self.dtype)
        row_bytes = self.local_heads * self._width * self.bits.itemsize
        self._trailer_rows = _trailer.trailer_rows(self.local_heads, self._width,
                                                   self.bits.itemsize)
        nbytes = n * (self.max_tokens + self._trailer_rows) * row_bytes
        self._send = cupy.empty(nbytes, cupy.uint8)
        self._recv = cupy.empty_like(self._send)
        signature = [_trailer.MAGIC, 0, self.num_heads, self.head_dim,
                     _trailer.DTYPE_CODES[self.dtype.name], int(self.base_e), A2A_CODE, 0]
        self._signature = cupy.asarray(np.array(signature, np.int64))
        self._state = cupy.zeros(2, cupy.int64)  # the call number (see pack_launch)
        self._status = MappedWords(n * _trailer.WORDS * _trailer.STATUS_WORDS, self)
        cupy.cuda.runtime.deviceSynchronize()  # the buffers are set before any call
        self._signed = (kernel_array(self._signature, np.int64, "signature"),
                        kernel_array(self._state, np.int64, "state"))

    def _warm_up(self, settings, device):
        build_shared(self.comm, a2a_tasks(self.dtype, self.head_dim, self.comm.world_size,
                                          max_tokens=self.max_tokens,
                                          local_heads=self.local_heads))

    def _buffers(self, tokens):
        """Send and receive views for ``tokens`` tokens, built once per size."""
        views = self._views.get(tokens)
        if views is None:
            shape = (self.comm.world_size, tokens + self._trailer_rows, self.local_heads,
                     self._width)
            chunk = shape[1] * self.local_heads * self._width * self.bits.itemsize
            views = self._views[tokens] = (_flat_view(self._send, shape, self.bits),
                                           _flat_view(self._recv, shape, self.bits), chunk)
        return views

    def _steps(self, tokens, x_bits, lse, mask, result, result_lse):
        send, recv, chunk = self._buffers(tokens)
        comm, send_ptr, recv_ptr = self.comm, send.ptr, recv.ptr
        return _ready_steps(
            pack_launch(x_bits, lse.view(np.uint32), *mask, send, recv, comm.rank,
                        signed=self._signed),
            lambda ptr: comm.alltoall_device(send_ptr, recv_ptr, chunk, ptr),
            combine_launch(self.dtype, recv, result, result_lse, self.base_e,
                           signed=(self._status.array, self._signed[1])))

    def _launch(self, steps, ptr):
        self.check()
        super()._launch(steps, ptr)

    def check(self):
        """Raise the ``ValueError`` of a divergent call that a combine has recorded
        (see the class docstring; it reads host-mapped memory: no synchronisation),
        once: the record is cleared. A call enqueued but not yet run is not seen."""
        if self._closed:
            raise RuntimeError(f"this {type(self).__name__} is closed")
        if self.comm.world_size == 1 or not self._status.words.any():  # the usual case, fast
            return
        message = divergence_message(type(self).__name__, self._status.words)
        if message is not None:
            self._status.words[:] = 0
            raise ValueError(message)

    def synchronize(self, stream=None, timeout=None):
        """Wait for this plan's work on ``stream`` (see :meth:`_Plan.synchronize`),
        then :meth:`check`."""
        super().synchronize(stream, timeout)
        self.check()

    def close(self):
        """Release the plan's buffers; see :meth:`_Plan.close`."""
        if self._closed:
            return
        super().close()
        status = getattr(self, "_status", None)
        if status is not None:
            status.free()


class DcpAgRsPlan(_Plan):
    """The AG+RS combine of one layer shape: the same contract as :class:`DcpA2APlan`.

    All-gather of the float32 LSEs ``[N, B, H]``; every rank scales each of
    its heads by its exact weight into a float32 buffer laid out by
    destination rank; a float32 reduce-scatter sums the ranks' terms; the sum
    is rounded once to the output dtype. It moves about twice the bytes of
    the packed all-to-all (float32 terms for all H heads), so it is the
    baseline the all-to-all is measured against.
    """

    strategy = "ag_rs"
    _stages_words = False

    def _allocate(self, cupy, settings, device, kernels):
        n, T = self.comm.world_size, self.max_tokens
        self._lse_in = cupy.empty(T * self.num_heads, cupy.float32)
        self._lses = cupy.empty(n * T * self.num_heads, cupy.float32)
        self._corrected = cupy.empty(n * T * self.local_heads * self.head_dim, cupy.float32)
        self._summed = cupy.empty(T * self.local_heads * self.head_dim, cupy.float32)

    def _warm_up(self, settings, device):
        build_shared(self.comm, agrs_tasks(self.dtype, self.num_heads, self.head_dim))

    def _buffers(self, tokens):
        views = self._views.get(tokens)
        if views is None:
            n, H, hn, D = self.comm.world_size, self.num_heads, self.local_heads, self.head_dim
            views = self._views[tokens] = (
                _flat_view(self._lses, (n, tokens, H), np.float32),
                _flat_view(self._corrected, (n, tokens, hn, D), np.float32),
                _flat_view(self._summed, (tokens, hn, D), np.float32))
        return views

    def _steps(self, tokens, x_bits, lse, mask, result, result_lse):
        lses, corrected, summed = self._buffers(tokens)
        comm, count = self.comm, tokens * self.num_heads
        lse_in = _flat_view(self._lse_in, (tokens, self.num_heads), np.float32)
        lse_in_ptr, lses_ptr, corrected_ptr = lse_in.ptr, lses.ptr, corrected.ptr
        summed_ptr, summed_size = summed.ptr, summed.size
        return _ready_steps(
            mask_launch(lse, *mask, lse_in),  # a private, masked copy
            lambda ptr: comm.allgather_device(lse_in_ptr, lses_ptr, count, ptr),
            correct_launch(self.dtype, x_bits.view(self._value), lses, comm.rank, self.base_e,
                           corrected),
            lambda ptr: comm.reduce_scatter_device(corrected_ptr, summed_ptr, summed_size, ptr),
            finish_launch(self.dtype, summed, lses, comm.rank, self.base_e, result, result_lse))


def _repeat_key(x, lse, out, out_lse, seq_lens, query_start_loc):
    """A call's arrays as a key of :meth:`_Plan._remember`: each ``None`` or a CuPy
    array's address, shape, strides and dtype (what every check of a call reads);
    ``None`` where one is another kind of array (its interface is read each call)."""
    cupy = _cupy()
    ndarray = None if cupy is None else cupy.ndarray  # no CuPy: no array to remember
    if type(x) is not ndarray or type(lse) is not ndarray:
        return None
    key = (x.data.ptr, x.shape, x.strides, x.dtype, lse.data.ptr, lse.shape, lse.strides,
           lse.dtype)
    if out is None and out_lse is None and seq_lens is None and query_start_loc is None:
        return key  # a decode loop's usual call: nothing more
    for a in (out, out_lse, seq_lens, query_start_loc):
        if a is None:
            key += (None,)
        elif type(a) is ndarray:
            key += (a.data.ptr, a.shape, a.strides, a.dtype)
        else:
            return None
    return key


def _ready_key(x_bits, lse, mask, result, result_lse):
    """What a call's launches depend on, besides the plan: its arrays' addresses,
    shapes and strides (their dtypes are the plan's) and the mask's length."""
    key = tuple((a.ptr, a.shape, a.strides) for a in (x_bits, lse, mask[0], mask[1], result))
    lse_out = None if result_lse is None else (result_lse.ptr, result_lse.shape, result_lse.strides)
    return key + (mask[2], lse_out)


def _ready_steps(*steps):
    """``(steps, keep)`` for :meth:`_Plan._steps`: each ``(kernel, grid, block, args)``
    made a ready launch, each function of the stream kept as it is; ``keep`` unless
    a kernel goes through Numba's launcher (its arguments hold the arrays)."""
    ready, keep = [], True
    for step in steps:
        if callable(step):
            ready.append(step)
            continue
        kernel, grid, block, args = step
        launch = kernel.prepare(grid, block, args)
        if launch is None:
            keep = False
            launch = functools.partial(_launch_now, kernel, grid, block, args)
        ready.append(launch)
    return ready, keep


def _launch_now(kernel, grid, block, args, ptr):
    kernel(grid, block, ptr, args)


def _plan_settings(world_size, max_tokens, num_heads, head_dim, dtype, return_lse,
                   is_lse_base_on_e, strategy):
    """The fields of :class:`PlanSettings` from a plan's shared arguments, checked
    (``ValueError`` for a bad size, ``TypeError`` for a bad dtype)."""
    given = dtype
    try:
        dtype = as_dtype(dtype)
        lse_pack_dim(dtype)
    except (TypeError, ValueError):
        raise TypeError(f"dtype must be float16, bfloat16 or float32 (got {given!r})") from None
    max_tokens = _checks.check_count(max_tokens, "max_tokens", 1)
    head_dim = _checks.check_count(head_dim, "head_dim", 1)
    num_heads = _checks.check_count(num_heads, "num_heads", 1)
    check_heads(num_heads, world_size)
    if max_tokens * num_heads >= 2 ** 31:  # the kernels number rows in 32 bits (with room)
        raise ValueError(f"max_tokens * num_heads must be below 2**31 (got {max_tokens} * "
                         f"{num_heads})")
    _checks.check_flag(is_lse_base_on_e, "is_lse_base_on_e")
    _checks.check_flag(return_lse, "return_lse")
    return dict(world_size=world_size, max_tokens=int(max_tokens), num_heads=int(num_heads),
                head_dim=int(head_dim), dtype=dtype, return_lse=bool(return_lse),
                is_lse_base_on_e=bool(is_lse_base_on_e), strategy=strategy,
                launcher=choose_launcher(_settings.launcher()))


def _contiguous_int64(arr):
    return arr.dtype == np.int64 and (arr.shape[0] <= 1 or arr.strides[0] == 8)
