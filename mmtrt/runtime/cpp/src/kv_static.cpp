// The static layout: one buffer per layer and kind [1, kv_heads, capacity, head_dim], bound as past and present;
// GroupQueryAttention writes the new rows at the sequence's length (seqlens_k) and attends up to it. The inputs
// are those mmtrt.runtime.batch.StaticStepper feeds, for one sequence (row 0).
#include "kv_cache.hpp"

#include "mmtrt/bundle.hpp"

namespace mmtrt {
namespace {

std::vector<int64_t> buffer_shape(const Manifest& manifest) {
  const json& llm = manifest.raw.at("model").at("llm");
  return {1, llm.at("num_kv_heads").get<int64_t>(), manifest.dims.at("capacity").max, llm.at("head_dim").get<int64_t>()};
}

class StaticKvCache : public KvCache {
 public:
  explicit StaticKvCache(const Manifest& manifest)
      : capacity_(manifest.dims.at("capacity").max), buffers_(manifest, buffer_shape(manifest)) {}

  void open(int64_t tokens) override {
    check(tokens);
    length_ = 0;  // the rows beyond seqlens_k are never read: no clearing
  }

  void add_feeds(int64_t seq, TensorViews& feeds, TensorViews& bound) override {
    check(length_ + seq);
    positions_.resize(static_cast<size_t>(seq));
    for (int64_t i = 0; i < seq; ++i) positions_[i] = length_ + i;
    seqlens_ = {static_cast<int32_t>(length_ + seq - 1)};
    total_ = {static_cast<int32_t>(length_ + seq)};
    logits_from_ = {seq - 1};  // the lm_head on the last position only
    values_.clear();
    values_.push_back(host_tensor(positions_, {1, seq}));
    values_.push_back(host_tensor(seqlens_, {1}));
    values_.push_back(host_tensor(total_, {}));
    values_.push_back(host_tensor(logits_from_, {1}));
    feeds["position_ids"] = values_[0];
    feeds["seqlens_k"] = values_[1];
    feeds["total_sequence_length"] = values_[2];
    feeds["logits_from"] = values_[3];
    buffers_.bind(feeds, bound);
  }

  void update(Tensors&, int64_t seq) override { length_ += seq; }

 private:
  void check(int64_t tokens) const {  // the Python runtime's message (StaticStepper.run)
    if (tokens > capacity_)
      throw Error(ErrorKind::BadInput, "the sequence would hold " + std::to_string(tokens) + " tokens; the "
                                           "bundle's KV capacity is " + std::to_string(capacity_) +
                                           "; recompile with a larger envelope");
  }

  int64_t capacity_, length_ = 0;
  CacheBuffers buffers_;
  std::vector<int64_t> positions_, logits_from_;
  std::vector<int32_t> seqlens_, total_;
  std::vector<Ort::Value> values_;
};

}  // namespace

std::unique_ptr<KvCache> make_static_cache(const Manifest& manifest) {
  return std::make_unique<StaticKvCache>(manifest);
}

}  // namespace mmtrt
