// Decoding step (causal-conv1d's causal_conv1d_update): L new tokens per sequence convolved
// against a rolling state of state_len columns per channel, which the step updates in place.
//
// One thread per (batch row, channel), channels fastest: a step moves a few bytes per channel, so
// its cost is the launch and the state's round trip, and a thread per channel keeps a warp's
// state rows in neighbouring bytes. The taps are summed as the forward template sums them (the
// bias, then one fma per tap k = 0..K-1, the same SiLU), so a step's outputs are bitwise the
// forward's for the same tokens after the same window.
//
// CIRCULAR: the state is a circular buffer whose next column is cache_seqlens[b] mod state_len
// (the K-1 columns before it are the window; the new tokens are written from it). Otherwise the
// window is the last K-1 columns and the state shifts left by L, the new tokens last.
// INDEXED: batch row b uses state row state_indices[b]; a negative index is a padding row
// (output 0, no state read or written).
#include "common.cuh"

template <typename T, typename TW, int K, bool HAS_BIAS, bool SILU, bool CIRCULAR, bool INDEXED>
__global__ void __launch_bounds__(128) conv1d_silu_update(const __grid_constant__ c1s::UpdateArgs a) {
  using namespace c1s;
  using A = typename Acc<T>::type;
  const long long C = a.C, L = a.L, n = a.state_len, sl = a.state_ls;
  const long long c_blocks = (C + blockDim.x - 1) / blockDim.x;
  const long long b = blockIdx.x / c_blocks;
  const long long c = (blockIdx.x - b * c_blocks) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const T* __restrict__ x = static_cast<const T*>(a.x) + b * a.x_bs + c * a.x_cs;
  T* __restrict__ out = static_cast<T*>(a.out) + b * a.out_bs + c * a.out_cs;
  const long long row = INDEXED ? (long long)load_ro(a.state_indices + b) : b;
  if (INDEXED && row < 0) {
    for (long long i = 0; i < L; ++i) out[i * a.out_ls] = cvt<T>(A(0));
    return;
  }
  T* __restrict__ state = static_cast<T*>(a.state) + row * a.state_bs + c * a.state_cs;

  A wv[K][1], bv[1];
  load_weights<A, TW, K, 1, HAS_BIAS>(static_cast<const TW*>(a.w), static_cast<const TW*>(a.bias), (int)c, wv, bv);

  // the window: taps 0..K-2 of the first new token, oldest first
  long long head = 0;  // CIRCULAR: the column the first new token goes to
  if (CIRCULAR) {
    head = load_ro(a.cache_seqlens + b) % n;
    head += head < 0 ? n : 0;
  }
  A win[K];
#pragma unroll
  for (int j = 0; j < K - 1; ++j) {
    const long long col = CIRCULAR ? (head + n - (K - 1) + j) % n : n - (K - 1) + j;
    win[j] = cvt<A>(state[col * sl]);
  }
  if (!CIRCULAR) {  // the columns that stay move left by L (read before they are written)
    for (long long j = 0; j + L < n; ++j) state[j * sl] = state[(j + L) * sl];
  }
  const long long first_kept = L > n ? L - n : 0;  // earlier tokens would be overwritten in this step
  for (long long i = 0; i < L; ++i) {
    const T xt = load_ro(x + i * a.x_ls);
    if (i >= first_kept) state[(CIRCULAR ? (head + i) % n : n - L + i) * sl] = xt;
    win[K - 1] = cvt<A>(xt);
    A z = bv[0];
#pragma unroll
    for (int k = 0; k < K; ++k) z = fma_(wv[k][0], win[k], z);
    out[i * a.out_ls] = cvt<T>(SILU ? z * sigmoid(z) : z);
#pragma unroll
    for (int k = 0; k < K - 1; ++k) win[k] = win[k + 1];
  }
}
