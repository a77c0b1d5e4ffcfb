// The bundle's preprocessing spec (preprocess.json, mmtrt.ir.preprocess) run on a decoded image, as
// mmtrt.backends.torchvision_backend runs it: resize on uint8, int-anchored crop, rescale folded into normalize.
#pragma once

#include <array>
#include <optional>
#include <vector>

#include "image.hpp"
#include "manifest.hpp"
#include "resize.hpp"

namespace mmtrt {

class Preprocessor {
 public:
  explicit Preprocessor(const json& spec);
  // float32 [3, H, W], channel-major.
  std::vector<float> run(const RgbImage& image) const;

 private:
  struct Resize {
    std::vector<int> size;
    Interpolation mode;
    bool antialias;
  };
  std::optional<Resize> resize_;
  std::optional<std::array<int, 2>> crop_;
  std::optional<double> rescale_;
  std::optional<std::array<float, 3>> mean_, std_;
  void resized_size(int height, int width, int& out_height, int& out_width) const;
};

}  // namespace mmtrt
