#include "runner.hpp"

#include <set>

#include "graph_ops.hpp"
#include "mmtrt/bundle.hpp"

namespace mmtrt {
namespace {

// ONNX Runtime's uint8 x int8 GEMM adds neighbouring products in saturating 16 bits on x86 CPUs without VNNI; its
// `session.x64quantprecision` runs such weights as uint8 x uint8 instead, exact. Only on graphs with such a GEMM:
// it also breaks a per-channel int8 DequantizeLinear without a zero point (mmtrt/backends/int8_gemm.py).
bool needs_exact_products(const std::string& path) {
#if defined(__x86_64__) || defined(__i386__)
  if (__builtin_cpu_supports("avx512vnni") || __builtin_cpu_supports("avxvnni")) return false;
  static const std::set<std::string> gemms = {"MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
                                              "QLinearMatMul", "QGemm"};
  for (const auto& op : graph_op_types(path))
    if (gemms.count(op)) return true;
#endif
  return false;
}

Ort::SessionOptions session_options(const std::string& path, const SessionSettings& settings) {
  Ort::SessionOptions options;
  options.SetLogSeverityLevel(3);
  if (settings.threads > 0) {  // as mmtrt.backends.onnxruntime_backend.session_options
    options.SetIntraOpNumThreads(settings.threads);
    options.SetInterOpNumThreads(1);
  }
  options.AddConfigEntry("session.intra_op.allow_spinning", settings.spin ? "1" : "0");
  options.AddConfigEntry("session.inter_op.allow_spinning", settings.spin ? "1" : "0");
  if (needs_exact_products(path)) options.AddConfigEntry("session.x64quantprecision", "1");
  return options;
}

Ort::Session open_session(const std::string& path, const SessionSettings& settings) {
  try {
    return Ort::Session(ort_env(), path.c_str(), session_options(path, settings));
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
