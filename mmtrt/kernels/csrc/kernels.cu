// The CUDA kernels of the mmtrt plugins, one extern "C" entry per plugin and activation type, so that TensorRT's
// AOT plugin interface (tensorrt.plugin.aot_impl) finds them by name in the PTX. Parameters follow that interface:
// input pointers, then int32 scalars (the plugin's SymIntExprs), then output pointers.
#include "int4_gemm.h"
#include "token_budget.h"
#include "token_select.h"

namespace mmtrt {

__device__ void block_tree(float* red, int tid, bool is_max) {
  for (int s = kTokenSelectThreads / 2; s > 0; s >>= 1) {
    if (tid < s) red[tid] = is_max ? fmaxf(red[tid], red[tid + s]) : red[tid] + red[tid + s];
    __syncthreads();
  }
}

// grid (n, row chunks), block kTokenSelectThreads; every block scores its image, then writes its share of rows.
template <class T>
__device__ void token_select(const typename T::raw* q, const typename T::raw* k, const typename T::raw* feat,
                             const TokenSelectShape s, typename T::raw* out) {
  extern __shared__ float smem[];
  float* logits = smem;
  float* score = logits + s.kv_len;
  float* kept = score + s.tokens;
  int* src = reinterpret_cast<int*>(kept + s.tokens);
  float* red = reinterpret_cast<float*>(src + s.keep);
  int* nearest = reinterpret_cast<int*>(red + kTokenSelectThreads);
  int* target_src = nearest + s.tokens;
  float* target_keys = reinterpret_cast<float*>(target_src + s.contextual);
  float* target_norms = target_keys + s.contextual * s.head_dim;
  const int b = blockIdx.x, tid = threadIdx.x;
  for (int t = tid; t < s.tokens; t += kTokenSelectThreads) score[t] = 0.0f;
  for (int h = 0; h < s.heads; ++h) {
    for (int key = tid; key < s.kv_len; key += kTokenSelectThreads) logits[key] = cls_logit<T>(q, k, s, b, h, key);
    __syncthreads();
    red[tid] = strided_max(logits, s.kv_len, tid);
    __syncthreads();
    block_tree(red, tid, true);
    const float max = red[0];
    __syncthreads();
    red[tid] = strided_exp_sum(logits, s.kv_len, max, tid);
    __syncthreads();
    block_tree(red, tid, false);
    const float sum = red[0];
    for (int t = tid; t < s.tokens; t += kTokenSelectThreads) score[t] += softmax_weight(logits[t + s.cls], max, sum);
    __syncthreads();
  }
  for (int t = tid; t < s.tokens; t += kTokenSelectThreads) score[t] /= static_cast<float>(s.heads);
  __syncthreads();
  for (int t = tid; t < s.tokens; t += kTokenSelectThreads)
    kept[t] = rank_of(score, s.tokens, t) < s.dominant() ? 1.0f : 0.0f;
  __syncthreads();
  for (int t = tid; t < s.tokens; t += kTokenSelectThreads) {
    if (kept[t] != 0.0f) {
      src[kept_before(kept, t)] = t;
    } else if (s.contextual) {
      const int c = target_of(s, rest_position(kept, t));
      nearest[t] = c < 0 ? -2 : -1;  // -2: merged, nearest target still to find; -1: a target, joins none
      if (c >= 0) target_src[c] = t;
    } else {
      nearest[t] = -1;
    }
  }
  __syncthreads();
  if (s.contextual) {
    for (int i = tid; i < s.contextual * s.head_dim; i += kTokenSelectThreads)
      target_keys[i] = mean_key<T>(k, s, b, target_src[i / s.head_dim], i % s.head_dim);
    __syncthreads();
    for (int c = tid; c < s.contextual; c += kTokenSelectThreads) target_norms[c] = norm_of(target_keys + c * s.head_dim, s.head_dim);
    __syncthreads();
    for (int t = tid; t < s.tokens; t += kTokenSelectThreads)
      if (kept[t] == 0.0f && nearest[t] == -2) nearest[t] = nearest_target<T>(k, s, b, t, target_keys, target_norms);
    for (int t = tid; t < s.tokens; t += kTokenSelectThreads)
      if (kept[t] != 0.0f) nearest[t] = -1;
    __syncthreads();
  }
  for (int r = blockIdx.y; r < s.keep; r += gridDim.y) {
    typename T::raw* dst = out + (static_cast<long long>(b) * s.keep + r) * s.dim;
    if (r < s.dominant()) {
      const typename T::raw* row = feat + (static_cast<long long>(b) * s.tokens + src[r]) * s.dim;
      for (int c = tid; c < s.dim; c += kTokenSelectThreads) dst[c] = row[c];
    } else {
      const int ctx = r - s.dominant();
      for (int c = tid; c < s.dim; c += kTokenSelectThreads)
        dst[c] = contextual_value<T>(feat, s, b, nearest, target_src[ctx], ctx, c);
    }
  }
}

// grid (n, row chunks), block kTokenSelectThreads; every block ranks its image, then writes its share of rows.
template <class T>
__device__ void token_select_scored(const float* scores, const typename T::raw* feat, const ScoredShape s,
                                    typename T::raw* out, int* counts) {
  extern __shared__ float smem[];
  float* score = smem;
  float* ranked = score + s.tokens;
  int* rank = reinterpret_cast<int*>(ranked + s.tokens);
  float* kept = reinterpret_cast<float*>(rank + s.tokens);
  int* src = reinterpret_cast<int*>(kept + s.tokens);
  int* count = src + s.keep;
  const int b = blockIdx.x, tid = threadIdx.x;
  for (int t = tid; t < s.tokens; t += kTokenSelectThreads) score[t] = scores[static_cast<long long>(b) * s.tokens + t];
  __syncthreads();
  for (int t = tid; t < s.tokens; t += kTokenSelectThreads) {
    rank[t] = rank_of(score, s.tokens, t);
    ranked[rank[t]] = score[t];
  }
  __syncthreads();
  if (tid == 0) *count = s.mass > 0.0f ? dynamic_count(ranked, s) : s.keep;
  __syncthreads();
  for (int t = tid; t < s.tokens; t += kTokenSelectThreads) kept[t] = rank[t] < *count ? 1.0f : 0.0f;
  __syncthreads();
  for (int t = tid; t < s.tokens; t += kTokenSelectThreads)
    if (kept[t] != 0.0f) src[kept_before(kept, t)] = t;
  __syncthreads();
  if (counts && blockIdx.y == 0 && tid == 0) counts[b] = *count;
  for (int r = blockIdx.y; r < s.keep; r += gridDim.y) {
    const int from = scored_source(src, *count, s.tokens, r);
    const typename T::raw* row = feat + (static_cast<long long>(b) * s.tokens + from) * s.dim;
    typename T::raw* dst = out + (static_cast<long long>(b) * s.keep + r) * s.dim;
    for (int c = tid; c < s.dim; c += kTokenSelectThreads) dst[c] = row[c];
  }
}

// grid (ceil(N / kInt4Cols), ceil(M / kInt4MaxRows)), block (kInt4Lanes, kInt4Slices): lane -> kInt4ColsPerLane
// columns, warp -> a K slice; the slices' partial sums meet in shared memory and are added in slice order.
template <class T, class S>
__device__ void int4_gemm(const typename T::raw* x, const uint8_t* w, const typename S::raw* scales,
                          const typename T::raw* pre, int M, int K, int N, int group, typename T::raw* y) {
  const int C = kInt4ColsPerLane;
  __shared__ float partial[kInt4Slices][kInt4MaxRows][kInt4Cols];
  const int lane = threadIdx.x, slice = threadIdx.y;
  const int n0 = blockIdx.x * kInt4Cols + C * lane, m0 = blockIdx.y * kInt4MaxRows;
  const int rows = min(kInt4MaxRows, M - m0);
  const int cols = max(0, min(C, N - n0));
  float acc[kInt4MaxRows][C];
  for (int m = 0; m < kInt4MaxRows; ++m)
    for (int j = 0; j < C; ++j) acc[m][j] = 0.0f;
  if (cols > 0) {
    for (int k = slice; k < K; k += kInt4Slices) {
      float wv[C];
      for (int j = 0; j < C; ++j) wv[j] = j < cols ? dequantized<T, S>(w, scales, k, n0 + j, N, group) : 0.0f;
      for (int m = 0; m < kInt4MaxRows; ++m) {
        if (m >= rows) break;
        const float xv = prescaled<T>(x, pre, m0 + m, k, K);
        for (int j = 0; j < C; ++j) acc[m][j] = fmaf(xv, wv[j], acc[m][j]);
      }
    }
  }
  for (int m = 0; m < kInt4MaxRows; ++m)
    for (int j = 0; j < C; ++j) partial[slice][m][C * lane + j] = acc[m][j];
  __syncthreads();
  for (int i = slice * kInt4Lanes + lane; i < kInt4MaxRows * kInt4Cols; i += kInt4Lanes * kInt4Slices) {
    const int m = i / kInt4Cols, c = i % kInt4Cols, n = blockIdx.x * kInt4Cols + c;
    if (m >= rows || n >= N) continue;
    float total = 0.0f;
    for (int sl = 0; sl < kInt4Slices; ++sl) total += partial[sl][m][c];
    y[static_cast<long long>(m0 + m) * N + n] = T::store(total);
  }
}

}  // namespace mmtrt

#define MMTRT_TOKEN_SELECT(SUFFIX, TYPE)                                                                       \
  extern "C" __global__ void __launch_bounds__(mmtrt::kTokenSelectThreads, 4) mmtrt_token_select_##SUFFIX(        \
      const TYPE::raw* q, const TYPE::raw* k, const TYPE::raw* feat, int heads, int q_len, int kv_len,       \
      int head_dim, int cls, int tokens, int dim, int keep, int scale_bits, TYPE::raw* out) {                \
    mmtrt::TokenSelectShape s = {heads, q_len, kv_len, head_dim, cls, tokens, dim, keep,                     \
                                 __int_as_float(scale_bits), 0, nullptr};                                    \
    mmtrt::token_select<TYPE>(q, k, feat, s, out);                                                           \
  }                                                                                                          \
  /* merged_at, the complement of target_at, is the decomposition's input; the kernel derives it */          \
  extern "C" __global__ void __launch_bounds__(mmtrt::kTokenSelectThreads, 4) mmtrt_token_select_merge_##SUFFIX(  \
      const TYPE::raw* q, const TYPE::raw* k, const TYPE::raw* feat, const int* target_at, const int* merged_at, \
      int heads, int q_len, int kv_len, int head_dim, int cls, int tokens, int dim, int keep, int scale_bits,    \
      int contextual, TYPE::raw* out) {                                                                      \
    mmtrt::TokenSelectShape s = {heads, q_len, kv_len, head_dim, cls, tokens, dim, keep,                     \
                                 __int_as_float(scale_bits), contextual, target_at};                          \
    mmtrt::token_select<TYPE>(q, k, feat, s, out);                                                           \
  }                                                                                                          \
  /* a score from the graph: a fixed keep (TokenSelectScored), or dynamic with a count (TokenSelectDynamic) */ \
  extern "C" __global__ void __launch_bounds__(mmtrt::kTokenSelectThreads, 4) mmtrt_token_select_scored_##SUFFIX( \
      const float* scores, const TYPE::raw* feat, int tokens, int dim, int keep, TYPE::raw* out) {            \
    mmtrt::ScoredShape s = {tokens, dim, keep, keep, 0.0f};                                                  \
    mmtrt::token_select_scored<TYPE>(scores, feat, s, out, nullptr);                                         \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(mmtrt::kTokenSelectThreads, 4) mmtrt_token_select_dynamic_##SUFFIX( \
      const float* scores, const TYPE::raw* feat, int tokens, int dim, int most, int least, int mass_bits,    \
      TYPE::raw* out, int* counts) {                                                                         \
    mmtrt::ScoredShape s = {tokens, dim, most, least, __int_as_float(mass_bits)};                            \
    mmtrt::token_select_scored<TYPE>(scores, feat, s, out, counts);                                          \
  }

#define MMTRT_INT4_GEMM(SUFFIX, TYPE, SCALE)                                                                   \
  extern "C" __global__ void __launch_bounds__(mmtrt::kInt4Lanes * mmtrt::kInt4Slices) mmtrt_int4_gemm_##SUFFIX( \
      const TYPE::raw* x, const int8_t* w, const SCALE::raw* scales, const TYPE::raw* pre, int M, int K, int N,  \
      int group, TYPE::raw* y) {                                                                              \
    mmtrt::int4_gemm<TYPE, SCALE>(x, reinterpret_cast<const uint8_t*>(w), scales, pre, M, K, N, group, y);     \
  }

MMTRT_TOKEN_SELECT(f32, mmtrt::F32)
MMTRT_TOKEN_SELECT(f16, mmtrt::F16)
MMTRT_TOKEN_SELECT(bf16, mmtrt::BF16)
MMTRT_INT4_GEMM(f32_f32, mmtrt::F32, mmtrt::F32)
MMTRT_INT4_GEMM(f16_f16, mmtrt::F16, mmtrt::F16)
MMTRT_INT4_GEMM(f16_f32, mmtrt::F16, mmtrt::F32)
MMTRT_INT4_GEMM(bf16_bf16, mmtrt::BF16, mmtrt::BF16)
MMTRT_INT4_GEMM(bf16_f32, mmtrt::BF16, mmtrt::F32)
