// The EXIF orientation of a JPEG (APP1) or PNG (eXIf chunk), and the image turned upright by it, as PIL's
// ImageOps.exif_transpose does (transformers' load_image), so both runtimes see what a viewer shows.
#pragma once

#include <cstdint>
#include <vector>

#include "image.hpp"

namespace mmtrt {

int exif_orientation(const std::vector<uint8_t>& file);  // 1 (upright) when absent or unreadable
void apply_orientation(RgbImage& image, int orientation);

}  // namespace mmtrt
