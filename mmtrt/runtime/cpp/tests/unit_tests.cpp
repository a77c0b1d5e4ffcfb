// Unit checks of the C API's contract that need no bundle: status codes and messages, never a crash.
#include <cstdio>
#include <cstring>
#include <string>

#include "mmtrt/mmtrt.h"

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
    ++failures;
  }
}

}  // namespace

int main() {
  mmtrt_bundle* bundle = reinterpret_cast<mmtrt_bundle*>(0x1);
  expect(mmtrt_bundle_load("/nonexistent/bundle", 1, 0, &bundle) == MMTRT_ERR_BUNDLE, "missing bundle -> BUNDLE");
  expect(bundle == nullptr, "out is reset on failure");
  expect(std::strstr(mmtrt_last_error(), "is not an mmtrt bundle (no manifest.json)") != nullptr,
         std::string("message names the problem: ") + mmtrt_last_error());
  expect(mmtrt_bundle_load(nullptr, 1, 0, &bundle) == MMTRT_ERR_ARGUMENT, "null path -> ARGUMENT");
  expect(mmtrt_bundle_load_with("/nonexistent/bundle", 1, 0, nullptr, nullptr, 2, &bundle) == MMTRT_ERR_ARGUMENT &&
             bundle == nullptr && std::strstr(mmtrt_last_error(), "unknown flags 2") != nullptr,
         std::string("unknown load flags -> ARGUMENT: ") + mmtrt_last_error());
  mmtrt_generation* generation = nullptr;
  expect(mmtrt_generate(nullptr, "a.png", "hi", 4, 0, &generation) == MMTRT_ERR_ARGUMENT, "null bundle -> ARGUMENT");
  size_t count = 0;
  expect(mmtrt_prompt_ids(nullptr, "hi", 0, nullptr, 0, &count) == MMTRT_ERR_ARGUMENT, "null bundle ids -> ARGUMENT");
  mmtrt_bundle_free(nullptr);
  mmtrt_generation_free(nullptr);
  expect(std::string(mmtrt_generation_text(nullptr)).empty(), "text of null is empty");
  mmtrt_sampling* sampling = nullptr;
  expect(mmtrt_sampling_create(&sampling) == MMTRT_OK && sampling != nullptr, "sampling create");
  expect(mmtrt_sampling_set_float(sampling, "top_p", 0.0) == MMTRT_ERR_INPUT &&
             std::strstr(mmtrt_last_error(), "sampling: top_p 0.0 is outside (0, 1]") != nullptr,
         std::string("top_p 0 -> INPUT naming the range: ") + mmtrt_last_error());
  expect(mmtrt_sampling_add_stop(sampling, "") == MMTRT_ERR_INPUT, "empty stop -> INPUT");
  expect(mmtrt_sampling_set_int(nullptr, "top_k", 3) == MMTRT_ERR_ARGUMENT, "null sampling -> ARGUMENT");
  mmtrt_sampler* sampler = nullptr;
  expect(mmtrt_sampler_create(sampling, nullptr, 0, 0, &sampler) == MMTRT_ERR_ARGUMENT, "vocab 0 -> ARGUMENT");
  expect(mmtrt_generate_sampled(nullptr, "a.png", "hi", 0, sampling, &generation) == MMTRT_ERR_ARGUMENT,
         "null bundle sampled -> ARGUMENT");
  mmtrt_sampling_free(sampling);
  mmtrt_sampler_free(nullptr);
  if (failures == 0) std::puts("unit tests passed");
  return failures == 0 ? 0 : 1;
}
