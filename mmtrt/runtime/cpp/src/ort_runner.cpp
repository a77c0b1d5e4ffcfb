#include "runner.hpp"

#include "mmtrt/bundle.hpp"

namespace mmtrt {
namespace {

Ort::SessionOptions session_options(const SessionSettings& settings) {
  Ort::SessionOptions options;
  options.SetLogSeverityLevel(3);
  if (settings.threads > 0) {  // as mmtrt.backends.onnxruntime_backend.session_options
    options.SetIntraOpNumThreads(settings.threads);
    options.SetInterOpNumThreads(1);
  }
  options.AddConfigEntry("session.intra_op.allow_spinning", settings.spin ? "1" : "0");
  options.AddConfigEntry("session.inter_op.allow_spinning", settings.spin ? "1" : "0");
  return options;
}

Ort::Session open_session(const std::string& path, const SessionSettings& settings) {
  try {
    return Ort::Session(ort_env(), path.c_str(), session_options(settings));
  } catch (const Ort::Exception& exc) {
    throw Error(ErrorKind::BadBundle, "ONNX Runtime cannot load " + path + " (" + exc.what() + "); recompile the recipe");
  }
}

}  // namespace

Ort::Env& ort_env() {
  static Ort::Env env(ORT_LOGGING_LEVEL_ERROR, "mmtrt");
  return env;
}

TensorViews views(const Tensors& tensors) {
  TensorViews out;
  for (const auto& [name, value] : tensors) out[name] = value;
  return out;
}

std::vector<int64_t> shape_of(const OrtValue* value) {
  return Ort::ConstValue(value).GetTensorTypeAndShapeInfo().GetShape();
}

OrtRunner::OrtRunner(const std::string& path, const SessionSettings& settings)
    : session_(open_session(path, settings)) {
  Ort::AllocatorWithDefaultOptions allocator;
  for (size_t i = 0; i < session_.GetInputCount(); ++i)
    inputs_.push_back(session_.GetInputNameAllocated(i, allocator).get());
  for (size_t i = 0; i < session_.GetOutputCount(); ++i)
    outputs_.push_back(session_.GetOutputNameAllocated(i, allocator).get());
}

Tensors Runner::run_bound(const TensorViews& feeds, const TensorViews& bound) {
  if (!bound.empty()) throw Error(ErrorKind::Runtime, "only an ONNX Runtime session binds outputs in place");
  return run(feeds);
}

Tensors OrtRunner::run_bound(const TensorViews& feeds, const TensorViews& bound) {
  if (bound.empty()) return run(feeds);
  const OrtApi& api = Ort::GetApi();
  Ort::IoBinding binding(session_);
  for (const auto& name : inputs_) {
    const auto found = feeds.find(name);
    if (found == feeds.end()) throw Error(ErrorKind::Runtime, "no value for the graph input " + name);
    Ort::ThrowOnError(api.BindInput(binding, name.c_str(), found->second));
  }
  static const Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault);
  for (const auto& name : outputs_) {
    const auto found = bound.find(name);
    if (found != bound.end()) Ort::ThrowOnError(api.BindOutput(binding, name.c_str(), found->second));
    else binding.BindOutput(name.c_str(), cpu);
  }
  try {
    session_.Run(Ort::RunOptions(), binding);
  } catch (const Ort::Exception& exc) {
    throw Error(ErrorKind::Runtime, std::string("ONNX Runtime failed: ") + exc.what());
  }
  const std::vector<std::string> names = binding.GetOutputNames();
  std::vector<Ort::Value> values = binding.GetOutputValues();
  Tensors out;
  for (size_t i = 0; i < names.size(); ++i)
    if (!bound.count(names[i])) out.emplace(names[i], std::move(values[i]));
  return out;
}

Tensors OrtRunner::run(const TensorViews& feeds) {
  std::vector<const char*> in_names, out_names;
  std::vector<const OrtValue*> in_values;
  for (const auto& name : inputs_) {
    const auto found = feeds.find(name);
    if (found == feeds.end()) throw Error(ErrorKind::Runtime, "no value for the graph input " + name);
    in_names.push_back(name.c_str());
    in_values.push_back(found->second);
  }
  for (const auto& name : outputs_) out_names.push_back(name.c_str());
  std::vector<OrtValue*> out_values(outputs_.size(), nullptr);
  const OrtApi& api = Ort::GetApi();
  OrtStatus* status = api.Run(session_, nullptr, in_names.data(), in_values.data(), in_values.size(),
                              out_names.data(), out_names.size(), out_values.data());
  Tensors out;
  for (size_t i = 0; i < outputs_.size(); ++i)
    if (out_values[i]) out.emplace(outputs_[i], Ort::Value(out_values[i]));
  if (status) {
    const std::string message = api.GetErrorMessage(status);
    api.ReleaseStatus(status);
    throw Error(ErrorKind::Runtime, "ONNX Runtime failed: " + message);
  }
  return out;
}

}  // namespace mmtrt
