// The LLM's KV cache, per the layout the bundle's kv_layout pass chose (manifest model.kv_cache; none: hf).
// hf: past.N.{key,value} [1, kv_heads, past, head_dim] in, present.* (grown copies) out (kv_cache.cpp).
// static: one buffer per layer and kind [1, kv_heads, capacity, head_dim], GroupQueryAttention writes the new rows
// in place (kv_static.cpp). paged: one pool of blocks per layer and kind, a block table (kv_paged.cpp).
// The static and paged buffers are allocated once per load and bound as both past and present of every call.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "manifest.hpp"
#include "runner.hpp"

namespace mmtrt {

class KvCache {
 public:
  virtual ~KvCache() = default;
  // Starts an empty sequence that may grow to `tokens` positions; refuses one the cache cannot hold.
  virtual void open(int64_t tokens) = 0;
  // The inputs of an LLM call of `seq` new tokens other than inputs_embeds (valid until the next call), and in
  // `bound` the outputs the graph writes in place.
  virtual void add_feeds(int64_t seq, TensorViews& feeds, TensorViews& bound) = 0;
  // Takes the call's outputs; the sequence is then `seq` longer.
  virtual void update(Tensors& outputs, int64_t seq) = 0;
};

// The cache of the bundle's layout; a layout this runtime does not run is refused (ErrorKind::BadBundle).
std::unique_ptr<KvCache> make_kv_cache(const Manifest& manifest);
// The layout the bundle's manifest declares: "hf" when it declares none.
std::string kv_layout(const Manifest& manifest);
// Why a TensorRT engine of an LLM segment is not used under a shared-buffer layout ("" for hf).
std::string kv_engine_fallback(const Manifest& manifest);

// The shared buffers of the static and paged layouts: one per past name, in the cache's element type, allocated
// once; the same OrtValue is bound as past.N.* (feeds) and present.N.* (bound), so the graph writes it in place.
class CacheBuffers {
 public:
  CacheBuffers(const Manifest& manifest, const std::vector<int64_t>& shape);
  void bind(TensorViews& feeds, TensorViews& bound) const;

 private:
  std::vector<std::pair<std::string, std::string>> names_;  // (past, present)
  std::vector<std::vector<uint8_t>> memory_;
  std::vector<Ort::Value> values_;
};

// A tensor over caller-owned host memory (no copy).
template <typename T>
Ort::Value host_tensor(std::vector<T>& data, const std::vector<int64_t>& shape) {
  static const Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault);
  return Ort::Value::CreateTensor<T>(cpu, data.data(), data.size(), shape.data(), shape.size());
}

std::unique_ptr<KvCache> make_static_cache(const Manifest& manifest);
std::unique_ptr<KvCache> make_paged_cache(const Manifest& manifest);

}  // namespace mmtrt
