// TokenSelectScored and TokenSelectDynamic: token_prune's selection from a score per patch that the graph
// computes (norm, random, attention_entropy, saliency, or [CLS] attention where TokenSelect does not take it).
// Fixed: the `keep` best patches (ties: the lower index first, as ONNX TopK orders them), in spatial order.
// Dynamic: count = the fewest best patches whose score sum reaches mass x the total, clamped to [least, most];
// the output is a block of `most` rows, the count kept patches first in spatial order and the last patch's row in
// the rest (what token_prune's graph writes there), plus the count per image. The sums run in rank order,
// sequentially, in fp32: the twin and the kernel's one summing thread add in the same order.
#pragma once
#include "token_select.h"

namespace mmtrt {

struct ScoredShape {
  int tokens, dim;  // scores [n, tokens] (fp32), features [n, tokens, dim]
  int keep;         // output rows: the fixed count, or `most` when dynamic
  int least;        // dynamic: the fewest kept
  float mass;       // dynamic: the share of the total to reach; 0 for a fixed count
};

// Shared memory of one block, in 4-byte words: scores, scores in rank order, ranks, keep flags, source rows, count.
MMTRT_HD int scored_smem_words(const ScoredShape& s) { return 4 * s.tokens + s.keep + 1; }

// How many of the best patches an image keeps, from its scores sorted best first.
MMTRT_HD int dynamic_count(const float* ranked, const ScoredShape& s) {
  float total = 0.0f;
  for (int i = 0; i < s.tokens; ++i) total += ranked[i];
  const float target = total * s.mass;
  float reached = 0.0f;
  int short_of = 0;
  for (int i = 0; i < s.tokens; ++i) {
    reached += ranked[i];
    short_of += reached < target;
  }
  const int count = short_of + 1 < s.keep ? short_of + 1 : s.keep;
  return count > s.least ? count : s.least;
}

// The patch whose row fills output row r: the r-th kept patch in spatial order, or the last patch past the count.
MMTRT_HD int scored_source(const int* src, int count, int tokens, int r) { return r < count ? src[r] : tokens - 1; }

}  // namespace mmtrt
