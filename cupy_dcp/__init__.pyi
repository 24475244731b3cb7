from .comm import Communicator as Communicator
from .direct import DcpDirectPlan as DcpDirectPlan
from .direct import dcp_plan as dcp_plan
from .direct import direct_problem as direct_problem
from .layout import lse_pack_dim as lse_pack_dim
from .plan import DcpA2APlan as DcpA2APlan
from .plan import DcpAgRsPlan as DcpAgRsPlan
from .reduce import dcp_a2a_lse_reduce as dcp_a2a_lse_reduce
from .reduce import dcp_ag_rs_lse_reduce as dcp_ag_rs_lse_reduce
from .reference import lse_weighted_combine as lse_weighted_combine
from .reference import pack_reference as pack_reference
from .reference import unpack_reference as unpack_reference

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

__version__: str
