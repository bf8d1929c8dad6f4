// A small single-threaded CUDA emulator for the kernel tests on machines without a GPU.
//
// Each CTA runs its threads as cooperative fibers (ucontext): a thread runs until it reaches
// __syncthreads(), then the next one runs; when every live thread waits, the barrier opens.
// CTAs run one after another, so inter-CTA protocols (last-CTA tickets) resolve in launch order.
// A barrier that some threads skip (they exited while others wait) is reported as an error:
// on a GPU that is undefined behaviour. Arithmetic follows the host's libm, so results match the
// GPU to rounding, not bit for bit; the tests compare with the reference at fp32 tolerances.
#pragma once

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <source_location>
#include <utility>
#include <vector>

#define CONV1D_SILU_EMULATE 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __grid_constant__

namespace emu {

struct Dim3 {
  unsigned int x = 1, y = 1, z = 1;
};

struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  Dim3 tid;
  bool done = false;
  bool waiting = false;
  // cp.async: copies land only at a wait that covers their group, so reading a row before its
  // wait sees stale shared memory, as it could on a GPU.
  struct Copy {
    void* dst;
    const void* src;
    int bytes;
  };
  std::vector<Copy> open;
  std::vector<std::vector<Copy>> groups;
};

struct State {
  Dim3 block_idx, block_dim, grid_dim;
  std::vector<Fiber> fibers;
  size_t current = 0;
  ucontext_t scheduler;
  std::vector<unsigned char> smem;
  const std::function<void()>* body = nullptr;
  // __syncthreads_or: barrier k collects into vote[k % 2], cleared when barrier k - 1 opens
  unsigned int generation = 0;
  int vote[2] = {0, 0};
  // warp shuffles: each thread's value and its call (site, kind, lane offset), exchanged between
  // two barriers; bad_shuffle: lanes of a warp met at different calls, or with a partial mask
  std::vector<uint64_t> lanes, calls;
  bool bad_shuffle = false;
};

inline State& state() {
  static State s;
  return s;
}

inline void fiber_entry() {
  State& s = state();
  (*s.body)();
  s.fibers[s.current].done = true;
  swapcontext(&s.fibers[s.current].ctx, &s.scheduler);
}

inline void barrier() {
  State& s = state();
  s.fibers[s.current].waiting = true;
  swapcontext(&s.fibers[s.current].ctx, &s.scheduler);
}

// Runs grid x block threads; returns 0, 1 when a barrier was skipped by exited threads, or 2 when
// the lanes of a warp met at different shuffles (or one had a partial mask).
inline int run(unsigned int grid, unsigned int block, unsigned int smem_bytes, const std::function<void()>& body) {
  State& s = state();
  s.grid_dim.x = grid;
  s.block_dim.x = block;
  s.body = &body;
  s.smem.assign(smem_bytes + 16, 0xCD);  // poisoned, like uninitialised shared memory
  s.fibers.resize(block);
  s.lanes.assign(block, 0);
  s.calls.assign(block, 0);
  s.bad_shuffle = false;
  for (auto& f : s.fibers)
    if (f.stack.size() < (1 << 17)) f.stack.resize(1 << 17);
  for (unsigned int b = 0; b < grid; ++b) {
    s.block_idx.x = b;
    s.generation = 0;
    s.vote[0] = s.vote[1] = 0;
    for (unsigned int t = 0; t < block; ++t) {
      Fiber& f = s.fibers[t];
      f.tid.x = t;
      f.done = f.waiting = false;
      f.open.clear();
      f.groups.clear();
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack.data();
      f.ctx.uc_stack.ss_size = f.stack.size();
      f.ctx.uc_link = nullptr;
      makecontext(&f.ctx, fiber_entry, 0);
    }
    for (;;) {
      for (size_t t = 0; t < block; ++t) {
        if (s.fibers[t].done || s.fibers[t].waiting) continue;
        s.current = t;
        swapcontext(&s.scheduler, &s.fibers[t].ctx);
      }
      size_t waiting = 0, done = 0;
      for (auto& f : s.fibers) {
        waiting += f.waiting;
        done += f.done;
      }
      if (waiting == 0) {
        if (s.bad_shuffle) return 2;
        break;
      }
      if (done != 0) return 1;
      for (auto& f : s.fibers) f.waiting = false;
      s.vote[++s.generation % 2] = 0;
    }
  }
  return 0;
}

inline Fiber& self() { return state().fibers[state().current]; }
inline void async_copy(void* dst, const void* src, int bytes) { self().open.push_back({dst, src, bytes}); }
inline void async_commit() {
  Fiber& f = self();
  f.groups.push_back(std::move(f.open));
  f.open.clear();
}
inline void async_wait(int pending) {
  Fiber& f = self();
  while ((int)f.groups.size() > pending) {
    for (const auto& c : f.groups.front()) std::memcpy(c.dst, c.src, c.bytes);
    f.groups.erase(f.groups.begin());
  }
}

// bf16 / fp16 conversions with round-to-nearest-even, as cvt.rn does.
inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bf16_to_f32(unsigned short b) { return bits_to_f32(uint32_t(b) << 16); }
inline unsigned short f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}
inline float f16_to_f32(unsigned short h) {
  _Float16 v;
  std::memcpy(&v, &h, 2);
  return (float)v;
}
inline unsigned short f32_to_f16(float f) {
  _Float16 v = (_Float16)f;
  unsigned short h;
  std::memcpy(&h, &v, 2);
  return h;
}

}  // namespace emu

#define threadIdx (emu::state().fibers[emu::state().current].tid)
#define blockIdx (emu::state().block_idx)
#define blockDim (emu::state().block_dim)
#define gridDim (emu::state().grid_dim)
#define CONV1D_SILU_DYNAMIC_SMEM(name) unsigned char* name = emu::state().smem.data()

inline void __syncthreads() { emu::barrier(); }
inline int __syncthreads_or(int predicate) {
  emu::State& s = emu::state();
  const unsigned int g = s.generation % 2;
  s.vote[g] |= predicate != 0;
  emu::barrier();
  return s.vote[g];
}
// A shuffle is an exchange between two barriers of the whole CTA here: every thread writes its
// value and its call, then reads its source lane's. The kernels shuffle with full warps in uniform
// code, so every warp passes the same shuffles; the 32 lanes of a warp must meet at the same call
// (source line, kind, offset) with a full mask, else the launch fails. A shuffle that some threads
// skip is reported as a skipped barrier. (Unlike a GPU's shuffle, the barriers also order shared
// memory between warps.)
namespace emu {
template <typename T> inline T shuffle(T v, int src_lane, unsigned int mask, uint64_t call) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "a shuffle moves up to 8 bytes");
  State& s = state();
  const unsigned int t = threadIdx.x, first = t & ~31u;
  std::memcpy(&s.lanes[t], &v, sizeof(T));
  s.calls[t] = call;
  barrier();
  if (mask != 0xffffffffu) s.bad_shuffle = true;
  for (unsigned int u = first; u < first + 32 && u < s.calls.size(); ++u)
    if (s.calls[u] != call) s.bad_shuffle = true;
  T out = v;  // src_lane < 0 or > 31: its own value
  if (src_lane >= 0 && src_lane < 32) std::memcpy(&out, &s.lanes[first + src_lane], sizeof(T));
  barrier();
  return out;
}
inline uint64_t call_of(const std::source_location& at, int kind, int offset) {
  return (uint64_t)at.line() << 24 | (uint64_t)at.column() << 8 | (uint64_t)(kind * 64 + (offset & 63));
}
}  // namespace emu
template <typename T>
inline T __shfl_sync(unsigned int mask, T v, int src, std::source_location at = std::source_location::current()) {
  return emu::shuffle(v, src & 31, mask, emu::call_of(at, 0, src & 31));
}
template <typename T>
inline T __shfl_up_sync(unsigned int mask, T v, unsigned int d, std::source_location at = std::source_location::current()) {
  return emu::shuffle(v, (int)(threadIdx.x & 31u) - (int)d, mask, emu::call_of(at, 1, (int)d));
}
template <typename T>
inline T __shfl_down_sync(unsigned int mask, T v, unsigned int d, std::source_location at = std::source_location::current()) {
  return emu::shuffle(v, (int)(threadIdx.x & 31u) + (int)d, mask, emu::call_of(at, 2, (int)d));
}
inline void __threadfence() {}
inline unsigned int atomicAdd(unsigned int* p, unsigned int v) {
  const unsigned int old = *p;
  *p = old + v;
  return old;
}
template <typename T> inline T __ldcg(const T* p) { return *p; }
inline float __expf(float v) { return std::exp(v); }
inline float __frcp_rn(float v) { return 1.0f / v; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline float __uint_as_float(unsigned int u) { return emu::bits_to_f32(u); }
using std::exp;
