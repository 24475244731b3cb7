from typing import Any

import numpy as np
import numpy.typing as npt

from ._typing import DType

__all__ = [
    "BFLOAT16",
    "SUPPORTED_DTYPES",
    "as_dtype",
    "bits_dtype",
    "c_strides",
    "check_heads",
    "is_bfloat16",
    "is_supported",
    "lse_pack_dim",
    "round_from_float64",
    "send_buffer_shape",
]

BFLOAT16: np.dtype[Any]
SUPPORTED_DTYPES: tuple[np.dtype[Any], ...]

def as_dtype(dtype: DType) -> np.dtype[Any]: ...
def is_bfloat16(dtype: np.dtype[Any]) -> bool: ...
def is_supported(dtype: np.dtype[Any]) -> bool: ...
def lse_pack_dim(dtype: DType) -> int: ...
def bits_dtype(dtype: DType) -> np.dtype[Any]: ...
def check_heads(num_heads: int, world_size: int) -> int: ...
def c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]: ...
def send_buffer_shape(world_size: int, num_tokens: int, num_heads: int, head_dim: int,
                      dtype: DType) -> tuple[int, int, int, int]: ...
def round_from_float64(values: npt.ArrayLike, dtype: DType) -> np.ndarray[Any, Any]: ...
