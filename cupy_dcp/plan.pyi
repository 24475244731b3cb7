import dataclasses
from typing import Any

import numpy as np

from ._typing import Array, DType, Stream
from .comm import Communicator

__all__ = ["DcpA2APlan", "DcpAgRsPlan"]

@dataclasses.dataclass(frozen=True)
class PlanSettings:
    world_size: int
    max_tokens: int
    num_heads: int
    head_dim: int
    dtype: np.dtype[Any]
    return_lse: bool
    is_lse_base_on_e: bool
    strategy: str
    launcher: str
    @property
    def local_heads(self) -> int: ...
    def fields(self) -> dict[str, Any]: ...

class _Plan:
    strategy: str | None
    settings_type: type[PlanSettings]
    settings: PlanSettings
    comm: Communicator
    dtype: np.dtype[Any]
    max_tokens: int
    num_heads: int
    head_dim: int
    local_heads: int
    return_lse: bool
    base_e: bool
    bits: np.dtype[Any]
    def __init__(self, comm: Communicator | Any, max_tokens: int, num_heads: int, head_dim: int,
                 dtype: DType, return_lse: bool = False, is_lse_base_on_e: bool = True,
                 **options: Any) -> None: ...
    # ``out [B, H/N, D]``, or ``(out, lse [B, H/N] float32)`` for a plan built with return_lse
    def __call__(self, cp_attn_out: Array, cp_attn_lse: Array, out: Array | None = None,
                 out_lse: Array | None = None, seq_lens: Array | None = None,
                 query_start_loc: Array | None = None, stream: Stream = None) -> Any: ...
    def synchronize(self, stream: Stream = None, timeout: float | None = None) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, *exc: object) -> None: ...

class DcpA2APlan(_Plan):
    def check(self) -> None: ...

class DcpAgRsPlan(_Plan): ...
