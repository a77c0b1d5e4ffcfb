// The twin of mmtrt/runtime/sampling.py, step for step: penalty, greedy or temperature, top-k, softmax, top-p,
// one uniform draw. The weights are float64 and summed left to right in the same order as np.cumsum, and the
// draw comes from numpy's generator reproduced here, so a token differs from Python's only if the draw falls
// within a few ulps of a boundary between two tokens' shares (exp may round differently in the last bit).
#include "mmtrt/sampling.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>
#include <random>

namespace mmtrt {
namespace {

// numpy/random/bit_generator.pyx: SeedSequence's hash constants
constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875, kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
constexpr int kPoolSize = 4;
// numpy/random/src/pcg64/pcg64.h: PCG_DEFAULT_MULTIPLIER_128
constexpr unsigned __int128 kPcgMultiplier =
    (static_cast<unsigned __int128>(2549297995355413924ULL) << 64) + 4865540595714422341ULL;

// SeedSequence(entropy).generate_state(4, np.uint64): the pool mixed from the entropy words, then 8 words out.
std::array<uint64_t, 4> seed_state(const std::vector<uint32_t>& entropy) {
  uint32_t hash_const = kInitA;
  auto hashmix = [&hash_const](uint32_t value) {
    value ^= hash_const;
    hash_const *= kMultA;
    value *= hash_const;
    return value ^ (value >> 16);
  };
  auto mix = [](uint32_t x, uint32_t y) {
    uint32_t result = kMixMultL * x - kMixMultR * y;
    return result ^ (result >> 16);
  };
  std::array<uint32_t, kPoolSize> pool{};
  for (int i = 0; i < kPoolSize; ++i) pool[i] = hashmix(i < static_cast<int>(entropy.size()) ? entropy[i] : 0);
  for (int src = 0; src < kPoolSize; ++src)
    for (int dst = 0; dst < kPoolSize; ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src]));
  for (size_t src = kPoolSize; src < entropy.size(); ++src)
    for (int dst = 0; dst < kPoolSize; ++dst) pool[dst] = mix(pool[dst], hashmix(entropy[src]));
  std::array<uint64_t, 4> out{};
  uint32_t out_const = kInitB;
  for (int i = 0; i < 8; ++i) {
    uint32_t value = pool[i % kPoolSize] ^ out_const;
    out_const *= kMultB;
    value *= out_const;
    value ^= value >> 16;
    out[i / 2] |= static_cast<uint64_t>(value) << (32 * (i % 2));
  }
  return out;
}

std::vector<uint32_t> words_of(uint64_t seed) {  // numpy's _coerce_to_uint32_array of an int
  std::vector<uint32_t> words = {static_cast<uint32_t>(seed)};
  if (seed >> 32) words.push_back(static_cast<uint32_t>(seed >> 32));
  return words;
}

std::string number(double v) {  // Python's repr of a float
  char buf[32];
  const auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
  std::string out(buf, end);
  if (out.find_first_not_of("-0123456789") == std::string::npos) out += ".0";
  return out;
}

std::string outside(const char* name, double v, const char* allowed) {
  return std::string("sampling: ") + name + " " + number(v) + " is outside " + allowed +
         "; pass a number in that range";
}

int32_t argmax(const std::vector<double>& x) {  // the first maximum, as np.argmax
  return static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
}

// sampling.draw: the token of penalized logits x for the uniform number u.
int32_t draw(std::vector<double>& x, double temperature, int64_t top_k, double top_p, double u) {
  const size_t vocab = x.size();
  for (double& v : x) v = v / temperature;
  std::vector<int32_t> ids;
  if (top_k > 0 && static_cast<size_t>(top_k) < vocab) {
    std::vector<double> sorted = x;
    const size_t at = vocab - static_cast<size_t>(top_k);
    std::nth_element(sorted.begin(), sorted.begin() + at, sorted.end());
    const double kth = sorted[at];
    for (size_t i = 0; i < vocab; ++i)
      if (x[i] >= kth) ids.push_back(static_cast<int32_t>(i));
  } else {
    ids.resize(vocab);
    std::iota(ids.begin(), ids.end(), 0);
  }
  double top = -INFINITY;
  for (int32_t i : ids) top = std::max(top, x[i]);
  if (top_p < 1) std::stable_sort(ids.begin(), ids.end(), [&x](int32_t a, int32_t b) { return x[a] > x[b]; });
  std::vector<double> cumulative(ids.size());
  double sum = 0;
  for (size_t j = 0; j < ids.size(); ++j) cumulative[j] = sum += std::exp(x[ids[j]] - top);
  size_t keep = ids.size();
  if (top_p < 1) {
    const double mass = top_p * cumulative.back();
    keep = 0;
    while (keep < ids.size() && (keep ? cumulative[keep - 1] : 0.0) < mass) ++keep;
  }
  const double target = u * cumulative[keep - 1];
  const size_t at = std::upper_bound(cumulative.begin(), cumulative.begin() + keep, target) - cumulative.begin();
  return ids[std::min(at, keep - 1)];
}

}  // namespace

std::string SamplingParams::problem() const {
  if (!std::isfinite(temperature) || temperature < 0 || temperature > 2)
    return outside("temperature", temperature, "[0, 2] (0: greedy)");
  if (!std::isfinite(top_p) || top_p <= 0 || top_p > 1) return outside("top_p", top_p, "(0, 1]");
  if (top_k < -1)
    return "sampling: top_k " + std::to_string(top_k) + " is not allowed; pass an integer >= 1, or 0 or -1 for off";
  if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0)
    return outside("repetition_penalty", repetition_penalty, "(0, inf) (1: off)");
  for (const auto& s : stop)
    if (s.empty()) return "sampling: stop '' is not allowed; pass non-empty strings";
  return "";
}

Pcg64::Pcg64(uint64_t seed) : Pcg64(words_of(seed)) {}

Pcg64::Pcg64(const std::vector<uint32_t>& entropy) {
  // pcg64_set_seed: state and increment from SeedSequence's four words, then pcg_setseq_128_srandom_r
  const auto words = seed_state(entropy);
  const unsigned __int128 initstate = (static_cast<unsigned __int128>(words[0]) << 64) | words[1];
  const unsigned __int128 initseq = (static_cast<unsigned __int128>(words[2]) << 64) | words[3];
  inc_ = (initseq << 1u) | 1u;
  state_ = 0;
  next64();
  state_ += initstate;
  next64();
}

Pcg64 Pcg64::from_entropy() {
  std::random_device device;
  return Pcg64(std::vector<uint32_t>{device(), device(), device(), device()});
}

uint64_t Pcg64::next64() {
  state_ = state_ * kPcgMultiplier + inc_;
  const uint64_t folded = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
  const unsigned rot = static_cast<unsigned>(state_ >> 122);
  return (folded >> rot) | (folded << ((64 - rot) & 63));
}

double Pcg64::next_double() { return static_cast<double>(next64() >> 11) * (1.0 / 9007199254740992.0); }

Sampler::Sampler(const SamplingParams& params, const std::vector<int32_t>& prompt_ids, size_t vocab)
    : params_(params), rng_(params.seed ? Pcg64(*params.seed) : Pcg64::from_entropy()), seen_(vocab, false),
      x_(vocab) {
  if (params.repetition_penalty != 1)
    for (int32_t id : prompt_ids)
      if (id >= 0 && static_cast<size_t>(id) < vocab) seen_[id] = true;
}

int32_t Sampler::choose(const float* logits) {
  const double penalty = params_.repetition_penalty;
  for (size_t i = 0; i < x_.size(); ++i) {
    double v = logits[i];
    if (penalty != 1 && seen_[i]) v = v > 0 ? v / penalty : v * penalty;
    x_[i] = v;
  }
  int32_t token;
  if (params_.temperature == 0) {
    token = argmax(x_);
  } else {
    std::vector<double> x = x_;
    token = draw(x, params_.temperature, params_.top_k, params_.top_p, rng_.next_double());
  }
  seen_[token] = true;
  return token;
}

}  // namespace mmtrt
