// Channel-first forward and backward: x, dy, y and dx are (B, C, L) with the sequence contiguous
// and any batch and channel strides (a chunk of a wider projection is read and written in place).
// The math is the channel-last templates', operation for operation (the bias, then one fma per tap
// k = 0..K-1; the same SiLU and SiLU gradient; the canonical reduction of dweight / dbias), so both
// layouts give the same bits. Only the walk differs: a thread owns one channel and VEC consecutive
// tokens per 16-byte load, and neighbouring threads own neighbouring tokens of the same channel.
//
// Tokens are numbered as the channel-last op numbers them, t = b * L + l, so document tables
// (seq_idx (B, L), cu_seqlens for B = 1), states ((N, K-1, C)) and the reduction tree are shared.
#include "common.cuh"

namespace c1s {

// The K-1 taps before token l0 of a channel row (tap m is token l0 - (K-1) + m), of which pos0
// precede l0 inside its document: x there, the document's initial state row before it (state <
// n_docs), else 0, as window_before fills them for the channel-last walk.
template <int K, bool HAS_INIT, typename A, typename T, typename I>
C1S_FN void taps_before(const T* __restrict__ xrow, const T* __restrict__ init, int C, int c, long long l0, int pos0,
                        int state, int n_docs, A* taps) {
#pragma unroll
  for (int m = 0; m < K - 1; ++m) {
    if (K - 1 - m <= pos0) {
      taps[m] = cvt<A>(load_ro(xrow + (I)(l0 - (K - 1) + m)));
    } else if (HAS_INIT && state < n_docs) {
      taps[m] = cvt<A>(load_ro(init + ((I)state * (K - 1) + m + pos0) * (I)C + c));
    } else {
      taps[m] = A(0);
    }
  }
}

// A walking thread's staged vectors of x and dy: its slab's NV, then its tail's (the next slab's
// first, or those staged after the round's last slab), in rows of PV vectors.
template <int NV, int PV, typename W, int N>
C1S_FN void staged_vectors(const W* xs, const W* ds, W (&xv)[N], W (&dv)[N]) {
#pragma unroll
  for (int q = 0; q < N; ++q) {
    const int at = q < NV ? threadIdx.x * PV + q : (threadIdx.x + 1) * PV + q - NV;
    xv[q] = xs[at];
    dv[q] = ds[at];
  }
}

// docs.begin at token l of batch row b: for batch rows without a table, the row is the document, so
// no 64-bit division finds it.
template <int MODE>
C1S_FN int begin_in_row(Docs<MODE>& docs, const DocArgs& da, long long b, long long l, int cap) {
  if constexpr (MODE == BATCH) {
    docs.state = (int)b;
    docs.next_start = (b + 1) * da.row_len;
    return (int)min_<long long>(l, cap);
  } else {
    return docs.begin(da, b * da.row_len + l, cap);
  }
}

}  // namespace c1s

// Forward. A CTA walks one chunk of one channel row (b, c): VPT x blockDim vectors of VEC tokens,
// vector v of thread i at (chunk VPT + v) blockDim + i, so each load instruction of a warp reads
// neighbouring bytes. A thread's window is its vector and the K-1 tokens before it, read again
// from x (the neighbour's vector, in L1: one more load where it holds them all).
// BARE (the bench's floor, never routed): y = x, the loads and stores without the math.
template <typename T, typename TW, int K, int VEC, bool HAS_BIAS, int MODE, bool HAS_INIT, bool FINAL,
          bool SILU, typename I, int VPT, bool BARE = false>
__global__ void __launch_bounds__(256) conv1d_silu_fwd_bcl(const __grid_constant__ c1s::FwdBclArgs a) {
  using namespace c1s;
  using A = typename Acc<T>::type;
  const TW* __restrict__ w = static_cast<const TW*>(a.w);
  const TW* __restrict__ bias = static_cast<const TW*>(a.bias);
  const T* __restrict__ init = static_cast<const T*>(a.init);
  T* __restrict__ final_states = static_cast<T*>(a.final_states);
  const long long L = a.L, n_chunks = a.n_chunks;
  const int C = (int)a.C, n_docs = (int)a.n_docs;
  const DocArgs da{a.table, a.S, L, n_docs};

  // (b, c), c fastest, then the chunk, in 32-bit arithmetic (the grid's size bounds them); token
  // offsets in I
  const unsigned int row = blockIdx.x / (unsigned int)n_chunks, chunk = blockIdx.x - row * (unsigned int)n_chunks;
  const unsigned int b = row / (unsigned int)C;
  const int c = (int)(row - b * (unsigned int)C);
  const T* __restrict__ xrow = static_cast<const T*>(a.x) + (I)b * (I)a.x_bs + (I)c * (I)a.x_cs;
  T* __restrict__ yrow = static_cast<T*>(a.y) + (I)b * (I)a.y_bs + (I)c * (I)a.y_cs;
  A wv[K][1], bv[1];
  load_weights<A, TW, K, 1, HAS_BIAS>(w, bias, c, wv, bv);

#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const unsigned int vi = (chunk * VPT + v) * blockDim.x + threadIdx.x;  // the vector's index in the row
    const I l0 = sizeof(I) == 4 ? (I)(vi * VEC) : (I)vi * VEC;  // with 64-bit offsets, rows past 2^32 tokens
    if (l0 >= (I)L) break;
    A xv[VEC];
    load_vec<true>(xrow, l0, xv);
    const long long t0 = (long long)b * L + l0;
    Docs<MODE> docs;
    const int pos0 = begin_in_row(docs, da, b, l0, K - 1);
    // win[j]: token l0 - (K-1) + j; token e's taps are win[e .. e+K-1]
    A win[K - 1 + VEC];
    if (VEC >= K - 1 && pos0 == K - 1) {  // all K-1 taps are x, in the previous vector: one load
      A pv[VEC];
      load_vec<true>(xrow, (I)(l0 - VEC), pv);
#pragma unroll
      for (int m = 0; m < K - 1; ++m) win[m] = pv[VEC - (K - 1) + m];
    } else {
      taps_before<K, HAS_INIT, A, T, I>(xrow, init, C, c, l0, pos0, docs.state, n_docs, win);
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e) win[K - 1 + e] = xv[e];
    A yv[VEC];
    static_for<0, VEC>([&](auto ie) {
      constexpr int E = decltype(ie)::value;
      const long long t = t0 + E;
      // a document starts at t: its initial state precedes it (batch rows never start inside a
      // vector: L is a multiple of VEC)
      if (E > 0 && MODE != BATCH && docs.next(da, t)) {
#pragma unroll
        for (int m = 0; m < K - 1; ++m)
          win[E + m] = HAS_INIT && docs.state < n_docs
                           ? cvt<A>(load_ro(init + ((I)docs.state * (K - 1) + m) * (I)C + c))
                           : A(0);
      }
      A z = bv[0];
#pragma unroll
      for (int k = 0; k < K; ++k) z = fma_(wv[k][0], win[E + k], z);
      yv[E] = BARE ? win[K - 1 + E] : docs.padding() ? A(0) : SILU ? z * sigmoid(z) : z;
      if (FINAL && docs.last(da, t) && docs.state < n_docs) {  // its last K-1 taps (states included)
#pragma unroll
        for (int j = 0; j < K - 1; ++j)
          final_states[((I)docs.state * (K - 1) + j) * (I)C + c] = cvt<T>(win[E + 1 + j]);
      }
    });
    store_vec(yrow, (I)l0, yv);
  }
}

// Backward. A thread walks one slab (SLAB tokens, the canonical reduction's leaf) of one channel
// and its K-1 tail tokens, as a channel-last lane walks its slabs: g from dy and the recomputed z,
// the slab's dweight / dbias partial (one fma per token in token order), dx of its own tokens and
// the initial-state gradients of the documents that start in it. A CTA walks rounds of blockDim
// consecutive slabs of one channel, folding each round's slabs into level-1 nodes and those into
// level-2 nodes in shared memory. With top_level 2 a CTA's part is one round, whose level-2 nodes go
// to the workspace (or are the root); above, its part is one node of top_level, and its level-2
// nodes climb to it through a chain of running sums, one per level (a node's children in index
// order, missing ones as +0, as the canonical tree adds them). conv1d_silu_fold folds the
// workspace's nodes from there to the root.
//
// SIMPLE: no document starts inside a slab and there are no states (one sequence, or batch rows of
// whole slabs), so one bound per slab, its row's end, says which tokens are live and the walk keeps
// no document rings. With 16-byte vectors of 16-bit x, 32-bit offsets and K <= 4 it is held to 64
// registers, four CTAs per SM, without spilling (other forms spill under that bound).
//
// CHAIN (the simple walk's cases where a vector holds a token's K-1 taps; bwd_bcl_chain2 takes 2):
// no staging. Each lane loads CHAIN consecutive vectors a step, a warp's lanes neighbouring runs
// (with 2, 16 bytes at a 32-byte stride per warp instruction); a warp's NV / CHAIN steps
// cover its 32 slabs. A lane computes g and dx of its own vectors in registers: the taps come from
// the lane below (lane 0: lane 31 at the step before, or memory at the first step), the g of the
// K-1 tokens after from the lane above (lane 31: lane 0 at the step after, or computed from memory
// at the last step; the steps run last to first). A slab's vectors lie on NV / CHAIN neighbouring
// lanes, and its partial is chained through them in token order by shuffles: the fmas of one
// thread's walk, so the same bits.
//
// BARE (the bench's floor, never routed; the simple walk only): dx = x + dy, the staging, the taps'
// loads and the stores of dx without the math, the slab partials and the fold.
template <typename T, typename TW, typename TG, int K, int VEC, bool HAS_BIAS, int MODE, bool HAS_INIT,
          bool SILU, typename I, bool SIMPLE, int CHAIN = 0, bool BARE = false>
__global__ void __launch_bounds__(256, SIMPLE && sizeof(T) == 2 && VEC == 8 && sizeof(I) == 4 && K <= 4 ? (CHAIN ? 3 : 4) : 1)
    conv1d_silu_bwd_bcl(const __grid_constant__ c1s::BwdBclArgs a) {
  using namespace c1s;
  griddep_launch_dependents();  // the fold may launch and wait for this grid in a free slot
  using A = typename Acc<T>::type;
  constexpr int NB = K + (HAS_BIAS ? 1 : 0);  // reduced rows: K taps (+ bias)
  constexpr int NV = SLAB / VEC;               // vectors per slab
  constexpr int NT = (K - 1 + VEC - 1) / VEC;  // vectors of the K-1 tail tokens
  constexpr int MAX_LEVELS = 24;               // chain levels 2 .. top_level - 1
  static_assert(SLAB % VEC == 0, "vectors tile a slab");
  static_assert(!SIMPLE || (!HAS_INIT && (MODE == SINGLE || MODE == BATCH)),
                "the simple walk knows no states or document tables");
  static_assert(!BARE || SIMPLE, "the bare walk is the simple one's");
  static_assert(!CHAIN || (SIMPLE && !BARE && NV % CHAIN == 0 && VEC >= K - 1 && VEC * sizeof(T) >= 4),
                "the chained round is the simple walk's, with a vector of whole 32-bit words holding a token's taps");
  const T* __restrict__ x = static_cast<const T*>(a.x);
  const T* __restrict__ dy = static_cast<const T*>(a.dy);
  const TW* __restrict__ w = static_cast<const TW*>(a.w);
  const TW* __restrict__ bias = static_cast<const TW*>(a.bias);
  const T* __restrict__ init = static_cast<const T*>(a.init);
  T* __restrict__ dx = static_cast<T*>(a.dx);
  T* __restrict__ dinit = static_cast<T*>(a.dinit);
  TG* __restrict__ dw = static_cast<TG*>(a.dw);
  TG* __restrict__ db = static_cast<TG*>(a.db);
  A* __restrict__ ws = static_cast<A*>(a.workspace);
  const long long S = a.S, L = a.L, n_parts = a.n_parts, part_slabs = a.part_slabs;
  const int C = (int)a.C, n_docs = (int)a.n_docs, accumulate = (int)a.accumulate;
  const int top = (int)a.top_level, root = (int)a.root_level;
  const DocArgs da{a.table, S, L, n_docs};

  const int c = (int)(blockIdx.x / n_parts);  // parts of one channel are neighbours
  const long long part = blockIdx.x - (long long)c * n_parts;
  const long long n_slabs = (S + SLAB - 1) / SLAB;
  const long long s_begin = part * part_slabs;
  const long long s_end = min_<long long>(n_slabs, s_begin + part_slabs);
  const int bd = (int)blockDim.x, n1 = bd / FAN, n2 = bd / (FAN * FAN);
  CONV1D_SILU_DYNAMIC_SMEM(smem_raw);
  A* slot = reinterpret_cast<A*>(smem_raw);  // [NB][bd] slabs, then [NB][n1] and [NB][n2] nodes
  A* lv1 = slot + NB * bd;
  A* lv2 = lv1 + NB * n1;
  // A round's x and dy rows (bd slabs and the tail vectors) pass through shared memory, each slab
  // followed by one vector of padding, so a warp's 16-byte reads of its slabs hit distinct banks.
  using V = Vec<T, VEC>;
  constexpr int PADDED = SLAB + VEC;  // tokens per staged slab
  constexpr int PV = PADDED / VEC;    // vectors per staged slab
  V* xs = reinterpret_cast<V*>(smem_raw + (NB * (bd + n1 + n2) * sizeof(A) + 15) / 16 * 16);
  V* ds = xs + bd * PV + NT;
  using R = Raw<T, VEC>;  // the same layout, as raw words
  R* xs_raw = reinterpret_cast<R*>(xs);
  R* ds_raw = reinterpret_cast<R*>(ds);
  const T* __restrict__ xc = x + (I)c * (I)a.x_cs;  // channel c of batch row 0
  const T* __restrict__ dyc = dy + (I)c * (I)a.dy_cs;
  // a staging thread's next vector is bd vectors on: step_b rows and step_l tokens further
  const I step_b = (I)(bd * VEC) / (I)L, step_l = (I)(bd * VEC) - step_b * (I)L;

  A wv[K][1], bv[1];
  load_weights<A, TW, K, 1, HAS_BIAS>(w, bias, c, wv, bv);
  // the chain (top > 2): thread k < NB keeps the running sum and child count of each level
  A chain[MAX_LEVELS];
  int count[MAX_LEVELS];
  for (int l = 2; l < top; ++l) {
    chain[l] = A(0);
    count[l] = 0;
  }
  A top_value = A(0);
  auto push = [&](int level, A v) {  // a finished node of `level` joins its parent
    while (level < top) {
      chain[level] = count[level] == 0 ? v : chain[level] + v;
      if (++count[level] < FAN) return;
      v = chain[level];
      count[level] = 0;
      ++level;
    }
    top_value = v;
  };

  for (long long base = s_begin; base < s_end; base += bd) {
    A acc[NB];
#pragma unroll
    for (int k = 0; k < NB; ++k) acc[k] = A(0);
    const long long s = base + threadIdx.x;
    if constexpr (CHAIN > 0) {
      // A part is whole rounds up to the sequence's end (gpu_bcl.backward_launches), so a round's
      // vectors inside S are this part's and no slab needs the walk's s < s_end.
      constexpr int SL = NV / CHAIN;          // lanes a slab spans, and steps of a round
      constexpr int STEP = 32 * CHAIN * VEC;  // tokens from a lane's vectors of one step to the next's
      constexpr int KW = K - 1 + VEC;         // a vector's window: its K-1 taps, then its tokens
      constexpr int TAP_WORD = (VEC - (K - 1)) * (int)sizeof(T) / 4;  // the taps' first 32-bit word
      const int lane = (int)threadIdx.x % 32, warp = (int)threadIdx.x / 32, seg = lane % SL;
      const I chain_b = (I)STEP / (I)L, chain_l = (I)STEP - chain_b * (I)L;
      // (row, token) of the lane's first vector of the step: by one division, then by adding
      I t = (I)(base * SLAB) + (I)((warp * 32 * NV + lane * CHAIN) * VEC);
      I b = t / (I)L, l = t - b * (I)L;
      // (token, row, token in the row) of the lane's vectors of the step, from its first vector's:
      // worked out again for the compute pass rather than held through the loads (registers bound it)
      auto vectors = [&](I(&vt)[CHAIN], I(&vb)[CHAIN], I(&vl)[CHAIN]) {
#pragma unroll
        for (int v = 0; v < CHAIN; ++v) {
          vt[v] = v == 0 ? t : vt[v > 0 ? v - 1 : 0] + (I)VEC;
          vb[v] = v == 0 ? b : vb[v > 0 ? v - 1 : 0];
          vl[v] = v == 0 ? l : vl[v > 0 ? v - 1 : 0] + (I)VEC;
          if (vl[v] == (I)L) {
            vl[v] = 0;
            ++vb[v];
          }
        }
      };
      R x_raw[SL][CHAIN], dy_raw[SL][CHAIN];
#pragma unroll
      for (int j = 0; j < SL; ++j) {  // every load in flight before any is used
        I vt[CHAIN], vb[CHAIN], vl[CHAIN];
        vectors(vt, vb, vl);
#pragma unroll
        for (int v = 0; v < CHAIN; ++v) {
          x_raw[j][v] = dy_raw[j][v] = R{};
          if (vt[v] < (I)S) {
            x_raw[j][v] = load_ro(reinterpret_cast<const R*>(xc + vb[v] * (I)a.x_bs + vl[v]));
            dy_raw[j][v] = load_ro(reinterpret_cast<const R*>(dyc + vb[v] * (I)a.dy_bs + vl[v]));
          }
        }
        if (j < SL - 1) {
          t += (I)STEP;
          b += chain_b;
          l += chain_l;
          if (l >= (I)L) {
            l -= (I)L;
            ++b;
          }
        }
      }
      A carry[K - 1];  // lane 0's first K-1 values of g at the step after: lane 31's next tokens
      static_for<0, SL>([&](auto jj) {
        constexpr int j = SL - 1 - decltype(jj)::value;
        I vt[CHAIN], vb[CHAIN], vl[CHAIN];
        vectors(vt, vb, vl);
        // the taps before the lane's first vector: the lane below's last; lane 0's, lane 31's at the
        // step before, or at the first step from memory (an L1 or L2 hit: the warp below loads it)
        R before = shfl_words<TAP_WORD, true>(x_raw[j][CHAIN - 1], 1);
        if constexpr (j > 0) {
          const R top = shfl_words<TAP_WORD>(x_raw[j > 0 ? j - 1 : 0][CHAIN - 1], 31);
          if (lane == 0) before = top;
        } else if (lane == 0 && vl[0] > 0 && vt[0] < (I)S) {
          before = load_ro(reinterpret_cast<const R*>(xc + vb[0] * (I)a.x_bs + vl[0] - VEC));
        }
        A win[CHAIN][KW], g[CHAIN][VEC];
#pragma unroll
        for (int v = 0; v < CHAIN; ++v) {
          const R& prev = v == 0 ? before : x_raw[j][v > 0 ? v - 1 : 0];
#pragma unroll
          for (int m = 0; m < K - 1; ++m) win[v][m] = vl[v] > 0 ? element<A, T>(prev, VEC - (K - 1) + m) : A(0);
#pragma unroll
          for (int e = 0; e < VEC; ++e) win[v][K - 1 + e] = element<A, T>(x_raw[j][v], e);
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const A dval = element<A, T>(dy_raw[j][v], e);
            if (SILU) {
              A z = bv[0];
#pragma unroll
              for (int k = 0; k < K; ++k) z = fma_(wv[k][0], win[v][e + k], z);
              g[v][e] = dval * silu_grad(z, sigmoid(z));
            } else {
              g[v][e] = dval;
            }
          }
        }
        // g of the K-1 tokens after the lane's last vector (used only inside its row)
        A after[K - 1];
#pragma unroll
        for (int m = 0; m < K - 1; ++m) after[m] = __shfl_down_sync(0xffffffffu, g[0][m], 1);
        if constexpr (j < SL - 1) {
          if (lane == 31) {
#pragma unroll
            for (int m = 0; m < K - 1; ++m) after[m] = carry[m];
          }
        } else if (lane == 31 && vl[CHAIN - 1] + (I)VEC < (I)L && vt[CHAIN - 1] + (I)VEC < (I)S) {
          const I at = vl[CHAIN - 1] + (I)VEC;
          const R xn = load_ro(reinterpret_cast<const R*>(xc + vb[CHAIN - 1] * (I)a.x_bs + at));
          const R dn = load_ro(reinterpret_cast<const R*>(dyc + vb[CHAIN - 1] * (I)a.dy_bs + at));
          A wn[2 * (K - 1)];  // tokens at - (K-1) .. at + K-2
#pragma unroll
          for (int m = 0; m < K - 1; ++m) {
            wn[m] = win[CHAIN - 1][VEC + m];
            wn[K - 1 + m] = element<A, T>(xn, m);
          }
#pragma unroll
          for (int m = 0; m < K - 1; ++m) {
            const A dval = element<A, T>(dn, m);
            if (SILU) {
              A z = bv[0];
#pragma unroll
              for (int k = 0; k < K; ++k) z = fma_(wv[k][0], wn[m + k], z);
              after[m] = dval * silu_grad(z, sigmoid(z));
            } else {
              after[m] = dval;
            }
          }
        }
#pragma unroll
        for (int m = 0; m < K - 1; ++m) carry[m] = __shfl_sync(0xffffffffu, g[0][m], 0);
        // dx[u] = sum_m w[K-1-m] g[u+m] over u's row
#pragma unroll
        for (int v = 0; v < CHAIN; ++v) {
          if (vt[v] < (I)S) {
            const I left = (I)L - vl[v];  // tokens from the vector's first to its row's end
            A dxv[VEC];
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
              A sum = A(0);
#pragma unroll
              for (int m = 0; m < K; ++m) {
                const int u = e + m;
                const A gu = u < VEC           ? g[v][u < VEC ? u : 0]
                             : v + 1 < CHAIN ? g[v + 1 < CHAIN ? v + 1 : v][u < VEC ? 0 : u - VEC]
                                             : after[u < VEC ? 0 : u - VEC];
                if (u < VEC || (I)u < left) sum = fma_(wv[K - 1 - m][0], gu, sum);
              }
              dxv[e] = sum;
            }
            store_vec(dx, vb[v] * (I)a.dx_bs + (I)c * (I)a.dx_cs + vl[v], dxv);
          }
        }
        // the slab's partial, one fma per token in token order, passed up through its lanes
        A part[NB];
#pragma unroll
        for (int k = 0; k < NB; ++k) part[k] = A(0);
        static_for<0, SL>([&](auto qq) {
          constexpr int q = decltype(qq)::value;
          if (seg == q) {
#pragma unroll
            for (int v = 0; v < CHAIN; ++v) {
              if (vt[v] < (I)S) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
#pragma unroll
                  for (int k = 0; k < K; ++k) part[k] = fma_(g[v][e], win[v][e + k], part[k]);
                  if (HAS_BIAS) part[NB - 1] += g[v][e];
                }
              }
            }
          }
          if constexpr (q < SL - 1) {
#pragma unroll
            for (int k = 0; k < NB; ++k) {
              const A below = __shfl_up_sync(0xffffffffu, part[k], 1);
              if (seg == q + 1) part[k] = below;
            }
          }
        });
        if (seg == SL - 1) {
#pragma unroll
          for (int k = 0; k < NB; ++k) slot[k * bd + warp * 32 + j * (32 / SL) + lane / SL] = part[k];
        }
        if constexpr (j > 0) {
          t -= (I)STEP;
          b -= chain_b;
          l -= chain_l;
          if (l < 0) {
            l += (I)L;
            --b;
          }
        }
      });
    } else {
      // the round's rows into shared memory, neighbouring threads reading neighbouring vectors (the
      // slab walk's own loads, 16 bytes at a 64-byte stride per warp, ran at ~30 % of the copy
      // bandwidth on the H100): a thread's NV vectors of x and dy (vector i = thread + j bd), and
      // the tail vector for the first NT threads, all loaded before any is stored so that they are
      // in flight together, moved as raw words (no element-wise copies); the first one's (row,
      // token) by one division, the others by adding
      I t = (I)(base * SLAB) + (I)threadIdx.x * VEC;
      I b = t / (I)L, l = t - b * (I)L;
      R x_raw[NV + 1], dy_raw[NV + 1];
#pragma unroll
      for (int j = 0; j <= NV; ++j) {
        x_raw[j] = dy_raw[j] = R{};
        if ((j < NV || (int)threadIdx.x < NT) && t < (I)S) {
          x_raw[j] = load_ro(reinterpret_cast<const R*>(xc + b * (I)a.x_bs + l));
          dy_raw[j] = load_ro(reinterpret_cast<const R*>(dyc + b * (I)a.dy_bs + l));
        }
        t += (I)(bd * VEC);
        b += step_b;
        l += step_l;
        if (l >= (I)L) {
          l -= (I)L;
          ++b;
        }
      }
#pragma unroll
      for (int j = 0; j <= NV; ++j) {
        if (j < NV || (int)threadIdx.x < NT) {
          const int i = (int)threadIdx.x + j * bd;
          xs_raw[(i / NV) * PV + i % NV] = x_raw[j];
          ds_raw[(i / NV) * PV + i % NV] = dy_raw[j];
        }
      }
      __syncthreads();
    }
    if (!CHAIN && SIMPLE && s < s_end) {
      const I t0 = (I)(s * SLAB), b = t0 / (I)L, l = t0 - b * (I)L;
      // tokens before lim are live: the slab's own tokens inside S and its tail up to its row's end
      const int lim = (int)min_<I>(min_<I>((I)S, (b + 1) * (I)L) - t0, (I)(SLAB + K));
      R x_words[NV + NT], dy_words[NV + NT];
      staged_vectors<NV, PV>(xs_raw, ds_raw, x_words, dy_words);
      A taps[K - 1];
      taps_before<K, false, A, T, I>(xc + b * (I)a.x_bs, init, C, c, l, (int)min_<I>(l, (I)(K - 1)), 0, n_docs, taps);
      // x of token i of the slab (i < 0: the taps before it)
      auto xat = [&](int i) { return i < 0 ? taps[i + K - 1] : element<A, T>(x_words[i / VEC], i % VEC); };
      A g[SLAB + K - 1], dxv[VEC];
      // dxv holds tokens u - (VEC-1) .. u of the slab: stored where they are live (lim is a multiple
      // of VEC: a vector is live or dead)
      auto store_dx = [&](int u) {
        if (u < lim) store_vec(dx, b * (I)a.dx_bs + (I)c * (I)a.dx_cs + l + (I)(u - (VEC - 1)), dxv);
      };
      if constexpr (BARE) {  // dx = x + dy, and the taps added to the slab's first token so that their loads stay
        static_for<0, SLAB>([&](auto uu) {
          constexpr int U = decltype(uu)::value;
          A v = xat(U) + element<A, T>(dy_words[U / VEC], U % VEC);
          if (U == 0) {
#pragma unroll
            for (int m = 0; m < K - 1; ++m) v += taps[m];
          }
          dxv[U % VEC] = v;
          if (U % VEC == VEC - 1) store_dx(U);
        });
      } else {
        static_for<0, SLAB + K - 1>([&](auto jj) {
          constexpr int J = decltype(jj)::value, U = J - (K - 1);
          const A dval = element<A, T>(dy_words[J / VEC], J % VEC);
          if (SILU) {
            A z = bv[0];
#pragma unroll
            for (int k = 0; k < K; ++k) z = fma_(wv[k][0], xat(U + k), z);
            g[J] = dval * silu_grad(z, sigmoid(z));
          } else {
            g[J] = dval;
          }
          if (J < SLAB && J < lim) {  // a dead token's g (computed all the same) joins no partial
#pragma unroll
            for (int k = 0; k < K; ++k) acc[k] = fma_(g[J], xat(U + k), acc[k]);
            if (HAS_BIAS) acc[NB - 1] += g[J];
          }
          if (U >= 0 && U < SLAB) {  // dx[u] = sum_m w[K-1-m] g[u+m] over u's row
            A v = A(0);
#pragma unroll
            for (int m = 0; m < K; ++m)
              if (U + m < lim) v = fma_(wv[K - 1 - m][0], g[U + m], v);
            dxv[U % VEC] = v;
            if (U % VEC == VEC - 1) store_dx(U);
          }
        });
      }
    } else if (!CHAIN && s < s_end) {
      const long long t0 = s * SLAB;
      const int own = (int)min_<long long>(SLAB, S - t0);  // own tokens inside S
      long long b = t0 / L, l = t0 - b * L;
      // own and tail tokens, VEC at a time (L is a multiple of VEC: no vector spans two rows), kept
      // as loaded and converted at use: half the registers of converted 16-bit values
      V xv[NV + NT], dv[NV + NT];
      staged_vectors<NV, PV>(xs, ds, xv, dv);
      Docs<MODE> docs;
      const int pos0 = docs.begin(da, t0, K - 1);
      // Rings over the last K tokens, as the channel-last walk keeps them: the token stepped at
      // phase P in slot P, tap k in slot (P + 1 + k) % K; xr = xx, gr = g, dr = document ordinal
      // (-2: before t0, -1: past the sequence), fr = a document starts there, sr = its state row.
      A xr[K], gr[K];
      int dr[K], sr[K];
      bool fr[K];
#pragma unroll
      for (int m = 0; m < K; ++m) {
        dr[m] = -2;
        sr[m] = 0;
        fr[m] = false;
        gr[m] = A(0);
      }
      {
        A taps[K - 1];
        taps_before<K, HAS_INIT, A, T, I>(x + (I)b * (I)a.x_bs + (I)c * (I)a.x_cs, init, C, c, l, pos0, docs.state,
                                          n_docs, taps);
#pragma unroll
        for (int m = 0; m < K - 1; ++m) xr[(1 + m) % K] = taps[m];
      }
      int ordinal = 0;
      A dxv[VEC];
      long long ub = b, ul = l;  // (row, token) of the next dx vector
      static_for<0, SLAB + K - 1>([&](auto jj) {
        constexpr int J = decltype(jj)::value, P = J % K;
        const long long t = t0 + J;
        A g = A(0);
        int d_new = -1, s_new = 0;
        bool start = false;
        if (J < SLAB ? J < own : t < S) {
          const A xval = cvt<A>(xv[J / VEC].v[J % VEC]), dval = cvt<A>(dv[J / VEC].v[J % VEC]);
          if (J == 0) {
            start = pos0 == 0;
          } else if (docs.next(da, t)) {  // a document starts at t: its initial state precedes it
            start = true;
            ++ordinal;
#pragma unroll
            for (int m = 0; m < K - 1; ++m)
              xr[(P + 1 + m) % K] = HAS_INIT && docs.state < n_docs
                                        ? cvt<A>(load_ro(init + ((I)docs.state * (K - 1) + m) * (I)C + c))
                                        : A(0);
          }
          xr[P] = xval;
          if (docs.padding()) {  // padding passes no gradient
            g = A(0);
          } else if (SILU) {
            A z = bv[0];
#pragma unroll
            for (int k = 0; k < K; ++k) z = fma_(wv[k][0], xr[(P + 1 + k) % K], z);
            g = dval * silu_grad(z, sigmoid(z));
          } else {
            g = dval;
          }
          if (J < SLAB) {
#pragma unroll
            for (int k = 0; k < K; ++k) acc[k] = fma_(g, xr[(P + 1 + k) % K], acc[k]);
            if (HAS_BIAS) acc[NB - 1] += g;
          }
          d_new = ordinal;
          s_new = docs.state;
        }
        dr[P] = d_new;
        sr[P] = s_new;
        fr[P] = start;
        gr[P] = g;

        // window row m is ring slot (P + 1 + m) % K, token t - (K-1) + m
        constexpr int JU = J - (K - 1);
        if (JU >= 0 && JU < own) {  // dx[u] = sum_m w[K-1-m] g[u+m] over u's document
          constexpr int first = (P + 1) % K;
          A v = A(0);
#pragma unroll
          for (int m = 0; m < K; ++m)
            if (dr[(P + 1 + m) % K] == dr[first]) v = fma_(wv[K - 1 - m][0], gr[(P + 1 + m) % K], v);
          dxv[JU % VEC] = v;
          if (JU % VEC == VEC - 1) {
            store_vec(dx, (I)ub * (I)a.dx_bs + (I)c * (I)a.dx_cs + (I)ul, dxv);
            ul += VEC;
            if (ul == L) {
              ul = 0;
              ++ub;
            }
          }
        }
        if (HAS_INIT) {
          // A document starting at window row m >= 1 completes its initial-state row K-1-m.
#pragma unroll
          for (int m = 1; m < K; ++m) {
            const int q0 = (P + 1 + m) % K;
            if (fr[q0] && sr[q0] < n_docs && JU + m >= 0 && JU + m < own) {
              A v = A(0);
#pragma unroll
              for (int q = m; q < K; ++q)
                if (dr[(P + 1 + q) % K] == dr[q0]) v = fma_(wv[K - 1 - q][0], gr[(P + 1 + q) % K], v);
              dinit[((I)sr[q0] * (K - 1) + (K - 1 - m)) * (I)C + c] = cvt<T>(v);
            }
          }
        }
      });
    }

    if constexpr (BARE) {  // no partials and no fold; the next round restages the slots
      __syncthreads();
      continue;
    }
    // The round's slabs into level-1 and level-2 nodes, children in index order.
    if constexpr (!CHAIN) {
#pragma unroll
      for (int k = 0; k < NB; ++k) slot[k * bd + threadIdx.x] = acc[k];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < NB * n1; i += bd) {
      const int k = i / n1, n = i - k * n1;
      A v = slot[k * bd + n * FAN];
#pragma unroll
      for (int j = 1; j < FAN; ++j) v += slot[k * bd + n * FAN + j];
      lv1[k * n1 + n] = v;
    }
    __syncthreads();
    const long long n_nodes2 = (n_slabs + FAN * FAN - 1) / (FAN * FAN);
    for (int i = threadIdx.x; i < NB * n2; i += bd) {
      const int k = i / n2, n = i - k * n2;
      A v = lv1[k * n1 + n * FAN];
#pragma unroll
      for (int j = 1; j < FAN; ++j) v += lv1[k * n1 + n * FAN + j];
      const long long node = base / (FAN * FAN) + n;
      if (top > 2) {
        lv2[k * n2 + n] = v;
      } else if (node < n_nodes2) {
        if (root == 2) {
          write_root<TG, A, K, HAS_BIAS>(dw, db, accumulate, k, c, v);
        } else {
          ws[(node * NB + k) * C + c] = v;
        }
      }
    }
    if (top > 2) {
      __syncthreads();
      if ((int)threadIdx.x < NB)
        for (int n = 0; n < n2; ++n) push(2, lv2[threadIdx.x * n2 + n]);
    }
    __syncthreads();  // the slots are reused by the next round
  }

  if (!BARE && top > 2 && (int)threadIdx.x < NB) {
    // The part's last nodes may lack children past the sequence: each partial level adds its +0
    // (one add stands for all: (v + 0) + 0 == v + 0) and joins its parent.
    for (int level = 2; level < top; ++level)
      if (count[level] > 0) {
        const A v = chain[level] + A(0);
        count[level] = 0;
        push(level + 1, v);
      }
    // a part above level 2 lies three levels below the root (gpu_bcl.top_level): never the root
    ws[(part * NB + threadIdx.x) * C + c] = top_value;
  }
}
