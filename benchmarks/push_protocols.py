"""Three ways to push and combine a direct call's rows, as bare CUDA C kernels (an
experiment that guides the direct kernel; not part of cupy_dcp, and not Numba).

    mpirun -np 2 python benchmarks/push_protocols.py [B,...] [GRID,...]   (two GPUs with peer access)

Two ranks, H/N = 64 heads each, D = 512 bfloat16, B tokens: each rank pushes
its partials of the peer's heads (and their LSEs) into the peer's window
(CUDA IPC), waits for the peer's, and combines them with its own (LSE
weights, bfloat16 out). Calls alternate between two slots by the parity of
an epoch in device memory, as in the direct kernel; a CUDA graph of 20
calls is replayed, and the slowest rank's median per call is printed.

- ``block``: each warp pushes a row (16-byte stores); a block barrier, one
  ``st.release.sys`` flag per block; one ``ld.acquire.sys`` poll per block,
  a barrier, each warp combines its row: the direct kernel's small calls.
- ``warp``: the same with a flag per warp (after ``__syncwarp``), polled
  per warp: no block barrier, a fence per row.
- ``ll128``: a row goes as nine 128-byte lines of 120 payload bytes and an
  8-byte flag (the epoch), a warp storing four lines per instruction; the
  reader polls the lines themselves: no fence and no flag store, but it
  relies on a warp's 128-byte store reaching the peer whole, which no
  documented memory model promises (NCCL's LL128 protocol relies on it on
  NVLink).

None of them handles what the direct kernel must (timeouts, failures, masks,
NaN and infinite LSEs, other dtypes and N); their outputs are compared bit
for bit with the ``block`` variant's.
"""
import sys
import numpy as np
import cupy as cp
from mpi4py import MPI

comm = MPI.COMM_WORLD
me = comm.rank
peer = 1 - me
cp.cuda.Device(me).use()
HN, D = 64, 512
src = r'''
typedef unsigned long long u64;
__device__ __forceinline__ long long ld_acq(const long long* p){long long v; asm volatile("ld.acquire.sys.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v;}
__device__ __forceinline__ void st_rel(long long* p, long long v){asm volatile("st.release.sys.global.b64 [%0], %1;" :: "l"(p), "l"(v) : "memory");}
__device__ __forceinline__ void st_v2(u64* p, u64 a, u64 b){asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" :: "l"(p), "l"(a), "l"(b) : "memory");}
__device__ __forceinline__ void ld_v2(const u64* p, u64& a, u64& b){asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");}
#define HN 64
#define D 512
#define ROWB 1152   /* window row bytes (V0, V2): 1024 data + LSE, line padded */
#define LINES 9     /* V1: 9 lines of 15 payload words (129 used) */
__device__ __forceinline__ float bf(unsigned short h){return __uint_as_float(((unsigned)h) << 16);}
__device__ __forceinline__ unsigned short tobf(float f){unsigned u = __float_as_uint(f); u += 0x7FFFu + ((u >> 16) & 1u); return (unsigned short)(u >> 16);}
__device__ __forceinline__ u64 mix(u64 a, u64 b, float w0, float w1){
  u64 r = 0;
  for (int k = 0; k < 4; ++k) {
    float v = w0 * bf((unsigned short)(a >> (16 * k))) + w1 * bf((unsigned short)(b >> (16 * k)));
    r |= ((u64)tobf(v)) << (16 * k);
  }
  return r;
}
__device__ __forceinline__ void weights(float l0, float l1, float& w0, float& w1){
  float m = fmaxf(l0, l1); float a = __expf(l0 - m), b = __expf(l1 - m); float inv = 1.f / (a + b); w0 = a * inv; w1 = b * inv;
}
__device__ __forceinline__ void arrive(long long* state, long long e){
  __syncthreads();
  if (threadIdx.x == 0) { __threadfence(); if (atomicAdd((unsigned long long*)(state + 1), 1ULL) == gridDim.x - 1) { state[1] = 0; state[0] = e; } }
}
// x [B][2*HN][D] bf16, lse [B][2*HN] f32, out [B][HN][D]; win: my window, pwin: the peer's (same layout)
extern "C" __global__ void __launch_bounds__(256, 2) v0(long long* state, const u64* x, const float* lse, u64* out,
    char* win, char* pwin, long long* flags, long long* pflags, int rows, int per_block, int warp_flags) {
  long long e = state[0] + 1; int par = e & 1;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int gw = blockIdx.x * 8 + warp;
  int nw = gridDim.x * 8;
  // push my rows: row r = (b, h) of the peer's heads
  for (int r = gw; r < rows; r += nw) {
    int b = r / HN, h = r % HN;
    const u64* s = x + ((size_t)b * 2 * HN + (1 - %ME%) * HN + h) * (D / 4);
    u64* d = (u64*)(pwin + ((size_t)par * rows + r) * ROWB);  // rows: the call's, slot by parity
    u64 a0 = s[2 * lane], a1 = s[2 * lane + 1], a2 = s[64 + 2 * lane], a3 = s[64 + 2 * lane + 1];
    st_v2(d + 2 * lane, a0, a1); st_v2(d + 64 + 2 * lane, a2, a3);
    if (lane == 0) ((float*)(d + 128))[0] = lse[b * 2 * HN + (1 - %ME%) * HN + h];
    if (warp_flags) { __syncwarp(); if (lane == 0) st_rel(pflags + 2 + r, e); }
  }
  if (!warp_flags) { __syncthreads(); if (threadIdx.x == 0) st_rel(pflags + 2 + blockIdx.x, e); }
  if (!warp_flags) { if (threadIdx.x == 0) while (ld_acq(flags + 2 + blockIdx.x) < e) {} __syncthreads(); }
  for (int r = gw; r < rows; r += nw) {
    int b = r / HN, h = r % HN;
    if (warp_flags) { if (lane == 0) while (ld_acq(flags + 2 + r) < e) {} __syncwarp(); }
    const u64* own = x + ((size_t)b * 2 * HN + %ME% * HN + h) * (D / 4);
    const u64* got = (const u64*)(win + ((size_t)par * rows + r) * ROWB);
    u64 o0 = own[2 * lane], o1 = own[2 * lane + 1], o2 = own[64 + 2 * lane], o3 = own[64 + 2 * lane + 1];
    u64 g0 = got[2 * lane], g1 = got[2 * lane + 1], g2 = got[64 + 2 * lane], g3 = got[64 + 2 * lane + 1];
    float l0 = lse[b * 2 * HN + %ME% * HN + h], l1 = ((const float*)(got + 128))[0];
    float w0, w1; weights(l0, l1, w0, w1);
    u64* dst = out + ((size_t)b * HN + h) * (D / 4);
    dst[2 * lane] = mix(o0, g0, w0, w1); dst[2 * lane + 1] = mix(o1, g1, w0, w1);
    dst[64 + 2 * lane] = mix(o2, g2, w0, w1); dst[64 + 2 * lane + 1] = mix(o3, g3, w0, w1);
  }
  arrive(state, e);
}
extern "C" __global__ void __launch_bounds__(256, 2) v1(long long* state, const u64* x, const float* lse, u64* out,
    char* win, char* pwin, long long* flags, long long* pflags, int rows, int per_block, int unused) {
  long long e = state[0] + 1; int par = e & 1;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int gw = blockIdx.x * 8 + warp;
  int nw = gridDim.x * 8;
  int p = lane % 8;
  for (int r = gw; r < rows; r += nw) {
    int b = r / HN, h = r % HN;
    const u64* s = x + ((size_t)b * 2 * HN + (1 - %ME%) * HN + h) * (D / 4);
    float l = lse[b * 2 * HN + (1 - %ME%) * HN + h];
    u64* d = (u64*)(pwin + ((size_t)par * rows + r) * (LINES * 128));
    u64 v[3][2];
    for (int i = 0; i < 3; ++i) {
      int line = 4 * i + lane / 8;
      int k = line * 15 + 2 * p;
      v[i][0] = k < 128 ? s[k] : (k == 128 ? (u64)__float_as_uint(l) : 0);
      v[i][1] = p == 7 ? (u64)e : (k + 1 < 128 ? s[k + 1] : (k + 1 == 128 ? (u64)__float_as_uint(l) : 0));
    }
    for (int i = 0; i < 3; ++i) { int line = 4 * i + lane / 8; if (line < LINES) st_v2(d + line * 16 + 2 * p, v[i][0], v[i][1]); }
  }
  for (int r = gw; r < rows; r += nw) {
    int b = r / HN, h = r % HN;
    const u64* own = x + ((size_t)b * 2 * HN + %ME% * HN + h) * (D / 4);
    const u64* got = (const u64*)(win + ((size_t)par * rows + r) * (LINES * 128));
    u64 g[3][2], o[3][2];
    for (int i = 0; i < 3; ++i) {
      int line = 4 * i + lane / 8; int k = line * 15 + 2 * p;
      o[i][0] = k < 128 ? own[k] : 0; o[i][1] = (p < 7 && k + 1 < 128) ? own[k + 1] : 0;
    }
    float l0 = lse[b * 2 * HN + %ME% * HN + h];
    while (true) {
      bool ok = true;
      for (int i = 0; i < 3; ++i) { int line = 4 * i + lane / 8; if (line < LINES) { ld_v2(got + line * 16 + 2 * p, g[i][0], g[i][1]); if (p == 7 && (long long)g[i][1] != e) ok = false; } }
      if (__all_sync(0xffffffffu, ok)) break;
    }
    float l1 = __uint_as_float((unsigned)__shfl_sync(0xffffffffu, g[2][0], 4));  // payload word 128: line 8, pair 4
    float w0, w1; weights(l0, l1, w0, w1);
    u64* dst = out + ((size_t)b * HN + h) * (D / 4);
    for (int i = 0; i < 3; ++i) {
      int line = 4 * i + lane / 8; int k = line * 15 + 2 * p;
      if (k < 128) dst[k] = mix(o[i][0], g[i][0], w0, w1);
      if (p < 7 && k + 1 < 128) dst[k + 1] = mix(o[i][1], g[i][1], w0, w1);
    }
  }
  arrive(state, e);
}
'''.replace("%ME%", str(me))
mod = cp.RawModule(code=src)
kern = {"block": (mod.get_function("v0"), 0), "warp": (mod.get_function("v0"), 1), "ll128": (mod.get_function("v1"), 0)}
maxB = 128
win_bytes = 2 * maxB * HN * max(1152, 9 * 128)
flag_words = 2 + maxB * HN
base = cp.cuda.runtime.malloc(win_bytes + 8 * flag_words + 4096)
cp.cuda.runtime.memset(base, 0, win_bytes + 8 * flag_words + 4096)
handles = comm.allgather(cp.cuda.runtime.ipcGetMemHandle(base))
pbase = cp.cuda.runtime.ipcOpenMemHandle(handles[peer])
flags, pflags = base + win_bytes, pbase + win_bytes
s = cp.cuda.Stream(non_blocking=True)

def bench(fn, calls=20, reps=20):
    s.begin_capture()
    for _ in range(calls): fn()
    g = s.end_capture()
    ts = []
    for rep in range(reps + 2):
        s.synchronize(); comm.Barrier()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(s); g.launch(s); e1.record(s); e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1000 / calls)
    return comm.allreduce(float(np.median(ts[2:])), op=MPI.MAX)

sizes = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "32,128").split(",")]
grids = [int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "256,264").split(",")]
rng = np.random.default_rng(me)
for B in sizes:
    rows = B * HN
    xh = (rng.standard_normal((B, 2 * HN, D)).astype(np.float32))
    xb = cp.asarray((xh.view(np.uint32) >> 16).astype(np.uint16))  # bf16 bits, truncated
    lse = cp.asarray(rng.uniform(-5, 5, (B, 2 * HN)).astype(np.float32))
    xu = xb.view(cp.uint64)
    outs, res = {}, []
    for name, (k, wf) in kern.items():
        for grid in grids:
            state = cp.zeros(4, cp.int64)  # a fresh epoch per variant: flags hold the epoch, reset them
            cp.cuda.runtime.memset(flags, 0, 8 * flag_words); cp.cuda.runtime.memset(base, 0, win_bytes)
            s.synchronize(); comm.Barrier()
            out = cp.zeros((B, HN, D // 4), cp.uint64)
            args = (state, xu, lse, out, np.uint64(base), np.uint64(pbase), np.uint64(flags), np.uint64(pflags), np.int32(rows), np.int32(0), np.int32(wf))
            fn = lambda: k((grid,), (256,), args, stream=s)
            fn(); s.synchronize(); comm.Barrier()
            first = cp.asnumpy(out)
            t = bench(fn)
            outs[(name, grid)] = first
            res.append((t, name, grid))
    ref = outs[("block", grids[0])]
    if me == 0:
        for t, name, grid in res:
            same = np.array_equal(outs[(name, grid)], ref)
            print(f"B={B:4d} {name:6s} grid {grid}: {t:7.2f} us{'' if same else '  DIFFERS from block'}", flush=True)
if me == 0:
    print("done", flush=True)
