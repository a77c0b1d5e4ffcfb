#include "exif.hpp"

#include <cstring>
#include <string>

namespace mmtrt {
namespace {

uint32_t read(const uint8_t* p, int bytes, bool little) {
  uint32_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint32_t>(p[little ? i : bytes - 1 - i]) << (8 * i);
  return v;
}

// Tag 0x0112 of IFD0 in a TIFF block (the body of an Exif APP1 after "Exif\0\0", or a PNG eXIf chunk).
int tiff_orientation(const uint8_t* tiff, size_t size) {
  if (size < 8) return 1;
  const bool little = tiff[0] == 'I' && tiff[1] == 'I';
  if (!little && !(tiff[0] == 'M' && tiff[1] == 'M')) return 1;
  const uint32_t ifd = read(tiff + 4, 4, little);
  if (ifd + 2 > size) return 1;
  const uint32_t entries = read(tiff + ifd, 2, little);
  for (uint32_t i = 0; i < entries; ++i) {
    const size_t at = ifd + 2 + 12 * static_cast<size_t>(i);
    if (at + 12 > size) return 1;
    if (read(tiff + at, 2, little) == 0x0112 && read(tiff + at + 2, 2, little) == 3) {
      const uint32_t value = read(tiff + at + 8, 2, little);
      return value >= 1 && value <= 8 ? static_cast<int>(value) : 1;
    }
  }
  return 1;
}

int jpeg_orientation(const std::vector<uint8_t>& f) {
  for (size_t at = 2; at + 4 <= f.size() && f[at] == 0xFF;) {
    const uint8_t marker = f[at + 1];
    if (marker == 0xDA || marker == 0xD9) return 1;  // image data: no metadata after it
    const size_t length = read(&f[at + 2], 2, false);
    if (length < 2 || at + 2 + length > f.size()) return 1;
    if (marker == 0xE1 && length >= 8 && std::memcmp(&f[at + 4], "Exif\0\0", 6) == 0)
      return tiff_orientation(&f[at + 10], length - 8);
    at += 2 + length;
  }
  return 1;
}

int png_orientation(const std::vector<uint8_t>& f) {
  for (size_t at = 8; at + 12 <= f.size();) {
    const size_t length = read(&f[at], 4, false);
    if (at + 12 + length > f.size()) return 1;
    if (std::memcmp(&f[at + 4], "eXIf", 4) == 0) return tiff_orientation(&f[at + 8], length);
    if (std::memcmp(&f[at + 4], "IEND", 4) == 0) return 1;
    at += 12 + length;
  }
  return 1;
}

}  // namespace

int exif_orientation(const std::vector<uint8_t>& file) {
  if (file.size() >= 4 && file[0] == 0xFF && file[1] == 0xD8) return jpeg_orientation(file);
  if (file.size() >= 8 && std::memcmp(file.data(), "\x89PNG\r\n\x1a\n", 8) == 0) return png_orientation(file);
  return 1;
}

// PIL's transposes for orientations 2..8: FLIP_LEFT_RIGHT, ROTATE_180, FLIP_TOP_BOTTOM, TRANSPOSE, ROTATE_270,
// TRANSVERSE, ROTATE_90; out(x, y) takes in(sx, sy).
void apply_orientation(RgbImage& image, int orientation) {
  if (orientation < 2 || orientation > 8) return;
  const int w = image.width, h = image.height;
  const bool swap = orientation >= 5;
  const int ow = swap ? h : w, oh = swap ? w : h;
  std::vector<uint8_t> out(image.pixels.size());
  for (int y = 0; y < oh; ++y)
    for (int x = 0; x < ow; ++x) {
      int sx = x, sy = y;
      switch (orientation) {
        case 2: sx = w - 1 - x; break;
        case 3: sx = w - 1 - x; sy = h - 1 - y; break;
        case 4: sy = h - 1 - y; break;
        case 5: sx = y; sy = x; break;
        case 6: sx = y; sy = h - 1 - x; break;
        case 7: sx = w - 1 - y; sy = h - 1 - x; break;
        case 8: sx = w - 1 - y; sy = x; break;
      }
      std::memcpy(&out[3 * (static_cast<size_t>(y) * ow + x)], &image.pixels[3 * (static_cast<size_t>(sy) * w + sx)], 3);
    }
  image.pixels = std::move(out);
  image.width = ow;
  image.height = oh;
}

}  // namespace mmtrt
