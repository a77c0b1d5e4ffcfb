// The LLM's KV cache as the bundle's llm graph declares it (manifest property llm.kv_cache.<layout>).
// The HF layout grows: past.N.{key,value} [batch, kv_heads, past, head_dim] in, present.* (one longer) out.
// A bundle of another layout (the `static` one of the KV-layout issue, not on this branch) is refused at load
// by make_kv_cache; supporting it means one more KvCache subclass here and a case in make_kv_cache.
#pragma once

#include <memory>
#include <string>

#include "manifest.hpp"
#include "runner.hpp"

namespace mmtrt {

class KvCache {
 public:
  virtual ~KvCache() = default;
  virtual int64_t past_length() const = 0;
  // Adds the cache's inputs (and any layout-specific ones) to an LLM call's feeds.
  virtual void add_feeds(TensorViews& feeds) const = 0;
  // Takes the cache's outputs from an LLM call.
  virtual void update(Tensors& outputs) = 0;
};

// Fresh (empty) cache for one sequence.
std::unique_ptr<KvCache> make_kv_cache(const Manifest& manifest);
// The layout the bundle declares; empty when it declares none.
std::string kv_layout(const Manifest& manifest);

}  // namespace mmtrt
