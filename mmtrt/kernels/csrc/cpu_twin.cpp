// The CPU twins of the kernels in kernels.cu: the same per-thread functions, called in the order the threads of
// a block and the blocks of a grid combine them. Built into a shared library that Python calls through ctypes.
#include <vector>

#include "int4_gemm.h"
#include "token_budget.h"
#include "token_select.h"

namespace mmtrt {
namespace {

void tree(std::vector<float>& red, bool is_max) {
  for (int s = kTokenSelectThreads / 2; s > 0; s >>= 1)
    for (int tid = 0; tid < s; ++tid) red[tid] = is_max ? fmaxf(red[tid], red[tid + s]) : red[tid] + red[tid + s];
}

template <class T>
void token_select(const void* qv, const void* kv, const void* fv, const TokenSelectShape& s, int n, void* outv,
                  float* scores, int* indices) {
  const typename T::raw *q = static_cast<const typename T::raw*>(qv), *k = static_cast<const typename T::raw*>(kv);
  const typename T::raw* feat = static_cast<const typename T::raw*>(fv);
  typename T::raw* out = static_cast<typename T::raw*>(outv);
  std::vector<float> logits(s.kv_len), score(s.tokens), kept(s.tokens), red(kTokenSelectThreads);
  std::vector<float> target_keys(s.contextual * s.head_dim), target_norms(s.contextual);
  std::vector<int> nearest(s.tokens), target_src(s.contextual);
  for (int b = 0; b < n; ++b) {
    std::fill(score.begin(), score.end(), 0.0f);
    for (int h = 0; h < s.heads; ++h) {
      for (int key = 0; key < s.kv_len; ++key) logits[key] = cls_logit<T>(q, k, s, b, h, key);
      for (int tid = 0; tid < kTokenSelectThreads; ++tid) red[tid] = strided_max(logits.data(), s.kv_len, tid);
      tree(red, true);
      const float max = red[0];
      for (int tid = 0; tid < kTokenSelectThreads; ++tid) red[tid] = strided_exp_sum(logits.data(), s.kv_len, max, tid);
      tree(red, false);
      const float sum = red[0];
      for (int t = 0; t < s.tokens; ++t) score[t] += softmax_weight(logits[t + s.cls], max, sum);
    }
    for (int t = 0; t < s.tokens; ++t) score[t] /= static_cast<float>(s.heads);
    for (int t = 0; t < s.tokens; ++t) kept[t] = rank_of(score.data(), s.tokens, t) < s.dominant() ? 1.0f : 0.0f;
    for (int t = 0; t < s.tokens; ++t) {
      scores[static_cast<long long>(b) * s.tokens + t] = score[t];
      nearest[t] = -1;
      if (kept[t] != 0.0f) {
        const int r = kept_before(kept.data(), t);
        indices[static_cast<long long>(b) * s.keep + r] = t;
        for (int c = 0; c < s.dim; ++c)
          out[(static_cast<long long>(b) * s.keep + r) * s.dim + c] = feat[(static_cast<long long>(b) * s.tokens + t) * s.dim + c];
      } else if (s.contextual) {
        const int c = target_of(s, rest_position(kept.data(), t));
        nearest[t] = c < 0 ? -2 : -1;
        if (c >= 0) target_src[c] = t;
      }
    }
    if (!s.contextual) continue;
    for (int i = 0; i < s.contextual * s.head_dim; ++i) target_keys[i] = mean_key<T>(k, s, b, target_src[i / s.head_dim], i % s.head_dim);
    for (int c = 0; c < s.contextual; ++c) target_norms[c] = norm_of(target_keys.data() + c * s.head_dim, s.head_dim);
    for (int t = 0; t < s.tokens; ++t)
      if (nearest[t] == -2) nearest[t] = nearest_target<T>(k, s, b, t, target_keys.data(), target_norms.data());
    for (int ctx = 0; ctx < s.contextual; ++ctx) {
      const int r = s.dominant() + ctx;
      indices[static_cast<long long>(b) * s.keep + r] = target_src[ctx];
      for (int c = 0; c < s.dim; ++c)
        out[(static_cast<long long>(b) * s.keep + r) * s.dim + c] = contextual_value<T>(feat, s, b, nearest.data(), target_src[ctx], ctx, c);
    }
  }
}

template <class T>
void token_select_scored(const float* scores, const void* fv, const ScoredShape& s, int n, void* outv, int* counts,
                         int* indices) {
  const typename T::raw* feat = static_cast<const typename T::raw*>(fv);
  typename T::raw* out = static_cast<typename T::raw*>(outv);
  std::vector<float> ranked(s.tokens), kept(s.tokens);
  std::vector<int> rank(s.tokens), src(s.keep);
  for (int b = 0; b < n; ++b) {
    const float* score = scores + static_cast<long long>(b) * s.tokens;
    for (int t = 0; t < s.tokens; ++t) {
      rank[t] = rank_of(score, s.tokens, t);
      ranked[rank[t]] = score[t];
    }
    const int count = s.mass > 0.0f ? dynamic_count(ranked.data(), s) : s.keep;
    for (int t = 0; t < s.tokens; ++t) kept[t] = rank[t] < count ? 1.0f : 0.0f;
    for (int t = 0; t < s.tokens; ++t)
      if (kept[t] != 0.0f) src[kept_before(kept.data(), t)] = t;
    counts[b] = count;
    for (int r = 0; r < s.keep; ++r) {
      const int from = scored_source(src.data(), count, s.tokens, r);
      indices[static_cast<long long>(b) * s.keep + r] = from;
      for (int c = 0; c < s.dim; ++c)
        out[(static_cast<long long>(b) * s.keep + r) * s.dim + c] = feat[(static_cast<long long>(b) * s.tokens + from) * s.dim + c];
    }
  }
}

template <class T, class S>
void int4_gemm(const void* xv, const uint8_t* w, const void* sv, const void* pv, int M, int K, int N, int group,
               void* yv) {
  const typename T::raw* x = static_cast<const typename T::raw*>(xv);
  const typename S::raw* scales = static_cast<const typename S::raw*>(sv);
  const typename T::raw* pre = static_cast<const typename T::raw*>(pv);
  typename T::raw* y = static_cast<typename T::raw*>(yv);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      float total = 0.0f;
      for (int slice = 0; slice < kInt4Slices; ++slice) total += slice_partial<T, S>(x, w, scales, pre, m, n, slice, K, N, group);
      y[static_cast<long long>(m) * N + n] = T::store(total);
    }
}

}  // namespace
}  // namespace mmtrt

extern "C" {

// indices: the kept patches, then (merging) each contextual token's target patch.
int mmtrt_token_select_cpu(int dtype, const void* q, const void* k, const void* feat, int n, int heads, int q_len,
                           int kv_len, int head_dim, int cls, int tokens, int dim, int keep, float scale,
                           int contextual, const int* target_at, void* out, float* scores, int* indices) {
  if (keep < 1 || keep > tokens || cls + tokens > kv_len || q_len < 1 || contextual < 0 || contextual >= keep) return 1;
  for (int c = 0; c < contextual; ++c)
    if (target_at[c] < 0 || target_at[c] >= tokens - (keep - contextual)) return 1;
  mmtrt::TokenSelectShape s = {heads, q_len, kv_len, head_dim, cls, tokens, dim, keep, scale, contextual, target_at};
  if (dtype == mmtrt::kF32) mmtrt::token_select<mmtrt::F32>(q, k, feat, s, n, out, scores, indices);
  else if (dtype == mmtrt::kF16) mmtrt::token_select<mmtrt::F16>(q, k, feat, s, n, out, scores, indices);
  else if (dtype == mmtrt::kBF16) mmtrt::token_select<mmtrt::BF16>(q, k, feat, s, n, out, scores, indices);
  else return 2;
  return 0;
}

// mass 0: keep a fixed `keep` (TokenSelectScored); otherwise keep is the most (TokenSelectDynamic). indices: the
// patch each output row holds.
int mmtrt_token_select_scored_cpu(int dtype, const float* scores, const void* feat, int n, int tokens, int dim,
                                  int keep, int least, float mass, void* out, int* counts, int* indices) {
  if (keep < 1 || keep > tokens || least < 1 || least > keep || mass < 0.0f || mass > 1.0f) return 1;
  mmtrt::ScoredShape s = {tokens, dim, keep, least, mass};
  if (dtype == mmtrt::kF32) mmtrt::token_select_scored<mmtrt::F32>(scores, feat, s, n, out, counts, indices);
  else if (dtype == mmtrt::kF16) mmtrt::token_select_scored<mmtrt::F16>(scores, feat, s, n, out, counts, indices);
  else if (dtype == mmtrt::kBF16) mmtrt::token_select_scored<mmtrt::BF16>(scores, feat, s, n, out, counts, indices);
  else return 2;
  return 0;
}

// Scales are in the activation type or fp32: the pairs kernels.cu instantiates.
int mmtrt_int4_gemm_cpu(int dtype, int scale_dtype, const void* x, const int8_t* packed, const void* scales,
                        const void* pre, int M, int K, int N, int group, void* y) {
  if (group < 1 || M < 0 || N % 2) return 1;
  const uint8_t* w = reinterpret_cast<const uint8_t*>(packed);
  if (scale_dtype != dtype && scale_dtype != mmtrt::kF32) return 2;
  const bool f32_scales = scale_dtype == mmtrt::kF32;
  if (dtype == mmtrt::kF32) mmtrt::int4_gemm<mmtrt::F32, mmtrt::F32>(x, w, scales, pre, M, K, N, group, y);
  else if (dtype == mmtrt::kF16 && f32_scales) mmtrt::int4_gemm<mmtrt::F16, mmtrt::F32>(x, w, scales, pre, M, K, N, group, y);
  else if (dtype == mmtrt::kF16) mmtrt::int4_gemm<mmtrt::F16, mmtrt::F16>(x, w, scales, pre, M, K, N, group, y);
  else if (dtype == mmtrt::kBF16 && f32_scales) mmtrt::int4_gemm<mmtrt::BF16, mmtrt::F32>(x, w, scales, pre, M, K, N, group, y);
  else if (dtype == mmtrt::kBF16) mmtrt::int4_gemm<mmtrt::BF16, mmtrt::BF16>(x, w, scales, pre, M, K, N, group, y);
  else return 2;
  return 0;
}

// Dynamic shared memory of a launch, in bytes, from the headers' own functions: what launch.py must compute.
int mmtrt_token_select_smem_bytes(int kv_len, int tokens, int keep, int head_dim, int contextual) {
  mmtrt::TokenSelectShape s = {1, 1, kv_len, head_dim, 0, tokens, 1, keep, 1.0f, contextual, nullptr};
  return 4 * mmtrt::token_select_smem_floats(s);
}

int mmtrt_scored_smem_bytes(int tokens, int rows) {
  mmtrt::ScoredShape s = {tokens, 1, rows, rows, 0.0f};
  return 4 * mmtrt::scored_smem_words(s);
}

// Round-trips floats through a storage type: the conversions every kernel uses, for the tests.
void mmtrt_round_cpu(int dtype, const float* in, float* out, long long n) {
  for (long long i = 0; i < n; ++i)
    out[i] = dtype == mmtrt::kF16 ? mmtrt::F16::round(in[i]) : dtype == mmtrt::kBF16 ? mmtrt::BF16::round(in[i]) : in[i];
}

}
