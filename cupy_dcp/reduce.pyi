from typing import Any

from ._typing import Array, Stream
from .comm import Communicator

__all__ = ["dcp_a2a_lse_reduce", "dcp_ag_rs_lse_reduce"]

# ``[B, H/N, D]`` in the input dtype, or ``(that, lse [B, H/N] float32)`` with return_lse
def dcp_a2a_lse_reduce(cp_attn_out: Array, cp_attn_lse: Array, comm: Communicator | Any,
                       return_lse: bool = False, is_lse_base_on_e: bool = True,
                       out: Array | None = None, seq_lens: Array | None = None,
                       query_start_loc: Array | None = None, stream: Stream = None,
                       check_consistency: bool = False) -> Any: ...
def dcp_ag_rs_lse_reduce(cp_attn_out: Array, cp_attn_lse: Array, comm: Communicator | Any,
                         return_lse: bool = False, is_lse_base_on_e: bool = True,
                         out: Array | None = None, seq_lens: Array | None = None,
                         query_start_loc: Array | None = None, stream: Stream = None,
                         check_consistency: bool = False) -> Any: ...
