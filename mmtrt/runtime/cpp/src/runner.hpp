// What runs a component (or one segment of it): ONNX Runtime on an ONNX file, or a TensorRT engine.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <onnxruntime_cxx_api.h>

namespace mmtrt {

using Tensors = std::map<std::string, Ort::Value>;
using TensorViews = std::map<std::string, const OrtValue*>;

class Runner {
 public:
  virtual ~Runner() = default;
  // Reads the inputs it needs by name from feeds; returns every output by name.
  virtual Tensors run(const TensorViews& feeds) = 0;
  // As run, the outputs named in `bound` written into those values (IOBinding); the rest returned. Only ONNX
  // Runtime sessions bind outputs: others refuse a non-empty `bound`.
  virtual Tensors run_bound(const TensorViews& feeds, const TensorViews& bound);
  virtual std::vector<std::string> providers() const = 0;
};

struct SessionSettings {
  int threads = 0;
  bool spin = true;
};

class OrtRunner : public Runner {
 public:
  OrtRunner(const std::string& path, const SessionSettings& settings);
  Tensors run(const TensorViews& feeds) override;
  Tensors run_bound(const TensorViews& feeds, const TensorViews& bound) override;
  std::vector<std::string> providers() const override { return {"CPUExecutionProvider"}; }

 private:
  Ort::Session session_;
  std::vector<std::string> inputs_, outputs_;
};

Ort::Env& ort_env();
TensorViews views(const Tensors& tensors);
std::vector<int64_t> shape_of(const OrtValue* value);

}  // namespace mmtrt
