// Which runner executes each component on this host (mmtrt.runtime.executors + the engine cache of
// mmtrt.backends.tensorrt.engines): a TensorRT segment runs as an engine when engines/index.json holds one
// whose key matches this host, otherwise ONNX Runtime runs it and the reason is kept.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "manifest.hpp"
#include "runner.hpp"

namespace mmtrt {

struct EngineChoice {
  std::string engine;  // path of the engine file; empty: ONNX Runtime runs the segment
  std::string why;
};

// What an engine is specific to; `error` is set instead when this host cannot run engines.
struct Target {
  std::string compute_capability, tensorrt, error;
  std::string tag() const;
};

Target probe_target();
// sha256 of Python's json.dumps(profile, sort_keys=True), first 12 hex digits, as profile_digest.
std::string profile_digest(const json& profile);
EngineChoice select_engine(const std::string& bundle, const json& entry, const Target& target, const json& index);
std::map<std::string, EngineChoice> engine_choices(const std::string& bundle, const Manifest& manifest);
std::unique_ptr<Runner> component_runner(const std::string& bundle, const Manifest& manifest,
                                         const std::string& component,
                                         const std::map<std::string, EngineChoice>& choices,
                                         const SessionSettings& settings);

}  // namespace mmtrt
