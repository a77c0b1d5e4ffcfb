// NOT COMPILED OR RUN here: written against the TensorRT 11 headers' API (NvInfer.h, NvInferRuntime.h of
// NVIDIA/TensorRT 11.1: getProfileShape, getProfileTensorValuesV2, setOptimizationProfileAsync,
// isShapeInferenceIO, getAliasedInputTensor), for a TensorRT host.
#include "trt_runner.hpp"

#include <NvInferVersion.h>

#include <fstream>
#include <iterator>
#include <map>
#include <utility>

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

namespace {

nvinfer1::Dims to_dims(const std::vector<int64_t>& shape) {
  nvinfer1::Dims dims{};
  dims.nbDims = static_cast<int32_t>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) dims.d[d] = shape[d];
  return dims;
}

bool within(const nvinfer1::Dims& low, const nvinfer1::Dims& high, const std::vector<int64_t>& values) {
  if (low.nbDims != static_cast<int32_t>(values.size()) || high.nbDims != low.nbDims) return false;
  for (size_t d = 0; d < values.size(); ++d)
    if (values[d] < low.d[d] || values[d] > high.d[d]) return false;
  return true;
}

}  // namespace

// The first optimization profile whose ranges hold every input's shape (and a shape tensor's values), in the
// plan's order (decode, then prefill), as the Python runner chooses: an engine built with several profiles runs
// each call in one of them, selected on the stream before the shapes are set.
int32_t TrtRunner::profile_for(const TensorViews& feeds) const {
  using nvinfer1::OptProfileSelector;
  for (int32_t p = 0; p < engine_->getNbOptimizationProfiles(); ++p) {
    bool fits = true;
    for (const auto& name : inputs_) {
      Ort::ConstValue value(feeds.at(name));
      const auto info = value.GetTensorTypeAndShapeInfo();
      fits = within(engine_->getProfileShape(name.c_str(), p, OptProfileSelector::kMIN),
                    engine_->getProfileShape(name.c_str(), p, OptProfileSelector::kMAX), info.GetShape());
      if (fits && engine_->isShapeInferenceIO(name.c_str())) {
        const int64_t* low = engine_->getProfileTensorValuesV2(name.c_str(), p, OptProfileSelector::kMIN);
        const int64_t* high = engine_->getProfileTensorValuesV2(name.c_str(), p, OptProfileSelector::kMAX);
        const auto* data = static_cast<const int64_t*>(value.GetTensorRawData());
        for (size_t i = 0; fits && low && high && i < info.GetElementCount(); ++i)
          fits = data[i] >= low[i] && data[i] <= high[i];
      }
      if (!fits) break;
    }
    if (fits) return p;
  }
  throw Error(ErrorKind::BadInput, "the inputs' shapes fit none of the engine's optimization profiles; recompile the "
                                   "bundle with a wider envelope");
}

Tensors TrtRunner::run(const TensorViews& feeds) {
  for (const auto& name : inputs_)
    if (feeds.find(name) == feeds.end()) throw Error(ErrorKind::Runtime, "no value for the engine input " + name);
  const int32_t profile = profile_for(feeds);
  if (profile != context_->getOptimizationProfile() && !context_->setOptimizationProfileAsync(profile, stream_))
    throw Error(ErrorKind::Runtime, "TensorRT cannot select optimization profile " + std::to_string(profile) + ": " +
                                        logger().last_error);
  DeviceBuffers device;
  std::map<std::string, std::pair<void*, std::vector<int64_t>>> input_at;
  for (const auto& name : inputs_) {
    Ort::ConstValue value(feeds.at(name));
    const auto info = value.GetTensorTypeAndShapeInfo();
    const std::vector<int64_t> shape = info.GetShape();
    if (!context_->setInputShape(name.c_str(), to_dims(shape)))
      throw Error(ErrorKind::BadInput, "engine input " + name + " has a shape outside its optimization profile");
    if (engine_->isShapeInferenceIO(name.c_str())) {  // a shape tensor (logits_from) is read on the host
      context_->setInputTensorAddress(name.c_str(), value.GetTensorRawData());
      continue;
    }
    const size_t bytes = info.GetElementCount() * type_info(engine_->getTensorDataType(name.c_str())).size;
    void* ptr = device.allocate(bytes);
    cuda_check(cudaMemcpyAsync(ptr, value.GetTensorRawData(), bytes, cudaMemcpyHostToDevice, stream_), "copy in");
    context_->setTensorAddress(name.c_str(), ptr);
    input_at.emplace(name, std::make_pair(ptr, shape));
  }
  Ort::AllocatorWithDefaultOptions allocator;
  Tensors out;
  std::vector<std::pair<void*, size_t>> copies;
  for (const auto& name : outputs_) {
    // An output the engine writes in place of an input (IKVCacheUpdateLayer: present.N.* over past.N.*) must be
    // bound at that input's address; TensorRT reads and writes the one buffer.
    const char* aliased = engine_->getAliasedInputTensor(name.c_str());
    const nvinfer1::Dims dims = context_->getTensorShape(name.c_str());
    std::vector<int64_t> shape(dims.d, dims.d + dims.nbDims);
    const TypeInfo type = type_info(engine_->getTensorDataType(name.c_str()));
    size_t elements = 1;
    for (int64_t d : shape) {
      if (d < 0) throw Error(ErrorKind::Runtime, "engine output " + name + " has a data-dependent shape");
      elements *= static_cast<size_t>(d);
    }
    void* ptr = nullptr;
    if (aliased != nullptr) {
      const auto source = input_at.find(aliased);
      if (source == input_at.end())
        throw Error(ErrorKind::Runtime, "engine output " + name + " aliases " + aliased + ", which is not a bound input");
      ptr = source->second.first;
    } else {
      ptr = device.allocate(elements * type.size);
    }
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
