"""cupy_dcp: the decode context-parallel (DCP) attention combine without PyTorch.

Every rank of a DCP group holds partial attention outputs ``[B, H, D]`` and
their log-sum-exp ``[B, H]``; :func:`dcp_a2a_lse_reduce` packs them, exchanges
head slices with ONE all-to-all and combines them exactly, so that rank r ends
with heads ``r*H/N ... (r+1)*H/N - 1``. Plans (:func:`dcp_plan`) bind a layer
shape once for decode loops and CUDA graphs; within one node,
:class:`DcpDirectPlan` exchanges over NVLink without NCCL.
"""

from .comm import Communicator
from .direct import DcpDirectPlan, dcp_plan, direct_problem
from .layout import lse_pack_dim
from .plan import DcpA2APlan, DcpAgRsPlan
from .reduce import dcp_a2a_lse_reduce, dcp_ag_rs_lse_reduce
from .reference import lse_weighted_combine, pack_reference, unpack_reference

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
