#include "engines.hpp"

#include <algorithm>
#include <sys/stat.h>

#include "mmtrt/bundle.hpp"
#ifdef MMTRT_WITH_TENSORRT
#include "trt_runner.hpp"
#endif

namespace mmtrt {
namespace {

bool is_file(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Runs segments in order; each reads its inputs from the tensors computed so far.
class SegmentChain : public Runner {
 public:
  SegmentChain(std::vector<std::unique_ptr<Runner>> steps, std::vector<std::string> outputs)
      : steps_(std::move(steps)), outputs_(std::move(outputs)) {}

  Tensors run(const TensorViews& feeds) override {
    TensorViews available = feeds;
    Tensors computed;
    for (auto& step : steps_) {
      for (auto& [name, value] : step->run(available)) {
        computed[name] = std::move(value);
        available[name] = computed[name];
      }
    }
    Tensors out;
    for (const auto& name : outputs_) out[name] = std::move(computed.at(name));
    return out;
  }

  std::vector<std::string> providers() const override {
    std::vector<std::string> all;
    for (const auto& step : steps_)
      for (const auto& p : step->providers())
        if (std::find(all.begin(), all.end(), p) == all.end()) all.push_back(p);
    return all;
  }

 private:
  std::vector<std::unique_ptr<Runner>> steps_;
  std::vector<std::string> outputs_;
};

std::unique_ptr<Runner> engine_runner(const std::string& engine) {
#ifdef MMTRT_WITH_TENSORRT
  return std::make_unique<TrtRunner>(engine);
#else
  throw Error(ErrorKind::Runtime, "engine " + engine + " chosen in a build without TensorRT");
#endif
}

}  // namespace

Target probe_target() {
#ifdef MMTRT_WITH_TENSORRT
  return trt_probe_target();
#else
  return {"", "", "this mmtrt runtime was built without TensorRT (cmake -DMMTRT_WITH_TENSORRT=ON on a TensorRT host)"};
#endif
}

std::map<std::string, EngineChoice> engine_choices(const std::string& bundle, const Manifest& manifest) {
  std::map<std::string, EngineChoice> choices;
  const json& trt = manifest.raw.value("tensorrt", json::object());
  if (!trt.is_object() || !trt.contains("segments") || trt.at("segments").empty()) return choices;
  const Target target = probe_target();
  const std::string index_path = bundle + "/engines/index.json";
  const json index = is_file(index_path) ? read_json_file(index_path) : json::object();
  for (const auto& entry : trt.at("segments"))
    choices[entry.at("id").get<std::string>()] = select_engine(bundle, entry, target, index);
  return choices;
}

std::unique_ptr<Runner> component_runner(const std::string& bundle, const Manifest& manifest,
                                         const std::string& component,
                                         const std::map<std::string, EngineChoice>& choices,
                                         const SessionSettings& settings) {
  const json& placement = manifest.raw.value("placement", json::object());
  json segments = json::array();
  if (placement.is_object() && placement.contains(component)) segments = placement.at(component).value("segments", json::array());
  auto has_engine = [&](const json& s) {
    const auto found = choices.find(s.at("id").get<std::string>());
    return found != choices.end() && !found->second.engine.empty();
  };
  const std::string artifact = manifest.raw.at("components").at(component).at("artifact").get<std::string>();
  if (std::none_of(segments.begin(), segments.end(), has_engine))
    return std::make_unique<OrtRunner>(bundle + "/" + artifact, settings);
  std::vector<std::unique_ptr<Runner>> steps;
  for (const auto& s : segments) {
    if (has_engine(s)) steps.push_back(engine_runner(choices.at(s.at("id").get<std::string>()).engine));
    else steps.push_back(std::make_unique<OrtRunner>(bundle + "/" + s.at("onnx").get<std::string>(), settings));
  }
  if (steps.size() == 1) return std::move(steps.front());
  std::vector<std::string> outputs;
  for (const auto& spec : manifest.outputs.at(component)) outputs.push_back(spec.name);
  return std::make_unique<SegmentChain>(std::move(steps), outputs);
}

}  // namespace mmtrt
