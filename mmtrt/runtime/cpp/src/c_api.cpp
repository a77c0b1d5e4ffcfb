// The C API: every entry point catches everything, so no exception crosses into C.
#include "mmtrt/mmtrt.h"

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

}  // namespace

extern "C" {

const char* mmtrt_last_error(void) { return last_error.c_str(); }

mmtrt_status mmtrt_bundle_load(const char* path, int threads, int spin, mmtrt_bundle** out) {
  return mmtrt_bundle_load_trusted(path, threads, spin, nullptr, nullptr, out);
}

mmtrt_status mmtrt_bundle_load_trusted(const char* path, int threads, int spin, const char* expect_digest,
                                       const char* public_key, mmtrt_bundle** out) {
  if (!path || !out) return fail(MMTRT_ERR_ARGUMENT, "mmtrt_bundle_load: path and out must not be null");
  *out = nullptr;
  return guarded([&] {
    mmtrt::LoadOptions options;
    options.threads = threads;
    options.spin = spin != 0;
    options.expect_digest = expect_digest ? expect_digest : "";
    options.public_key = public_key ? public_key : "";
    auto handle = std::make_unique<mmtrt_bundle>();
    handle->bundle = mmtrt::Bundle::load(path, options);
    *out = handle.release();
    return MMTRT_OK;
  });
}

void mmtrt_bundle_free(mmtrt_bundle* bundle) { delete bundle; }

mmtrt_status mmtrt_generate(mmtrt_bundle* bundle, const char* image_path, const char* prompt, int max_new_tokens,
                            int raw_prompt, mmtrt_generation** out) {
  if (!bundle || !image_path || !prompt || !out)
    return fail(MMTRT_ERR_ARGUMENT, "mmtrt_generate: bundle, image_path, prompt and out must not be null");
  *out = nullptr;
  return guarded([&] {
    auto handle = std::make_unique<mmtrt_generation>();
    std::optional<int> limit;
    if (max_new_tokens > 0) limit = max_new_tokens;
    handle->generation = bundle->bundle->generate(image_path, prompt, limit, raw_prompt != 0);
    handle->json = handle->generation.to_json();
    *out = handle.release();
    return MMTRT_OK;
  });
}

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
