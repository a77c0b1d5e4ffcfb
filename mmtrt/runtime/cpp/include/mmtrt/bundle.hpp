// mmtrt::Bundle: load a bundle folder written by `mmtrt compile`, generate from one image and one prompt.
// The C++ twin of mmtrt.runtime (Python); the bundle's manifest is the only contract with the compiler.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mmtrt/sampling.hpp"

#if defined(MMTRT_BUILDING)
#define MMTRT_API __attribute__((visibility("default")))
#else
#define MMTRT_API
#endif

namespace mmtrt {

// What went wrong, so a caller can tell a user's mistake from a failure of the runtime.
enum class ErrorKind { BadBundle = 2, BadInput = 3, Runtime = 4 };

// Bad bundles and bad inputs carry one line that names the problem and the fix.
class MMTRT_API Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

struct LoadOptions {
  int threads = 0;     // ONNX Runtime intra-op threads; 0 lets ONNX Runtime choose
  bool spin = true;    // ONNX Runtime's spin-waiting thread pools
  std::string expect_digest;  // refuse the bundle unless its manifest's sha256 is this ("sha256:..." or hex)
  std::string public_key;     // refuse the bundle unless `mmtrt sign` signed it with this PEM key's private key
  bool parse_special_tokens = false;  // special tokens typed in a prompt act as such; by default they are text
};

struct Timings {
  double preprocess_ms = 0, vision_ms = 0, prefill_ms = 0, decode_ms_per_token = 0;
};

using NamedStrings = std::vector<std::pair<std::string, std::string>>;

struct MMTRT_API Generation {
  std::string text;
  std::vector<int32_t> token_ids;
  std::string finish_reason = "stop";  // "stop": an end-of-sequence token or a stop string; "length": the limit
  int prompt_tokens = 0;
  int image_tokens = 0;  // the image's tokens in the prompt
  Timings timings;
  NamedStrings backends;   // component -> what ran it
  NamedStrings fallbacks;  // TensorRT segment -> why ONNX Runtime ran it instead
  // The JSON `mmtrt run --json` prints (same keys, same order).
  std::string to_json() const;
};

// One call at a time per Bundle (the tokenizer and the sessions' buffers are shared); load one per thread.
class MMTRT_API Bundle {
 public:
  // Reads the manifest, checks every artifact's sha256, opens the sessions and the tokenizer.
  static std::unique_ptr<Bundle> load(const std::string& path, const LoadOptions& options = {});
  ~Bundle();
  Bundle(const Bundle&) = delete;
  Bundle& operator=(const Bundle&) = delete;

  // Greedy decoding; max_new_tokens defaults to the bundle's envelope.max_new_tokens.
  Generation generate(const std::string& image_path, const std::string& prompt,
                      std::optional<int> max_new_tokens = std::nullopt, bool raw_prompt = false);
  // Decoding as `sampling` asks (greedy by default); values outside their ranges are ErrorKind::BadInput.
  Generation generate(const std::string& image_path, const std::string& prompt, const SamplingParams& sampling,
                      bool raw_prompt = false);

  // The steps generate takes, for callers and tests that check one of them.
  std::vector<int32_t> prompt_ids(const std::string& prompt, bool raw_prompt = false) const;
  std::vector<float> pixel_values(const std::string& image_path) const;  // [1, 3, H, W]
  std::string decode(const std::vector<int32_t>& ids) const;

 private:
  struct Impl;
  explicit Bundle(std::unique_ptr<Impl> impl);
  static std::unique_ptr<Impl> load_impl(const std::string& path, const LoadOptions& options);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mmtrt
