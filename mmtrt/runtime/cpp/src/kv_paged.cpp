// The paged layout: one pool per layer and kind [num_slots, kv_heads, head_dim] (slot = block * block_tokens +
// offset), bound as past and present; the graph writes each new token at its slot (ScatterND) and gathers the
// sequence's blocks in table order. The inputs are those mmtrt.runtime.paged.PagedStepper feeds, for one sequence.
#include "kv_cache.hpp"

#include "mmtrt/bundle.hpp"

namespace mmtrt {
namespace {

class PagedKvCache : public KvCache {
 public:
  explicit PagedKvCache(const Manifest& manifest)
      : block_tokens_(manifest.raw.at("model").at("kv_cache").at("block_tokens").get<int64_t>()),
        pool_blocks_(manifest.dims.at("pool_blocks").max),
        buffers_(manifest, pool_shape(manifest)) {}

  void open(int64_t tokens) override {  // the Python runtime's message (PagedStepper.check)
    const int64_t need = blocks_for(tokens);
    if (need > pool_blocks_)
      throw Error(ErrorKind::BadInput, "the request needs " + std::to_string(need) + " KV blocks, the bundle's "
                                           "pool holds " + std::to_string(pool_blocks_) +
                                           "; recompile with a larger kv_layout.pool_blocks");
    table_.clear();  // one sequence at a time: every block is free again
    length_ = 0;
  }

  void add_feeds(int64_t seq, TensorViews& feeds, TensorViews& bound) override {
    const int64_t blocks = blocks_for(length_ + seq);
    if (blocks > pool_blocks_)
      throw Error(ErrorKind::BadInput, "the sequence would hold " + std::to_string(length_ + seq) + " tokens; the "
                                           "bundle's KV pool holds " + std::to_string(pool_blocks_ * block_tokens_) +
                                           "; recompile with a larger kv_layout.pool_blocks");
    while (static_cast<int64_t>(table_.size()) < blocks) table_.push_back(static_cast<int64_t>(table_.size()));
    positions_.resize(static_cast<size_t>(seq));
    slots_.resize(static_cast<size_t>(seq));
    for (int64_t i = 0; i < seq; ++i) {
      const int64_t position = length_ + i;
      positions_[i] = position;
      slots_[i] = table_[position / block_tokens_] * block_tokens_ + position % block_tokens_;
    }
    logits_from_ = {seq - 1};  // the lm_head on the last position only
    values_.clear();
    values_.push_back(host_tensor(positions_, {1, seq}));
    values_.push_back(host_tensor(slots_, {seq, 1}));
    values_.push_back(host_tensor(table_, {1, blocks}));
    values_.push_back(host_tensor(logits_from_, {1}));
    feeds["position_ids"] = values_[0];
    feeds["slot_mapping"] = values_[1];
    feeds["block_table"] = values_[2];
    feeds["logits_from"] = values_[3];
    buffers_.bind(feeds, bound);
  }

  void update(Tensors&, int64_t seq) override { length_ += seq; }

 private:
  static std::vector<int64_t> pool_shape(const Manifest& manifest) {
    const json& llm = manifest.raw.at("model").at("llm");
    return {manifest.dims.at("num_slots").max, llm.at("num_kv_heads").get<int64_t>(),
            llm.at("head_dim").get<int64_t>()};
  }
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_tokens_ - 1) / block_tokens_; }

  int64_t block_tokens_, pool_blocks_, length_ = 0;
  CacheBuffers buffers_;
  std::vector<int64_t> table_, positions_, slots_, logits_from_;
  std::vector<Ort::Value> values_;
};

}  // namespace

std::unique_ptr<KvCache> make_paged_cache(const Manifest& manifest) {
  return std::make_unique<PagedKvCache>(manifest);
}

}  // namespace mmtrt
