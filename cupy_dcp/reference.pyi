from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["lse_weighted_combine", "pack_reference", "unpack_reference"]

# ``[B, H, D]`` float32 (float64 for float64 inputs), accumulated in float64, or
# ``(that, lse [B, H])`` with return_lse
def lse_weighted_combine(outputs: npt.ArrayLike, lses: npt.ArrayLike, return_lse: bool = False,
                         is_lse_base_on_e: bool = True) -> Any: ...
def pack_reference(out: npt.ArrayLike, lse: npt.ArrayLike, world_size: int,
                   mask: npt.ArrayLike | None = None) -> np.ndarray[Any, Any]: ...
def unpack_reference(recv: npt.ArrayLike,
                     head_dim: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]: ...
