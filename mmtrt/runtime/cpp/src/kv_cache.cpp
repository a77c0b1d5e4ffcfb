#include "kv_cache.hpp"

#include "mmtrt/bundle.hpp"

namespace mmtrt {
namespace {

const std::string kPrefix = "llm.kv_cache.";

class HfKvCache : public KvCache {
 public:
  explicit HfKvCache(const Manifest& manifest) {
    const json& llm = manifest.raw.at("model").at("llm");
    const std::vector<int64_t> shape = {1, llm.at("num_kv_heads").get<int64_t>(), 0, llm.at("head_dim").get<int64_t>()};
    Ort::AllocatorWithDefaultOptions allocator;
    for (const auto& spec : manifest.inputs.at("llm"))
      if (spec.name.rfind("past.", 0) == 0)
        past_.emplace(spec.name, Ort::Value::CreateTensor<float>(allocator, shape.data(), shape.size()));
  }

  int64_t past_length() const override {
    return past_.empty() ? 0 : shape_of(past_.begin()->second)[2];
  }

  void add_feeds(TensorViews& feeds) const override {
    for (const auto& [name, value] : past_) feeds[name] = value;
  }

  void update(Tensors& outputs) override {
    for (auto& [name, value] : outputs)
      if (name.rfind("present.", 0) == 0) past_["past." + name.substr(8)] = std::move(value);
  }

 private:
  Tensors past_;
};

}  // namespace

std::string kv_layout(const Manifest& manifest) {
  for (const auto& property : manifest.raw.value("properties", json::array()))
    if (property.is_string() && property.get<std::string>().rfind(kPrefix, 0) == 0)
      return property.get<std::string>().substr(kPrefix.size());
  return "";
}

std::unique_ptr<KvCache> make_kv_cache(const Manifest& manifest) {
  const std::string layout = kv_layout(manifest);
  if (layout == "hf" || layout.empty()) return std::make_unique<HfKvCache>(manifest);
  throw Error(ErrorKind::BadBundle, "this bundle's KV cache layout is '" + layout +
                                        "', which the C++ runtime does not run yet (it runs 'hf'); use the Python "
                                        "runtime or recompile with the hf layout");
}

}  // namespace mmtrt
