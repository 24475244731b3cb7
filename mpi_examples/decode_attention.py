"""One decode step of context-parallel attention, combined with cupy_dcp.

    mpirun -n 4 python -m mpi4py mpi_examples/decode_attention.py

Each rank owns a contiguous shard of every sequence's KV cache (short
sequences leave the last ranks' shards empty), computes partial attention and
its LSE for all heads, and calls ``dcp_a2a_lse_reduce``: rank r ends with the
exact output of heads r*H/N ... (r+1)*H/N-1. The result is checked against
full attention over the gathered KV; a mismatch exits non-zero.

Runs on GPUs (CuPy, one per rank) when present, else on the CPU with NumPy;
``--device cpu`` forces the host path. Ranks that share a GPU (more ranks than
GPUs) still run: NCCL refuses that, so cupy_dcp warns and exchanges their
device arrays through host memory with MPI (exact, slower).
"""

import argparse
import sys
import time

import numpy as np
from mpi4py import MPI

import cupy_dcp


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seqs", type=int, default=8, help="decode tokens B (one per sequence)")
    p.add_argument("--heads", type=int, default=16, help="query heads H (a multiple of N)")
    p.add_argument("--head-dim", type=int, default=128, help="head size D")
    p.add_argument("--max-kv", type=int, default=512, help="longest KV length")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "gpu"])
    p.add_argument("--iters", type=int, default=20, help="timed calls")
    args = p.parse_args()
    for name in ("seqs", "heads", "head_dim", "max_kv", "iters"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(args, name)})")
    ranks = MPI.COMM_WORLD.Get_size()
    if args.heads % ranks:
        p.error(f"--heads must be a multiple of the ranks (got {args.heads} heads for {ranks})")
    return args


def pick_backend(device, comm):
    """NumPy, or CuPy on this rank's GPU."""
    if device == "cpu":
        return np
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver or no GPU: the host path
        count = 0
    if count == 0:
        if device == "gpu":
            raise RuntimeError("--device gpu needs CuPy and a CUDA GPU")
        return np
    local = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
    cupy.cuda.Device(local % count).use()
    return cupy


def kv_shard(lengths, rank, world):
    """[start, stop) of each sequence's KV owned by ``rank``: contiguous chunks."""
    chunk = -(-lengths // world)
    start = np.minimum(rank * chunk, lengths)
    return start, np.minimum(start + chunk, lengths)


def partial_attention(xp, q, k, v):
    """Attention of q [H, Dk] over k, v [L, H, D]: (out [H, D], lse [H]); L may be 0."""
    H, D = q.shape[0], v.shape[2]
    if k.shape[0] == 0:
        return xp.zeros((H, D), dtype=xp.float32), xp.full((H,), -np.inf, dtype=xp.float32)
    scores = xp.einsum("hd,lhd->hl", q, k) / np.sqrt(q.shape[1])
    m = scores.max(axis=1, keepdims=True)
    p = xp.exp(scores - m)
    total = p.sum(axis=1, keepdims=True)
    return xp.einsum("hl,lhd->hd", p / total, v), (xp.log(total) + m)[:, 0]


def main():
    args = parse_args()
    comm = MPI.COMM_WORLD
    rank, world = comm.rank, comm.size
    xp = pick_backend(args.device, comm)
    dtype = cupy_dcp.layout.as_dtype(args.dtype)
    B, H, D = args.seqs, args.heads, args.head_dim
    hn = H // world

    rng = np.random.default_rng(1234)  # the same full problem on every rank
    lengths = rng.integers(1, args.max_kv + 1, size=B)
    lengths[0] = 1  # one KV entry: every rank but the first has an empty shard
    q = rng.standard_normal((B, H, D)).astype(np.float32)
    kv = [rng.standard_normal((2, int(n), H, D)).astype(np.float32) for n in lengths]

    start, stop = kv_shard(lengths, rank, world)
    mine = [x[:, s:e] for x, s, e in zip(kv, start, stop)]
    out = xp.zeros((B, H, D), dtype=xp.float32)
    lse = xp.zeros((B, H), dtype=xp.float32)
    for b in range(B):
        k, v = xp.asarray(mine[b][0]), xp.asarray(mine[b][1])
        out[b], lse[b] = partial_attention(xp, xp.asarray(q[b]), k, v)
    out = out.astype(dtype)

    result = cupy_dcp.dcp_a2a_lse_reduce(out, lse, comm)
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        result = cupy_dcp.dcp_a2a_lse_reduce(out, lse, comm)
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()
    per_call_us = (time.perf_counter() - t0) / max(args.iters, 1) * 1e6

    # Expected: full attention over the KV gathered from every rank's shard.
    shards = comm.allgather(mine)
    errors = []
    for b in range(B):
        full_k = np.concatenate([s[b][0] for s in shards])
        full_v = np.concatenate([s[b][1] for s in shards])
        expect, _ = partial_attention(np, q[b], full_k, full_v)
        got = np.asarray(result[b].get() if xp is not np else result[b]).astype(np.float32)
        errors.append(np.abs(got - expect[rank * hn:(rank + 1) * hn]).max())
    max_err = float(max(errors))
    tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}[args.dtype]
    worst = comm.allreduce(max_err, op=MPI.MAX)
    where = "GPU" if xp is not np else "CPU"
    print(f"rank {rank}/{world} [{where}] B={B} H={H} D={D} {args.dtype}: "
          f"max error {max_err:.2e}, {per_call_us:.1f} us per call", flush=True)
    if worst > tol:
        if rank == 0:
            print(f"FAILED: max error {worst:.2e} > {tol:.0e}", file=sys.stderr, flush=True)
        sys.exit(1)
    if rank == 0:
        print(f"OK: every rank within {tol:.0e} of full attention", flush=True)


if __name__ == "__main__":
    main()
