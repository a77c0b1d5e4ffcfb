// NOT COMPILED OR RUN here: written against the TensorRT 11 headers' API (NvInfer.h), for a TensorRT host.
#include "trt_runner.hpp"

#include <NvInferVersion.h>

#include <fstream>
#include <iterator>

#include "mmtrt/bundle.hpp"

namespace mmtrt {
namespace {

class Logger : public nvinfer1::ILogger {
 public:
  void log(Severity severity, const char* message) noexcept override {
    if (severity <= Severity::kERROR) last_error = message;
  }
  std::string last_error;
};

Logger& logger() {
  static Logger instance;
  return instance;
}

void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw Error(ErrorKind::Runtime, std::string(what) + ": " + cudaGetErrorString(status));
}

struct TypeInfo {
  ONNXTensorElementDataType onnx;
  size_t size;
};

TypeInfo type_info(nvinfer1::DataType type) {
  switch (type) {
    case nvinfer1::DataType::kFLOAT: return {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, 4};
    case nvinfer1::DataType::kHALF: return {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, 2};
    case nvinfer1::DataType::kBF16: return {ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16, 2};
    case nvinfer1::DataType::kINT32: return {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, 4};
    case nvinfer1::DataType::kINT64: return {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, 8};
    case nvinfer1::DataType::kBOOL: return {ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL, 1};
    case nvinfer1::DataType::kUINT8: return {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, 1};
    case nvinfer1::DataType::kINT8: return {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8, 1};
    default: throw Error(ErrorKind::Runtime, "an engine tensor has a data type the C++ runtime does not copy");
  }
}

// Device buffers for one call, freed however the call ends.
class DeviceBuffers {
 public:
  void* allocate(size_t bytes) {
    void* ptr = nullptr;
    cuda_check(cudaMalloc(&ptr, bytes ? bytes : 1), "cudaMalloc");
    buffers_.push_back(ptr);
    return ptr;
  }
  ~DeviceBuffers() {
    for (void* ptr : buffers_) cudaFree(ptr);
  }

 private:
  std::vector<void*> buffers_;
};

}  // namespace

Target trt_probe_target() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    return {"", "", "TensorRT " + std::to_string(NV_TENSORRT_MAJOR) + " is linked but no CUDA GPU is visible"};
  int device = 0;
  cudaDeviceProp props{};
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  cuda_check(cudaGetDeviceProperties(&props, device), "cudaGetDeviceProperties");
  // tensorrt.__version__ of the Python bindings, which named the engines: major.minor.patch.build
  const std::string version = std::to_string(NV_TENSORRT_MAJOR) + "." + std::to_string(NV_TENSORRT_MINOR) + "." +
                              std::to_string(NV_TENSORRT_PATCH) + "." + std::to_string(NV_TENSORRT_BUILD);
  return {std::to_string(props.major) + "." + std::to_string(props.minor), version, ""};
}

TrtRunner::TrtRunner(const std::string& engine_path) {
  std::ifstream in(engine_path, std::ios::binary);
  const std::vector<char> blob((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  runtime_.reset(nvinfer1::createInferRuntime(logger()));
  if (!runtime_) throw Error(ErrorKind::Runtime, "cannot create a TensorRT runtime: " + logger().last_error);
  engine_.reset(runtime_->deserializeCudaEngine(blob.data(), blob.size()));
  if (!engine_)
    throw Error(ErrorKind::BadBundle, "TensorRT cannot load " + engine_path + " (" + logger().last_error +
                                          "); run `mmtrt build-engines BUNDLE --force`");
  context_.reset(engine_->createExecutionContext());
  if (!context_) throw Error(ErrorKind::Runtime, "cannot create a TensorRT execution context");
  cuda_check(cudaStreamCreate(&stream_), "cudaStreamCreate");
  for (int32_t i = 0; i < engine_->getNbIOTensors(); ++i) {
    const char* name = engine_->getIOTensorName(i);
    (engine_->getTensorIOMode(name) == nvinfer1::TensorIOMode::kINPUT ? inputs_ : outputs_).push_back(name);
  }
}

TrtRunner::~TrtRunner() {
  if (stream_) cudaStreamDestroy(stream_);
}

Tensors TrtRunner::run(const TensorViews& feeds) {
  DeviceBuffers device;
  for (const auto& name : inputs_) {
    const auto found = feeds.find(name);
    if (found == feeds.end()) throw Error(ErrorKind::Runtime, "no value for the engine input " + name);
    Ort::ConstValue value(found->second);
    const auto info = value.GetTensorTypeAndShapeInfo();
    const std::vector<int64_t> shape = info.GetShape();
    nvinfer1::Dims dims{};
    dims.nbDims = static_cast<int32_t>(shape.size());
    for (size_t d = 0; d < shape.size(); ++d) dims.d[d] = shape[d];
    if (!context_->setInputShape(name.c_str(), dims))
      throw Error(ErrorKind::BadInput, "engine input " + name + " has a shape outside its optimization profile");
    const size_t bytes = info.GetElementCount() * type_info(engine_->getTensorDataType(name.c_str())).size;
    void* ptr = device.allocate(bytes);
    cuda_check(cudaMemcpyAsync(ptr, value.GetTensorRawData(), bytes, cudaMemcpyHostToDevice, stream_), "copy in");
    context_->setTensorAddress(name.c_str(), ptr);
  }
  Ort::AllocatorWithDefaultOptions allocator;
  Tensors out;
  std::vector<std::pair<void*, size_t>> copies;
  for (const auto& name : outputs_) {
    const nvinfer1::Dims dims = context_->getTensorShape(name.c_str());
    std::vector<int64_t> shape(dims.d, dims.d + dims.nbDims);
    const TypeInfo type = type_info(engine_->getTensorDataType(name.c_str()));
    size_t elements = 1;
    for (int64_t d : shape) {
      if (d < 0) throw Error(ErrorKind::Runtime, "engine output " + name + " has a data-dependent shape");
      elements *= static_cast<size_t>(d);
    }
    void* ptr = device.allocate(elements * type.size);
    context_->setTensorAddress(name.c_str(), ptr);
    out.emplace(name, Ort::Value::CreateTensor(allocator, shape.data(), shape.size(), type.onnx));
    copies.emplace_back(ptr, elements * type.size);
  }
  if (!context_->enqueueV3(stream_)) throw Error(ErrorKind::Runtime, "TensorRT enqueueV3 failed: " + logger().last_error);
  size_t i = 0;
  for (const auto& name : outputs_) {
    cuda_check(cudaMemcpyAsync(out.at(name).GetTensorMutableRawData(), copies[i].first, copies[i].second,
                               cudaMemcpyDeviceToHost, stream_), "copy out");
    ++i;
  }
  cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  return out;
}

}  // namespace mmtrt
