"""cupy_dcp: the decode context-parallel (DCP) attention combine without PyTorch.

Every rank of a DCP group holds partial attention outputs ``[B, H, D]`` and
their log-sum-exp ``[B, H]``; :func:`dcp_a2a_lse_reduce` packs them, exchanges
head slices with ONE all-to-all and combines them exactly, so that rank r ends
with heads ``r*H/N ... (r+1)*H/N - 1``. Plans (:func:`dcp_plan`) bind a layer
shape once for decode loops and CUDA graphs; within one node,
:class:`DcpDirectPlan` exchanges over NVLink without NCCL.

Compiled kernels are kept on disk across processes (see
``cupy_dcp.kernels._cache`` for where, and how to move or turn it off);
``python -m cupy_dcp.warmup`` fills that cache ahead of time.
"""

from .kernels import _cache as _kernel_cache
from .kernels._lazy import lazy_names

_HOMES = {  # each public name and the module that defines it, imported on first use
    "Communicator": "comm",
    "DcpA2APlan": "plan",
    "DcpAgRsPlan": "plan",
    "DcpDirectPlan": "direct",
    "dcp_a2a_lse_reduce": "reduce",
    "dcp_ag_rs_lse_reduce": "reduce",
    "dcp_plan": "direct",
    "direct_problem": "direct",
    "lse_pack_dim": "layout",
    "lse_weighted_combine": "reference",
    "pack_reference": "reference",
    "unpack_reference": "reference",
}

__all__ = [
    "Communicator",
    "DcpA2APlan",
    "DcpAgRsPlan",
    "DcpDirectPlan",
    "dcp_a2a_lse_reduce",
    "dcp_ag_rs_lse_reduce",
    "dcp_plan",
    "direct_problem",
    "lse_pack_dim",
    "lse_weighted_combine",
    "pack_reference",
    "unpack_reference",
]

__version__ = "0.1.0"


def _kernel_cache_dir():  # read on the kernel cache's first use, not at import
    from ._settings import kernel_cache_dir

    return kernel_cache_dir()


_kernel_cache.use_default(_kernel_cache_dir)


__getattr__ = lazy_names(__name__, _HOMES)


def __dir__():
    return sorted(set(globals()) | set(__all__))
