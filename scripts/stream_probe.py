"""What the backward's access pattern can reach, without the backward: a probe kernel that reads
two [S, C] bf16 tensors and writes a third (out = x ^ dy, bitwise, checked; no math), with the
backward's geometry (CTAs of 8 lanes x t threads, each lane walking `rows` consecutive rows of one
channel tile), over the ways a thread can move its bytes:

  vec     4, 8 or 16 bytes per thread per access
  mode    ldg:   plain loads into a double-buffered register ring of AHEAD rows
          async: cp.async into the thread's own shared-memory ring of AHEAD + 1 rows (as
                 kernels/common.cuh's RowPipe; .ca below 16 bytes, .cg at 16), one group per row
  ahead   rows in flight per thread
  ctas    CTAs per SM: as many as fit, and those giving 16 and 32 warps per SM (set by padding
          the dynamic shared memory)

against torch.add of the same tensors. Graph replays, cold L2, medians, µs; one JSON line per
shape, keys vec/mode/ahead/rows/tile/ctas (docs/performance.md v13).

    KERNELS="8/1/4 8/1/8" ROWS="256 32" TILES="32 96" INTERLEAVE=0 python3 scripts/stream_probe.py S:C ...

KERNELS: vec/mode(0 ldg, 1 async)/ahead; ROWS: rows per lane (S a multiple of 8 x rows); TILES:
threads per lane; CTAS: CTAs per SM to try; INTERLEAVE=1 also runs 256-row lanes that take every
8th row of the CTA's block; PERM: unit orders to try (unit = blockIdx * PERM mod grid, PERM coprime);
TRACE=1 adds per-configuration CTA timelines (unit durations, span, busiest / idlest SM);
TRACE_DIR keeps the raw stamps there; CARVEOUT: preferred shared-memory carveouts (percent) to try;
HALO: rows a lane reads past its own (the backward reads K - 1 of x and dy, and K - 1 of x before).
Padding fills the carveout and so leaves 28 KiB of L1, except at CTAS=5 and 7, which overshoot the
SM's shared memory by under 128 bytes and so hold 4 and 6 CTAs in a 196 KiB carveout (60 KiB of L1):
the trace's "resident" says how many ran at once (docs/performance.md v14).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conv1d_silu.bench import Timer, shape_inputs  # noqa: E402

SOURCE = r"""
template <int VB> struct Vt;
template <> struct Vt<4> { using type = unsigned int; };
template <> struct Vt<8> { using type = uint2; };
template <> struct Vt<16> { using type = uint4; };
__device__ __forceinline__ unsigned int mix(unsigned int a, unsigned int b) { return a ^ b; }
__device__ __forceinline__ uint2 mix(uint2 a, uint2 b) { return make_uint2(a.x ^ b.x, a.y ^ b.y); }
__device__ __forceinline__ uint4 mix(uint4 a, uint4 b) {
  return make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w);
}
template <int VB> __device__ __forceinline__ void copy_async(unsigned int dst, const void* src) {
  if (VB == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(dst), "l"(src), "n"(VB) : "memory");
}

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One lane's walk over n rows (row_bytes apart). MODE 0: register ring; MODE 1: cp.async ring,
// which reads n_read >= n rows (the backward's halo: rows past the lane's own that it reads but
// does not write). Rows per lane a multiple of 2 * AHEAD for MODE 0.
template <int VB, int MODE, int AHEAD>
__device__ __forceinline__ void walk_lane(const char* px, const char* pd, char* po, long long row_bytes, int n,
                                          int n_read, unsigned char* smem) {
  using V = typename Vt<VB>::type;
  if (MODE == 0) {
    V xa[AHEAD], da[AHEAD], xb[AHEAD], db[AHEAD];
#pragma unroll
    for (int i = 0; i < AHEAD; ++i) {
      xa[i] = *reinterpret_cast<const V*>(px + i * row_bytes);
      da[i] = *reinterpret_cast<const V*>(pd + i * row_bytes);
    }
    for (int j = 0; j < n; j += 2 * AHEAD) {
#pragma unroll
      for (int i = 0; i < AHEAD; ++i) {
        xb[i] = *reinterpret_cast<const V*>(px + (j + AHEAD + i) * row_bytes);
        db[i] = *reinterpret_cast<const V*>(pd + (j + AHEAD + i) * row_bytes);
      }
#pragma unroll
      for (int i = 0; i < AHEAD; ++i) *reinterpret_cast<V*>(po + (j + i) * row_bytes) = mix(xa[i], da[i]);
      if (j + 2 * AHEAD < n) {
#pragma unroll
        for (int i = 0; i < AHEAD; ++i) {
          xa[i] = *reinterpret_cast<const V*>(px + (j + 2 * AHEAD + i) * row_bytes);
          da[i] = *reinterpret_cast<const V*>(pd + (j + 2 * AHEAD + i) * row_bytes);
        }
      }
#pragma unroll
      for (int i = 0; i < AHEAD; ++i)
        *reinterpret_cast<V*>(po + (j + AHEAD + i) * row_bytes) = mix(xb[i], db[i]);
    }
  } else {
    constexpr int STAGES = AHEAD + 1, PITCH = 2 * STAGES + 1;  // odd: a warp's slices in distinct banks
    const unsigned int mine = (unsigned int)__cvta_generic_to_shared(smem) + threadIdx.x * PITCH * VB;
    const V* me = reinterpret_cast<const V*>(smem + threadIdx.x * PITCH * VB);
#pragma unroll
    for (int i = 0; i < AHEAD; ++i) {
      copy_async<VB>(mine + (2 * i) * VB, px + i * row_bytes);
      copy_async<VB>(mine + (2 * i + 1) * VB, pd + i * row_bytes);
      asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    for (int j0 = 0; j0 < n_read; j0 += STAGES) {
#pragma unroll
      for (int s = 0; s < STAGES; ++s) {  // stage s holds row j0 + s
        const int j = j0 + s;
        asm volatile("cp.async.wait_group %0;\n" ::"n"(AHEAD - 1) : "memory");
        const V a = me[2 * s], b = me[2 * s + 1];
        const int q = j + AHEAD, qs = (s + AHEAD) % STAGES;
        if (q < n_read) {
          copy_async<VB>(mine + (2 * qs) * VB, px + q * row_bytes);
          copy_async<VB>(mine + (2 * qs + 1) * VB, pd + q * row_bytes);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        if (j < n) *reinterpret_cast<V*>(po + j * row_bytes) = mix(a, b);
      }
    }
  }
}

// trace (optional): per CTA its start and end (%globaltimer, ns) and SM id.
template <int VB, int MODE, int AHEAD>
__global__ void walk(const char* __restrict__ x, const char* __restrict__ dy, char* __restrict__ out,
                     long long S, long long row_bytes, long long rows_per_lane, long long n_ctiles,
                     long long tile_t, long long interleave, long long perm, long long halo,
                     unsigned long long* trace) {
  extern __shared__ __align__(16) unsigned char smem[];
  if (trace && threadIdx.x == 0) trace[3 * blockIdx.x] = global_ns();
  const int lane = threadIdx.x / (int)tile_t, vl = threadIdx.x % (int)tile_t;
  const long long unit = (long long)blockIdx.x * perm % gridDim.x;  // perm coprime to the grid
  const long long ct = unit % n_ctiles, node = unit / n_ctiles;
  const long long c = (ct * tile_t + vl) * VB;
  // a lane walks rows_per_lane consecutive rows, or (interleave) every 8th row of the CTA's block
  const long long r0 = interleave ? node * 8 * rows_per_lane + lane : (node * 8 + lane) * rows_per_lane;
  if (c < row_bytes && r0 < S)  // S a multiple of 8 * rows_per_lane
    walk_lane<VB, MODE, AHEAD>(x + r0 * row_bytes + c, dy + r0 * row_bytes + c, out + r0 * row_bytes + c,
                               row_bytes * (interleave ? 8 : 1), (int)rows_per_lane,
                               (int)min(rows_per_lane + halo, S - r0), smem);
  if (trace) {
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned int sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      trace[3 * blockIdx.x + 1] = global_ns();
      trace[3 * blockIdx.x + 2] = sm;
    }
  }
}
"""

# vec bytes, mode (0: ldg, 1: async), rows ahead
NAMES = [f"walk<{vb}, {m}, {a}>" for vb in (4, 8, 16) for m in (0, 1) for a in (2, 4, 8)]
SM_SMEM = 233472  # bytes of shared memory per SM on sm_90 (228 KiB)
CTA_RESERVED = 1024


def trace_summary(launch, grid: int, sms: int, timer: Timer, save: str | None = None) -> dict:
    """One cold-L2 launch with per-CTA %globaltimer stamps: unit durations (q10 / q50 / q90, µs),
    the span, and the busiest and idlest SM's summed unit time, which show whether a slow
    configuration has slow units everywhere or slow SMs. save: a path for the raw [grid, 3]
    (start ns, end ns, SM) stamps."""
    trace = torch.zeros(grid, 3, dtype=torch.int64, device="cuda")
    timer._flush()
    launch(trace)
    torch.cuda.synchronize()
    if save:
        torch.save(trace.cpu(), save)
    start, end, sm = trace.cpu().unbind(1)
    dur = (end - start).double() / 1e3
    busy = torch.zeros(sms, dtype=torch.float64).index_add_(0, sm, dur)
    q = torch.quantile(dur, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()
    # CTAs resident at once on each SM (the most of its units that overlap), min and max over SMs
    conc = []
    for s in range(sms):
        on = sm == s
        events = sorted([(v, 1) for v in start[on].tolist()] + [(v, -1) for v in end[on].tolist()])
        live = peak = 0
        for _, step in events:
            live += step
            peak = max(peak, live)
        conc.append(peak)
    return {"unit_us": [round(v, 2) for v in q], "span_us": round((end.max() - start.min()).item() / 1e3, 1),
            "sm_busy_us": [round(busy.min().item(), 1), round(busy.max().item(), 1)],
            "resident": [min(conc), max(conc)]}


def main(shapes: list[str]) -> None:
    import cupy
    import numpy as np

    warnings.simplefilter("ignore", DeprecationWarning)  # cupy.cuda.ExternalStream
    dev = torch.device("cuda")
    timer = Timer(dev, reps=int(os.environ.get("REPS", "15")), warmup=2, graph=True)
    med = lambda f: round(statistics.median(timer(f)), 2)  # noqa: E731
    kept = os.environ.get("KERNELS", "8/0/2 8/0/4 8/1/4 8/1/8 16/0/2").split()
    lane_rows = [int(r) for r in os.environ.get("ROWS", "256 32").split()]
    tiles = [int(t) for t in os.environ.get("TILES", "32 48 64 96 128").split()]
    interleave = (0, 1) if int(os.environ.get("INTERLEAVE", "1")) else (0,)
    perms = [int(p) for p in os.environ.get("PERM", "1").split()]  # unit order: blockIdx * PERM mod grid
    halos = [int(h) for h in os.environ.get("HALO", "0").split()]  # rows read past a lane's own (async only)
    tracing = bool(int(os.environ.get("TRACE", "0")))
    # preferred shared-memory carveout, percent of 228 KiB (-1: the driver's choice; the rest of the
    # SM's 256 KiB is L1)
    carveouts = [int(c) for c in os.environ.get("CARVEOUT", "-1").split()]
    mod = cupy.RawModule(code=SOURCE, options=("-std=c++17",), name_expressions=NAMES)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for shape in shapes:
        S, C = (int(v) for v in shape.split(":"))
        x, _, _, dy = shape_inputs(S, C, 4, torch.bfloat16, dev)
        x = x.detach()
        out = torch.empty_like(x)
        ref = (x.view(torch.int16) ^ dy.view(torch.int16)).view(torch.bfloat16)
        row = {"S": S, "C": C, "add": med(lambda: torch.add(x, dy, out=out))}
        configs = [(name, rows, tile_t, inter, perm, halo) for name in NAMES for rows in lane_rows
                   for tile_t in tiles for inter in interleave for perm in perms for halo in halos]
        for name, rows, tile_t, inter, perm, halo in configs:
            vb, mode, ahead = (int(v) for v in name[5:-1].split(","))
            if f"{vb}/{mode}/{ahead}" not in kept or (C * 2) % vb or tile_t * 8 > 1024 or (inter and rows < 256) \
                    or (mode == 0 and (rows % (2 * ahead) or halo)) or (inter and halo) or S % (8 * rows):
                continue  # the register ring reads 2 x ahead rows at a time
            kern = mod.get_function(name)
            block = 8 * tile_t
            n_ctiles = -(-C * 2 // (tile_t * vb))  # the last tile may have idle threads
            grid = S // (8 * rows) * n_ctiles
            if math.gcd(perm, grid) != 1:
                continue
            ring = block * (2 * (ahead + 1) + 1) * vb if mode == 1 else 0
            fit = min(65536 // (block * max(kern.num_regs, 1)), 2048 // block)
            # as many as fit, 16 and 32 warps per SM (or CTAS="1 2 3 ...")
            # (0: no padding, the ring only; CARVEOUT then sets how many fit and how much L1 is left)
            wanted = {int(n) for n in os.environ.get("CTAS", "").split()} or {fit, 512 // block, 1024 // block}
            for ctas, co in [(n, co) for n in sorted(wanted & set(range(0, fit + 1))) for co in carveouts]:
                smem = max(ring, SM_SMEM // ctas - CTA_RESERVED) if ctas else ring
                if ctas and ring + CTA_RESERVED > SM_SMEM // ctas:
                    continue  # that many CTAs do not fit
                kern.max_dynamic_shared_size_bytes = max(smem, 1)
                kern.preferred_shared_memory_carveout = co
                args = (np.uint64(x.data_ptr()), np.uint64(dy.data_ptr()), np.uint64(out.data_ptr()),
                        np.int64(S), np.int64(C * 2), np.int64(rows), np.int64(n_ctiles), np.int64(tile_t),
                        np.int64(inter), np.int64(perm), np.int64(halo))

                def launch(trace: torch.Tensor | None = None) -> None:
                    with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
                        ptr = np.uint64(0 if trace is None else trace.data_ptr())
                        kern((grid,), (block,), (*args, ptr), shared_mem=smem)

                out.zero_()
                launch()
                torch.cuda.synchronize()
                key = (f"v{vb}/{'async' if mode else 'ldg'}/a{ahead}/r{rows}{'i' if inter else ''}/t{tile_t}/cta{ctas}"
                       + (f"/p{perm}" if perm != 1 else "") + (f"/co{co}" if co >= 0 else "")
                       + (f"/h{halo}" if halo else ""))
                ok = torch.equal(out.view(torch.int16), ref.view(torch.int16))
                t = med(launch)
                row[key] = t if ok else f"WRONG {t}"
                if tracing:
                    keep = os.environ.get("TRACE_DIR")
                    save = f"{keep}/{S}x{C}_{key.replace('/', '_')}.pt" if keep else None
                    row[key + "/trace"] = trace_summary(launch, grid, sms, timer, save)
        row["sms"] = sms
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
