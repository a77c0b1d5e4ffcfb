// mmtrt-run BUNDLE --image IMAGE --prompt PROMPT [--max-new-tokens N] [--raw-prompt] [--threads N] [--json]
//           [--expect-digest SHA256] [--public-key PEM] [--parse-special-tokens]
//           [--temperature T] [--top-p P] [--top-k K] [--seed S] [--repetition-penalty R] [--stop TEXT]...
// The arguments and output of `mmtrt run`. Bad input: one line on stderr, exit code 2; output that cannot be
// written (a full disk): exit code 2 too, as the Python CLI exits for a failing write.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "mmtrt/bundle.hpp"

namespace {

constexpr int kUserError = 2;
const char* kUsage =
    "usage: mmtrt-run [-h] --image IMAGE --prompt PROMPT [--max-new-tokens MAX_NEW_TOKENS] [--raw-prompt] "
    "[--threads THREADS] [--expect-digest EXPECT_DIGEST] [--public-key PUBLIC_KEY] [--parse-special-tokens] "
    "[--json] [--temperature TEMPERATURE] [--top-p TOP_P] [--top-k TOP_K] [--seed SEED] "
    "[--repetition-penalty REPETITION_PENALTY] [--stop STOP] bundle";

struct Args {
  std::string bundle, image, prompt, expect_digest, public_key;
  std::optional<int> max_new_tokens, threads;
  bool raw_prompt = false, json = false, parse_special_tokens = false;
  mmtrt::SamplingParams sampling;
};

struct UsageError {
  std::string message;
};

struct WriteError {
  int error;
};

int parse_int(const std::string& flag, const std::string& value) {
  try {
    size_t used = 0;
    const int v = std::stoi(value, &used);
    if (used == value.size()) return v;
  } catch (const std::exception&) {
  }
  throw UsageError{"argument " + flag + ": invalid int value: '" + value + "'"};
}

double parse_float(const std::string& flag, const std::string& value) {
  try {
    size_t used = 0;
    const double v = std::stod(value, &used);
    if (used == value.size()) return v;
  } catch (const std::out_of_range&) {
    return value.find('-') == 0 ? -HUGE_VAL : HUGE_VAL;  // as Python's float('1e999'): then out of range
  } catch (const std::exception&) {
  }
  throw UsageError{"argument " + flag + ": invalid float value: '" + value + "'"};
}

uint64_t parse_seed(const std::string& flag, const std::string& value) {
  try {
    size_t used = 0;
    const unsigned long long v = std::stoull(value, &used);
    if (used == value.size() && value.find('-') == std::string::npos) return v;
  } catch (const std::exception&) {
  }
  throw UsageError{"argument " + flag + ": invalid seed value: '" + value + "' (an integer from 0 to 2^64-1)"};
}

Args parse(int argc, char** argv) {
  Args args;
  std::vector<std::string> positional;
  bool have_image = false, have_prompt = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    const size_t eq = arg.find('=');
    const bool inline_value = arg.rfind("--", 0) == 0 && eq != std::string::npos;
    if (inline_value) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    auto take = [&]() -> std::string {
      if (inline_value) return value;
      if (i + 1 >= argc) throw UsageError{"argument " + arg + ": expected one argument"};
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage << "\n";
      std::exit(0);
    } else if (arg == "--image") {
      args.image = take();
      have_image = true;
    } else if (arg == "--prompt") {
      args.prompt = take();
      have_prompt = true;
    } else if (arg == "--max-new-tokens") {
      args.max_new_tokens = parse_int(arg, take());
    } else if (arg == "--threads") {
      const std::string text = take();
      args.threads = parse_int(arg, text);
      if (*args.threads < 1) throw UsageError{"argument --threads: '" + text + "' is not an integer >= 1"};
    } else if (arg == "--expect-digest") {
      args.expect_digest = take();
    } else if (arg == "--public-key") {
      args.public_key = take();
    } else if (arg == "--parse-special-tokens" && !inline_value) {
      args.parse_special_tokens = true;
    } else if (arg == "--temperature") {
      args.sampling.temperature = parse_float(arg, take());
    } else if (arg == "--top-p") {
      args.sampling.top_p = parse_float(arg, take());
    } else if (arg == "--top-k") {
      args.sampling.top_k = parse_int(arg, take());
    } else if (arg == "--seed") {
      args.sampling.seed = parse_seed(arg, take());
    } else if (arg == "--repetition-penalty") {
      args.sampling.repetition_penalty = parse_float(arg, take());
    } else if (arg == "--stop") {
      args.sampling.stop.push_back(take());
    } else if (arg == "--raw-prompt" && !inline_value) {
      args.raw_prompt = true;
    } else if (arg == "--json" && !inline_value) {
      args.json = true;
    } else if (arg.rfind("--", 0) == 0 && arg.size() > 2) {
      throw UsageError{"unrecognized arguments: " + std::string(argv[i])};
    } else {
      positional.push_back(argv[i]);
    }
  }
  std::vector<std::string> missing;
  if (positional.empty()) missing.push_back("bundle");
  if (!have_image) missing.push_back("--image");
  if (!have_prompt) missing.push_back("--prompt");
  if (!missing.empty()) {
    std::string names;
    for (const auto& m : missing) names += (names.empty() ? "" : ", ") + m;
    throw UsageError{"the following arguments are required: " + names};
  }
  if (positional.size() > 1) throw UsageError{"unrecognized arguments: " + positional[1]};
  args.bundle = positional.front();
  args.sampling.max_new_tokens = args.max_new_tokens;
  if (const std::string problem = args.sampling.problem(); !problem.empty())
    throw mmtrt::Error(mmtrt::ErrorKind::BadInput, problem);  // one line, as `mmtrt run`
  return args;
}

int run(const Args& args) {
  mmtrt::LoadOptions options;
  options.threads = args.threads.value_or(0);
  options.expect_digest = args.expect_digest;
  options.public_key = args.public_key;
  options.parse_special_tokens = args.parse_special_tokens;
  const auto bundle = mmtrt::Bundle::load(args.bundle, options);
  const mmtrt::Generation result = bundle->generate(args.image, args.prompt, args.sampling, args.raw_prompt);
  for (const auto& [what, why] : result.fallbacks)
    if (what == "speculative") std::cerr << "mmtrt-run: note: " << why << "\n";
  std::cout << (args.json ? result.to_json() : result.text) << "\n" << std::flush;
  if (!std::cout) throw WriteError{errno};
  if (args.json) return 0;
  const auto& t = result.timings;
  std::fprintf(stderr, "preprocess_ms=%.2f vision_ms=%.2f prefill_ms=%.2f decode_ms_per_token=%.2f\n",
               t.preprocess_ms, t.vision_ms, t.prefill_ms, t.decode_ms_per_token);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const UsageError& exc) {
    std::cerr << "mmtrt-run: error: " << exc.message << "; see `mmtrt-run --help`\n";
    return kUserError;
  } catch (const WriteError& exc) {
    std::cerr << "mmtrt-run: error: cannot write the output (" << std::strerror(exc.error ? exc.error : EIO)
              << "); check the free space where it goes\n";
    return kUserError;
  } catch (const mmtrt::Error& exc) {
    std::cerr << "mmtrt-run: error: " << exc.what() << "\n";
    return exc.kind() == mmtrt::ErrorKind::Runtime ? 1 : kUserError;
  } catch (const std::exception& exc) {
    std::cerr << "mmtrt-run: internal error: " << exc.what() << "\n";
    return 1;
  }
}
