// Int4GroupGemm: y = (x * pre) @ dequant(W) for small batches (decode), AWQ's W4A16 layout as awq_int4 lowers it
// for TensorRT: W int4 [K, N] held as int8 [K, N / 2] (row k's byte j holds columns 2j in the low nibble and 2j + 1 in
// the high one, two's complement: the bytes of ONNX's INT4 packing of the row-major [K, N]; TensorRT takes INT4 only
// as a DequantizeLinear input, so the plugin's input is INT8, as NVIDIA's INT4 GEMM plugins take it), scales
// [ceil(K / group), N] in the activation type or fp32 (S), the pre-quant scale [K] multiplied into the activations
// first. Products are rounded to the activation type where the ONNX decomposition rounds them (x * pre; q * scale,
// computed in S and cast); the dot product accumulates in fp32.
#pragma once
#include "numeric.h"

namespace mmtrt {

const int kInt4Lanes = 32;       // threads along N per block
const int kInt4ColsPerLane = 2;  // one weight byte per lane and k: a warp reads one 32-byte sector per row
const int kInt4Slices = 8;       // warps along K per block
const int kInt4Cols = kInt4ColsPerLane * kInt4Lanes;
const int kInt4MaxRows = 8;      // rows of x per block (grid.y covers more)

MMTRT_HD int int4_at(const uint8_t* w, long long flat) {
  int v = (flat & 1) ? (w[flat >> 1] >> 4) : (w[flat >> 1] & 15);
  return v >= 8 ? v - 16 : v;
}

template <class T, class S>
MMTRT_HD float dequantized(const uint8_t* w, const typename S::raw* scales, int k, int n, int N, int group) {
  return T::round(S::round(static_cast<float>(int4_at(w, static_cast<long long>(k) * N + n)) *
                           S::load(scales[static_cast<long long>(k / group) * N + n])));
}

template <class T>
MMTRT_HD float prescaled(const typename T::raw* x, const typename T::raw* pre, int m, int k, int K) {
  return T::round(T::load(x[static_cast<long long>(m) * K + k]) * T::load(pre[k]));
}

// One K slice's partial dot product for row m and column n: k = slice, slice + kInt4Slices, ...
template <class T, class S>
MMTRT_HD float slice_partial(const typename T::raw* x, const uint8_t* w, const typename S::raw* scales,
                             const typename T::raw* pre, int m, int n, int slice, int K, int N, int group) {
  float acc = 0.0f;
  for (int k = slice; k < K; k += kInt4Slices)
    acc = fmaf(prescaled<T>(x, pre, m, k, K), dequantized<T, S>(w, scales, k, n, N, group), acc);
  return acc;
}

}  // namespace mmtrt
