// Shared pieces of the forward and backward templates: number formats, vector access, the
// activation, and the document walker. Compiled by NVRTC (no CUDA headers needed) and, for the
// CPU kernel tests, by g++ with tests/emulator/cuda_emulator.h.
#pragma once

#define C1S_FN __device__ __forceinline__
#ifndef CONV1D_SILU_EMULATE
#define CONV1D_SILU_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

namespace c1s {

// Document modes (conv1d_silu/documents.py).
constexpr int SINGLE = 0, BATCH = 1, SEQ_IDX = 2, CU_SEQLENS = 3;
// Canonical reduction (docs/kernel-design.md): tokens per slab and children per tree node.
constexpr int SLAB = 32;
constexpr int FAN = 8;
constexpr int LANES = 8;  // thread rows per CTA: one tree node's children

struct bf16 { unsigned short bits; };
struct f16 { unsigned short bits; };

// ---- kernel arguments -------------------------------------------------------------------------
// Each kernel takes one struct (conv1d_silu/kernels/__init__.py, ARGS, names the fields in order
// and gpu.py fills them by name). Every field is 8 bytes, a pointer or a long long, so the host
// packs a struct as an array of 8-byte slots; the 32-bit values narrow inside the kernel.
struct FwdArgs {
  const void* x; long long x_rs; const void* w; const void* bias; const int* table; long long row_len;
  long long n_docs; const void* init; void* y; void* final_states; long long S; long long C;
  long long tile_v; long long n_ctiles; long long n_units;
};
struct BwdArgs {
  const void* x; long long x_rs; const void* dy; long long dy_rs; const void* w; const void* bias;
  const int* table; long long row_len; long long n_docs; const void* init; void* dx; void* dinit;
  void* dw; void* db; long long accumulate; void* workspace; unsigned int* tickets; long long S;
  long long C; long long tile_v; long long n_ctiles; long long n_units; long long root_level;
  const void* next_x; const void* next_dy; long long n_next; long long n_vec; long long split;
};
struct UpdateArgs {
  const void* x; long long x_bs; long long x_cs; long long x_ls; void* state; long long state_bs;
  long long state_cs; long long state_ls; long long state_len; const void* w; const void* bias;
  const int* cache_seqlens; const int* state_indices; void* out; long long out_bs; long long out_cs;
  long long out_ls; long long C; long long L;
};
// Channel-first (conv1d_silu_bcl.cu): x, dy, y and dx are (B, C, L) with the sequence contiguous
// and any batch (_bs) and channel (_cs) strides.
struct FwdBclArgs {
  const void* x; long long x_bs; long long x_cs; const void* w; const void* bias; const int* table;
  long long n_docs; const void* init; void* y; long long y_bs; long long y_cs; void* final_states; long long S;
  long long C; long long L; long long n_chunks;
};
struct BwdBclArgs {
  const void* x; long long x_bs; long long x_cs; const void* dy; long long dy_bs; long long dy_cs; const void* w;
  const void* bias; const int* table; long long n_docs; const void* init; void* dx; long long dx_bs;
  long long dx_cs; void* dinit; void* dw; void* db; long long accumulate; void* workspace; long long S;
  long long C; long long L; long long n_parts; long long part_slabs; long long top_level; long long root_level;
};
struct FoldArgs {
  const void* workspace; void* dw; void* db; long long accumulate; long long C; long long n_nodes;
  long long levels;
};

// ---- conversions (round to nearest even on the way out) -------------------------------------
template <typename To, typename From> struct Convert;
template <> struct Convert<float, float> { static C1S_FN float run(float v) { return v; } };
template <> struct Convert<double, double> { static C1S_FN double run(double v) { return v; } };
template <> struct Convert<float, double> { static C1S_FN float run(double v) { return (float)v; } };
template <> struct Convert<double, float> { static C1S_FN double run(float v) { return (double)v; } };
#ifndef CONV1D_SILU_EMULATE
template <> struct Convert<float, bf16> {
  static C1S_FN float run(bf16 v) { return __uint_as_float(((unsigned int)v.bits) << 16); }
};
template <> struct Convert<bf16, float> {
  static C1S_FN bf16 run(float v) {
    bf16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(v));
    return r;
  }
};
template <> struct Convert<float, f16> {
  static C1S_FN float run(f16 v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
  }
};
template <> struct Convert<f16, float> {
  static C1S_FN f16 run(float v) {
    f16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(v));
    return r;
  }
};
#else
template <> struct Convert<float, bf16> { static float run(bf16 v) { return emu::bf16_to_f32(v.bits); } };
template <> struct Convert<bf16, float> { static bf16 run(float v) { return bf16{emu::f32_to_bf16(v)}; } };
template <> struct Convert<float, f16> { static float run(f16 v) { return emu::f16_to_f32(v.bits); } };
template <> struct Convert<f16, float> { static f16 run(float v) { return f16{emu::f32_to_f16(v)}; } };
#endif
template <typename To, typename From> C1S_FN To cvt(From v) { return Convert<To, From>::run(v); }

// Arithmetic type: fp64 for fp64 data, fp32 otherwise.
template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

C1S_FN float fma_(float a, float b, float c) { return __fmaf_rn(a, b, c); }
C1S_FN double fma_(double a, double b, double c) { return __fma_rn(a, b, c); }

// 1 / (1 + e^-z): ex2 and rcp on the special-function unit (approximate to ~1 ulp), exact 0 / 1
// at -inf / +inf, NaN in -> NaN out.
#ifndef CONV1D_SILU_EMULATE
C1S_FN float rcp_approx(float v) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}
C1S_FN float exp2_approx(float v) {  // MUFU.EX2 alone (no denormal-range fix-up: ftz)
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}
#else
inline float rcp_approx(float v) { return 1.0f / v; }
inline float exp2_approx(float v) { return std::exp2(v); }
#endif
C1S_FN float sigmoid(float z) { return rcp_approx(1.0f + exp2_approx(z * -1.4426950408889634f)); }
C1S_FN double sigmoid(double z) { return 1.0 / (1.0 + exp(-z)); }

// silu'(z) = s (1 + z (1 - s)) = s + z s (1 - s), two FMAs given s.
template <typename A> C1S_FN A silu_grad(A z, A s) { return fma_(z, fma_(-s, s, s), s); }

// ---- vectors of VEC elements (VEC * sizeof(T) <= 16 bytes, aligned) --------------------------
template <typename T, int N> struct alignas(sizeof(T) * N) Vec { T v[N]; };

// 16-bit formats move in pairs: one 32-bit word holds elements (2i, 2i+1), low half first.
template <typename T> struct IsHalf { static constexpr bool value = false; };
template <> struct IsHalf<bf16> { static constexpr bool value = true; };
template <> struct IsHalf<f16> { static constexpr bool value = true; };

C1S_FN void unpack2(bf16, unsigned int u, float& lo, float& hi) {
  lo = __uint_as_float(u << 16);
  hi = __uint_as_float(u & 0xffff0000u);
}
C1S_FN void unpack2(f16, unsigned int u, float& lo, float& hi) {
  lo = cvt<float>(f16{(unsigned short)(u & 0xffffu)});
  hi = cvt<float>(f16{(unsigned short)(u >> 16)});
}
#ifndef CONV1D_SILU_EMULATE
C1S_FN unsigned int pack2(bf16, float lo, float hi) {
  unsigned int u;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(u) : "f"(hi), "f"(lo));
  return u;
}
C1S_FN unsigned int pack2(f16, float lo, float hi) {
  unsigned int u;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(u) : "f"(hi), "f"(lo));
  return u;
}
#else
template <typename H> inline unsigned int pack2(H, float lo, float hi) {
  return (unsigned int)cvt<H>(lo).bits | ((unsigned int)cvt<H>(hi).bits << 16);
}
#endif

// ---- loads through the read-only (non-coherent) path -------------------------------------------
// For the inputs no kernel writes (x, weights, bias, initial states, document tables). The compiler
// takes this path by itself only for const __restrict__ kernel parameters, which the fields of an
// argument struct are not.
template <int BYTES> struct RoWord;
template <> struct RoWord<2> { using type = unsigned short; };
template <> struct RoWord<4> { using type = unsigned int; };
template <> struct RoWord<8> { using type = unsigned long long; };
#ifndef CONV1D_SILU_EMULATE
template <> struct RoWord<16> { using type = uint4; };
#else
template <> struct RoWord<16> { using type = Vec<unsigned int, 4>; };
#endif
template <typename T> C1S_FN T load_ro(const T* p) {
#ifndef CONV1D_SILU_EMULATE
  using W = typename RoWord<sizeof(T)>::type;
  const W v = __ldg(reinterpret_cast<const W*>(p));
  return *reinterpret_cast<const T*>(&v);
#else
  return *p;
#endif
}

// A vector of VEC elements of T held as its raw bits, moved by one load or store of its width.
template <typename T, int VEC> using Raw = typename RoWord<VEC * (int)sizeof(T)>::type;

// A raw vector's 32-bit words FROM.. from lane `src` of the warp (UP: from lane - src, a lane below
// src keeping its own), every lane of the warp taking part; the other words stay the caller's.
template <int FROM, bool UP = false, typename R> C1S_FN R shfl_words(R raw, int src) {
  static_assert(sizeof(R) % 4 == 0, "whole 32-bit words");
  unsigned int* w = reinterpret_cast<unsigned int*>(&raw);
#pragma unroll
  for (int i = FROM; i < (int)(sizeof(R) / 4); ++i)
    w[i] = UP ? __shfl_up_sync(0xffffffffu, w[i], src) : __shfl_sync(0xffffffffu, w[i], src);
  return raw;
}

// Element j (a compile-time index once unrolled) of a vector held raw: a 16-bit element is one
// shift or mask of its 32-bit word. Converting a Vec<T, VEC> element by element costs the copies
// that pick each 16-bit half out first.
template <typename A, typename T, typename R> C1S_FN A element(const R& raw, int j) {
  if constexpr (IsHalf<T>::value && sizeof(R) >= 4) {
    const unsigned int u = reinterpret_cast<const unsigned int*>(&raw)[j / 2];
    return cvt<A>(T{(unsigned short)(j % 2 ? u >> 16 : u & 0xffffu)});
  } else {
    return cvt<A>(reinterpret_cast<const T*>(&raw)[j]);
  }
}

// RO: global memory no kernel writes (load_ro); else any memory, shared included.
template <bool RO = false, typename A, typename T, int N, typename I>
C1S_FN void load_vec(const T* __restrict__ base, I offset, A (&out)[N]) {
  if constexpr (IsHalf<T>::value && N % 2 == 0) {
    const auto* at = reinterpret_cast<const Vec<unsigned int, N / 2>*>(base + offset);
    const Vec<unsigned int, N / 2> r = RO ? load_ro(at) : *at;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) unpack2(T{}, r.v[i], out[2 * i], out[2 * i + 1]);
  } else {
    const auto* at = reinterpret_cast<const Vec<T, N>*>(base + offset);
    const Vec<T, N> r = RO ? load_ro(at) : *at;
#pragma unroll
    for (int e = 0; e < N; ++e) out[e] = cvt<A>(r.v[e]);
  }
}

template <typename T, typename A, int N, typename I>
C1S_FN void store_vec(T* __restrict__ base, I offset, const A (&in)[N]) {
  if constexpr (IsHalf<T>::value && N % 2 == 0) {
    Vec<unsigned int, N / 2> r;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) r.v[i] = pack2(T{}, in[2 * i], in[2 * i + 1]);
    *reinterpret_cast<Vec<unsigned int, N / 2>*>(base + offset) = r;
  } else {
    Vec<T, N> r;
#pragma unroll
    for (int e = 0; e < N; ++e) r.v[e] = cvt<T>(in[e]);
    *reinterpret_cast<Vec<T, N>*>(base + offset) = r;
  }
}

// ---- per-thread asynchronous row pipeline ---------------------------------------------------
// A thread copies the rows it will read next into its own slice of shared memory with cp.async
// (sm_80+): the loads are in flight while it computes the current rows, hold no registers, and
// need no barrier, because only the issuing thread reads them back (after async_wait). 2-byte
// vectors (cp.async moves 4, 8 or 16) are copied synchronously.
#ifndef CONV1D_SILU_EMULATE
template <int BYTES> C1S_FN void async_copy(void* dst, const void* src) {
  if constexpr (BYTES < 4) {
    *reinterpret_cast<Vec<unsigned char, BYTES>*>(dst) = *reinterpret_cast<const Vec<unsigned char, BYTES>*>(src);
  } else {
    const unsigned int s = (unsigned int)__cvta_generic_to_shared(dst);
    // .ca at every width: 16-byte .cg (L2 only) copies run the 16-byte programs 1.1-1.3x slower
    // (H100)
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s), "l"(src), "n"(BYTES) : "memory");
  }
}
C1S_FN void async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Wait until at most PENDING committed groups are still in flight.
template <int PENDING> C1S_FN void async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory"); }
#else
template <int BYTES> inline void async_copy(void* dst, const void* src) { emu::async_copy(dst, src, BYTES); }
inline void async_commit() { emu::async_commit(); }
template <int PENDING> inline void async_wait() { emu::async_wait(PENDING); }
#endif

// DEPTH stages of K rows (one ring turn) x NSRC sources per thread, in the thread's own slice:
// every offset but the stage's is a compile-time immediate. Slices are an odd number of vectors
// apart (ENTRIES | 1), so a warp's same-entry accesses fall in distinct banks.
template <typename T, int VEC, int K, int NSRC, int DEPTH> struct RowPipe {
  static constexpr int ENTRIES = DEPTH * K * NSRC;
  T* mine;
  C1S_FN explicit RowPipe(T* base) : mine(base + (int)threadIdx.x * (ENTRIES | 1) * VEC) {}
  C1S_FN T* at(int stage, int row, int src) const { return mine + ((stage * K + row) * NSRC + src) * VEC; }
  C1S_FN void copy(int stage, int row, int src, const T* from) const {
    async_copy<VEC * (int)sizeof(T)>(at(stage, row, src), from);
  }
};

// dweight[c, k] / dbias[c] from the root of the tree; fp32 main_grad accumulation adds once.
template <typename TG, typename A, int K, bool HAS_BIAS>
C1S_FN void write_root(TG* __restrict__ dw, TG* __restrict__ db, int accumulate, int k, int c, A v) {
  TG* out = k < K ? dw + (long long)c * K + k : db + c;
  *out = cvt<TG>(accumulate ? cvt<A>(*out) + v : v);
}

template <bool B> struct Bool { static constexpr bool value = B; };
template <int V> struct Int { static constexpr int value = V; };

// f(Int<0>{}), f(Int<1>{}), ..., f(Int<N-1>{}): a loop whose index is a compile-time constant.
template <int I, int N, typename F> C1S_FN void static_for(F&& f) {
  if constexpr (I < N) {
    f(Int<I>{});
    static_for<I + 1, N>(f);
  }
}

// The fold's ticket: one thread per CTA adds 1 with acquire-release semantics at GPU scope. Issued
// after a __syncthreads, the release publishes every write of the CTA (fences are cumulative in the
// PTX memory model), so no other thread fences and the CTA's outstanding dx stores wait for nobody
// but thread 0; the acquire, followed by a __syncthreads, orders the children's writes before every
// thread's reads of them (the pattern of CUTLASS's split-K semaphore).
#ifndef CONV1D_SILU_EMULATE
C1S_FN unsigned int ticket_add(unsigned int* p) {
  unsigned int prev;
  asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], 1;" : "=r"(prev) : "l"(p) : "memory");
  return prev;
}
#else
inline unsigned int ticket_add(unsigned int* p) { return atomicAdd(p, 1u); }
#endif

// Programmatic dependent launch (sm_90+): launch_dependents lets the next kernel in the stream, if
// it was launched with the attribute (runtime.Launch.programmatic), start before this one ends; that
// kernel's wait returns once this one has finished and its writes are visible. Both are no-ops for
// a plain launch and before sm_90.
#ifndef CONV1D_SILU_EMULATE
C1S_FN void griddep_launch_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
C1S_FN void griddep_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
#else
inline void griddep_launch_dependents() {}
inline void griddep_wait() {}
#endif

template <typename T> C1S_FN T min_(T a, T b) { return a < b ? a : b; }
template <typename T> C1S_FN T max_(T a, T b) { return a < b ? b : a; }

// ---- documents ----------------------------------------------------------------------------
// Walks the packed token axis row by row for one thread. begin(r0) returns how many rows of the
// current document precede r0 (capped at K-1); next(t), called for t = r0+1, r0+2, ... in order,
// says whether a document starts at t; last(t) whether t ends its document. `state` is the
// current document's row in initial_states / final_states; a document whose state is >= n_docs
// has none (zeros in, nothing out): the kernels check `state < n_docs` before every state access.
// padding() says the current token is padding (a negative seq_idx, as causal-conv1d's callers mark
// the tail of a batch row): its output is 0, its gradient is 0, and its run has no state.
// Every table read is bounds-checked, so any table content is memory-safe.
constexpr int NO_STATE = 0x7fffffff;  // a state no table has: padding runs read and write none
struct DocArgs {
  const int* __restrict__ table;  // seq_idx (S) or cu_seqlens (n_docs + 1)
  long long S;
  long long row_len;  // tokens per batch row (BATCH / SEQ_IDX)
  int n_docs;
  C1S_FN int at(long long i) const { return load_ro(table + i); }
};

template <int MODE> struct Docs;

template <> struct Docs<SINGLE> {
  int state = 0;
  static constexpr bool padding() { return false; }
  C1S_FN int begin(const DocArgs&, long long r0, int cap) { return (int)min_<long long>(r0, cap); }
  C1S_FN bool next(const DocArgs&, long long) { return false; }
  C1S_FN bool last(const DocArgs& a, long long t) { return t + 1 == a.S; }
};

template <> struct Docs<BATCH> {
  int state = 0;
  static constexpr bool padding() { return false; }
  long long next_start = 0;
  C1S_FN int begin(const DocArgs& a, long long r0, int cap) {
    const long long d = r0 / a.row_len;
    state = (int)d;
    next_start = (d + 1) * a.row_len;
    return (int)min_<long long>(r0 - d * a.row_len, cap);
  }
  C1S_FN bool next(const DocArgs& a, long long t) {
    if (t != next_start) return false;
    ++state;
    next_start += a.row_len;
    return true;
  }
  C1S_FN bool last(const DocArgs&, long long t) { return t + 1 == next_start; }
};

template <> struct Docs<CU_SEQLENS> {
  int state = 0;
  static constexpr bool padding() { return false; }
  long long next_start = 0;
  C1S_FN int begin(const DocArgs& a, long long r0, int cap) {
    // Largest d with cu[d] <= r0 (skips empty documents).
    int lo = 0, hi = a.n_docs - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (a.at(mid) <= r0) lo = mid; else hi = mid - 1;
    }
    state = lo;
    next_start = a.at(lo + 1);
    return (int)min_<long long>(max_<long long>(r0 - a.at(lo), 0), cap);
  }
  C1S_FN bool next(const DocArgs& a, long long t) {
    if (t < next_start) return false;
    while (state + 1 < a.n_docs && a.at(state + 1) <= t) ++state;
    next_start = max_<long long>(a.at(state + 1), t + 1);
    return true;
  }
  C1S_FN bool last(const DocArgs&, long long t) { return t + 1 >= next_start; }
};

template <> struct Docs<SEQ_IDX> {
  int state = 0;
  int current = 0;
  C1S_FN bool padding() const { return current < 0; }
  long long next_row = 0;  // next batch-row boundary
  C1S_FN int begin(const DocArgs& a, long long r0, int cap) {
    const long long row0 = (r0 / a.row_len) * a.row_len;
    next_row = row0 + a.row_len;
    current = a.at(r0);
    state = current < 0 ? NO_STATE : current;
    int pos = 0;
    while (pos < cap && r0 - pos - 1 >= row0 && a.at(r0 - pos - 1) == current) ++pos;
    return pos;
  }
  C1S_FN bool next(const DocArgs& a, long long t) {
    const int v = a.at(t);
    bool start = v != current;
    if (t == next_row) {
      start = true;
      next_row += a.row_len;
    }
    current = v;
    state = v < 0 ? NO_STATE : v;
    return start;
  }
  C1S_FN bool last(const DocArgs& a, long long t) {
    return t + 1 == a.S || t + 1 == next_row || a.at(t + 1) != current;
  }
};

// ---- per-thread pieces shared by both templates ------------------------------------------
template <typename A, typename TW, int K, int VEC, bool HAS_BIAS>
C1S_FN void load_weights(const TW* __restrict__ w, const TW* __restrict__ bias, int c0, A (&wv)[K][VEC],
                         A (&bv)[VEC]) {
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
#pragma unroll
    for (int k = 0; k < K; ++k) wv[k][e] = cvt<A>(load_ro(w + (c0 + e) * K + k));
    bv[e] = HAS_BIAS ? cvt<A>(load_ro(bias + c0 + e)) : A(0);
  }
}

// Windows are rings of K rows indexed by a compile-time phase P: the token stepped at phase P
// sits in slot P, and tap k (token t - (K-1) + k) in slot (P + 1 + k) % K, so stepping needs no
// register moves. window_before<P> fills taps 0..K-2 of a step at phase P with the K-1 tokens
// before token t, of which pos0 are inside its document: x there, the document's initial state
// rows before it (state < n_docs), else 0. With pos0 = 0 it is the reset at a document start.
template <int P, int K, int VEC, bool HAS_INIT, typename A, typename T, typename I>
C1S_FN void window_before(const T* __restrict__ x, long long x_rs, const T* __restrict__ init, int C, int c0,
                          long long t, int pos0, int state, int n_docs, A (&ring)[K][VEC]) {
#pragma unroll
  for (int m = 0; m < K - 1; ++m) {
    A (&row)[VEC] = ring[(P + 1 + m) % K];
    if (K - 1 - m <= pos0) {
      load_vec(x, (I)(t - (K - 1) + m) * (I)x_rs + c0, row);
    } else if (HAS_INIT && state < n_docs) {
      load_vec<true>(init, ((I)state * (K - 1) + m + pos0) * (I)C + c0, row);
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) row[e] = A(0);
    }
  }
}

}  // namespace c1s
