// Decoding an image file into 8-bit RGB as PIL's open + convert_rgb gives it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mmtrt {

struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> pixels;  // height x width x 3
};

// JPEG through libjpeg (PIL's decoder, islow IDCT, fancy upsampling); PNG and the rest through stb_image.
// Transparency is composited onto white with PIL's integer alpha_composite (transformers' convert_to_rgb).
RgbImage read_image(const std::string& path);

}  // namespace mmtrt
