// mmtrt::Bundle: the steps of mmtrt.runtime.pipeline.Pipeline, in the same order and with the same messages.
#include "mmtrt/bundle.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <set>

#include "engines.hpp"
#include "image.hpp"
#include "image_tokens.hpp"
#include "jinja_whitespace.hpp"
#include "kv_cache.hpp"
#include "manifest.hpp"
#include "preprocess.hpp"
#include "runner.hpp"
#include "signature.hpp"
#include "special_tokens.hpp"
#include "tokenizer.hpp"

namespace mmtrt {
namespace {

using Clock = std::chrono::steady_clock;

std::string absolute(const std::string& path) {
  char resolved[PATH_MAX];
  return realpath(path.c_str(), resolved) ? std::string(resolved) : path;
}

size_t count_of(const std::string& text, const std::string& needle) {
  size_t count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++count;
  return count;
}

std::string replace_all(std::string text, const std::string& needle, const std::string& with) {
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + with.size()))
    text.replace(at, needle.size(), with);
  return text;
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

// A bundle compiled with a speculative draft decodes here one token per step: the same greedy tokens, without the
// draft's speed-up. The reason is returned for the fallbacks, and mmtrt-run prints it once.
std::string speculative_fallback(const nlohmann::json& model) {
  const auto spec = model.find("speculative");
  if (spec == model.end() || spec->is_null()) return "";
  return "the C++ runtime does not run the bundle's " + spec->value("draft", std::string("speculative")) +
         " draft: it decodes one token per step (the same greedy tokens, without the draft's speed-up); "
         "run the bundle with the Python runtime (mmtrt run) to use it";
}

// Any-resolution models (LLaVA-NeXT, LLaVA-OneVision) tile each image and lay its tiles' features out by its
// size; this runtime runs one fixed-size image per prompt, and says so before any session loads.
void refuse_tiled_images(const std::string& bundle, const Manifest& manifest) {
  const auto& model = manifest.raw.at("model");
  if (!model.at("vision").contains("anyres")) return;
  throw Error(ErrorKind::BadBundle, bundle + " holds a " + model.at("architecture").get<std::string>() +
                                        " model, which tiles each image at any resolution; the C++ runtime runs "
                                        "fixed-size images only: run this bundle with the Python runtime (mmtrt run)");
}

void refuse_modified(const std::string& bundle, const Manifest& manifest) {
  const std::vector<std::string> bad = modified_artifacts(bundle, manifest);
  if (bad.empty()) return;
  const std::string more = bad.size() > 1 ? " (and " + std::to_string(bad.size() - 1) + " more)" : "";
  throw Error(ErrorKind::BadBundle, bundle + "/" + bad.front() + " is missing or does not match its sha256 in "
                                        "manifest.json" + more + "; restore the bundle or recompile the recipe");
}

template <typename T>
Ort::Value tensor(std::vector<T>& data, const std::vector<int64_t>& shape) {
  static const Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  return Ort::Value::CreateTensor<T>(cpu, data.data(), data.size(), shape.data(), shape.size());
}

// Families whose preprocessing or positions this runtime does not implement: refused at load, in one line.
void refuse_family(const std::string& path, const Manifest& m) {
  const std::string family = m.raw.at("model").value("architecture", "llava");
  if (family == "qwen2_vl" || family == "qwen2_5_vl")
    throw Error(ErrorKind::BadBundle, path + " holds a " + family + " model; the C++ runtime does not run Qwen2-VL "
                "(its dynamic-resolution preprocessing and M-RoPE positions are implemented in the Python runtime "
                "only); run it with `mmtrt run`");
}

}  // namespace

// What generate reads from the manifest, read once at load so a missing key is a load error.
struct ModelFacts {
  std::string chat_template, image_token;
  int64_t image_tokens = 0, image_token_id = 0;
  std::set<int64_t> eos;
  int max_new_tokens = 0;

  explicit ModelFacts(const json& manifest) {
    const json& model = manifest.at("model");
    chat_template = with_jinja_whitespace(model.at("chat_template").get<std::string>());
    image_token = model.at("image_token").get<std::string>();
    image_tokens = model.at("vision").at("image_tokens").get<int64_t>();
    image_token_id = model.at("image_token_id").get<int64_t>();
    for (const auto& id : model.at("eos_token_ids")) eos.insert(id.get<int64_t>());
    max_new_tokens = manifest.at("envelope").at("max_new_tokens").get<int>();
  }
};

struct Bundle::Impl {
  std::string path;  // as the caller named it, for messages
  std::string root;  // absolute
  Manifest manifest;
  std::unique_ptr<ModelFacts> model;
  std::unique_ptr<Preprocessor> preprocessor;
  std::unique_ptr<Tokenizer> tokenizer;
  std::map<std::string, std::unique_ptr<Runner>> runners;
  std::unique_ptr<KvCache> cache;  // allocated once per load; open() starts each sequence
  std::string prompt_graph;        // int8_prefill's graph, run for calls of at least prompt_tokens new tokens
  int64_t prompt_tokens = 0;
  bool parse_special_tokens = false;
  NamedStrings backends, fallbacks;

  Tensors run(const std::string& name, const TensorViews& feeds, const TensorViews& bound = {}) {
    for (const auto& spec : manifest.inputs.at(name)) {
      const auto found = feeds.find(spec.name);
      if (found == feeds.end()) {
        std::string given;
        for (const auto& [k, v] : feeds) given += (given.empty() ? "" : ", ") + k;
        throw Error(ErrorKind::BadBundle, path + "/manifest.json: components." + name + " takes '" + spec.name +
                                              "', which the runtime does not give (" + given + "); recompile the "
                                              "recipe or restore the bundle");
      }
      check_shape(name, spec, shape_of(found->second), manifest.dims);
    }
    return runners.at(name)->run_bound(feeds, bound);
  }

  std::vector<int32_t> prompt_ids(const std::string& prompt, bool raw) const {
    if (!valid_utf8(prompt))
      throw Error(ErrorKind::BadInput, "the prompt is not valid UTF-8 text (a lone surrogate or a byte that is not "
                                       "UTF-8); re-encode it as UTF-8");
    const int64_t image_tokens = model->image_tokens;
    std::vector<int32_t> ids = raw || parse_special_tokens || !tokenizer->holds_special_tokens(prompt)
                                   ? template_ids(raw ? prompt : tokenizer->format_prompt(model->chat_template, prompt))
                                   : user_text_ids(prompt);
    const int64_t limit = manifest.dims.at("seq").max;
    if (static_cast<int64_t>(ids.size()) > limit)
      throw Error(ErrorKind::BadInput, "the prompt is " + std::to_string(ids.size() - image_tokens) +
                                           " tokens after the chat template; this bundle accepts at most " +
                                           std::to_string(limit - image_tokens) + "; shorten it or recompile with "
                                           "a larger envelope.prompt_tokens.max");
    return ids;
  }

  // mmtrt.runtime.prompt.tokenize: the one placeholder expanded, the BOS added unless the text starts with it.
  std::vector<int32_t> template_ids(const std::string& text) const {
    const std::string& image_token = model->image_token;
    const size_t count = count_of(text, image_token);
    if (count != 1)
      throw Error(ErrorKind::BadInput, "the prompt holds " + std::to_string(count) + " " + image_token +
                                           " placeholders; with one image it needs exactly one (with --raw-prompt, "
                                           "put " + image_token + " where the image goes)");
    return tokenizer->encode(expand(text), !starts_with_bos(text));
  }

  // mmtrt.runtime.prompt.tokenize_user_text: the template's special tokens parsed, the user's text kept as text.
  std::vector<int32_t> user_text_ids(const std::string& prompt) const {
    static const std::string sentinel = "\xee\x80\x80mmtrt-user-text\xee\x80\x80";  // U+E000 around a name
    const std::string framed = tokenizer->format_prompt(model->chat_template, sentinel);
    if (count_of(framed, sentinel) != 1)
      throw Error(ErrorKind::BadInput, "the prompt holds special tokens and this bundle's chat template alters the "
                                       "user's text, so they cannot be kept as text; remove them, or load with "
                                       "parse_special_tokens=True");
    const size_t count = count_of(framed, model->image_token);
    if (count != 1)
      throw Error(ErrorKind::BadInput, "the chat template holds " + std::to_string(count) + " " + model->image_token +
                                           " placeholders; with one image it needs exactly one; recompile the recipe");
    const size_t at = framed.find(sentinel);
    const std::string before = expand(framed.substr(0, at)), after = expand(framed.substr(at + sentinel.size()));
    std::vector<int32_t> ids = tokenizer->encode(before, !starts_with_bos(before));
    const std::vector<int32_t> text = tokenizer->encode_text(prompt);
    ids.insert(ids.end(), text.begin(), text.end());
    if (!after.empty()) {
      const std::vector<int32_t> tail = tokenizer->encode(after, false);
      ids.insert(ids.end(), tail.begin(), tail.end());
    }
    return ids;
  }

  std::string expand(const std::string& text) const {
    std::string repeated;
    for (int64_t i = 0; i < model->image_tokens; ++i) repeated += model->image_token;
    return replace_all(text, model->image_token, repeated);
  }

  bool starts_with_bos(const std::string& text) const {
    const std::string& bos = tokenizer->bos_token();
    return !bos.empty() && text.rfind(bos, 0) == 0;
  }

  std::vector<float> pixel_values(const std::string& image_path) const {
    const RgbImage image = read_image(image_path);
    // the recipe's optional bounds on the user's file, as the Python runtime's image_bounds.check_image
    const json& bounds = manifest.raw.at("envelope").at("image");
    const json lo = bounds.value("min_side", json()), hi = bounds.value("max_side", json());
    const int shorter = std::min(image.width, image.height), longer = std::max(image.width, image.height);
    if ((!lo.is_null() && shorter < lo.get<int>()) || (!hi.is_null() && longer > hi.get<int>()))
      throw Error(ErrorKind::BadInput, "image is " + std::to_string(image.width) + "x" + std::to_string(image.height) +
                                           "; this bundle's recipe accepts sides from " +
                                           (lo.is_null() ? std::string("1") : lo.dump()) + " to " +
                                           (hi.is_null() ? std::string("any size") : hi.dump()) +
                                           " pixels; resize it or recompile with a wider envelope.image");
    return preprocessor->run(image);
  }

  std::vector<int64_t> pixel_shape() const {
    const auto& shape = manifest.outputs.at("preprocess").at(0).shape;
    std::vector<int64_t> out;
    for (const auto& d : shape) out.push_back(std::holds_alternative<int64_t>(d) ? std::get<int64_t>(d) : 1);
    return out;
  }

  Ort::Value embed(std::vector<int64_t>& ids, const Ort::Value* features) {
    Ort::Value input = tensor(ids, {1, static_cast<int64_t>(ids.size())});
    Tensors out = run("embed", {{"input_ids", input}});
    Ort::Value embeds = std::move(out.at("inputs_embeds"));
    if (!features) return embeds;
    const int64_t hidden = shape_of(embeds).back();
    const int64_t image_token_id = model->image_token_id;
    const auto feature_shape = features->GetTensorTypeAndShapeInfo().GetShape();
    const int64_t rows = feature_shape.at(0) * feature_shape.at(1);
    const int64_t slots = std::count(ids.begin(), ids.end(), image_token_id);
    if (rows != slots || feature_shape.at(2) != hidden)
      throw Error(ErrorKind::Runtime, "the prompt holds " + std::to_string(slots) + " image tokens but the vision "
                                          "encoder gave " + std::to_string(rows) + " features");
    float* data = embeds.GetTensorMutableData<float>();
    const float* rows_data = features->GetTensorData<float>();
    int64_t row = 0;
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] == image_token_id) std::copy_n(rows_data + hidden * row++, hidden, data + hidden * i);
    return embeds;
  }

  // One LLM call from the cache's position: returns the logits; the cache grows.
  Ort::Value step(const Ort::Value& embeds, KvCache& cache) {
    const int64_t seq = shape_of(embeds)[1];
    TensorViews feeds = {{"inputs_embeds", embeds}}, bound;
    cache.add_feeds(seq, feeds, bound);
    Tensors out = run(!prompt_graph.empty() && seq >= prompt_tokens ? prompt_graph : "llm", feeds, bound);
    cache.update(out, seq);
    return std::move(out.at("logits"));
  }

  static int32_t last_argmax(const Ort::Value& logits) {
    const auto shape = logits.GetTensorTypeAndShapeInfo().GetShape();
    const int64_t vocab = shape.back();
    const float* last = logits.GetTensorData<float>() + (shape[1] - 1) * vocab;
    return static_cast<int32_t>(std::max_element(last, last + vocab) - last);  // the first maximum, as np.argmax
  }

  // Tokens until an end-of-sequence token, a stop string (the text cut before it) or the limit, into g.
  void decode(Ort::Value logits, KvCache& cache, int max_new_tokens, const SamplingParams& sampling,
              const std::vector<int32_t>& prompt, Generation& g) {
    std::optional<Sampler> sampler;
    if (!sampling.greedy()) sampler.emplace(sampling, prompt, shape_of(logits).back());
    auto& generated = g.token_ids;
    while (true) {
      const auto shape = logits.GetTensorTypeAndShapeInfo().GetShape();
      const int32_t token = sampler ? sampler->choose(logits.GetTensorData<float>() + (shape[1] - 1) * shape[2])
                                    : last_argmax(logits);
      generated.push_back(token);
      if (model->eos.count(token)) break;
      if (!sampling.stop.empty()) {  // the whole text again: a stop may span tokens, a character may complete
        g.text = tokenizer->decode(generated);
        if (cut_at_stop(g.text, sampling.stop)) return;
      }
      if (static_cast<int>(generated.size()) == max_new_tokens) {
        g.finish_reason = "length";
        break;
      }
      std::vector<int64_t> next = {token};
      logits = step(embed(next, nullptr), cache);
    }
    g.text = tokenizer->decode(generated);
  }

  static bool cut_at_stop(std::string& text, const std::vector<std::string>& stops) {
    size_t first = std::string::npos;
    for (const auto& stop : stops) first = std::min(first, text.find(stop));
    if (first == std::string::npos) return false;
    text.resize(first);
    return true;
  }
};

Bundle::Bundle(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Bundle::~Bundle() = default;

std::unique_ptr<Bundle::Impl> Bundle::load_impl(const std::string& path, const LoadOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  check_trust(path, options.expect_digest, options.public_key);
  impl->manifest = read_manifest(path);
  impl->root = absolute(path);
  refuse_modified(path, impl->manifest);
  const Manifest& m = impl->manifest;
  refuse_family(path, m);
  try {
    impl->model = std::make_unique<ModelFacts>(m.raw);
  } catch (const Error& exc) {  // a chat template Jinja could not read either
    throw Error(exc.kind(), path + "/manifest.json: model.chat_template: " + exc.what() + "; recompile the recipe");
  }
  refuse_tiled_images(path, m);
  for (const char* dim : {"seq", "height"})
    if (!m.dims.count(dim)) throw Error(ErrorKind::BadBundle, path + "/manifest.json has no dim " + dim + "; recompile the recipe");
  if (!m.outputs.count("preprocess") || m.outputs.at("preprocess").empty())
    throw Error(ErrorKind::BadBundle, path + "/manifest.json has no preprocess output; recompile the recipe");
  impl->cache = make_kv_cache(m);  // refuses a layout this runtime does not run, before the sessions load
  impl->preprocessor = std::make_unique<Preprocessor>(
      read_json_file(impl->root + "/" + m.raw.at("components").at("preprocess").at("artifact").get<std::string>()));
  auto choices = engine_choices(impl->root, m);
  if (const std::string why = kv_engine_fallback(m); !why.empty())  // as mmtrt.runtime.pipeline.Pipeline
    for (auto& [segment, choice] : choices)
      if (segment.rfind("llm.", 0) == 0 && !choice.engine.empty()) choice = {"", why};
  for (const auto& [segment, choice] : choices)
    if (choice.engine.empty()) impl->fallbacks.emplace_back(segment, choice.why);
  // The Python runtime's key for the LLM's TensorRT-LLM engine: this runtime never runs one, and says so.
  if (m.raw.contains("tensorrt_llm") && !m.raw.at("tensorrt_llm").is_null())
    impl->fallbacks.emplace_back("llm (tensorrt-llm)", "the C++ runtime does not run TensorRT-LLM engines");
  if (const std::string why = speculative_fallback(m.raw.at("model")); !why.empty())
    impl->fallbacks.emplace_back("speculative", why);
  const SessionSettings settings{options.threads, options.spin};
  for (const char* name : {"vision", "embed", "llm"}) {
    impl->runners[name] = component_runner(impl->root, m, name, choices, settings);
    impl->backends.emplace_back(name, join(impl->runners[name]->providers(), "+"));
  }
  if (const json& model = m.raw.at("model"); model.contains("prefill") && !model.at("prefill").is_null()) {
    impl->prompt_graph = model.at("prefill").at("component").get<std::string>();
    impl->prompt_tokens = model.at("prefill").at("min_tokens").get<int64_t>();
    impl->runners[impl->prompt_graph] = component_runner(impl->root, m, impl->prompt_graph, choices, settings);
    impl->backends.emplace_back(impl->prompt_graph, join(impl->runners[impl->prompt_graph]->providers(), "+"));
  }
  impl->backends.emplace_back("preprocess", "cpp");
  impl->tokenizer = std::make_unique<Tokenizer>(impl->root + "/tokenizer", m.raw.at("model"));
  impl->parse_special_tokens = options.parse_special_tokens;
  check_token_ids(path, m.raw.at("model"), impl->tokenizer->special_tokens());
  return impl;
}

std::unique_ptr<Bundle> Bundle::load(const std::string& path, const LoadOptions& options) {
  try {
    return std::unique_ptr<Bundle>(new Bundle(load_impl(path, options)));
  } catch (const nlohmann::json::exception& exc) {  // a manifest without a key the runtime reads
    throw Error(ErrorKind::BadBundle, path + "/manifest.json lacks what the runtime reads (" + exc.what() +
                                          "); recompile the recipe with this mmtrt");
  }
}

Generation Bundle::generate(const std::string& image_path, const std::string& prompt,
                            std::optional<int> max_new_tokens, bool raw_prompt) {
  SamplingParams greedy;
  greedy.max_new_tokens = max_new_tokens;
  return generate(image_path, prompt, greedy, raw_prompt);
}

Generation Bundle::generate(const std::string& image_path, const std::string& prompt, const SamplingParams& sampling,
                            bool raw_prompt) {
  Impl& b = *impl_;
  if (const std::string problem = sampling.problem(); !problem.empty()) throw Error(ErrorKind::BadInput, problem);
  const int limit = b.model->max_new_tokens;
  const int wanted = sampling.max_new_tokens.value_or(limit);
  if (wanted < 1 || wanted > limit)
    throw Error(ErrorKind::BadInput, "max_new_tokens " + std::to_string(wanted) + " is outside 1.." +
                                         std::to_string(limit) + ", the bundle's KV capacity; recompile with a "
                                         "larger envelope.max_new_tokens");
  const std::vector<int32_t> ids32 = b.prompt_ids(prompt, raw_prompt);
  std::vector<int64_t> ids(ids32.begin(), ids32.end());
  const auto t0 = Clock::now();
  std::vector<float> pixels = b.pixel_values(image_path);
  const auto t1 = Clock::now();
  const std::vector<int64_t> shape = b.pixel_shape();
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  if (elements != static_cast<int64_t>(pixels.size()))
    throw Error(ErrorKind::BadBundle, "preprocessing gave " + std::to_string(pixels.size()) + " values where the "
                                          "manifest's preprocess output holds " + std::to_string(elements) +
                                          "; recompile the recipe or restore the bundle");
  Ort::Value pixel_tensor = tensor(pixels, shape);
  Tensors vision = b.run("vision", {{"pixel_values", pixel_tensor}});
  fit_to_image_token_count(vision, ids, b.model->image_token_id);
  const auto t2 = Clock::now();
  KvCache* cache = b.cache.get();
  cache->open(static_cast<int64_t>(ids.size()) + wanted);
  Ort::Value embeds = b.embed(ids, &vision.at("image_features"));
  Ort::Value logits = b.step(embeds, *cache);
  const auto t3 = Clock::now();
  Generation g;
  b.decode(std::move(logits), *cache, wanted, sampling, ids32, g);
  const auto t4 = Clock::now();
  const double steps = std::max<double>(static_cast<double>(g.token_ids.size()) - 1, 1);
  const auto ms = [](Clock::time_point a, Clock::time_point z) {
    return std::chrono::duration<double, std::milli>(z - a).count();
  };
  const auto round3 = [](double v) { return std::round(v * 1000) / 1000; };
  g.timings = {round3(ms(t0, t1)), round3(ms(t1, t2)), round3(ms(t2, t3)), round3(ms(t3, t4) / steps)};
  g.prompt_tokens = static_cast<int>(ids.size());
  g.image_tokens = static_cast<int>(std::count(ids.begin(), ids.end(), b.model->image_token_id));
  g.backends = b.backends;
  g.fallbacks = b.fallbacks;
  return g;
}

std::vector<int32_t> Bundle::prompt_ids(const std::string& prompt, bool raw_prompt) const {
  return impl_->prompt_ids(prompt, raw_prompt);
}

std::vector<float> Bundle::pixel_values(const std::string& image_path) const {
  return impl_->pixel_values(image_path);
}

std::string Bundle::decode(const std::vector<int32_t>& ids) const { return impl_->tokenizer->decode(ids); }

std::string Generation::to_json() const {
  nlohmann::ordered_json out;
  out["text"] = text;
  out["token_ids"] = token_ids;
  out["finish_reason"] = finish_reason;
  out["prompt_tokens"] = prompt_tokens;
  out["image_tokens"] = image_tokens;
  out["timings"] = {{"preprocess_ms", timings.preprocess_ms},
                    {"vision_ms", timings.vision_ms},
                    {"prefill_ms", timings.prefill_ms},
                    {"decode_ms_per_token", timings.decode_ms_per_token}};
  out["backends"] = nlohmann::ordered_json::object();
  for (const auto& [k, v] : backends) out["backends"][k] = v;
  out["fallbacks"] = nlohmann::ordered_json::object();
  for (const auto& [k, v] : fallbacks) out["fallbacks"][k] = v;
  return out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace mmtrt
