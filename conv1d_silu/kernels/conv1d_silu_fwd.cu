// Forward template: y = act(bias + sum_k w[k] * xx[t - (K-1) + k]), one template for every variant.
//
// Geometry (conv1d_silu/gpu.py): a CTA has LANES x tile_v threads; thread (lane, v) owns channel
// vector v of its tile (VEC channels, one 16-byte load for bf16/fp16 when VEC = 8) and walks ROWS
// consecutive tokens, keeping the K-token window of x in registers. Work units are (row group,
// channel tile) pairs with the channel tile fastest, so neighbouring CTAs read neighbouring bytes.
#include "common.cuh"

template <typename T, typename TW, int K, int VEC, bool HAS_BIAS, int MODE, bool HAS_INIT, bool FINAL,
          bool SILU, typename I, int ROWS>
__global__ void __launch_bounds__(256) conv1d_silu_fwd(
    const T* __restrict__ x, long long x_rs, const TW* __restrict__ w, const TW* __restrict__ bias,
    const int* __restrict__ table, long long row_len, int n_docs, const T* __restrict__ init,
    T* __restrict__ y, T* __restrict__ final_states, long long S, int C, int tile_v, int n_ctiles,
    long long n_units) {
  using namespace c1s;
  using A = typename Acc<T>::type;
  const DocArgs da{table, S, row_len, n_docs};
  const int lane = threadIdx.x / tile_v;
  const int vl = threadIdx.x - lane * tile_v;

  for (long long unit = blockIdx.x; unit < n_units; unit += gridDim.x) {
    const int ct = (int)(unit % n_ctiles);
    const long long group = unit / n_ctiles;
    const int c0 = (ct * tile_v + vl) * VEC;
    const long long r0 = (group * LANES + lane) * ROWS;
    if (c0 >= C || r0 >= S) continue;

    A wv[K][VEC], bv[VEC];
    load_weights<A, TW, K, VEC, HAS_BIAS>(w, bias, c0, wv, bv);

    // Window xw[k] = xx[t - (K-1) + k]; before the first token, xw[1..K-1] hold the K-1 rows
    // preceding r0 (x inside the document, else its initial state rows, else 0).
    Docs<MODE> docs;
    const int pos0 = docs.begin(da, r0, K - 1);
    A xw[K][VEC];
    window_before<K, VEC, HAS_INIT, A, T, I>(x, x_rs, init, C, c0, r0, pos0, docs.state, n_docs, xw);

    const long long rows = min_<long long>(ROWS, S - r0);
#pragma unroll 8
    for (int i = 0; i < rows; ++i) {
      const long long t = r0 + i;
      A xv[VEC];
      load_vec(x, (I)t * (I)x_rs + c0, xv);
      if (i > 0 && docs.next(da, t)) {  // a document starts at t: its initial state precedes it
        window_before<K, VEC, HAS_INIT, A, T, I>(x, x_rs, init, C, c0, t, 0, docs.state, n_docs, xw);
      }
#pragma unroll
      for (int m = 0; m < K - 1; ++m) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) xw[m][e] = xw[m + 1][e];
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e) xw[K - 1][e] = xv[e];

      A yv[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        A z = bv[e];
#pragma unroll
        for (int k = 0; k < K; ++k) z = fma_(wv[k][e], xw[k][e], z);
        yv[e] = SILU ? z * sigmoid(z) : z;
      }
      store_vec(y, (I)t * (I)C + c0, yv);

      if (FINAL && docs.last(da, t) && docs.state < n_docs) {  // the document's last K-1 rows (initial state included)
#pragma unroll
        for (int j = 0; j < K - 1; ++j) store_vec(final_states, ((I)docs.state * (K - 1) + j) * (I)C + c0, xw[j + 1]);
      }
    }
  }
}
