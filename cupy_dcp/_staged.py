"""The MPI transport of device buffers: staged through host memory.

For communicators built with ``backend="mpi"`` that are handed device arrays
(no NCCL at hand, several ranks sharing one GPU, debugging): each exchange
copies the bytes to the host, runs the MPI collective, and copies the result
back, synchronising the stream on the way. It is exact but slow, and it cannot
be captured in a CUDA graph (it raises if the stream is capturing).
"""

import numpy as np

__all__ = ["staged_allgather", "staged_alltoall", "staged_reduce_scatter"]


def _cuda():
    import cupy
    return cupy


def _to_host(cupy, ptr, nbytes, stream_ptr):
    host = np.empty(nbytes, dtype=np.uint8)
    if nbytes:
        cupy.cuda.runtime.memcpyAsync(host.ctypes.data, ptr, nbytes,
                                      cupy.cuda.runtime.memcpyDeviceToHost, stream_ptr)
    cupy.cuda.runtime.streamSynchronize(stream_ptr)
    return host


def _to_device(cupy, ptr, host, stream_ptr):
    if host.nbytes:
        cupy.cuda.runtime.memcpyAsync(ptr, host.ctypes.data, host.nbytes,
                                      cupy.cuda.runtime.memcpyHostToDevice, stream_ptr)
    cupy.cuda.runtime.streamSynchronize(stream_ptr)


def _not_capturing(cupy, stream_ptr):
    if stream_ptr not in (0, 1) and cupy.cuda.runtime.streamIsCapturing(stream_ptr):
        raise RuntimeError("the MPI transport of device arrays copies through host memory and "
                           "cannot be captured in a CUDA graph: use backend='nccl'")


def staged_alltoall(comm, send_ptr, recv_ptr, chunk_bytes, stream_ptr):
    """All-to-all of N chunks of ``chunk_bytes``; this rank's own chunk of ``recv`` is left alone.

    The host rows are signed with ``chunk_bytes`` (``Communicator.exchange_signed``):
    ranks whose chunks differ in size raise the same ``ValueError`` before any byte
    reaches the device, where NCCL could not tell.
    """
    from ._signed import TRAILER_BYTES

    cupy = _cuda()
    _not_capturing(cupy, stream_ptr)
    n = comm.world_size
    send = np.empty((n, chunk_bytes + TRAILER_BYTES), dtype=np.uint8)
    send[:, :chunk_bytes] = _to_host(cupy, send_ptr, n * chunk_bytes,
                                     stream_ptr).reshape(n, chunk_bytes)
    recv = np.empty_like(send)
    got = comm.exchange_signed(send, recv, dict(chunk_bytes=chunk_bytes),
                               "the staged all-to-all of device arrays")
    for peer, body in enumerate(got):
        if body is not None:
            _to_device(cupy, recv_ptr + peer * chunk_bytes, np.ascontiguousarray(body), stream_ptr)


def staged_allgather(comm, send_ptr, recv_ptr, count, stream_ptr):
    """All-gather of ``count`` float32 per rank."""
    cupy = _cuda()
    _not_capturing(cupy, stream_ptr)
    send = _to_host(cupy, send_ptr, 4 * count, stream_ptr).view(np.float32)
    recv = np.empty((comm.world_size, count), dtype=np.float32)
    comm.allgather_host(send, recv)
    _to_device(cupy, recv_ptr, recv.reshape(-1), stream_ptr)


def staged_reduce_scatter(comm, send_ptr, recv_ptr, count, stream_ptr):
    """Reduce-scatter (sum) of float32, ``count`` per rank; summed in float64 on the host."""
    cupy = _cuda()
    _not_capturing(cupy, stream_ptr)
    n = comm.world_size
    send = _to_host(cupy, send_ptr, 4 * n * count, stream_ptr).view(np.float32)
    recv = np.empty(count, dtype=np.float64)
    comm.reduce_scatter_host(send.astype(np.float64).reshape(n, count), recv)
    _to_device(cupy, recv_ptr, recv.astype(np.float32), stream_ptr)
