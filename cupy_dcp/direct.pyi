import dataclasses
from collections.abc import Iterable
from typing import Any, Literal

from ._typing import DirectProtocol, DType, Stream
from .comm import Communicator
from .plan import DcpA2APlan, PlanSettings, _Plan

__all__ = ["DcpDirectPlan", "dcp_plan", "direct_problem"]

def direct_problem(comm: Communicator | Any) -> str | None: ...

@dataclasses.dataclass(frozen=True)
class DirectSettings(PlanSettings):
    timeout: float
    pdl: bool | None
    protocols: tuple[DirectProtocol, ...]

class DcpDirectPlan(_Plan):
    settings_type: type[DirectSettings]
    settings: DirectSettings
    @property
    def timeout(self) -> float: ...
    def __init__(self, comm: Communicator | Any, max_tokens: int, num_heads: int, head_dim: int,
                 dtype: DType, return_lse: bool = False, is_lse_base_on_e: bool = True,
                 timeout: float | None = None, pdl: bool | None = None,
                 protocols: Iterable[DirectProtocol] | None = None) -> None: ...
    def check(self) -> None: ...
    def synchronize(self, stream: Stream = None, timeout: float | None = None) -> None: ...
    def close(self) -> None: ...

def dcp_plan(comm: Communicator | Any, max_tokens: int, num_heads: int, head_dim: int,
             dtype: DType, return_lse: bool = False, is_lse_base_on_e: bool = True,
             strategy: Literal["auto", "direct", "a2a"] = "auto",
             timeout: float | None = None, pdl: bool | None = None,
             protocols: Iterable[DirectProtocol] | None = None) -> DcpDirectPlan | DcpA2APlan: ...
