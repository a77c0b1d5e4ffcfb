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
  mmtrt_generation* generation = nullptr;
  expect(mmtrt_generate(nullptr, "a.png", "hi", 4, 0, &generation) == MMTRT_ERR_ARGUMENT, "null bundle -> ARGUMENT");
  size_t count = 0;
  expect(mmtrt_prompt_ids(nullptr, "hi", 0, nullptr, 0, &count) == MMTRT_ERR_ARGUMENT, "null bundle ids -> ARGUMENT");
  mmtrt_bundle_free(nullptr);
  mmtrt_generation_free(nullptr);
  expect(std::string(mmtrt_generation_text(nullptr)).empty(), "text of null is empty");
  if (failures == 0) std::puts("unit tests passed");
  return failures == 0 ? 0 : 1;
}
