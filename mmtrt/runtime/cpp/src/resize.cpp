// A port of the arithmetic of ATen's UpSampleKernel.cpp / UpSampleKernelAVXAntialias.h for uint8 input
// (_compute_index_ranges_int16_weights, _compute_indices_min_size_weights_aa, the int16 interpolation loops),
// so the pixels equal torchvision's, not just approximate them.
#include "resize.hpp"

#include <algorithm>
#include <cmath>

#include "mmtrt/bundle.hpp"

namespace mmtrt {
namespace {

struct AxisWeights {
  std::vector<int64_t> start, size;
  std::vector<int16_t> weights;  // out x stride
  int64_t stride = 0;
  unsigned precision = 0;
};

double bilinear_filter(double x) {
  x = std::abs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

double bicubic_filter(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0.0;
}

AxisWeights axis_weights(int64_t in, int64_t out, Interpolation mode, bool antialias) {
  const int interp_size = mode == Interpolation::Bicubic ? 4 : 2;
  double (*filter)(double) = mode == Interpolation::Bicubic ? bicubic_filter : bilinear_filter;
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  const double support = (antialias && scale >= 1.0) ? interp_size * 0.5 * scale : interp_size * 0.5;
  const double invscale = (antialias && scale >= 1.0) ? 1.0 / scale : 1.0;
  AxisWeights w;
  w.stride = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  w.start.resize(out);
  w.size.resize(out);
  std::vector<double> weights(static_cast<size_t>(out * w.stride), 0.0);
  double wt_max = 0.0;
  for (int64_t i = 0; i < out; ++i) {
    const double center = scale * (i + 0.5);
    const int64_t xmin = std::max(static_cast<int64_t>(center - support + 0.5), int64_t{0});
    int64_t xsize = std::min(static_cast<int64_t>(center + support + 0.5), in) - xmin;
    xsize = std::clamp(xsize, int64_t{0}, w.stride);
    double* wt = weights.data() + i * w.stride;
    double total = 0.0;
    for (int64_t j = 0; j < xsize; ++j) {
      wt[j] = filter((j + xmin - center + 0.5) * invscale);
      total += wt[j];
    }
    if (total != 0.0) {
      for (int64_t j = 0; j < xsize; ++j) {
        wt[j] /= total;
        wt_max = std::max(wt_max, wt[j]);
      }
    }
    w.start[i] = xmin;
    w.size[i] = xsize;
  }
  for (w.precision = 0; w.precision < 22; ++w.precision) {
    const int next = static_cast<int>(0.5 + wt_max * (1 << (w.precision + 1)));
    if (next >= (1 << 15)) break;
  }
  w.weights.resize(weights.size());
  for (size_t k = 0; k < weights.size(); ++k) {
    const double v = weights[k] * (1 << w.precision);
    w.weights[k] = static_cast<int16_t>(v < 0 ? static_cast<int>(-0.5 + v) : static_cast<int>(0.5 + v));
  }
  return w;
}

uint8_t round_clamp(int32_t acc, unsigned precision) {
  return static_cast<uint8_t>(std::clamp(acc >> precision, 0, 255));
}

// One pass along an axis: `pitch` elements between neighbours on that axis.
std::vector<uint8_t> resize_axis(const std::vector<uint8_t>& src, int64_t lines, int64_t in, int64_t out,
                                 int64_t channels, bool horizontal, Interpolation mode,
                                 bool antialias) {
  const AxisWeights w = axis_weights(in, out, mode, antialias);
  const int32_t half = w.precision > 0 ? (1 << (w.precision - 1)) : 0;
  std::vector<uint8_t> dst(static_cast<size_t>(lines * out * channels));
  for (int64_t line = 0; line < lines; ++line) {
    for (int64_t o = 0; o < out; ++o) {
      const int16_t* wt = w.weights.data() + o * w.stride;
      for (int64_t c = 0; c < channels; ++c) {
        int32_t acc = half;
        for (int64_t j = 0; j < w.size[o]; ++j) {
          const int64_t x = w.start[o] + j;
          const size_t at = horizontal ? static_cast<size_t>((line * in + x) * channels + c)
                                       : static_cast<size_t>((x * lines + line) * channels + c);
          acc += static_cast<int32_t>(src[at]) * wt[j];
        }
        const size_t to = horizontal ? static_cast<size_t>((line * out + o) * channels + c)
                                     : static_cast<size_t>((o * lines + line) * channels + c);
        dst[to] = round_clamp(acc, w.precision);
      }
    }
  }
  return dst;
}

// torch's nearest-exact: src = min(floor((dst + 0.5) * scale), in - 1), scale in float.
std::vector<uint8_t> resize_nearest_exact(const std::vector<uint8_t>& src, int height, int width, int channels,
                                          int out_height, int out_width) {
  const float sy = static_cast<float>(height) / static_cast<float>(out_height);
  const float sx = static_cast<float>(width) / static_cast<float>(out_width);
  std::vector<uint8_t> dst(static_cast<size_t>(out_height) * out_width * channels);
  for (int y = 0; y < out_height; ++y) {
    const int iy = std::min(static_cast<int>(std::floor((y + 0.5f) * sy)), height - 1);
    for (int x = 0; x < out_width; ++x) {
      const int ix = std::min(static_cast<int>(std::floor((x + 0.5f) * sx)), width - 1);
      for (int c = 0; c < channels; ++c)
        dst[(static_cast<size_t>(y) * out_width + x) * channels + c] =
            src[(static_cast<size_t>(iy) * width + ix) * channels + c];
    }
  }
  return dst;
}

}  // namespace

Interpolation parse_interpolation(const std::string& name) {
  if (name == "bilinear") return Interpolation::Bilinear;
  if (name == "bicubic") return Interpolation::Bicubic;
  if (name == "nearest-exact") return Interpolation::NearestExact;
  throw Error(ErrorKind::BadBundle, "the bundle's preprocessing resizes with " + name +
                                        ", which the C++ runtime does not implement (bilinear, bicubic, "
                                        "nearest-exact); use the Python runtime or recompile with one of those");
}

std::vector<uint8_t> resize_u8(const std::vector<uint8_t>& src, int height, int width, int channels, int out_height,
                               int out_width, Interpolation mode, bool antialias) {
  if (mode == Interpolation::NearestExact)
    return resize_nearest_exact(src, height, width, channels, out_height, out_width);
  std::vector<uint8_t> image = src;
  if (out_width != width)  // the horizontal pass first, as torch does; an unchanged axis is skipped
    image = resize_axis(image, height, width, out_width, channels, true, mode, antialias);
  if (out_height != height)
    image = resize_axis(image, out_width, height, out_height, channels, false, mode, antialias);
  return image;
}

}  // namespace mmtrt
