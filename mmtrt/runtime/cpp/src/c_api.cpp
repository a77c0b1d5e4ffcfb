// The C API: every entry point catches everything, so no exception crosses into C.
#include "mmtrt/mmtrt.h"

#include <cstdint>
#include <cstring>
#include <new>

#include "mmtrt/bundle.hpp"

struct mmtrt_bundle {
  std::unique_ptr<mmtrt::Bundle> bundle;
};

struct mmtrt_generation {
  mmtrt::Generation generation;
  std::string json;
};

struct mmtrt_sampling {
  mmtrt::SamplingParams params;
};

struct mmtrt_sampler {
  mmtrt::Sampler sampler;
};

namespace {

thread_local std::string last_error;

mmtrt_status fail(mmtrt_status status, const std::string& message) {
  last_error = message;
  return status;
}

template <typename F>
mmtrt_status guarded(F&& body) {
  try {
    last_error.clear();
    return body();
  } catch (const mmtrt::Error& exc) {
    const auto kind = exc.kind();
    return fail(kind == mmtrt::ErrorKind::BadBundle ? MMTRT_ERR_BUNDLE
                : kind == mmtrt::ErrorKind::BadInput ? MMTRT_ERR_INPUT
                                                     : MMTRT_ERR_RUNTIME,
                exc.what());
  } catch (const std::bad_alloc&) {
    return fail(MMTRT_ERR_RUNTIME, "out of memory");
  } catch (const std::exception& exc) {
    return fail(MMTRT_ERR_RUNTIME, exc.what());
  } catch (...) {
    return fail(MMTRT_ERR_RUNTIME, "unknown error");
  }
}

template <typename T>
mmtrt_status copy_out(const std::vector<T>& values, T* out, size_t capacity, size_t* count) {
  *count = values.size();
  if (capacity < values.size())
    return fail(MMTRT_ERR_ARGUMENT, "buffer holds " + std::to_string(capacity) + " elements, " +
                                        std::to_string(values.size()) + " needed");
  if (!values.empty()) std::memcpy(out, values.data(), values.size() * sizeof(T));
  return MMTRT_OK;
}

// Apply `change` to a copy; keep it only when every value stays in its range.
template <typename F>
mmtrt_status set_checked(mmtrt_sampling* sampling, F&& change) {
  mmtrt::SamplingParams next = sampling->params;
  change(next);
  if (const std::string problem = next.problem(); !problem.empty()) return fail(MMTRT_ERR_INPUT, problem);
  sampling->params = std::move(next);
  return MMTRT_OK;
}

}  // namespace

extern "C" {

const char* mmtrt_last_error(void) { return last_error.c_str(); }

mmtrt_status mmtrt_bundle_load(const char* path, int threads, int spin, mmtrt_bundle** out) {
  return mmtrt_bundle_load_trusted(path, threads, spin, nullptr, nullptr, out);
}

mmtrt_status mmtrt_bundle_load_trusted(const char* path, int threads, int spin, const char* expect_digest,
                                       const char* public_key, mmtrt_bundle** out) {
  return mmtrt_bundle_load_with(path, threads, spin, expect_digest, public_key, 0, out);
}

mmtrt_status mmtrt_bundle_load_with(const char* path, int threads, int spin, const char* expect_digest,
                                    const char* public_key, unsigned flags, mmtrt_bundle** out) {
  if (!path || !out) return fail(MMTRT_ERR_ARGUMENT, "mmtrt_bundle_load: path and out must not be null");
  *out = nullptr;
  if (flags & ~static_cast<unsigned>(MMTRT_PARSE_SPECIAL_TOKENS))
    return fail(MMTRT_ERR_ARGUMENT, "mmtrt_bundle_load_with: unknown flags " + std::to_string(flags));
  return guarded([&] {
    mmtrt::LoadOptions options;
    options.threads = threads;
    options.spin = spin != 0;
    options.expect_digest = expect_digest ? expect_digest : "";
    options.public_key = public_key ? public_key : "";
    options.parse_special_tokens = (flags & MMTRT_PARSE_SPECIAL_TOKENS) != 0;
    auto handle = std::make_unique<mmtrt_bundle>();
    handle->bundle = mmtrt::Bundle::load(path, options);
    *out = handle.release();
    return MMTRT_OK;
  });
}

void mmtrt_bundle_free(mmtrt_bundle* bundle) { delete bundle; }

mmtrt_status mmtrt_generate(mmtrt_bundle* bundle, const char* image_path, const char* prompt, int max_new_tokens,
                            int raw_prompt, mmtrt_generation** out) {
  mmtrt_sampling greedy;
  if (max_new_tokens > 0) greedy.params.max_new_tokens = max_new_tokens;
  return mmtrt_generate_sampled(bundle, image_path, prompt, raw_prompt, &greedy, out);
}

mmtrt_status mmtrt_generate_sampled(mmtrt_bundle* bundle, const char* image_path, const char* prompt,
                                    int raw_prompt, const mmtrt_sampling* sampling, mmtrt_generation** out) {
  if (!bundle || !image_path || !prompt || !sampling || !out)
    return fail(MMTRT_ERR_ARGUMENT, "mmtrt_generate: bundle, image_path, prompt, sampling and out must not be null");
  *out = nullptr;
  return guarded([&] {
    auto handle = std::make_unique<mmtrt_generation>();
    handle->generation = bundle->bundle->generate(image_path, prompt, sampling->params, raw_prompt != 0);
    handle->json = handle->generation.to_json();
    *out = handle.release();
    return MMTRT_OK;
  });
}

mmtrt_status mmtrt_sampling_create(mmtrt_sampling** out) {
  if (!out) return fail(MMTRT_ERR_ARGUMENT, "mmtrt_sampling_create: out must not be null");
  return guarded([&] {
    *out = new mmtrt_sampling();
    return MMTRT_OK;
  });
}

void mmtrt_sampling_free(mmtrt_sampling* sampling) { delete sampling; }

mmtrt_status mmtrt_sampling_set_float(mmtrt_sampling* sampling, const char* name, double value) {
  if (!sampling || !name) return fail(MMTRT_ERR_ARGUMENT, "mmtrt_sampling_set_float: null argument");
  last_error.clear();
  const std::string key = name;
  if (key == "temperature") return set_checked(sampling, [&](auto& p) { p.temperature = value; });
  if (key == "top_p") return set_checked(sampling, [&](auto& p) { p.top_p = value; });
  if (key == "repetition_penalty") return set_checked(sampling, [&](auto& p) { p.repetition_penalty = value; });
  return fail(MMTRT_ERR_ARGUMENT, "mmtrt_sampling_set_float: " + key + " is not one of temperature, top_p, "
                                  "repetition_penalty");
}

mmtrt_status mmtrt_sampling_set_int(mmtrt_sampling* sampling, const char* name, int64_t value) {
  if (!sampling || !name) return fail(MMTRT_ERR_ARGUMENT, "mmtrt_sampling_set_int: null argument");
  last_error.clear();
  const std::string key = name;
  if (key == "top_k") return set_checked(sampling, [&](auto& p) { p.top_k = value; });
  if (key == "max_new_tokens") {
    if (value < 1 || value > INT32_MAX)
      return fail(MMTRT_ERR_INPUT, "sampling: max_new_tokens " + std::to_string(value) + " is outside >= 1; pass "
                                   "an integer in that range");
    sampling->params.max_new_tokens = static_cast<int>(value);
    return MMTRT_OK;
  }
  return fail(MMTRT_ERR_ARGUMENT, "mmtrt_sampling_set_int: " + key + " is not one of top_k, max_new_tokens");
}

mmtrt_status mmtrt_sampling_set_seed(mmtrt_sampling* sampling, uint64_t seed) {
  if (!sampling) return fail(MMTRT_ERR_ARGUMENT, "mmtrt_sampling_set_seed: null sampling");
  last_error.clear();
  sampling->params.seed = seed;
  return MMTRT_OK;
}

mmtrt_status mmtrt_sampling_add_stop(mmtrt_sampling* sampling, const char* stop) {
  if (!sampling || !stop) return fail(MMTRT_ERR_ARGUMENT, "mmtrt_sampling_add_stop: null argument");
  return guarded([&] { return set_checked(sampling, [&](auto& p) { p.stop.emplace_back(stop); }); });
}

mmtrt_status mmtrt_sampler_create(const mmtrt_sampling* sampling, const int32_t* prompt_ids, size_t count,
                                  size_t vocab, mmtrt_sampler** out) {
  if (!sampling || (count && !prompt_ids) || !vocab || !out)
    return fail(MMTRT_ERR_ARGUMENT, "mmtrt_sampler_create: null argument or vocab 0");
  *out = nullptr;
  return guarded([&] {
    const std::vector<int32_t> prompt(prompt_ids, prompt_ids + count);
    *out = new mmtrt_sampler{mmtrt::Sampler(sampling->params, prompt, vocab)};
    return MMTRT_OK;
  });
}

mmtrt_status mmtrt_sampler_choose(mmtrt_sampler* sampler, const float* logits, int32_t* token) {
  if (!sampler || !logits || !token) return fail(MMTRT_ERR_ARGUMENT, "mmtrt_sampler_choose: null argument");
  return guarded([&] {
    *token = sampler->sampler.choose(logits);
    return MMTRT_OK;
  });
}

void mmtrt_sampler_free(mmtrt_sampler* sampler) { delete sampler; }

void mmtrt_generation_free(mmtrt_generation* generation) { delete generation; }

const char* mmtrt_generation_text(const mmtrt_generation* g) { return g ? g->generation.text.c_str() : ""; }
size_t mmtrt_generation_token_count(const mmtrt_generation* g) { return g ? g->generation.token_ids.size() : 0; }
const int32_t* mmtrt_generation_tokens(const mmtrt_generation* g) {
  return g ? g->generation.token_ids.data() : nullptr;
}
const char* mmtrt_generation_json(const mmtrt_generation* g) { return g ? g->json.c_str() : ""; }

mmtrt_status mmtrt_prompt_ids(const mmtrt_bundle* bundle, const char* prompt, int raw_prompt, int32_t* ids,
                              size_t capacity, size_t* count) {
  if (!bundle || !prompt || !count || (capacity && !ids))
    return fail(MMTRT_ERR_ARGUMENT, "mmtrt_prompt_ids: null argument");
  return guarded([&] { return copy_out(bundle->bundle->prompt_ids(prompt, raw_prompt != 0), ids, capacity, count); });
}

mmtrt_status mmtrt_pixel_values(const mmtrt_bundle* bundle, const char* image_path, float* values, size_t capacity,
                                size_t* count) {
  if (!bundle || !image_path || !count || (capacity && !values))
    return fail(MMTRT_ERR_ARGUMENT, "mmtrt_pixel_values: null argument");
  return guarded([&] { return copy_out(bundle->bundle->pixel_values(image_path), values, capacity, count); });
}

mmtrt_status mmtrt_decode(const mmtrt_bundle* bundle, const int32_t* ids, size_t count, char* text, size_t capacity,
                          size_t* length) {
  if (!bundle || (count && !ids) || !length || (capacity && !text))
    return fail(MMTRT_ERR_ARGUMENT, "mmtrt_decode: null argument");
  return guarded([&] {
    const std::string decoded = bundle->bundle->decode(std::vector<int32_t>(ids, ids + count));
    *length = decoded.size();
    if (capacity < decoded.size() + 1)
      return fail(MMTRT_ERR_ARGUMENT, "buffer holds " + std::to_string(capacity) + " bytes, " +
                                          std::to_string(decoded.size() + 1) + " needed");
    std::memcpy(text, decoded.c_str(), decoded.size() + 1);
    return MMTRT_OK;
  });
}

}  // extern "C"
