"""Probe (timing only, not a program): a forward that moves whole-row runs with bulk copies.

A CTA owns chunks of R = G x RG consecutive rows, which are one contiguous run of bytes in a
contiguous (S, C) tensor. One thread copies a chunk (and its K-1 halo rows) into shared memory with
one ``cp.async.bulk`` per chunk on an mbarrier, STAGES chunks ahead; the threads, fixed (row group,
channel vector) pairs with their weights in registers, compute from shared memory into an output
buffer that one thread stores with one bulk copy (or, DIRECT, straight from registers). So every
global access is a long contiguous run: the ragged-C line pattern of the column walk (v24) is gone.
The question: how close to ``y.copy_(x)`` does that get, bare (MATH=0) and with the conv + SiLU
(MATH=1), against the routed forward, at ragged and whole-line C? (docs/performance.md v38: on the
H100 at most 3.5 % ahead of the routed forward at 32768-65536 tokens, 2-10 % behind from 250340.)

    CONFIGS="VEC,RG,STAGES,DIRECT,MINB ..." python3 scripts/runs_probe.py 250340:264 65536:384 ...
    (JSON lines on stdout)
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conv1d_silu import causal_conv1d_silu  # noqa: E402
from conv1d_silu.bench import Timer  # noqa: E402

SOURCE = r"""
typedef unsigned long long u64;
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(u64* b) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(b)) : "memory");
}
__device__ __forceinline__ void mbar_expect(u64* b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem_addr(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(u64* b, unsigned parity) {
  asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}"
               :: "r"(smem_addr(b)), "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, u64* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(b)) : "memory");
}
__device__ __forceinline__ void bulk_store(void* dst, const void* src, unsigned bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" :: "l"(dst), "r"(smem_addr(src)), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
__device__ __forceinline__ float lo(unsigned u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float hi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ unsigned pack(float a, float b) {
  unsigned r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a)); return r;
}
__device__ __forceinline__ float silu(float z) { return z / (1.f + __expf(-z)); }

// VEC bf16 per vector (8: 16 B, 4: 8 B); threads = G * n_vec, thread = (row group g, vector v), fixed.
// DIRECT: y stored from registers (the column pattern) instead of through a buffer and a bulk store.
template <int N> struct Words;
template <> struct Words<2> { typedef uint2 type; };
template <> struct Words<4> { typedef uint4 type; };
template <int NW> __device__ __forceinline__ void unpack(const void* p, unsigned* u) {
  typedef typename Words<NW>::type W;
  const W t = *reinterpret_cast<const W*>(p);
  const unsigned* q = reinterpret_cast<const unsigned*>(&t);
#pragma unroll
  for (int i = 0; i < NW; ++i) u[i] = q[i];
}
template <int NW> __device__ __forceinline__ void store(void* p, const unsigned* u) {
  typedef typename Words<NW>::type W;
  W t;
  unsigned* q = reinterpret_cast<unsigned*>(&t);
#pragma unroll
  for (int i = 0; i < NW; ++i) q[i] = u[i];
  *reinterpret_cast<W*>(p) = t;
}

template <int K, int VEC, int RG, int STAGES, int MATH, int DIRECT, int MINB>
__global__ void __launch_bounds__(256, MINB) runs_fwd(const unsigned short* __restrict__ x, const float* __restrict__ w,
    const float* __restrict__ bias, unsigned short* __restrict__ y, long long S, int C, int G, long long n_chunks) {
  constexpr int NW = VEC / 2;
  extern __shared__ __align__(128) unsigned char smem[];
  const int n_vec = C / VEC, R = G * RG, row_bytes = C * 2;
  const int in_stride = ((R + K - 1) * row_bytes + 127) & ~127, out_stride = (R * row_bytes + 127) & ~127;
  u64* mbar = reinterpret_cast<u64*>(smem);
  unsigned char* in0 = smem + 128;
  unsigned char* out0 = in0 + STAGES * in_stride;
  const int tid = threadIdx.x, g = tid / n_vec, v = tid - g * n_vec;
  float wv[K][VEC], bv[VEC];
  for (int e = 0; e < VEC; ++e) {
    bv[e] = bias[v * VEC + e];
    for (int k = 0; k < K; ++k) wv[k][e] = w[(v * VEC + e) * K + k];
  }
  auto issue = [&](long long chunk, int stage) {  // one thread: the chunk's run, halo rows first
    const long long r0 = chunk * R;
    const long long rows = min((long long)R, S - r0);
    const long long h = r0 == 0 ? 0 : K - 1;
    const unsigned bytes = (unsigned)((rows + h) * row_bytes);
    mbar_expect(&mbar[stage], bytes);
    bulk_load(in0 + stage * in_stride + (K - 1 - h) * row_bytes, x + (r0 - h) * C, bytes, &mbar[stage]);
  };
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) mbar_init(&mbar[s]);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (tid == 0)
    for (int s = 0; s < STAGES; ++s)
      if (blockIdx.x + (long long)s * gridDim.x < n_chunks) issue(blockIdx.x + (long long)s * gridDim.x, s);
  int it = 0;
  for (long long chunk = blockIdx.x; chunk < n_chunks; chunk += gridDim.x, ++it) {
    const int stage = it % STAGES;
    const long long r0 = chunk * R;
    const int rows = (int)min((long long)R, S - r0);
    mbar_wait(&mbar[stage], (it / STAGES) & 1);
    const unsigned char* in = in0 + stage * in_stride;
    unsigned char* out = out0 + (it & 1) * out_stride;
    if (g < G) {
      float xr[K][VEC];
      const int i0 = g * RG;  // chunk row of this group's first output; smem row i0 + K - 1
#pragma unroll
      for (int j = 0; j < K - 1; ++j) {  // rows i0 - (K-1) + j (zero before the sequence)
        unsigned u[NW];
        unpack<NW>(in + (i0 + j) * row_bytes + v * VEC * 2, u);
        const bool live = r0 + i0 - (K - 1) + j >= 0;
#pragma unroll
        for (int q = 0; q < NW; ++q) { xr[j][2 * q] = live ? lo(u[q]) : 0.f; xr[j][2 * q + 1] = live ? hi(u[q]) : 0.f; }
      }
#pragma unroll
      for (int i = 0; i < RG; ++i) {
        if (i0 + i < rows) {
          unsigned u[NW];
          unpack<NW>(in + (i0 + i + K - 1) * row_bytes + v * VEC * 2, u);
          if (MATH) {
            float* cur = xr[(i + K - 1) % K];
#pragma unroll
            for (int q = 0; q < NW; ++q) { cur[2 * q] = lo(u[q]); cur[2 * q + 1] = hi(u[q]); }
            float yv[VEC];
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
              float z = bv[e];
#pragma unroll
              for (int k = 0; k < K; ++k) z = fmaf(wv[k][e], xr[(i + k) % K][e], z);
              yv[e] = silu(z);
            }
#pragma unroll
            for (int q = 0; q < NW; ++q) u[q] = pack(yv[2 * q], yv[2 * q + 1]);
          }
          if (DIRECT) store<NW>(y + (r0 + i0 + i) * C + v * VEC, u);
          else store<NW>(out + (i0 + i) * row_bytes + v * VEC * 2, u);
        }
      }
    }
    if (!DIRECT) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // my writes, visible to the bulk store
      // store it-1 has read its buffer before the barrier, so iteration it+1 may overwrite it
      if (tid == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    }
    __syncthreads();
    if (tid == 0) {
      if (!DIRECT) bulk_store(y + r0 * C, out, (unsigned)(rows * row_bytes));
      const long long next = chunk + (long long)STAGES * gridDim.x;
      if (next < n_chunks) issue(next, stage);
    }
  }
  if (!DIRECT && tid == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
"""

NAME = "runs_fwd<4, {vec}, {rg}, {st}, {math}, {direct}, {minb}>"
# VEC,RG,STAGES,DIRECT,MINB per config
CONFIGS = "8,4,3,0,1 8,4,4,0,1 4,4,3,0,1 4,8,3,0,1 8,4,3,1,1 4,4,3,1,1 8,4,3,0,3 4,4,4,0,3"


def names(configs: str = CONFIGS, maths: tuple[int, ...] = (0, 1)) -> dict[tuple, str]:
    """The kernel instance of each (config, math) pair."""
    out = {}
    for c in configs.split():
        vec, rg, st, direct, minb = (int(v) for v in c.split(","))
        for m in maths:
            out[(vec, rg, st, direct, minb), m] = NAME.format(vec=vec, rg=rg, st=st, direct=direct, minb=minb, math=m)
    return out


def geometry(C: int, vec: int) -> tuple[int, int]:
    n_vec = C // vec
    G = max(1, 256 // n_vec)
    return G, G * n_vec


def main(shapes: list[str]) -> None:
    import cupy as cp
    from cupy_backends.cuda.api import driver

    dev = torch.device("cuda")
    sm = torch.cuda.get_device_properties(dev).multi_processor_count
    timer = Timer(dev, reps=int(os.environ.get("REPS", "25")), warmup=2, graph=True)
    instances = names(os.environ.get("CONFIGS", CONFIGS), tuple(int(m) for m in os.environ.get("MATHS", "0 1").split()))
    module = cp.RawModule(code=SOURCE, options=("-std=c++17", "--use_fast_math"), name_expressions=list(instances.values()))
    for shape in shapes:
        S, C = (int(v) for v in shape.split(":"))
        x = torch.randn(S, C, device=dev).to(torch.bfloat16)
        w = torch.randn(C, 4, device=dev) * 0.5
        b = torch.randn(C, device=dev) * 0.1
        y = torch.empty_like(x)
        xf = torch.nn.functional.pad(x.float().t(), (3, 0))
        ref = torch.nn.functional.silu(torch.nn.functional.conv1d(xf[None], w[:, None, :], b, groups=C)[0].t())
        del xf
        row = {"S": S, "C": C}
        calls = {"copy": lambda: y.copy_(x)}
        for (vec, rg, st, direct, minb), m in instances:
            G, threads = geometry(C, vec)
            R = G * rg
            smem = 128 + st * (-(-((R + 3) * C * 2) // 128) * 128) + (0 if direct else 2 * (-(-(R * C * 2) // 128) * 128))
            n_chunks = -(-S // R)
            fn = module.get_function(instances[(vec, rg, st, direct, minb), m])
            key = f"v{vec}_rg{rg}_st{st}{'_direct' if direct else ''}{f'_lb{minb}' if minb > 1 else ''}_{'math' if m else 'bare'}"
            try:
                fn.max_dynamic_shared_size_bytes = smem
                per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, threads, smem)
            except Exception as err:  # e.g. more shared memory than an SM has
                row[key] = f"FAILED {err}"[:120]
                continue
            grid = int(min(n_chunks, per_sm * sm))
            row[key + "_ctas"] = f"{per_sm}x{threads}/{fn.num_regs}r"

            def call(fn=fn, grid=grid, smem=smem, threads=threads, G=G, n_chunks=n_chunks):
                with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
                    fn((grid,), (threads,), (x.data_ptr(), w.data_ptr(), b.data_ptr(), y.data_ptr(),
                                              cp.int64(S), cp.int32(C), cp.int32(G), cp.int64(n_chunks)),
                       shared_mem=smem)

            y.zero_()
            call()
            torch.cuda.synchronize()
            row[key + "_err"] = round(float(((y.float() - ref) if m else (y.float() - x.float())).abs().max()), 4)
            calls[key] = call
        w_bf, b_bf = w.to(torch.bfloat16), b.to(torch.bfloat16)
        calls["routed"] = lambda: causal_conv1d_silu(x, w_bf, b_bf)
        keys = list(calls)
        prepared = [timer.prepare(calls[k]) for k in keys]
        for k, t in zip(keys, timer.times(prepared)):
            row[k] = round(statistics.median(t), 2)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    with torch.no_grad():
        main(sys.argv[1:] or ["250340:264", "250340:384"])
