// Sampling with the names and semantics of mmtrt.runtime.sampling (vLLM's SamplingParams, OpenAI's API), and the
// same generator and arithmetic: the same seed gives the same tokens here as in the Python runtime.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#if !defined(MMTRT_API)
#if defined(MMTRT_BUILDING)
#define MMTRT_API __attribute__((visibility("default")))
#else
#define MMTRT_API
#endif
#endif

namespace mmtrt {

struct MMTRT_API SamplingParams {
  std::optional<int> max_new_tokens;  // none: the bundle's envelope.max_new_tokens
  double temperature = 0.0;           // 0: greedy (the default), up to 2
  double top_p = 1.0;                 // (0, 1]
  int64_t top_k = 0;                  // 0 or -1: off
  std::optional<uint64_t> seed;       // none: fresh entropy
  double repetition_penalty = 1.0;    // (0, inf); 1: off
  std::vector<std::string> stop;      // the text ends before the first of these

  bool greedy() const { return temperature == 0 && repetition_penalty == 1; }
  // The Python runtime's message for the first field outside its range ("sampling: top_p 1.5 is outside ..."),
  // or empty when every field is allowed. max_new_tokens is checked against the bundle by generate.
  std::string problem() const;
};

// numpy's PCG64 (PCG XSL RR 128/64) seeded by numpy's SeedSequence, and Generator.random()'s doubles.
class MMTRT_API Pcg64 {
 public:
  explicit Pcg64(uint64_t seed);
  static Pcg64 from_entropy();
  uint64_t next64();
  double next_double();  // [0, 1), 53 bits

 private:
  explicit Pcg64(const std::vector<uint32_t>& entropy);
  unsigned __int128 state_ = 0, inc_ = 0;
};

// One sequence's choices: its parameters, its generator and the tokens it has seen (for the penalty).
class MMTRT_API Sampler {
 public:
  Sampler(const SamplingParams& params, const std::vector<int32_t>& prompt_ids, size_t vocab);
  int32_t choose(const float* logits);  // logits: [vocab] of one position

 private:
  SamplingParams params_;
  Pcg64 rng_;
  std::vector<bool> seen_;
  std::vector<double> x_;
};

}  // namespace mmtrt
