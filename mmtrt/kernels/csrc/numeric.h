// Float storage types shared by the CUDA kernels and their CPU twins. Conversions are written out bit by bit
// (round to nearest even, as __float2half_rn and __float2bfloat16_rn round), so host and device run the same code
// and the CPU twin needs no CUDA header.
#pragma once
#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define MMTRT_HD __host__ __device__ __forceinline__
#else
#define MMTRT_HD inline
#endif

namespace mmtrt {

enum DType { kF32 = 0, kF16 = 1, kBF16 = 2 };

MMTRT_HD uint32_t f32_bits(float f) {
  union { float f; uint32_t u; } v;
  v.f = f;
  return v.u;
}

MMTRT_HD float bits_f32(uint32_t u) {
  union { uint32_t u; float f; } v;
  v.u = u;
  return v.f;
}

MMTRT_HD float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

MMTRT_HD uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

MMTRT_HD float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1fu) return bits_f32(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    float v = static_cast<float>(man) * (1.0f / 16777216.0f);  // man * 2^-24, exact
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

MMTRT_HD uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // 65520 and above round to inf
  if (a < 0x38800000u) {  // below 2^-14: a subnormal half, round(|f| * 2^24)
    float v = bits_f32(a) * 16777216.0f;
    uint32_t r = static_cast<uint32_t>(v);
    float frac = v - static_cast<float>(r);
    if (frac > 0.5f || (frac == 0.5f && (r & 1u))) r++;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t h = (((a >> 23) - 112u) << 10) | ((a & 0x7fffffu) >> 13), rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
  return static_cast<uint16_t>(sign | h);
}

// A storage type: raw bits in memory, float in registers; round() is what storing and loading again gives.
struct F32 {
  typedef float raw;
  static MMTRT_HD float load(raw v) { return v; }
  static MMTRT_HD raw store(float v) { return v; }
  static MMTRT_HD float round(float v) { return v; }
};
struct F16 {
  typedef uint16_t raw;
  static MMTRT_HD float load(raw v) { return f16_to_f32(v); }
  static MMTRT_HD raw store(float v) { return f32_to_f16(v); }
  static MMTRT_HD float round(float v) { return f16_to_f32(f32_to_f16(v)); }
};
struct BF16 {
  typedef uint16_t raw;
  static MMTRT_HD float load(raw v) { return bf16_to_f32(v); }
  static MMTRT_HD raw store(float v) { return f32_to_bf16(v); }
  static MMTRT_HD float round(float v) { return bf16_to_f32(f32_to_bf16(v)); }
};

}  // namespace mmtrt
