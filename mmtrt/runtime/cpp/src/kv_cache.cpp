#include "kv_cache.hpp"

#include <map>

#include "mmtrt/bundle.hpp"

namespace mmtrt {
namespace {

const json& kv_facts(const Manifest& manifest) {
  static const json none;
  const json& model = manifest.raw.at("model");
  const auto found = model.find("kv_cache");
  return found == model.end() || found->is_null() ? none : *found;
}

// The grown copy of the exporter's graph; a fresh (empty) cache at each open. A graph that takes logits_from
// (bundles compiled since it existed) runs the lm_head on the last position only.
class HfKvCache : public KvCache {
 public:
  explicit HfKvCache(const Manifest& manifest) {
    const json& llm = manifest.raw.at("model").at("llm");
    shape_ = {1, llm.at("num_kv_heads").get<int64_t>(), 0, llm.at("head_dim").get<int64_t>()};
    for (const auto& spec : manifest.inputs.at("llm")) {
      if (spec.name.rfind("past.", 0) == 0) names_.push_back(spec.name);
      if (spec.name == "logits_from") logits_from_ = {0};
    }
  }

  void open(int64_t) override {
    Ort::AllocatorWithDefaultOptions allocator;
    past_.clear();
    for (const auto& name : names_)
      past_.emplace(name, Ort::Value::CreateTensor<float>(allocator, shape_.data(), shape_.size()));
    length_ = 0;
  }

  void add_feeds(int64_t seq, TensorViews& feeds, TensorViews&) override {
    mask_.assign(static_cast<size_t>(length_ + seq), 1);
    positions_.resize(static_cast<size_t>(seq));
    for (int64_t i = 0; i < seq; ++i) positions_[i] = length_ + i;
    mask_value_ = host_tensor(mask_, {1, length_ + seq});
    position_value_ = host_tensor(positions_, {1, seq});
    feeds["attention_mask"] = mask_value_;
    feeds["position_ids"] = position_value_;
    if (!logits_from_.empty()) {
      logits_from_[0] = seq - 1;
      logits_from_value_ = host_tensor(logits_from_, {1});
      feeds["logits_from"] = logits_from_value_;
    }
    for (const auto& [name, value] : past_) feeds[name] = value;
  }

  void update(Tensors& outputs, int64_t seq) override {
    for (auto& [name, value] : outputs)
      if (name.rfind("present.", 0) == 0) past_["past." + name.substr(8)] = std::move(value);
    length_ += seq;
  }

 private:
  std::vector<int64_t> shape_;
  std::vector<std::string> names_;
  Tensors past_;
  int64_t length_ = 0;
  std::vector<int64_t> mask_, positions_, logits_from_;  // logits_from_: empty where the graph does not take it
  Ort::Value mask_value_{nullptr}, position_value_{nullptr}, logits_from_value_{nullptr};
};

struct CacheType {
  ONNXTensorElementDataType onnx;
  size_t bytes;
};

CacheType cache_type(const json& kv) {
  static const std::map<std::string, CacheType> types = {
      {"float32", {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, 4}}, {"float16", {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, 2}}};
  const std::string dtype = kv.at("dtype").get<std::string>();
  const auto found = types.find(dtype);
  if (found == types.end())  // the Python runtime's message (mmtrt.runtime.kv.cache_dtype)
    throw Error(ErrorKind::BadBundle, "this bundle's KV cache is " + dtype + "; the runtime holds float32 and "
                                          "float16 caches; recompile with cast_precision dtype fp16");
  return found->second;
}

}  // namespace

CacheBuffers::CacheBuffers(const Manifest& manifest, const std::vector<int64_t>& shape) {
  const json& kv = kv_facts(manifest);
  const CacheType type = cache_type(kv);
  const std::string past = kv.at("past").get<std::string>(), present = kv.at("present").get<std::string>();
  const auto name = [](std::string pattern, int layer, const std::string& kind) {
    pattern.replace(pattern.find("{layer}"), 7, std::to_string(layer));
    return pattern.replace(pattern.find("{kind}"), 6, kind);
  };
  size_t elements = 1;
  for (int64_t d : shape) elements *= static_cast<size_t>(d);
  static const Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault);
  const int layers = manifest.raw.at("model").at("llm").at("num_layers").get<int>();
  for (int layer = 0; layer < layers; ++layer)
    for (const auto& kind : kv.at("kinds")) {
      names_.emplace_back(name(past, layer, kind.get<std::string>()), name(present, layer, kind.get<std::string>()));
      memory_.emplace_back(elements * type.bytes, 0);
      values_.push_back(Ort::Value::CreateTensor(cpu, memory_.back().data(), memory_.back().size(), shape.data(),
                                                 shape.size(), type.onnx));
    }
}

void CacheBuffers::bind(TensorViews& feeds, TensorViews& bound) const {
  for (size_t i = 0; i < names_.size(); ++i) {
    feeds[names_[i].first] = values_[i];
    bound[names_[i].second] = values_[i];
  }
}

std::string kv_layout(const Manifest& manifest) {
  const json& kv = kv_facts(manifest);
  return kv.is_null() ? "hf" : kv.at("layout").get<std::string>();
}

std::string kv_engine_fallback(const Manifest& manifest) {
  if (kv_layout(manifest) == "hf") return "";
  // as mmtrt.runtime.pipeline.STATIC_ON_ORT
  return "the KV cache's shared buffers are bound into one ONNX Runtime session of the whole LLM; no "
         "runtime binds them into an engine of its TensorRT form (TensorScatter + Attention) yet";
}

std::unique_ptr<KvCache> make_kv_cache(const Manifest& manifest) {
  const std::string layout = kv_layout(manifest);
  if (layout == "hf") return std::make_unique<HfKvCache>(manifest);
  if (layout == "static") return make_static_cache(manifest);
  if (layout == "paged") return make_paged_cache(manifest);
  throw Error(ErrorKind::BadBundle, "this bundle's KV cache layout is '" + layout +
                                        "', which the C++ runtime does not run (it runs hf, static and paged); "
                                        "recompile the recipe with this mmtrt");
}

}  // namespace mmtrt
