// Forward template: y = act(bias + sum_k w[k] * xx[t - (K-1) + k]), one template for every variant.
//
// Geometry (conv1d_silu/gpu.py): a thread owns one channel vector v of a channel tile (VEC
// channels, one 16-byte load for bf16/fp16 when VEC = 8) and walks ROWS consecutive tokens (a
// lane), keeping the K-token window of x in registers. A CTA's threads lie flat over the tile's
// (lane, v) pairs, v fastest: LANES x tile_v threads are LANES whole lanes, and a tile as wide as
// the row with any block size covers whole rows with no idle thread at any C. Work units are
// (thread group, channel tile) pairs with the channel tile fastest, so neighbouring CTAs read
// neighbouring bytes.
// x arrives through a per-thread cp.async pipeline (common.cuh, RowPipe) DEPTH-1 ring turns ahead
// of the math.
// BARE (the bench's floor, never routed): y = x, the program's loads and stores without the math.
#include "common.cuh"

template <typename T, typename TW, int K, int VEC, bool HAS_BIAS, int MODE, bool HAS_INIT, bool FINAL,
          bool SILU, typename I, int ROWS, int DEPTH, bool BARE = false>
__global__ void __launch_bounds__(256) conv1d_silu_fwd(const __grid_constant__ c1s::FwdArgs a) {
  using namespace c1s;
  const T* __restrict__ x = static_cast<const T*>(a.x);
  const TW* __restrict__ w = static_cast<const TW*>(a.w);
  const TW* __restrict__ bias = static_cast<const TW*>(a.bias);
  const T* __restrict__ init = static_cast<const T*>(a.init);
  T* __restrict__ y = static_cast<T*>(a.y);
  T* __restrict__ final_states = static_cast<T*>(a.final_states);
  const long long x_rs = a.x_rs, S = a.S, n_units = a.n_units;
  // the struct's 8-byte fields narrow here
  const int n_docs = (int)a.n_docs, C = (int)a.C, tile_v = (int)a.tile_v, n_ctiles = (int)a.n_ctiles;
  using A = typename Acc<T>::type;
  CONV1D_SILU_DYNAMIC_SMEM(smem_raw);
  const RowPipe<T, VEC, K, 1, DEPTH> pipe{reinterpret_cast<T*>(smem_raw)};
  const DocArgs da{a.table, S, a.row_len, n_docs};

  for (long long unit = blockIdx.x; unit < n_units; unit += gridDim.x) {
    const int ct = (int)(unit % n_ctiles);
    const long long item = unit / n_ctiles * blockDim.x + threadIdx.x;  // (lane, v) of this tile
    const long long lane = item / tile_v;
    const int c0 = (ct * tile_v + (int)(item - lane * tile_v)) * VEC;
    const long long r0 = lane * ROWS;
    if (c0 >= C || r0 >= S) continue;

    const int rows = (int)min_<long long>(ROWS, S - r0);
    const int n_turns = (rows + K - 1) / K;
    const T* px = x + (I)r0 * (I)x_rs + c0;  // the next row to prefetch
    auto prefetch = [&](int q) {  // turn q: rows qK .. qK+K-1 into stage q % DEPTH
      if (q < n_turns) {
#pragma unroll
        for (int i = 0; i < K; ++i) {
          if (q * K + K <= rows || q * K + i < rows) pipe.copy(q % DEPTH, i, 0, px);
          px += x_rs;
        }
      }
      async_commit();
    };
#pragma unroll
    for (int q = 0; q < DEPTH - 1; ++q) prefetch(q);

    A wv[K][VEC], bv[VEC];
    load_weights<A, TW, K, VEC, HAS_BIAS>(w, bias, c0, wv, bv);

    // Ring of the last K tokens (see window_before): the token at phase P sits in slot P, tap k in
    // slot (P + 1 + k) % K. Before the first token it holds the K-1 rows preceding r0.
    Docs<MODE> docs;
    const int pos0 = docs.begin(da, r0, K - 1);
    A xr[K][VEC];
    window_before<0, K, VEC, HAS_INIT, A, T, I>(x, x_rs, init, C, c0, r0, pos0, docs.state, n_docs, xr);

    int stage = 0;
    T* py = y + (I)r0 * (I)C + c0;  // y row r0 + i, stored in order
    auto step = [&](auto phase, int i) {
      constexpr int P = decltype(phase)::value;
      const long long t = r0 + i;
      A xv[VEC];
      load_vec(pipe.at(stage, P, 0), 0, xv);
      if (i > 0 && docs.next(da, t)) {  // a document starts at t: its initial state precedes it
        window_before<P, K, VEC, HAS_INIT, A, T, I>(x, x_rs, init, C, c0, t, 0, docs.state, n_docs, xr);
      }
      A yv[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        xr[P][e] = xv[e];
        A z = bv[e];
#pragma unroll
        for (int k = 0; k < K; ++k) z = fma_(wv[k][e], xr[(P + 1 + k) % K][e], z);
        yv[e] = BARE ? xv[e] : docs.padding() ? A(0) : SILU ? z * sigmoid(z) : z;
      }
      store_vec(py, 0, yv);
      py += C;
      if (FINAL && docs.last(da, t) && docs.state < n_docs) {  // its last K-1 rows (states included)
#pragma unroll
        for (int j = 0; j < K - 1; ++j)
          store_vec(final_states, ((I)docs.state * (K - 1) + j) * (I)C + c0, xr[(P + 2 + j) % K]);
      }
    };
    for (int q = 0; q < n_turns; ++q) {  // one ring turn at a time
      prefetch(q + DEPTH - 1);  // into the stage that turn q-1 has read
      async_wait<DEPTH - 1>();  // turn q has landed
      stage = q % DEPTH;
      const int i0 = q * K;
      if (i0 + K <= rows) {
        static_for<0, K>([&](auto p) { step(p, i0 + decltype(p)::value); });
      } else {
        static_for<0, K>([&](auto p) {
          if (i0 + decltype(p)::value < rows) step(p, i0 + decltype(p)::value);
        });
      }
    }
  }
}
