from typing import Any, Literal

from ._typing import DType, Stream
from .comm import Communicator
from .plan import DcpA2APlan, _Plan

__all__ = ["DcpDirectPlan", "dcp_plan", "direct_problem"]

def direct_problem(comm: Communicator | Any) -> str | None: ...

class DcpDirectPlan(_Plan):
    timeout: float
    def __init__(self, comm: Communicator | Any, max_tokens: int, num_heads: int, head_dim: int,
                 dtype: DType, return_lse: bool = False, is_lse_base_on_e: bool = True,
                 timeout: float | None = None) -> None: ...
    def check(self) -> None: ...
    def synchronize(self, stream: Stream = None, timeout: float | None = None) -> None: ...
    def close(self) -> None: ...

def dcp_plan(comm: Communicator | Any, max_tokens: int, num_heads: int, head_dim: int,
             dtype: DType, return_lse: bool = False, is_lse_base_on_e: bool = True,
             strategy: Literal["auto", "direct", "a2a"] = "auto",
             timeout: float | None = None) -> DcpDirectPlan | DcpA2APlan: ...
