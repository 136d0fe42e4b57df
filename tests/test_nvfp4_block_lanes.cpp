// A 16-block spread over 16 lanes (kernels/nvfp4_block_lanes.cuh: the AdamW update writing the next forward's
// bf16 operand, --keep-weight-operands always) run on the host in lock-step with the header's own functions:
// every lane ends with the same block maximum and, per search candidate, with block_squared_error's tree sum bit
// for bit; the scale code and each element's operand value equal the CPU codec's quantize + dequantize. The
// kernel adds the shuffles and stores; tests/gpu/test_adamw_kernel.cpp checks it on a GPU.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "nvfp4_block_lanes.cuh"
#include "qwen3/nvfp4/nvfp4.h"

namespace qwen3 {
namespace {

namespace codec = kernels::codec;
namespace lanes = kernels::block_lanes;
using Lanes = std::array<float, codec::kBlock>;

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// One exchange step of the lanes: lane i combines its value with lane (i ^ w)'s, all lanes at once.
template <typename Combine>
Lanes exchange(const Lanes& v, int w, Combine combine) {
  Lanes next{};
  for (int i = 0; i < codec::kBlock; ++i) next[i] = combine(v[i], v[i ^ w]);
  return next;
}

template <typename Combine>
float all_lanes(Lanes v, Combine combine) {
  for (int w = lanes::kFirstWidth; w >= 1; w /= 2) v = exchange(v, w, combine);
  for (int i = 1; i < codec::kBlock; ++i) EXPECT_EQ(bits(v[i]), bits(v[0])) << "lane " << i << " disagrees";
  return v[0];
}

// block_lanes::scale_code's steps, the 16 lanes in lock-step.
uint8_t lanes_scale_code(const Lanes& x, bool search) {
  Lanes amax{};
  for (int i = 0; i < codec::kBlock; ++i) amax[i] = codec::max_abs_nan(0.0f, x[i]);
  const float block_max = all_lanes(amax, [](float a, float b) { return codec::max_abs_nan(a, b); });
  if (!codec::finite_maximum(block_max)) return codec::kNonFiniteBlockScale;
  const int center = codec::rne_scale_code(block_max);
  if (!search) return static_cast<uint8_t>(center);
  int best_code = center;
  float best_error = 0.0f;
  bool have_best = false;
  for (int k = 0; k < 5; ++k) {
    bool valid = false;
    const int code = codec::search_candidate(center, k, valid);
    const float scale = codec::e4m3_to_float(static_cast<uint8_t>(code));
    Lanes error{};
    for (int i = 0; i < codec::kBlock; ++i)
      error[i] = codec::element_squared_error(x[i], scale, scale > 0.0f ? codec::recip_rn(scale) : 0.0f);
    const float total = all_lanes(error, [](float a, float b) { return codec::add_rn(a, b); });
    EXPECT_EQ(bits(total), bits(codec::block_squared_error(x.data(), static_cast<uint8_t>(code))))
        << "the lanes' sum is not the tree's, code " << code;
    lanes::keep_better(valid, code, total, best_code, best_error, have_best);
  }
  return static_cast<uint8_t>(best_code);
}

// The CPU codec's scale code and dequantized block against the lanes', element by element.
void expect_codec(const Lanes& x, nvfp4::ScaleMode mode) {
  uint8_t codes[codec::kBlock / 2], scale = 0;
  nvfp4::quantize_rows_cpu(x.data(), 1, codec::kBlock, codes, &scale, mode);
  float want[codec::kBlock];
  nvfp4::dequantize_rows_cpu(codes, &scale, 1, codec::kBlock, want);
  const uint8_t code = lanes_scale_code(x, mode == nvfp4::ScaleMode::search);
  ASSERT_EQ(code, scale) << "x[0] = " << x[0];
  const float s = codec::e4m3_to_float(code);
  for (int i = 0; i < codec::kBlock; ++i)
    EXPECT_EQ(bits(codec::element_operand(x[i], s, s > 0.0f ? codec::recip_rn(s) : 0.0f)), bits(want[i]))
        << "element " << i << " of a block with x[0] = " << x[0];
}

TEST(Nvfp4BlockLanes, ScaleAndOperandAreTheCodecsOnRandomBlocks) {
  std::mt19937 rng(7);
  for (const float sigma : {1e-30f, 1e-6f, 5e-3f, 1.0f, 300.0f, 1e30f}) {
    std::normal_distribution<float> normal(0.0f, sigma);
    for (int b = 0; b < 400; ++b) {
      Lanes x{};
      for (float& v : x) v = normal(rng);
      expect_codec(x, nvfp4::ScaleMode::rne);
      expect_codec(x, nvfp4::ScaleMode::search);
    }
  }
}

// Ties of the E2M1 grid, a lone non-zero element, an all-zero block and the largest finite values: where an order
// of the error sums or a rounding would show.
TEST(Nvfp4BlockLanes, ScaleAndOperandAreTheCodecsOnEdgeBlocks) {
  std::vector<Lanes> blocks;
  Lanes ties{};
  for (int i = 0; i < codec::kBlock; ++i) ties[i] = (i % 2 ? -0.25f : 0.25f) * static_cast<float>(1 + 2 * (i % 12));
  blocks.push_back(ties);
  Lanes lone{};
  lone[5] = 3.0e-3f;
  blocks.push_back(lone);
  blocks.push_back(Lanes{});
  Lanes big{};
  big.fill(std::numeric_limits<float>::max());
  big[3] = -1.0f;
  blocks.push_back(big);
  Lanes tiny{};
  tiny.fill(std::numeric_limits<float>::denorm_min());
  blocks.push_back(tiny);
  for (const Lanes& x : blocks) {
    expect_codec(x, nvfp4::ScaleMode::rne);
    expect_codec(x, nvfp4::ScaleMode::search);
  }
}

// A block with an infinite or NaN element: the non-finite scale code (the kernels raise their flag) and NaN
// operand values, as the quantize kernels' operand of such a block decodes.
TEST(Nvfp4BlockLanes, NonFiniteBlocksGiveTheNanScale) {
  for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    Lanes x{};
    x.fill(0.5f);
    x[9] = bad;
    for (const bool search : {false, true}) {
      const uint8_t code = lanes_scale_code(x, search);
      EXPECT_EQ(code, codec::kNonFiniteBlockScale);
      const float s = codec::e4m3_to_float(code);
      EXPECT_TRUE(std::isnan(codec::element_operand(x[0], s, s > 0.0f ? codec::recip_rn(s) : 0.0f)));
    }
  }
}

}  // namespace
}  // namespace qwen3
