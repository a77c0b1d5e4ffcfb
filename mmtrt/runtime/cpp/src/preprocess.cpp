#include "preprocess.hpp"

#include <algorithm>
#include <cmath>

#include "mmtrt/bundle.hpp"

namespace mmtrt {
namespace {

const std::vector<std::string> kOpOrder = {"convert_rgb", "resize", "center_crop", "rescale", "normalize"};

Error bad_spec(const std::string& why) {
  return Error(ErrorKind::BadBundle, "preprocess.json: " + why + "; recompile the recipe with this mmtrt");
}

std::array<float, 3> three(const json& values, const char* what) {
  if (!values.is_array() || values.size() != 3) throw bad_spec(std::string(what) + " needs 3 values");
  return {values[0].get<float>(), values[1].get<float>(), values[2].get<float>()};
}

}  // namespace

Preprocessor::Preprocessor(const json& spec) {
  if (spec.value("version", 0) != 1) throw bad_spec("spec version " + spec.value("version", json()).dump() + ", expected 1");
  size_t last = 0;
  for (const auto& op : spec.at("ops")) {
    const std::string name = op.at("op").get<std::string>();
    const auto at = std::find(kOpOrder.begin(), kOpOrder.end(), name);
    const size_t index = static_cast<size_t>(at - kOpOrder.begin());
    if (at == kOpOrder.end() || index < last) throw bad_spec("ops are not a subsequence of convert_rgb, resize, "
                                                             "center_crop, rescale, normalize");
    last = index + 1;
    if (name == "resize") {
      resize_ = Resize{op.at("size").get<std::vector<int>>(),
                       parse_interpolation(op.at("interpolation").get<std::string>()), op.at("antialias").get<bool>()};
      if (resize_->size.empty() || resize_->size.size() > 2) throw bad_spec("resize.size needs 1 or 2 values");
      if (!resize_->antialias && resize_->mode != Interpolation::NearestExact)
        throw bad_spec("resize without antialias is not implemented by the C++ runtime");
    }
    if (name == "center_crop") {
      const auto size = op.at("size").get<std::vector<int>>();
      if (size.size() != 2) throw bad_spec("center_crop.size needs 2 values");
      crop_ = std::array<int, 2>{size[0], size[1]};
    }
    if (name == "rescale") rescale_ = op.at("factor").get<double>();
    if (name == "normalize") {
      mean_ = three(op.at("mean"), "normalize.mean");
      std_ = three(op.at("std"), "normalize.std");
    }
  }
  if (mean_) {
    // The rescale factor divided into mean and std in float32, as the HF torchvision backend fuses them.
    const float inverse = static_cast<float>(1.0 / rescale_.value_or(1.0));
    for (int c = 0; c < 3; ++c) {
      (*mean_)[c] = (*mean_)[c] * inverse;
      (*std_)[c] = (*std_)[c] * inverse;
    }
  }
}

// torchvision's _compute_resized_output_size: one size is the shorter edge, the longer one truncated.
void Preprocessor::resized_size(int height, int width, int& out_height, int& out_width) const {
  const auto& size = resize_->size;
  if (size.size() == 2) {
    out_height = size[0];
    out_width = size[1];
    return;
  }
  const int shorter = std::min(height, width), longer = std::max(height, width);
  const int new_short = size[0];
  const int new_long = static_cast<int>(static_cast<double>(new_short) * longer / shorter);
  out_height = width <= height ? new_long : new_short;
  out_width = width <= height ? new_short : new_long;
}

std::vector<float> Preprocessor::run(const RgbImage& image) const {
  int height = image.height, width = image.width;
  std::vector<uint8_t> pixels = image.pixels;
  if (resize_) {
    int out_height = 0, out_width = 0;
    resized_size(height, width, out_height, out_width);
    constexpr int64_t kPixelLimit = 89478485;  // PIL's Image.MAX_IMAGE_PIXELS, the Python runtime's guard
    if (resize_->size.size() == 1 && static_cast<int64_t>(out_height) * out_width > kPixelLimit) {
      const double scale = static_cast<double>(resize_->size[0]) / std::min(width, height);
      throw Error(ErrorKind::BadInput, "image is " + std::to_string(width) + "x" + std::to_string(height) +
                                           "; preprocessing resizes its short side to " +
                                           std::to_string(resize_->size[0]) + ", giving " +
                                           std::to_string(std::llround(width * scale)) + "x" +
                                           std::to_string(std::llround(height * scale)) + " pixels, more than the "
                                           "decompression-bomb limit of " + std::to_string(kPixelLimit) +
                                           "; crop it closer to square");
    }
    if (out_height != height || out_width != width)
      pixels = resize_u8(pixels, height, width, 3, out_height, out_width, resize_->mode, resize_->antialias);
    height = out_height;
    width = out_width;
  }
  int top = 0, left = 0, out_height = height, out_width = width;
  if (crop_) {
    out_height = (*crop_)[0];
    out_width = (*crop_)[1];
    top = static_cast<int>((height - out_height) / 2.0);  // int() truncates toward zero, like Python's
    left = static_cast<int>((width - out_width) / 2.0);
  }
  const size_t plane = static_cast<size_t>(out_height) * out_width;
  std::vector<float> out(3 * plane);
  for (int y = 0; y < out_height; ++y) {
    for (int x = 0; x < out_width; ++x) {
      const int sy = top + y, sx = left + x;
      const bool inside = sy >= 0 && sy < height && sx >= 0 && sx < width;  // outside: zero padding
      for (int c = 0; c < 3; ++c) {
        float v = inside ? static_cast<float>(pixels[(static_cast<size_t>(sy) * width + sx) * 3 + c]) : 0.0f;
        if (mean_) v = (v - (*mean_)[c]) / (*std_)[c];
        else if (rescale_) v = v * static_cast<float>(*rescale_);
        out[c * plane + static_cast<size_t>(y) * out_width + x] = v;
      }
    }
  }
  return out;
}

}  // namespace mmtrt
