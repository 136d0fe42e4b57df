// Inputs for the NVFP4 kernel tests: adversarial blocks (exact E2M1 ties after scaling, E4M3 rounding ties
// of amax/6, zeros, saturation near 448·6, E4M3 subnormal scales, fp32 subnormals) and random blocks, and
// their bf16/f16 versions.
#pragma once
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gpu_test_util.h"
#include "nvfp4_codec.cuh"

namespace qwen3::gpu_test {

using Block = std::vector<float>;  // 16 values

inline std::vector<Block> adversarial_blocks() {
  namespace codec = kernels::codec;
  std::vector<Block> blocks;
  const float grid[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, 0.0f};
  // Every finite non-zero E4M3 scale s: one element is 6s, so amax/6 == s exactly and s0 = s; the others sit
  // exactly on (or one fp32 ulp beside) the E2M1 midpoints times s.
  for (int code = 1; code <= codec::kE4m3MaxCode; ++code) {
    const float s = codec::e4m3_to_float(static_cast<uint8_t>(code));
    for (int nudge = -1; nudge <= 1; ++nudge) {
      Block b(16);
      b[0] = (code % 2 ? -6.0f : 6.0f) * s;
      for (int i = 1; i < 16; ++i) {
        float v = grid[(i + code) % 15] * s;
        if (nudge != 0) v = std::nextafter(v, nudge > 0 ? INFINITY : 0.0f);
        b[i] = (i % 3 == 0) ? -v : v;
      }
      blocks.push_back(b);
    }
  }
  // amax/6 exactly halfway between two E4M3 values: the scale rounding's own ties.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (int code = 0; code < codec::kE4m3MaxCode; ++code) {
    const float mid = 0.5f * (codec::e4m3_to_float(static_cast<uint8_t>(code)) +
                              codec::e4m3_to_float(static_cast<uint8_t>(code + 1)));
    Block b(16);
    b[0] = 6.0f * mid;
    for (int i = 1; i < 16; ++i) b[i] = unit(rng) * b[0];
    blocks.push_back(b);
  }
  blocks.push_back(Block(16, 0.0f));
  Block negative_zeros(16, -0.0f);
  blocks.push_back(negative_zeros);
  // Saturation: amax at and beyond 448·6 = 2688 (464·6 = 2784 would round to the NaN code without it).
  for (float amax : {2688.0f, 2688.5f, 2700.0f, 2784.0f, 2800.0f, 3000.0f, 1e6f, 1e30f, FLT_MAX}) {
    Block b(16);
    b[0] = amax;
    for (int i = 1; i < 16; ++i) b[i] = unit(rng) * amax;
    blocks.push_back(b);
  }
  // Small: E4M3 subnormal scales, the 0 / 2^-9 tie (amax = 6·2^-10), all-but-zero blocks, fp32 subnormals.
  for (float amax : {6.0f * 0x1p-10f, std::nextafter(6.0f * 0x1p-10f, 1.0f), 6.0f * 0x1p-9f, 6.0f * 0x1p-8f,
                     6.0f * 3 * 0x1p-9f, 6.0f * 7 * 0x1p-9f, 6.0f * 0x1p-6f, 1e-6f, 1e-20f, 1e-38f, 1e-40f, 1e-45f}) {
    Block b(16);
    b[0] = -amax;
    for (int i = 1; i < 16; ++i) b[i] = unit(rng) * amax;
    blocks.push_back(b);
  }
  // Random blocks over 12 decades.
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> decade(-8.0f, 4.0f);
  for (int n = 0; n < 200; ++n) {
    const float magnitude = std::pow(10.0f, decade(rng));
    Block b(16);
    for (float& v : b) v = normal(rng) * magnitude;
    blocks.push_back(b);
  }
  return blocks;
}

// The blocks laid out as a [rows, cols] matrix (cols = 16 * blocks_per_row), padded with zero blocks.
inline std::vector<float> blocks_to_matrix(const std::vector<Block>& blocks, int64_t blocks_per_row,
                                           int64_t& rows) {
  rows = (static_cast<int64_t>(blocks.size()) + blocks_per_row - 1) / blocks_per_row;
  std::vector<float> matrix(static_cast<size_t>(rows * blocks_per_row * 16), 0.0f);
  for (size_t b = 0; b < blocks.size(); ++b)
    for (int i = 0; i < 16; ++i) matrix[b * 16 + i] = blocks[b][i];
  return matrix;
}

inline std::vector<float> gaussian(size_t n, float stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// Rounds fp32 values to a 16-bit type (bits out), keeping them finite: a value that overflows the type
// becomes its largest finite value of the same sign. `view` receives the exact fp32 values of the result.
inline std::vector<uint16_t> to_16bit(kernels::KernelDType type, const std::vector<float>& values,
                                      std::vector<float>& view) {
  const uint16_t max_finite = type == kernels::KernelDType::bf16 ? 0x7F7F : 0x7BFF;
  std::vector<uint16_t> bits(values.size());
  view.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    uint16_t b = to_bits(type, values[i]);
    if (std::isinf(from_bits(type, b))) b = static_cast<uint16_t>(max_finite | (b & 0x8000));
    bits[i] = b;
    view[i] = from_bits(type, b);
  }
  return bits;
}

}  // namespace qwen3::gpu_test
