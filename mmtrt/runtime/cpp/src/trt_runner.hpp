// A TensorRT engine behind the Runner interface (TensorRT 11 C++ API: IRuntime, ICudaEngine,
// IExecutionContext::enqueueV3). Built only with -DMMTRT_WITH_TENSORRT=ON; it has never been compiled or run
// on the development hosts (no TensorRT, no GPU).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <NvInfer.h>
#include <cuda_runtime_api.h>

#include "engines.hpp"
#include "runner.hpp"

namespace mmtrt {

Target trt_probe_target();

class TrtRunner : public Runner {
 public:
  explicit TrtRunner(const std::string& engine_path);
  ~TrtRunner() override;
  Tensors run(const TensorViews& feeds) override;
  std::vector<std::string> providers() const override { return {"TensorRT"}; }

 private:
  int32_t profile_for(const TensorViews& feeds) const;

  std::unique_ptr<nvinfer1::IRuntime> runtime_;
  std::unique_ptr<nvinfer1::ICudaEngine> engine_;
  std::unique_ptr<nvinfer1::IExecutionContext> context_;
  cudaStream_t stream_ = nullptr;
  std::vector<std::string> inputs_, outputs_;
};

}  // namespace mmtrt
