#include "image_tokens.hpp"

#include <algorithm>
#include <string>

#include "mmtrt/bundle.hpp"

namespace mmtrt {
namespace {

// ids with their run of `token` (one run, as the expanded placeholder is) made `count` long.
std::vector<int64_t> fit_image_tokens(const std::vector<int64_t>& ids, int64_t token, int64_t count) {
  const auto first = std::find(ids.begin(), ids.end(), token);
  const auto run = std::count(ids.begin(), ids.end(), token);
  std::vector<int64_t> out(ids.begin(), first);
  out.insert(out.end(), static_cast<size_t>(count), token);
  out.insert(out.end(), first + run, ids.end());
  return out;
}

}  // namespace

void fit_to_image_token_count(Tensors& vision, std::vector<int64_t>& ids, int64_t image_token_id) {
  const auto counted = vision.find("image_token_count");
  if (counted == vision.end()) return;
  const Ort::Value& block = vision.at("image_features");
  const auto shape = block.GetTensorTypeAndShapeInfo().GetShape();
  const auto count_info = counted->second.GetTensorTypeAndShapeInfo();
  if (count_info.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 || count_info.GetElementCount() != 1 ||
      shape.size() != 3 || shape[0] != 1)
    throw Error(ErrorKind::Runtime, "the vision encoder's image_token_count is not one int64 for the one image");
  const int64_t count = counted->second.GetTensorData<int64_t>()[0];
  if (count < 1 || count > shape[1])
    throw Error(ErrorKind::Runtime, "the vision encoder kept " + std::to_string(count) + " image tokens of a block "
                                        "of " + std::to_string(shape[1]));
  Ort::AllocatorWithDefaultOptions allocator;
  const std::vector<int64_t> kept = {1, count, shape[2]};
  Ort::Value out = Ort::Value::CreateTensor<float>(allocator, kept.data(), kept.size());
  std::copy_n(block.GetTensorData<float>(), count * shape[2], out.GetTensorMutableData<float>());
  ids = fit_image_tokens(ids, image_token_id, count);
  vision.at("image_features") = std::move(out);
}

}  // namespace mmtrt
