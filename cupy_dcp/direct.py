"""The direct plan: no NCCL; one kernel pushes each head slice into its owner's memory.

Every rank of a one-node group allocates a *window* (flags and two receive
slots, see ``cupy_dcp.kernels.direct`` for its layout, the protocol and the
argument why no call overwrites data still being read), exports it as a CUDA
IPC handle, and maps every peer's window; the handles travel over MPI. A call
is one kernel on the caller's stream, in tiles of (token, head) rows: it
stores each tile of the peers' slices straight into their windows over
NVLink and raises a flag per tile at each; it waits for each peer's flag of
a tile (bounded), then combines that tile, reading its own slice from the
input, while other tiles are still crossing. Nothing synchronises the host,
so a call can be captured in a CUDA graph and replayed.

The smallest calls go word by word (each 8-byte word carries 4 bytes and the
call's tag: no flag, no fence), the next ones in 128-byte lines that carry
their own flag (NCCL's LL128 way: it relies on a warp's 128-byte store
arriving whole, see ``cupy_dcp.kernels.direct``; ``protocols`` without
``"lines"`` turns them off), the rest in tiles behind flags.

Where every rank has a GPU of its own (Hopper or later, a driver of CUDA
12.3 or later), each call is launched as a *programmatic dependent* of the
kernel before it on the stream: it may be scheduled while that kernel ends
and waits for it on the GPU (``griddepcontrol``), and a small call lets the
kernel after it do the same (a kernel that was launched as an ordinary one
is unaffected; one launched as a programmatic dependent must wait, with
``griddepcontrol.wait``, before it touches the call's results, as the PDL
contract asks). ``pdl=False`` turns this off. Never where ranks share a
GPU: a call's blocks that started early could take the places that a
peer's blocks, on that GPU, need to run at all.

A peer that does not arrive within ``timeout`` seconds makes the waiting
kernel give up: the tiles it has not combined yet become NaN (tiles
combined before keep exact values: treat the whole call as failed), and
it records the peer in host-mapped memory; the plan's next call, :meth:`DcpDirectPlan.check` or
:meth:`DcpDirectPlan.synchronize` raises a ``RuntimeError`` naming it. The
plan is dead after that: its peers fail too (fast: the failing rank tells
them), and it must be closed.
"""

import ctypes
import dataclasses
import math
import numbers
import typing

import numpy as np

from ._compile import direct_residency
from .layout import c_strides, lse_pack_dim
from .kernels._launch import DeviceArray
from .kernels.direct import (PEER_FAILED, STATE_WORDS, TIMED_OUT, direct_launch, line_rows,
                             region_grid, window_layout)
from . import _settings
from .comm import check_timeout
from .plan import DcpA2APlan, PlanSettings, _Plan, _ready_steps
from .kernels._arrays import kernel_array

__all__ = ["DcpDirectPlan", "dcp_plan", "direct_problem"]

DEFAULT_TIMEOUT = 30.0
_MAX_TIMEOUT = 1e9  # seconds; its nanoseconds must fit the kernel's int64
_HOST_ALLOC_PORTABLE_MAPPED = 3  # cudaHostAllocPortable | cudaHostAllocMapped


def direct_problem(comm):
    """Collective: why the direct path cannot run on ``comm`` (a string), or ``None``.

    It needs every rank on one node, CuPy and a GPU on every rank, and every
    rank able to reach every peer's GPU: the same GPU, or peer access between
    the two. Selects each rank's GPU as a side effect.
    """
    from .comm import as_communicator

    return _survey(as_communicator(comm))[0]


def _survey(comm):
    """Collective: ``(problem, addresses)``: :func:`direct_problem`'s answer and every
    rank's GPU as a PCI address (``None`` where a problem was found before them)."""
    from mpi4py import MPI

    from .comm import _cupy_problem

    # every step is bounded by the communicator's timeout (MPI's Split_type is not)
    nodes = comm.allgather_object("finding the ranks' nodes", MPI.Get_processor_name())
    if len(set(nodes)) > 1:
        return "the ranks are not all on one node", None
    problem = _cupy_problem()
    if not all(comm.allgather_object("checking the ranks' GPUs", problem is None)):
        return "a rank lacks CuPy or a GPU", None
    comm.select_device()
    import cupy

    runtime = cupy.cuda.runtime
    mine = _pci_address(runtime, comm.device)
    everyone = comm.allgather_object("finding the ranks' GPUs", mine)
    local = {_pci_address(runtime, d): d for d in range(runtime.getDeviceCount())}
    problem = None
    for rank, address in enumerate(everyone):
        device = local.get(address)
        if device is None:
            problem = f"rank {comm.rank} cannot see rank {rank}'s GPU ({address})"
        elif device != comm.device and not runtime.deviceCanAccessPeer(comm.device, device):
            problem = f"no peer access from rank {comm.rank}'s GPU to rank {rank}'s"
        if problem:
            break
    problems = [p for p in comm.allgather_object("checking peer access", problem) if p]
    return (problems[0] if problems else None), everyone


def dependent_launch(addresses, capability, driver_version, enabled=True):
    """Whether one rank's GPU lets direct calls launch as programmatic dependents:
    ``enabled``, every rank on a GPU of its own (``addresses``: every rank's GPU),
    compute ``capability`` 9.0 or later, and a driver of CUDA 12.3 or later (graphs
    capture the dependency from then on)."""
    return (bool(enabled) and len(set(addresses)) == len(addresses)
            and tuple(capability) >= (9, 0) and driver_version >= 12030)


def resolve_pdl(pdl, addresses, gpus):
    """Whether direct calls launch as programmatic dependents, for the ``pdl``
    setting (:func:`cupy_dcp._settings.pdl`), every rank's GPU (``addresses``) and
    every rank's ``(capability, driver_version)`` (``gpus``): the same answer on
    every rank. ``RuntimeError`` where ``pdl`` is ``True`` and a rank's GPU cannot."""
    supported = all(dependent_launch(addresses, capability, driver) for capability, driver in gpus)
    if pdl and not supported:
        raise RuntimeError(
            "pdl=True needs every rank on a GPU of its own, of compute capability 9.0 or "
            f"later, with a CUDA 12.3 or later driver (got GPUs {addresses}, capabilities "
            f"and drivers {gpus})")
    return supported if pdl is None else pdl


@dataclasses.dataclass(frozen=True)
class DirectSettings(PlanSettings):
    """:class:`PlanSettings` and the direct plan's own, resolved."""

    timeout: float  # seconds a call waits for a peer
    pdl: typing.Optional[bool]  # programmatic dependent launches: None where supported
    protocols: tuple  # of ``_settings.PROTOCOLS``, in that order


class _Devices(typing.NamedTuple):
    """What the direct plan learns of the group's GPUs (:meth:`DcpDirectPlan._prepare_device`)."""

    addresses: list  # every rank's GPU, by PCI address
    dependent: bool  # calls launch as programmatic dependents (:func:`resolve_pdl`)


def _check_kernel_timeout(timeout):
    """The kernels' wait, ``timeout``, as float seconds: ``TypeError`` unless a real
    number (not a bool, see :func:`cupy_dcp.comm.check_timeout`), ``ValueError``
    unless > 0 and finite enough for the kernels' nanosecond clock."""
    if (isinstance(timeout, numbers.Real) and not isinstance(timeout, bool)
            and not 0 < timeout <= _MAX_TIMEOUT):  # NaN too
        raise ValueError(f"timeout must be > 0 and <= {_MAX_TIMEOUT:g} seconds (got {timeout!r})")
    return check_timeout(timeout)


def _pci_address(runtime, device):
    props = runtime.getDeviceProperties(device)
    return f"{props['pciDomainID']:04x}:{props['pciBusID']:02x}:{props['pciDeviceID']:02x}"


class DcpDirectPlan(_Plan):
    """The direct combine of one layer shape: the contract of :class:`DcpA2APlan`,
    with the exchange done by the kernels themselves over NVLink.

    Args:
        comm, max_tokens, num_heads, head_dim, dtype, return_lse,
            is_lse_base_on_e: as for :class:`DcpA2APlan`.
        timeout: seconds a call waits for a peer's tile before it gives up
            (see the module docstring); ``None`` is the communicator's
            ``timeout`` (at most 1e9 s: a communicator's ``math.inf`` waits
            that long), else 30 s. A number (not a bool: ``TypeError``), > 0
            and at most 1e9 (``ValueError``).
        pdl: launch calls as programmatic dependents (see the module
            docstring): ``True`` (``RuntimeError`` where a rank's GPU cannot),
            ``False``, or ``None``: where every rank has a GPU of its own that
            can (``CUPY_DCP_PDL=0`` makes it ``False``).
        protocols: the transfers calls may use, names among ``"tiles"``,
            ``"words"`` and ``"lines"`` (``"tiles"`` one of them); ``None`` is
            all three (without ``"lines"`` under ``CUPY_DCP_LINES=0``).

    Every rank must resolve the same ``timeout``, ``pdl`` and ``protocols``
    (else every rank raises ``ValueError``); the resolved values are
    :attr:`settings` (a :class:`DirectSettings`).

    Collective to build and to :meth:`close` (or use it as a context
    manager); every step of the build waits at most the communicator's
    :meth:`~cupy_dcp.Communicator.limit` for a peer. Raises ``RuntimeError``
    on every rank where the group cannot use it (see :func:`direct_problem`);
    :func:`dcp_plan` falls back to the NCCL all-to-all instead. Calls of one
    plan must be made in the same order on every rank, each on one stream (or
    synchronised by the caller).
    """

    strategy = "direct"
    settings_type = DirectSettings
    _writes_while_reading = True  # a block combines while others still push the partials

    def __init__(self, comm, max_tokens, num_heads, head_dim, dtype, return_lse=False,
                 is_lse_base_on_e=True, timeout=None, pdl=None, protocols=None):
        self._window = self._status = None  # what close() releases, however far the build got
        self._peers = []
        self._windows = self._flags = self._lls = self._line_regions = ()
        self._dependent = False
        super().__init__(comm, max_tokens, num_heads, head_dim, dtype, return_lse,
                         is_lse_base_on_e, timeout=timeout, pdl=pdl, protocols=protocols)

    def _own_settings(self, comm, timeout, pdl, protocols):
        if timeout is None:  # the communicator's, within the kernels' clock (inf: no bound)
            timeout = DEFAULT_TIMEOUT if comm.timeout is None else min(comm.timeout, _MAX_TIMEOUT)
        timeout = _check_kernel_timeout(timeout)
        # the ranks agree on the timeout too: a rank that gave up sooner would stop pushing
        return dict(timeout=timeout, pdl=_settings.pdl(pdl),
                    protocols=_settings.protocols(protocols))

    def _prepare_device(self, settings):
        """Collective: every rank's GPU and whether calls launch as programmatic
        dependents (:class:`_Devices`); ``RuntimeError`` where the group cannot use
        the direct path."""
        problem, addresses = _survey(self.comm)  # every rank's GPU, by PCI address
        if problem is not None:
            raise RuntimeError(f"the direct path cannot run here: {problem} "
                               "(use DcpA2APlan, or dcp_plan(..., strategy='auto'))")
        import cupy

        capability = divmod(int(cupy.cuda.Device(self.comm.device).compute_capability), 10)
        gpus = self.comm.allgather_object("comparing the ranks' GPUs",
                                          (capability, cupy.cuda.runtime.driverGetVersion()))
        return _Devices(addresses, resolve_pdl(settings.pdl, addresses, gpus))

    def _allocate(self, cupy, settings, device, resident):
        comm = self.comm
        n = comm.world_size
        if n == 1:
            return
        self._dependent = device.dependent
        runtime = cupy.cuda.runtime
        # The kernel's blocks wait for each other across GPUs, so every block of every
        # rank on this GPU must be resident at once; and every rank must cut a call into
        # the same tiles and blocks: the fewest that any rank can hold.
        sharing = device.addresses.count(device.addresses[comm.rank])
        # ranks sharing a GPU may run any of the kernels beside each other: the smallest
        # residency bounds them all then (a block of one fits where another's could)
        resident = resident if sharing == 1 else [min(resident)] * 3
        caps = comm.allgather_object("sizing the direct calls",
                                     [max(1, r // sharing) for r in resident])
        self._max_blocks, self._ll_max_blocks, self._line_max_blocks = (
            min(c) for c in zip(*caps))
        width = self.head_dim + lse_pack_dim(self.dtype)
        layout = window_layout(
            n, self.max_tokens, self.local_heads, width, self.bits.itemsize,
            rows=None if "words" in settings.protocols else 0,
            line_rows=line_rows(n, self.max_tokens, self.local_heads, width, self.bits.itemsize,
                                self._line_max_blocks) if "lines" in settings.protocols else 0)
        nbytes = layout.nbytes
        error = None
        try:
            self._window = runtime.malloc(nbytes)  # its own allocation: IPC maps whole ones
            runtime.memset(self._window, 0, nbytes)
            self._state = cupy.zeros(STATE_WORDS, cupy.int64)
            self._status = runtime.hostAlloc(8 * n, _HOST_ALLOC_PORTABLE_MAPPED)
            self._status_view = np.ctypeslib.as_array(
                (ctypes.c_int64 * n).from_address(self._status))
            self._status_view[:] = 0
            self._all_clear = self._status_view.tobytes()
            runtime.deviceSynchronize()
            handle = runtime.ipcGetMemHandle(self._window)
        except Exception as exc:  # every rank must learn of it, or the others would wait
            error, handle = exc, None
        handles = comm.allgather_object("sharing the windows", None if error else bytes(handle))
        if error is None and None not in handles:
            try:
                for rank, theirs in enumerate(handles):
                    if rank != comm.rank:
                        self._peers.append(runtime.ipcOpenMemHandle(
                            theirs, runtime.cudaIpcMemLazyEnablePeerAccess))
            except Exception as exc:
                error = exc
        failed = comm.allgather_object("mapping the windows",
                                       None if error is None else f"{type(error).__name__}: {error}")
        bad = [(r, e) for r, e in enumerate(failed) if e]
        if bad:
            self._release(cupy)
            if error is not None:
                raise RuntimeError(f"rank {comm.rank} could not set up the direct path: {error}") \
                    from error
            rank, detail = bad[0]
            raise RuntimeError(f"rank {rank} could not set up the direct path: {detail}")
        bases = list(self._peers)
        bases.insert(comm.rank, self._window)
        self._state_arr = kernel_array(self._state, np.int64, "state")
        self._status_arr = DeviceArray(self._status, (n,), (8,), np.int64, self)
        self._flags = tuple(DeviceArray(b, (layout.flag_words,), (8,), np.int64, self)
                            for b in bases)
        self._windows = tuple(DeviceArray(b + layout.slots_offset, layout.slots_shape,
                                          layout.slots_strides, self.bits, self) for b in bases)
        self._lls, self._line_regions = (
            tuple(DeviceArray(b + offset, shape, c_strides(shape, 8), np.dtype(np.uint64), self)
                  for b in bases)
            for offset, shape in ((layout.ll_offset, layout.ll_shape),
                                  (layout.line_offset, layout.line_shape)))
        try:
            comm.barrier("setting up the direct path")  # every window is zeroed and mapped
        except RuntimeError:
            # a late peer may still get past this barrier and push into our window:
            # leave it allocated, unmap theirs
            self._release(cupy, free_window=False)
            self._closed = True
            raise

    def _warm_up(self, settings, device):
        """The blocks of WARPS warps of each path's kernels that fit at once on this GPU
        (each has its own registers): ``[tiles, words, lines]``; ``None`` in a group
        of one."""
        n = self.comm.world_size
        if n == 1:
            return None
        # only the paths that some call can take are compiled (a path that none takes
        # gets a count that bounds nothing)
        return direct_residency(self.comm, self.dtype, self.bits, self.head_dim,
                                self.max_tokens, self.local_heads, device.dependent,
                                settings.protocols,
                                device.addresses.count(device.addresses[self.comm.rank]))

    @property
    def timeout(self):
        """Seconds a call waits for a peer before it gives up (``settings.timeout``)."""
        return self.settings.timeout

    def _launch(self, steps, ptr):
        self.check()
        super()._launch(steps, ptr)

    def _steps(self, tokens, x_bits, lse, mask, result, result_lse):
        return _ready_steps(direct_launch(
            self.dtype, x_bits, lse, *mask, self._windows, self._flags, self._lls, self._state_arr,
            self._status_arr, result.view(self.bits), result_lse, self.base_e, self.comm.rank,
            int(self.timeout * 1e9), self._max_blocks, dependent=self._dependent,
            ll_max_blocks=self._ll_max_blocks, lines=self._line_regions,
            line_max_blocks=self._line_max_blocks))

    def _call_grid(self, tokens):
        """The ``CallGrid`` (tile rows, blocks, pushing blocks, protocol) of a call of
        ``tokens`` tokens, as its launch cuts it."""
        rank = self.comm.rank
        return region_grid(self.comm.world_size, tokens * self.local_heads, self._lls[rank].shape,
                           self._line_regions[rank].shape, self._max_blocks,
                           self._ll_max_blocks, self._line_max_blocks)

    def check(self):
        """Raise ``RuntimeError`` if a call of this plan has failed a wait (it reads
        host-mapped memory: no synchronisation). That call's result is void (NaN
        where the kernel gave up), every later one NaN."""
        if self._closed:
            raise RuntimeError("this DcpDirectPlan is closed")
        if self._status is None or self._status_view.tobytes() == self._all_clear:
            return  # the usual case, in a bytes comparison (a NumPy reduction costs more)
        codes = self._status_view.copy()
        if codes.any():
            what = []
            for rank in np.flatnonzero(codes):
                if codes[rank] == TIMED_OUT:
                    what.append(f"rank {rank} did not arrive within {self.timeout} s")
                elif codes[rank] == PEER_FAILED:
                    what.append(f"rank {rank} failed first")
                else:
                    what.append(f"rank {rank}: status {codes[rank]}")
            raise RuntimeError(
                f"rank {self.comm.rank}: a direct combine gave up waiting ({'; '.join(what)}); "
                "that call's result is void (NaN where it gave up) and the plan is unusable: "
                "close it")

    def synchronize(self, stream=None, timeout=None):
        """Wait for the work on ``stream``, then :meth:`check`.

        The kernels' own waits are bounded by the plan's ``timeout``, so this
        returns: ``timeout`` (seconds) only bounds the host's wait, by default
        the communicator's plus the plan's (queued work delays the kernels'
        clocks). Past it, ``RuntimeError``; no NCCL communicator is aborted.
        """
        from .comm import drain

        timeout = check_timeout(timeout)
        if timeout is None:
            timeout = self.comm.limit() + self.timeout
        if not drain(stream, None if timeout == math.inf else timeout):
            self.check()
            raise RuntimeError(f"rank {self.comm.rank}: the work on the stream did not "
                               f"complete within {timeout} s")
        self.check()

    def close(self):
        """Collective: unmap the peers' windows and free this rank's (after every
        rank's work is done). Idempotent.

        If a peer does not reach the close within the communicator's
        ``timeout`` plus the plan's, this rank's window is left allocated (a
        peer might still write into it) and ``RuntimeError`` is raised; the
        mappings of the peers' windows are closed either way.
        """
        if self._closed:
            return
        self._closed = True
        self._forget()
        if self.comm.world_size == 1 or self._window is None:
            return
        import cupy

        with cupy.cuda.Device(self.comm.device):
            cupy.cuda.runtime.deviceSynchronize()  # this rank's kernels are done
            self._release(cupy, free_window=False)  # so its mappings can go
            # Past the barrier every rank has done both: nobody writes into or maps
            # this window any more. The wait allows for a peer still in its last
            # combine's bounded wait.
            limit = self.comm.limit() + self.timeout
            self.comm.barrier("closing the direct path", limit)
            self._release(cupy)

    def _release(self, cupy, free_window=True):
        runtime = cupy.cuda.runtime
        while self._peers:
            runtime.ipcCloseMemHandle(self._peers.pop())
        self._windows = self._flags = self._lls = self._line_regions = ()
        self._ready = {}  # the ready calls name the windows
        if free_window:
            if self._window is not None:
                runtime.free(self._window)
                self._window = None
            if self._status is not None:
                self._status_view = None
                runtime.freeHost(self._status)
                self._status = None



def dcp_plan(comm, max_tokens, num_heads, head_dim, dtype, return_lse=False,
             is_lse_base_on_e=True, strategy="auto", timeout=None, pdl=None, protocols=None):
    """A plan for the fastest strategy the group can run (collective).

    ``strategy``: ``"auto"`` (:class:`DcpDirectPlan` where :func:`direct_problem`
    finds nothing against it, else :class:`DcpA2APlan`), ``"direct"`` (raises
    where it cannot run) or ``"a2a"``. ``timeout``, ``pdl`` and ``protocols`` are
    the direct plan's (see :class:`DcpDirectPlan`): with ``"a2a"`` they must be
    ``None`` (``ValueError`` otherwise, raised before any collective); with
    ``"auto"`` a plan that falls back to the all-to-all ignores them.
    """
    from .comm import as_communicator

    if strategy not in ("auto", "direct", "a2a"):
        raise ValueError(f"strategy must be 'auto', 'direct' or 'a2a' (got {strategy!r})")
    if strategy == "a2a":
        given = [f"{name}={value!r}" for name, value in
                 (("timeout", timeout), ("pdl", pdl), ("protocols", protocols))
                 if value is not None]
        if given:
            raise ValueError(f"timeout, pdl and protocols are the direct plan's; "
                             f"strategy='a2a' takes none of them (got {', '.join(given)})")
    comm = as_communicator(comm)
    if strategy == "auto" and comm.world_size > 1 and direct_problem(comm) is None:
        try:
            return DcpDirectPlan(comm, max_tokens, num_heads, head_dim, dtype, return_lse,
                                 is_lse_base_on_e, timeout, pdl, protocols)
        except RuntimeError as exc:  # raised on every rank alike (e.g. IPC refused)
            import warnings
            warnings.warn(f"cupy_dcp: the direct path failed to set up ({exc}); "
                          "using the NCCL all-to-all", RuntimeWarning, stacklevel=2)
    elif strategy == "direct":
        return DcpDirectPlan(comm, max_tokens, num_heads, head_dim, dtype, return_lse,
                             is_lse_base_on_e, timeout, pdl, protocols)
    return DcpA2APlan(comm, max_tokens, num_heads, head_dim, dtype, return_lse, is_lse_base_on_e)
