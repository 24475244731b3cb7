# Type aliases shared by the stubs (stub-only: no runtime module).
import argparse
from collections.abc import Callable
from typing import Any, Literal, Union

import numpy as np

from .comm import Communicator

# A host (NumPy) or device array of any framework: CuPy, Numba, PyTorch, JAX
# (DLPack or __cuda_array_interface__). The library reads shapes, strides and
# dtypes at run time; the type system cannot.
Array = Any
# float16, bfloat16 ("bfloat16" or ml_dtypes.bfloat16) or float32, as a name,
# a NumPy dtype or a scalar type.
DType = Union[str, np.dtype[Any], type]
# A CUDA stream: a cupy.cuda.Stream, or None for the current one.
Stream = Any
# An mpi4py communicator (mpi4py.MPI.Comm).
MPIComm = Any
Backend = Literal["auto", "nccl", "mpi"]
# A direct call's transfer (DcpDirectPlan's protocols=).
DirectProtocol = Literal["tiles", "words", "lines"]
# A strategy that a script adds to ``cupy_dcp.bench.run``:
# make(comm, args, B, dtype, stream) -> (fn, close), or None where it cannot run.
CaseMaker = Callable[[Communicator, argparse.Namespace, int, Any, Stream],
                     tuple[Callable[[], object], Callable[[], object]] | None]
