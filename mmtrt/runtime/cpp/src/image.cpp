#include "image.hpp"

#include <csetjmp>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <sys/stat.h>

#include <jpeglib.h>
#include <jerror.h>

#define STB_IMAGE_IMPLEMENTATION
#define STBI_NO_LINEAR
#define STBI_NO_HDR
#define STBI_FAILURE_USERMSG
#include <stb_image.h>

#include "exif.hpp"
#include "mmtrt/bundle.hpp"

namespace mmtrt {
namespace {

Error unreadable(const std::string& path, const std::string& why) {
  return Error(ErrorKind::BadInput, "cannot read image " + path + " (" + why + "); pass a PNG or JPEG file");
}

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool truncated;
};

void on_jpeg_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  cinfo->err->format_message(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// libjpeg only warns about a truncated file and fills the rest with grey; PIL refuses it, and so do we.
void on_jpeg_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) reinterpret_cast<JpegError*>(cinfo->err)->truncated = true;
}

// No C++ object with a destructor lives across the setjmp, so longjmp skips nothing.
bool decode_jpeg(const std::vector<uint8_t>& data, RgbImage& out, std::string& why) {
  jpeg_decompress_struct cinfo{};
  JpegError err{};
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = on_jpeg_error;
  err.mgr.emit_message = on_jpeg_message;
  if (setjmp(err.jump)) {
    why = err.message;
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data.data(), static_cast<unsigned long>(data.size()));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    why = "CMYK JPEG, which the C++ runtime does not convert; save it as RGB";
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  out.width = static_cast<int>(cinfo.output_width);
  out.height = static_cast<int>(cinfo.output_height);
  out.pixels.resize(static_cast<size_t>(out.width) * out.height * 3);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out.pixels.data() + static_cast<size_t>(cinfo.output_scanline) * out.width * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  if (err.truncated) why = "image file is truncated";
  return !err.truncated;
}

// PIL's AlphaComposite.c with a white opaque background, PRECISION_BITS 7.
uint8_t over_white(uint32_t value, uint32_t alpha) {
  constexpr uint32_t bits = 7;
  const uint32_t blend = 255 * (255 - alpha);
  const uint32_t outa255 = alpha * 255 + blend;
  const uint32_t coef1 = alpha * 255 * 255 * (1u << bits) / outa255;
  const uint32_t coef2 = 255 * (1u << bits) - coef1;
  const uint32_t tmp = value * coef1 + 255 * coef2 + (0x80u << bits);
  return static_cast<uint8_t>((((tmp >> 8) + tmp) >> 8) >> bits);
}

bool decode_stb(const std::vector<uint8_t>& data, RgbImage& out, std::string& why) {
  const auto* bytes = data.data();
  const int size = static_cast<int>(data.size());
  // a 16-bit file comes back with each value's high byte (stbi__convert_16_to_8), as PIL's 8-bit modes take it
  int width = 0, height = 0, channels = 0;
  std::unique_ptr<stbi_uc, void (*)(void*)> rgba(stbi_load_from_memory(bytes, size, &width, &height, &channels, 4),
                                                 stbi_image_free);
  if (!rgba) {
    why = stbi_failure_reason();
    return false;
  }
  const bool alpha = channels == 2 || channels == 4;
  out.width = width;
  out.height = height;
  out.pixels.resize(static_cast<size_t>(width) * height * 3);
  for (size_t i = 0, n = static_cast<size_t>(width) * height; i < n; ++i) {
    const stbi_uc* p = rgba.get() + 4 * i;
    for (int c = 0; c < 3; ++c) {
      uint8_t v = p[c];
      if (alpha) v = p[3] == 0 ? 255 : over_white(p[c], p[3]);
      out.pixels[3 * i + c] = v;
    }
  }
  return true;
}

constexpr size_t kHead = 1 << 16;
constexpr size_t kMaxBytes = size_t{256} << 20;

// The file, read only while it can be an image: its head must be one a decoder knows (so /dev/zero or a FIFO of
// text stops at 64 KiB), and it may not pass 256 MiB.
std::vector<uint8_t> read_bounded(std::ifstream& in, const std::string& path) {
  std::vector<uint8_t> data(kHead);
  in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(kHead));
  data.resize(static_cast<size_t>(in.gcount()));
  const bool jpeg = data.size() >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
  int w = 0, h = 0, c = 0;
  if (!jpeg && !stbi_info_from_memory(data.data(), static_cast<int>(data.size()), &w, &h, &c))
    throw unreadable(path, "cannot identify image file");
  std::vector<char> block(1 << 20);
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    data.insert(data.end(), block.begin(), block.begin() + in.gcount());
    if (data.size() > kMaxBytes) throw unreadable(path, "larger than 256 MiB");
  }
  return data;
}

}  // namespace

RgbImage read_image(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0)
    throw Error(ErrorKind::BadInput, "image " + path + " does not exist; pass the path of a PNG or JPEG file");
  if (S_ISDIR(st.st_mode))
    throw Error(ErrorKind::BadInput, "image " + path + " is a folder, not an image file; pass the path of a PNG or JPEG file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw unreadable(path, "permission denied or not a regular file");
  const std::vector<uint8_t> data = read_bounded(in, path);
  RgbImage image;
  std::string why;
  const bool jpeg = data.size() >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
  if (!(jpeg ? decode_jpeg(data, image, why) : decode_stb(data, image, why))) throw unreadable(path, why);
  if (image.width <= 0 || image.height <= 0) throw unreadable(path, "empty image");
  apply_orientation(image, exif_orientation(data));
  return image;
}

}  // namespace mmtrt
