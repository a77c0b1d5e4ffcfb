// Resizing 8-bit images as torchvision does on uint8 tensors (torch's separable antialiased uint8 kernel).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mmtrt {

enum class Interpolation { Bilinear, Bicubic, NearestExact };

Interpolation parse_interpolation(const std::string& name);

// src: height x width x channels, interleaved. Antialiased bilinear/bicubic as
// torch.nn.functional.interpolate(uint8, antialias=True): PIL-style filters (cubic a = -0.5) with weights in
// int16 fixed point, horizontal pass then vertical, each rounded and clamped to uint8.
std::vector<uint8_t> resize_u8(const std::vector<uint8_t>& src, int height, int width, int channels, int out_height,
                               int out_width, Interpolation mode, bool antialias);

}  // namespace mmtrt
