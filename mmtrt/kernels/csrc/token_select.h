// TokenSelect: token_prune's [CLS]-attention selection in one kernel. Per image: the logit of the [CLS] query
// against every key per head, softmax, mean over heads; the `keep` best patches (ties: the lower index first, as
// ONNX TopK orders them), in spatial order; the gather of their feature rows. What one thread computes lives
// here, so the CUDA kernel and the CPU twin run the same arithmetic in the same order.
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
};

// Shared memory of one block, in floats: logits, scores, keep flags, source rows, reduction slots.
MMTRT_HD int token_select_smem_floats(const TokenSelectShape& s) {
  return s.kv_len + 2 * s.tokens + s.keep + kTokenSelectThreads;
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

// How many patches rank before patch t: it is kept when fewer than `keep` do.
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

}  // namespace mmtrt
