// Backward template: dx, dweight, dbias and d(initial_states), one template for every variant.
//
//   g[t]        = dy[t] * silu'(z[t])          (z recomputed from x; nothing else is saved)
//   dx[u]       = sum_k w[k] * g[u + (K-1) - k]  (same document only; no cross-thread sum)
//   dweight[k]  = sum_t g[t] * xx[t - (K-1) + k],  dbias = sum_t g[t]
//
// Canonical reduction (docs/kernel-design.md): dweight/dbias are fp32 (fp64) sums over slabs of
// SLAB tokens, each summed by one thread in token order with FMAs; slab partials are folded by a
// fixed tree of fan-in FAN (children added in index order, missing children as +0) whose shape
// depends on S only. Every program computes the same tree, so every program gives the same bits.
//
// Geometry: a CTA has CTA_LANES x tile_v threads: tile_v columns of CTA_LANES lanes. A column is
// one tree node at level cta_level (1: each of LANES / SPL lanes walks SPL = 1, 2 or 4 slabs; 2:
// each of LANES lanes walks FAN slabs, SPL = 8) times one channel vector. Tiled (!FLAT): a work unit is one node times one channel tile of
// tile_v vectors, and takes one ticket per parent. FLAT (n_vec = vectors per row): units run over
// the row-major (node, vector) columns, tile_v at a time, so no thread idles whatever C, and
// each column takes its own ticket. The CTA folds its lanes into the nodes in shared memory,
// writes them to the workspace, and takes tickets on the parents; the last of a parent's
// children to arrive folds the parent, and so on up to the root, which is written as
// dweight/dbias (or added to the fp32 main_grad). Tickets order only the fold: no gradient value
// is ever summed atomically. With split the CTAs only write their nodes, and conv1d_silu_fold,
// launched next, folds the levels above (no ticket, no fence in this kernel).
//
// x and dy arrive through a per-thread cp.async pipeline (common.cuh, RowPipe) DEPTH-1 ring turns
// ahead of the math; the slots of the fold come first in dynamic shared memory, the pipeline after.
//
// BARE (the bench's floor, never routed): the program's loads of x and dy and stores of dx without
// the math, the slab partials or the fold: dx[t - (K-1)] = x[t] + dy[t] (0 past the sequence).
#include "common.cuh"

template <typename T, typename TW, typename TG, int K, int VEC, bool HAS_BIAS, int MODE, bool HAS_INIT,
          bool SILU, typename I, int SPL, int DEPTH, bool FLAT, bool BARE = false>
__global__ void __launch_bounds__(256) conv1d_silu_bwd(const __grid_constant__ c1s::BwdArgs a) {
  using namespace c1s;
  // every CTA has started: the fold (split) may launch and wait for this grid in a free slot
  griddep_launch_dependents();
  const T* __restrict__ x = static_cast<const T*>(a.x);
  const T* __restrict__ dy = static_cast<const T*>(a.dy);
  const TW* __restrict__ w = static_cast<const TW*>(a.w);
  const TW* __restrict__ bias = static_cast<const TW*>(a.bias);
  const T* __restrict__ init = static_cast<const T*>(a.init);
  const T* __restrict__ next_x = static_cast<const T*>(a.next_x);
  const T* __restrict__ next_dy = static_cast<const T*>(a.next_dy);
  T* __restrict__ dx = static_cast<T*>(a.dx);
  T* __restrict__ dinit = static_cast<T*>(a.dinit);
  TG* __restrict__ dw = static_cast<TG*>(a.dw);
  TG* __restrict__ db = static_cast<TG*>(a.db);
  unsigned int* __restrict__ tickets = a.tickets;
  const long long x_rs = a.x_rs, dy_rs = a.dy_rs, S = a.S, n_units = a.n_units, n_vec = a.n_vec;
  // the struct's 8-byte fields narrow here
  const int n_docs = (int)a.n_docs, accumulate = (int)a.accumulate, C = (int)a.C, tile_v = (int)a.tile_v;
  const int n_ctiles = (int)a.n_ctiles, root_level = (int)a.root_level, n_next = (int)a.n_next;
  using A = typename Acc<T>::type;
  constexpr int NB = K + (HAS_BIAS ? 1 : 0);  // reduced rows: K taps (+ bias)
  // A lane walks SPL slabs. Below FAN, the CTA's LANES / SPL lanes share one level-1 node and each
  // slab's partial gets a slot of its own, so the CTA folds the same LANES slab values in the same
  // order as with lanes of one slab; at FAN each lane folds a whole level-1 node into its slot
  // (index order) and the CTA's LANES lanes make a level-2 node.
  static_assert(FAN % SPL == 0, "a lane walks a whole fraction of a level-1 node, or all of it");
  constexpr int CTA_LEVEL = SPL == FAN ? 2 : 1;
  constexpr int CTA_LANES = CTA_LEVEL == 1 ? LANES / SPL : LANES;  // thread rows per CTA
  constexpr int LANE_SLOTS = CTA_LEVEL == 1 ? SPL : 1;              // slots one lane fills
  constexpr long long LANE_ROWS = (long long)SPL * SLAB;
  constexpr long long NODE_SLABS = CTA_LEVEL == 1 ? FAN : FAN * FAN;
  constexpr int FOLD_VALUES = (NB * VEC + CTA_LANES - 1) / CTA_LANES;  // (k, c) values per thread in a fold

  CONV1D_SILU_DYNAMIC_SMEM(smem_raw);
  A* slot = reinterpret_cast<A*>(smem_raw);  // [LANES][NB][tile_v * VEC], then the row pipeline
  const RowPipe<T, VEC, K, 2, DEPTH> pipe{reinterpret_cast<T*>(slot + LANES * NB * tile_v * VEC)};
  // The fold's plans (one per tiled unit; one per column of a flat unit, tile_v <= 32): the node
  // and first channel, then per level the children to fold (0: none) and the workspace index of
  // the first child and of the parent
  constexpr int PLANS = FLAT ? 32 : 1;
  __shared__ long long col_node[PLANS], col_src[PLANS], col_dst[PLANS];
  __shared__ int col_c[PLANS], col_n[PLANS];
  A* ws = reinterpret_cast<A*>(a.workspace);

  const DocArgs da{a.table, S, a.row_len, n_docs};
  const int lane = threadIdx.x / tile_v;
  const int vl = threadIdx.x - lane * tile_v;
  const int tile_c = tile_v * VEC;
  const long long n_slabs = (S + SLAB - 1) / SLAB;
  const long long n_nodes = (n_slabs + NODE_SLABS - 1) / NODE_SLABS;  // at the CTA's level
  // Column g of a unit: its node and first channel (C: no such column).
  auto column = [&](long long unit, int g, long long& node, int& c) {
    if (FLAT) {
      const long long col = unit * tile_v + g;
      // columns fit in 32 bits at any practical size (nodes x vectors); the 64-bit division is a
      // ~70-instruction routine
      node = col < 0x7fffffff ? (long long)((unsigned)col / (unsigned)n_vec) : col / n_vec;
      c = node < n_nodes ? (int)(col - node * n_vec) * VEC : C;
    } else {
      node = unit / n_ctiles;
      c = ((int)(unit % n_ctiles) * tile_v + g) * VEC;
    }
  };

  for (long long unit = blockIdx.x; unit < n_units; unit += gridDim.x) {
    const int ct = (int)(unit % n_ctiles);
    long long node;
    int c0;
    column(unit, vl, node, c0);
    if (lane == 0 && (FLAT || vl == 0)) {  // the unit's plans (tiled: column 0's channel is the tile's)
      col_node[vl] = node;                 // read after the barrier before the fold
      col_c[vl] = c0;
    }
    const long long r0 = (node * CTA_LANES + lane) * LANE_ROWS;
    const long long r_end = min_<long long>(S, r0 + LANE_ROWS);  // own rows: [r0, r_end)
    A* my_slot = slot + (lane * LANE_SLOTS * NB * tile_c) + vl * VEC;  // + (s NB + k) tile_c + e

    A acc[NB][VEC];
#pragma unroll
    for (int k = 0; k < NB; ++k)
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[k][e] = A(0);

    if (c0 < C && r0 < S) {
      A wv[K][VEC], bv[VEC];
      load_weights<A, TW, K, VEC, HAS_BIAS>(w, bias, c0, wv, bv);

      // Turn q (steps j = qK .. qK+K-1) of x and dy goes to pipeline stage q % DEPTH, DEPTH-1
      // turns ahead of the math. Row t: x / dy inside S, next_x / next_dy for trailing rows.
      constexpr int N_STEPS = (int)LANE_ROWS + K - 1;  // own rows and the K-1 tail tokens
      constexpr int N_TURNS = (N_STEPS + K - 1) / K;
      // Turns whose K rows all lie inside S (all but the last one or two) copy from running row
      // pointers.
      const T* px = x + (I)r0 * (I)x_rs + c0;
      const T* pdy = dy + (I)r0 * (I)dy_rs + c0;
      auto prefetch_whole = [&](int st) {
#pragma unroll
        for (int i = 0; i < K; ++i) {
          pipe.copy(st, i, 0, px);
          pipe.copy(st, i, 1, pdy);
          px += x_rs;
          pdy += dy_rs;
        }
        async_commit();
      };
      auto prefetch = [&](int q) {
        const int st = q % DEPTH;
        if (q * K + K <= N_STEPS && r0 + q * K + K <= S) {  // q < whole_turns
          prefetch_whole(st);
          return;
        }
        if (q < N_TURNS) {
#pragma unroll
          for (int i = 0; i < K; ++i) {
            const int j = q * K + i;
            const long long t = r0 + j;
            if (j < N_STEPS && t < S + n_next) {
              const bool trail = t >= S;
              pipe.copy(st, i, 0, trail ? next_x + (I)(t - S) * (I)C + c0 : x + (I)t * (I)x_rs + c0);
              pipe.copy(st, i, 1, trail ? next_dy + (I)(t - S) * (I)C + c0 : dy + (I)t * (I)dy_rs + c0);
            }
          }
        }
        async_commit();
      };
#pragma unroll
      for (int q = 0; q < DEPTH - 1; ++q) prefetch(q);

      Docs<MODE> docs;
      const int pos0 = docs.begin(da, r0, K - 1);
      // Rings over the last K tokens (see window_before): xr = xx, gr = g, dr = document ordinal
      // (-2: before r0, -1: past the sequence), and for the initial-state gradient: fr = a
      // document starts there, sr = its state row.
      A xr[K][VEC], gr[K][VEC];
      int dr[K], sr[K];
      bool fr[K];
#pragma unroll
      for (int m = 0; m < K; ++m) {
        dr[m] = -2;
        sr[m] = 0;
        fr[m] = false;
#pragma unroll
        for (int e = 0; e < VEC; ++e) gr[m][e] = A(0);
      }
      window_before<0, K, VEC, HAS_INIT, A, T, I>(x, x_rs, init, C, c0, r0, pos0, docs.state, n_docs, xr);
      int ordinal = 0;

      // Token t = r0 + j at ring phase P: extend the rings, accumulate the slab partial if t is
      // an own row, emit dx[t-(K-1)] and the initial-state gradients that complete at t. With
      // FULL (compile-time) the caller promises r0 <= t < r_end (an own row, inside S), with INNER
      // also j >= K (past the first turn, so dx[t-(K-1)] is an own row too). Rows
      // S .. S+n_next-1 are trailing rows (context parallelism: the next rank's first tokens of
      // the same document): their g completes dx, nothing else.
      const int own_steps = (int)(r_end - r0);  // steps j < own_steps are own rows inside S
      int stage = 0;
      T* pdx = dx + (I)r0 * (I)C + c0;  // dx row r0 + ju, stored in order
      auto step = [&](auto phase, auto full, auto inner, int j) {
        constexpr int P = decltype(phase)::value;
        constexpr bool INNER = decltype(inner)::value;
        constexpr bool FULL = INNER || decltype(full)::value;
        const long long t = r0 + j;
        const bool own = FULL || j < own_steps;
        A g[VEC];
        int d_new = -1, s_new = 0;
        bool start = false;
        if (FULL || t < S + n_next) {
          A xv[VEC], dv[VEC];
          load_vec(pipe.at(stage, P, 0), 0, xv);
          load_vec(pipe.at(stage, P, 1), 0, dv);
          if (j == 0) {
            start = pos0 == 0;
          } else if ((FULL || t < S) && docs.next(da, t)) {
            start = true;
            ++ordinal;
            window_before<P, K, VEC, HAS_INIT, A, T, I>(x, x_rs, init, C, c0, t, 0, docs.state, n_docs, xr);
          }
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            xr[P][e] = xv[e];
            if (BARE) {
              g[e] = xv[e] + dv[e];
            } else if (docs.padding()) {  // padding passes no gradient
              g[e] = A(0);
            } else if (SILU) {
              A z = bv[e];
#pragma unroll
              for (int k = 0; k < K; ++k) z = fma_(wv[k][e], xr[(P + 1 + k) % K][e], z);
              g[e] = dv[e] * silu_grad(z, sigmoid(z));
            } else {
              g[e] = dv[e];
            }
          }
          if (own && !BARE) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
#pragma unroll
              for (int k = 0; k < K; ++k) acc[k][e] = fma_(g[e], xr[(P + 1 + k) % K][e], acc[k][e]);
              if (HAS_BIAS) acc[NB - 1][e] += g[e];
            }
          }
          d_new = ordinal;
          s_new = docs.state;
        } else {
#pragma unroll
          for (int e = 0; e < VEC; ++e) g[e] = A(0);
        }
        dr[P] = d_new;
        sr[P] = s_new;
        fr[P] = start;
#pragma unroll
        for (int e = 0; e < VEC; ++e) gr[P][e] = g[e];

        // window row m of this step is ring slot (P + 1 + m) % K, token t - (K-1) + m
        const int ju = j - (K - 1);
        // dx[u] = sum_m w[K-1-m] g[u+m] over u's document (in a full turn u < t is an own row)
        if (INNER || (FULL ? ju >= 0 : ju >= 0 && ju < own_steps)) {
          // one document and all window rows inside S: no masks needed
          constexpr bool ALL_SAME = FULL && MODE == SINGLE;
          constexpr int first = (P + 1) % K;
          A dxv[VEC];
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            A v = A(0);
#pragma unroll
            for (int m = 0; m < K; ++m)
              if (ALL_SAME || dr[(P + 1 + m) % K] == dr[first])
                v = fma_(wv[K - 1 - m][e], gr[(P + 1 + m) % K][e], v);
            dxv[e] = BARE ? gr[P][e] : v;
          }
          store_vec(pdx, 0, dxv);
          pdx += C;
        }
        if (HAS_INIT) {
          // A document starting at window row m >= 1 completes its initial-state row K-1-m.
#pragma unroll
          for (int m = 1; m < K; ++m) {
            const int q0 = (P + 1 + m) % K;
            if (fr[q0] && sr[q0] < n_docs && ju + m >= 0 && ju + m < own_steps) {
              A dv[VEC];
#pragma unroll
              for (int e = 0; e < VEC; ++e) {
                A v = A(0);
#pragma unroll
                for (int q = m; q < K; ++q)
                  if (dr[(P + 1 + q) % K] == dr[q0]) v = fma_(wv[K - 1 - q][e], gr[(P + 1 + q) % K][e], v);
                dv[e] = v;
              }
              store_vec(dinit, ((I)sr[q0] * (K - 1) + (K - 1 - m)) * (I)C + c0, dv);
            }
          }
        }
        if (!BARE && SPL > 1 && j < LANE_ROWS && j % SLAB == SLAB - 1) {
          // end of slab j / SLAB: into its own slot (SPL < FAN), or folded into the lane's level-1
          // node in index order (SPL = FAN); slabs past S give their +0 like any other
          A* to = my_slot + (CTA_LEVEL == 1 ? (j / SLAB) * NB * tile_c : 0);
#pragma unroll
          for (int k = 0; k < NB; ++k)
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
              to[k * tile_c + e] = CTA_LEVEL == 1 || j < SLAB ? acc[k][e] : to[k * tile_c + e] + acc[k][e];
              acc[k][e] = A(0);
            }
        }
      };

      // Own rows and the K-1 tail tokens, K steps (one ring turn) at a time. The hot turns,
      // 1 <= q < hot_end, need no checks: own rows only, each step's dx row an own row, and the
      // turn prefetched DEPTH-1 ahead wholly inside S. Lanes of one slab (9 turns, 5 of them hot)
      // go without: there the extra copy of the step costs more than its checks (3-7 % slower at
      // 32768 x 264 on the H200).
      const int whole_turns = (int)min_<long long>(N_STEPS / K, (S - r0) / K);
      const int hot_end = SPL == 1 ? 0 : min_(own_steps / K, whole_turns - (DEPTH - 1));
      for (int q = 0; q < N_TURNS; ++q) {
        const int j0 = q * K;
        if (q >= 1 && q < hot_end) {
          prefetch_whole(stage);  // turn q + DEPTH - 1 into the stage that turn q - 1 has read
          async_wait<DEPTH - 1>();
          stage = stage + 1 == DEPTH ? 0 : stage + 1;
          static_for<0, K>([&](auto p) { step(p, Bool<true>{}, Bool<true>{}, j0 + decltype(p)::value); });
          continue;
        }
        prefetch(q + DEPTH - 1);  // into the stage that turn q-1 has read
        async_wait<DEPTH - 1>();  // turn q has landed
        stage = q % DEPTH;
        if (j0 + K <= own_steps) {
          static_for<0, K>([&](auto p) { step(p, Bool<true>{}, Bool<false>{}, j0 + decltype(p)::value); });
        } else {
          static_for<0, K>([&](auto p) {
            if (j0 + decltype(p)::value < N_STEPS) step(p, Bool<false>{}, Bool<false>{}, j0 + decltype(p)::value);
          });
        }
      }
    }

    if (BARE) continue;  // no partials, no fold (nothing in shared memory but this thread's pipeline)

    // This lane's values: its slab partial (SPL = 1); with SPL > 1 its slabs' partials or its
    // level-1 node, already in the slots. A lane without rows contributes +0 to each of its slots.
    if (c0 < C && (SPL == 1 || r0 >= S)) {
#pragma unroll
      for (int s = 0; s < LANE_SLOTS; ++s)
#pragma unroll
        for (int k = 0; k < NB; ++k)
#pragma unroll
          for (int e = 0; e < VEC; ++e) my_slot[(s * NB + k) * tile_c + e] = acc[k][e];
    }
    __syncthreads();

    // Fold the LANES slot values (slabs or level-1 nodes) into this CTA's nodes, then climb the
    // tree by tickets. A plan covers the columns that share a node and a ticket: all of a tiled
    // unit's (plan 0), one column of a flat unit; value (k, cl) of the tile belongs to plan p at
    // channel col_c[p] + off.
    const int n_vals = NB * tile_c;
    auto plan_of = [&](int cl, int& p, int& off) {
      p = FLAT ? cl / VEC : 0;
      off = cl - p * VEC;
    };
    long long n_level = n_nodes;
    long long ws_off = 0;  // workspace offset of the current level
    long long tk_off = 0;  // ticket offset of the parent level
    for (int i = threadIdx.x; i < n_vals; i += blockDim.x) {
      const int k = i / tile_c, cl = i - k * tile_c;
      int p, off;
      plan_of(cl, p, off);
      const int c = col_c[p] + off;
      if (c >= C) continue;
      A v = slot[k * tile_c + cl];
#pragma unroll
      for (int l = 1; l < LANES; ++l) v += slot[(l * NB + k) * tile_c + cl];
      if (CTA_LEVEL == root_level) {
        write_root<TG, A, K, HAS_BIAS>(dw, db, accumulate, k, c, v);
      } else {
        ws[ws_off + (col_node[p] * NB + k) * C + c] = v;
      }
    }
    // One ticket per (parent, channel tile), or per (parent, vector) when flat, taken by the
    // plan's thread after a __syncthreads: its release publishes the CTA's node writes. The plans
    // whose parent this CTA folds (their children have all arrived) note where the children are
    // and where the parent goes, and the whole CTA folds them.
    static_assert(FAN == 8, "parents by shifts");
    const long long n_tk = FLAT ? n_vec : n_ctiles;  // tickets per parent
    int shift = 3;  // a CTA-level node's parent at this level: node >> shift
    const int climb_to = a.split ? CTA_LEVEL : root_level;
    for (int level = CTA_LEVEL; level < climb_to; ++level, shift += 3) {
      __syncthreads();  // the nodes are written, the previous level's plans read
      int fold = 0;     // children of plan g's parent that this CTA folds (0: none)
      if (threadIdx.x < (FLAT ? tile_v : 1)) {
        const int g = threadIdx.x, c = col_c[g];
        if (c < C && (level == CTA_LEVEL || col_n[g] > 0)) {
          const long long parent = col_node[g] >> shift;
          const int children = (int)min_<long long>(FAN, n_level - parent * FAN);
          unsigned int* tk = &tickets[tk_off + parent * n_tk + (FLAT ? c / VEC : ct)];
          if (ticket_add(tk) + 1 == (unsigned int)children) {
            // Every child has arrived, and nobody else touches this ticket in this launch: left
            // at zero for the next launch on the stream (gpu.backward_scratch).
            *tk = 0;
            fold = children;
            col_src[g] = ws_off + parent * FAN * NB * C + c;        // child j, row k: + (j NB + k) C
            col_dst[g] = ws_off + (n_level + parent) * NB * C + c;  // parent row k: + k C
          }
        }
        col_n[g] = fold;
      }
      // orders the acquires before every thread's reads of the children; any parent to fold?
      if (!__syncthreads_or(fold)) break;
      const bool top = level + 1 == root_level;
      // Every child of every value this thread folds is loaded before the first add: one L2 round
      // trip per level instead of one per value (the fold holds a CTA slot; under full DRAM load
      // a round trip is ~1-2 µs). Missing children load as +0, as the canonical tree defines.
      A ch[FOLD_VALUES][FAN];
#pragma unroll
      for (int r = 0; r < FOLD_VALUES; ++r) {
        const int i = threadIdx.x + r * blockDim.x;
        const int k = i / tile_c, cl = i - k * tile_c;
        int p, off;
        plan_of(cl, p, off);
        const int n = i < n_vals && col_c[p] + off < C ? col_n[p] : 0;
        const long long at = (n ? col_src[p] : 0) + (long long)k * C + off;
#pragma unroll
        for (int j = 0; j < FAN; ++j) ch[r][j] = j < n ? __ldcg(&ws[at + (long long)j * NB * C]) : A(0);
      }
#pragma unroll
      for (int r = 0; r < FOLD_VALUES; ++r) {
        const int i = threadIdx.x + r * blockDim.x;
        const int k = i / tile_c, cl = i - k * tile_c;
        int p, off;
        plan_of(cl, p, off);
        if (i >= n_vals || col_n[p] == 0 || col_c[p] + off >= C) continue;
        A v = ch[r][0];
#pragma unroll
        for (int j = 1; j < FAN; ++j) v += ch[r][j];
        if (top) {
          write_root<TG, A, K, HAS_BIAS>(dw, db, accumulate, k, col_c[p] + off, v);
        } else {
          ws[col_dst[p] + (long long)k * C + off] = v;
        }
      }
      ws_off += n_level * NB * C;
      tk_off += ((n_level + FAN - 1) / FAN) * n_tk;
      n_level = (n_level + FAN - 1) / FAN;
    }
    __syncthreads();  // the slots and the plans are reused by the next unit
  }
}

// The canonical tree above the CTAs' level for a backward launched with split: the folds of the
// tickets' climb (FAN children in index order, missing ones as +0), so the same bits. One CTA per
// FOLD_COLS channels of one reduced row k; the first level reads the CTAs' nodes from the
// workspace (every load of a parent before its adds), the levels above stay in shared memory
// (rows [0, np) and [np, np + np / FAN), used in turn). Launched programmatically after the
// backward, it may be resident before the backward ends and waits for its writes first.
constexpr int FOLD_COLS = 32, FOLD_ROWS = 16, FOLD_BATCH = 4;  // 512 threads: channels x parents
// Its argument is not __grid_constant__: NVRTC 13 then keeps the children (ch) in local memory.
template <typename T, typename TG, int K, bool HAS_BIAS>
__global__ void __launch_bounds__(512) conv1d_silu_fold(const c1s::FoldArgs a) {
  using namespace c1s;
  using A = typename Acc<T>::type;
  constexpr int NB = K + (HAS_BIAS ? 1 : 0);
  TG* __restrict__ dw = static_cast<TG*>(a.dw);
  TG* __restrict__ db = static_cast<TG*>(a.db);
  const long long n_nodes = a.n_nodes;
  const int C = (int)a.C, levels = (int)a.levels, accumulate = (int)a.accumulate;
  const int n_ct = (C + FOLD_COLS - 1) / FOLD_COLS;
  const int k = (int)blockIdx.x / n_ct;
  const int tx = (int)threadIdx.x % FOLD_COLS, ty = (int)threadIdx.x / FOLD_COLS;
  const int c = ((int)blockIdx.x - k * n_ct) * FOLD_COLS + tx;
  const A* ws = static_cast<const A*>(a.workspace);
  CONV1D_SILU_DYNAMIC_SMEM(smem_raw);
  A* buf = reinterpret_cast<A*>(smem_raw);  // [rows][FOLD_COLS]
  // Pass 0 runs the whole fold with every global access predicated off while the backward still
  // runs, so the real pass finds its instructions and shared memory warm (cold, the first level takes
  // 1.8-5.9 us after the wait on the H100). "unroll 1": one copy of the body.
#pragma unroll 1
  for (int pass = 0; pass < 2; ++pass) {
    if (pass) {
      __syncthreads();  // pass 0 is done with the shared memory
      griddep_wait();
    }
    const bool live = pass && c < C;

    long long n = n_nodes;
    int np = (int)((n + FAN - 1) / FAN);
    // FOLD_BATCH parents per thread at a time, every child loaded before the first add: one L2 round
    // trip per batch
    for (int p0 = ty; p0 < np; p0 += FOLD_BATCH * FOLD_ROWS) {
      A ch[FOLD_BATCH][FAN];
#pragma unroll
      for (int u = 0; u < FOLD_BATCH; ++u)
#pragma unroll
        for (int j = 0; j < FAN; ++j) {
          const long long child = (long long)(p0 + u * FOLD_ROWS) * FAN + j;
          ch[u][j] = live && child < n ? __ldcg(&ws[(child * NB + k) * C + c]) : A(0);
        }
#pragma unroll
      for (int u = 0; u < FOLD_BATCH; ++u) {
        const int p = p0 + u * FOLD_ROWS;
        if (p >= np) break;
        A v = ch[u][0];
#pragma unroll
        for (int j = 1; j < FAN; ++j) v += ch[u][j];
        if (levels > 1) {
          buf[p * FOLD_COLS + tx] = v;
        } else if (live) {
          write_root<TG, A, K, HAS_BIAS>(dw, db, accumulate, k, c, v);
        }
      }
    }
    int src = 0, dst = np;
    for (int l = 1; l < levels; ++l) {
      __syncthreads();  // the level below is written
      const int m = np;
      np = (np + FAN - 1) / FAN;
      for (int p = ty; p < np; p += FOLD_ROWS) {
        A v = buf[(src + p * FAN) * FOLD_COLS + tx];
#pragma unroll
        for (int j = 1; j < FAN; ++j) v += p * FAN + j < m ? buf[(src + p * FAN + j) * FOLD_COLS + tx] : A(0);
        if (l + 1 < levels) {
          buf[(dst + p) * FOLD_COLS + tx] = v;
        } else if (live) {
          write_root<TG, A, K, HAS_BIAS>(dw, db, accumulate, k, c, v);
        }
      }
      const int t = src;
      src = dst;
      dst = t;
    }
  }
}
