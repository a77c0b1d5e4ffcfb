// TokenSelect: token_prune's [CLS]-attention selection in one kernel. Per image: the logit of the [CLS] query
// against every key per head, softmax, mean over heads; the best patches (ties: the lower index first, as ONNX
// TopK orders them), in spatial order; the gather of their feature rows. TokenSelectMerge (VisionZip's
// `merge: contextual`) keeps keep - contextual of them and merges the dropped ones into `contextual` tokens: the
// dropped patches at `target_at` (positions among the dropped, in spatial order) are targets, every other dropped
// patch joins the target whose head-mean key is most similar (cosine; ties: the first target), and a contextual
// token is its target's row plus the mean of the rows that joined. What one thread computes lives here, so the
// CUDA kernel and the CPU twin run the same arithmetic in the same order.
#pragma once
#include "numeric.h"

namespace mmtrt {

const int kTokenSelectThreads = 256;

struct TokenSelectShape {
  int heads, q_len, kv_len, head_dim;  // q [n, heads, q_len, head_dim], k [n, heads, kv_len, head_dim]
  int cls;                             // the patches are keys cls .. cls + tokens - 1
  int tokens;                          // features [n, tokens, dim]
  int dim;
  int keep;                            // output [n, keep, dim]
  float scale;
  int contextual;                      // 0: no merge
  const int* target_at;                // [contextual], when merging

  MMTRT_HD int dominant() const { return keep - contextual; }
};

// Shared memory of one block, in floats: logits, scores, keep flags, source rows, reduction slots, and for a merge
// the nearest target per patch, the target rows, their mean keys and key norms.
MMTRT_HD int token_select_smem_floats(const TokenSelectShape& s) {
  return s.kv_len + 2 * s.tokens + s.keep + kTokenSelectThreads + s.tokens + s.contextual * (s.head_dim + 2);
}

template <class T>
MMTRT_HD float cls_logit(const typename T::raw* q, const typename T::raw* k, const TokenSelectShape& s, int b,
                         int h, int key) {
  const typename T::raw* qr = q + static_cast<long long>(b * s.heads + h) * s.q_len * s.head_dim;
  const typename T::raw* kr = k + (static_cast<long long>(b * s.heads + h) * s.kv_len + key) * s.head_dim;
  float acc = 0.0f;
  for (int i = 0; i < s.head_dim; ++i) acc = fmaf(T::load(qr[i]), T::load(kr[i]), acc);
  return acc * s.scale;
}

// Per thread `tid` of kTokenSelectThreads: its share of a block-wide max or exp-sum (then a tree combines them).
MMTRT_HD float strided_max(const float* v, int n, int tid) {
  float m = -INFINITY;
  for (int i = tid; i < n; i += kTokenSelectThreads) m = fmaxf(m, v[i]);
  return m;
}

MMTRT_HD float strided_exp_sum(const float* v, int n, float max, int tid) {
  float acc = 0.0f;
  for (int i = tid; i < n; i += kTokenSelectThreads) acc += expf(v[i] - max);
  return acc;
}

MMTRT_HD float softmax_weight(float logit, float max, float sum) { return expf(logit - max) / sum; }

MMTRT_HD bool ranks_before(float sa, int ia, float sb, int ib) { return sa > sb || (sa == sb && ia < ib); }

// How many patches rank before patch t: it is kept when fewer than `dominant()` do.
MMTRT_HD int rank_of(const float* score, int tokens, int t) {
  int r = 0;
  for (int u = 0; u < tokens; ++u) r += ranks_before(score[u], u, score[t], t);
  return r;
}

// The row of a kept patch in the output: kept patches keep their spatial order.
MMTRT_HD int kept_before(const float* kept, int t) {
  int d = 0;
  for (int u = 0; u < t; ++u) d += kept[u] != 0.0f;
  return d;
}

// Merge (contextual > 0): a dropped patch's position among the dropped ones, in spatial order.
MMTRT_HD int rest_position(const float* kept, int t) { return t - kept_before(kept, t); }

// The target a dropped patch is (its index among the targets), or -1 when it is merged into one.
MMTRT_HD int target_of(const TokenSelectShape& s, int rest_pos) {
  for (int c = 0; c < s.contextual; ++c)
    if (s.target_at[c] == rest_pos) return c;
  return -1;
}

// Component i of patch t's key averaged over heads (VisionZip's similarity metric, before the unit length).
template <class T>
MMTRT_HD float mean_key(const typename T::raw* k, const TokenSelectShape& s, int b, int t, int i) {
  float acc = 0.0f;
  for (int h = 0; h < s.heads; ++h)
    acc += T::load(k[(static_cast<long long>(b * s.heads + h) * s.kv_len + s.cls + t) * s.head_dim + i]);
  return acc / static_cast<float>(s.heads);
}

MMTRT_HD float norm_of(const float* v, int n) {
  float acc = 0.0f;
  for (int i = 0; i < n; ++i) acc = fmaf(v[i], v[i], acc);
  return sqrtf(acc);
}

// The target whose mean key is most similar to merged patch t's (cosine), the first on ties.
template <class T>
MMTRT_HD int nearest_target(const typename T::raw* k, const TokenSelectShape& s, int b, int t, const float* target_keys,
                            const float* target_norms) {
  float own = 0.0f;
  for (int i = 0; i < s.head_dim; ++i) {
    const float v = mean_key<T>(k, s, b, t, i);
    own = fmaf(v, v, own);
  }
  own = sqrtf(own);
  int best = 0;
  float best_cos = -INFINITY;
  for (int c = 0; c < s.contextual; ++c) {
    float dot = 0.0f;
    for (int i = 0; i < s.head_dim; ++i) dot = fmaf(mean_key<T>(k, s, b, t, i), target_keys[c * s.head_dim + i], dot);
    const float cos = dot / (own * target_norms[c]);
    if (cos > best_cos) best = c, best_cos = cos;
  }
  return best;
}

// Column col of contextual token c: the target's row plus the mean of the rows of the patches that joined it,
// rounded to the feature type where the ONNX decomposition rounds (the sums, the mean, the total).
template <class T>
MMTRT_HD typename T::raw contextual_value(const typename T::raw* feat, const TokenSelectShape& s, int b,
                                          const int* nearest, int target, int c, int col) {
  float acc = 0.0f;
  int count = 0;
  for (int t = 0; t < s.tokens; ++t)
    if (nearest[t] == c) acc += T::load(feat[(static_cast<long long>(b) * s.tokens + t) * s.dim + col]), ++count;
  const float mean = T::round(T::round(acc) / static_cast<float>(count > 0 ? count : 1));
  return T::store(T::load(feat[(static_cast<long long>(b) * s.tokens + target) * s.dim + col]) + mean);
}

}  // namespace mmtrt
