// An NVFP4 block spread over a group of lanes (kernels/nvfp4_block_lanes.cuh: the AdamW update writing the next
// forward's bf16 operand, --keep-weight-operands always), the header's own functions run on host threads in
// lock-step (tests/lane_lockstep.h), in the three layouts the kernels use: 16 lanes of one element (plain
// moments), 4 of 4 (nvfp4) and 2 of 8 (int8). Every lane must end with the same block maximum and, per search
// candidate, with block_squared_error's tree sum bit for bit; the scale code and each element's operand value must
// equal the CPU codec's quantize + dequantize. The kernels add the shuffles and stores; tests/gpu/test_adamw_kernel.cpp
// checks them on a GPU.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "adamw_update.cuh"
#include "lane_lockstep.h"
#include "nvfp4_block_lanes.cuh"
#include "qwen3/nvfp4/nvfp4.h"

namespace qwen3 {
namespace {

namespace codec = kernels::codec;
namespace lanes = kernels::block_lanes;
using Block = std::array<float, codec::kBlock>;

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// What each lane of a group computed for one block.
struct LaneResults {
  std::vector<uint8_t> code;                // the scale code, a lane each
  std::vector<std::array<float, 5>> error;  // spread_squared_error of the five candidates around the center
  std::vector<Block> operand;               // the lane's elements of the operand, in their places
};

// Runs the header's functions for every block, the group's lanes on threads in lock-step.
template <int kPer>
std::vector<LaneResults> run_lanes(const std::vector<Block>& blocks, bool search) {
  constexpr int kLanes = codec::kBlock / kPer;
  std::vector<LaneResults> out(blocks.size());
  for (LaneResults& r : out) r.code.resize(kLanes), r.error.resize(kLanes), r.operand.resize(kLanes);
  test::LaneLockstep group(kLanes);
  group.run([&](int lane, const test::LaneLockstep::Exchange& exchange) {
    for (size_t b = 0; b < blocks.size(); ++b) {
      float x[kPer];
      for (int i = 0; i < kPer; ++i) x[i] = blocks[b][lane * kPer + i];
      const uint8_t code = lanes::spread_scale_code(x, search, exchange);
      out[b].code[lane] = code;
      const float amax = lanes::spread_block_max(x, exchange);
      for (int k = 0; k < 5; ++k) {
        bool valid = false;
        const int candidate =
            codec::search_candidate(codec::finite_maximum(amax) ? codec::rne_scale_code(amax) : 1, k, valid);
        const float s = codec::e4m3_to_float(static_cast<uint8_t>(candidate));
        out[b].error[lane][k] = lanes::spread_squared_error(x, s, s > 0.0f ? codec::recip_rn(s) : 0.0f, exchange);
      }
      float operand[kPer];
      lanes::spread_operand(x, code, operand);
      for (int i = 0; i < kPer; ++i) out[b].operand[lane][lane * kPer + i] = operand[i];
    }
  });
  return out;
}

// Every lane's results against the CPU codec, for finite blocks.
template <int kPer>
void expect_codec(const std::vector<Block>& blocks, nvfp4::ScaleMode mode) {
  constexpr int kLanes = codec::kBlock / kPer;
  const std::vector<LaneResults> got = run_lanes<kPer>(blocks, mode == nvfp4::ScaleMode::search);
  for (size_t b = 0; b < blocks.size(); ++b) {
    const Block& x = blocks[b];
    uint8_t codes[codec::kBlock / 2], scale = 0;
    nvfp4::quantize_rows_cpu(x.data(), 1, codec::kBlock, codes, &scale, mode);
    float want[codec::kBlock];
    nvfp4::dequantize_rows_cpu(codes, &scale, 1, codec::kBlock, want);
    float amax = 0.0f;
    for (float v : x) amax = codec::max_abs_nan(amax, v);
    for (int lane = 0; lane < kLanes; ++lane) {
      ASSERT_EQ(got[b].code[lane], scale) << kLanes << " lanes, lane " << lane << ", block " << b;
      for (int k = 0; k < 5; ++k) {
        bool valid = false;
        const int candidate = codec::search_candidate(codec::rne_scale_code(amax), k, valid);
        const float tree = codec::block_squared_error(x.data(), static_cast<uint8_t>(candidate));
        EXPECT_EQ(bits(got[b].error[lane][k]), bits(tree))
            << "the lanes' sum is not the tree's: " << kLanes << " lanes, lane " << lane << ", code " << candidate;
      }
      for (int i = 0; i < kPer; ++i)
        EXPECT_EQ(bits(got[b].operand[lane][lane * kPer + i]), bits(want[lane * kPer + i]))
            << kLanes << " lanes, element " << lane * kPer + i << " of block " << b;
    }
  }
}

void expect_codec_in_every_layout(const std::vector<Block>& blocks) {
  for (const nvfp4::ScaleMode mode : {nvfp4::ScaleMode::rne, nvfp4::ScaleMode::search}) {
    expect_codec<1>(blocks, mode);
    expect_codec<4>(blocks, mode);
    expect_codec<8>(blocks, mode);
  }
}

TEST(Nvfp4BlockLanes, ScaleAndOperandAreTheCodecsOnRandomBlocks) {
  std::mt19937 rng(7);
  std::vector<Block> blocks;
  for (const float sigma : {1e-30f, 1e-6f, 5e-3f, 1.0f, 300.0f, 1e30f}) {
    std::normal_distribution<float> normal(0.0f, sigma);
    for (int b = 0; b < 60; ++b) {
      Block x{};
      for (float& v : x) v = normal(rng);
      blocks.push_back(x);
    }
  }
  expect_codec_in_every_layout(blocks);
}

// Ties of the E2M1 grid, a lone non-zero element, an all-zero block and the largest finite values: where an order
// of the error sums or a rounding would show.
TEST(Nvfp4BlockLanes, ScaleAndOperandAreTheCodecsOnEdgeBlocks) {
  std::vector<Block> blocks;
  Block ties{};
  for (int i = 0; i < codec::kBlock; ++i) ties[i] = (i % 2 ? -0.25f : 0.25f) * static_cast<float>(1 + 2 * (i % 12));
  blocks.push_back(ties);
  Block lone{};
  lone[5] = 3.0e-3f;
  blocks.push_back(lone);
  blocks.push_back(Block{});
  Block big{};
  big.fill(std::numeric_limits<float>::max());
  big[3] = -1.0f;
  blocks.push_back(big);
  Block tiny{};
  tiny.fill(std::numeric_limits<float>::denorm_min());
  blocks.push_back(tiny);
  expect_codec_in_every_layout(blocks);
}

// A block with an infinite or NaN element, in each layout and in each place of a lane: the non-finite scale code
// in every lane (the kernels raise their flag) and NaN operand values, as the quantize kernels' operand of such a
// block decodes.
template <int kPer>
void expect_non_finite_scale() {
  for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<Block> blocks;
    for (int at = 0; at < codec::kBlock; at += 3) {
      Block x{};
      x.fill(0.5f);
      x[at] = bad;
      blocks.push_back(x);
    }
    for (const bool search : {false, true}) {
      const std::vector<LaneResults> got = run_lanes<kPer>(blocks, search);
      for (const LaneResults& r : got)
        for (size_t lane = 0; lane < r.code.size(); ++lane) {
          EXPECT_EQ(r.code[lane], codec::kNonFiniteBlockScale) << codec::kBlock / kPer << " lanes";
          EXPECT_TRUE(std::isnan(r.operand[lane][lane * kPer]));
        }
    }
  }
}

// The operand's bf16 pair from the top halves of its fp32 values equals bf16 round-to-nearest-even
// (bf16_nearest) of each: every E2M1 value of both signs times every finite E4M3 scale (those products are what an
// operand holds), and a non-finite block's NaN. Fails with the pair's halves swapped (checked).
TEST(Nvfp4BlockLanes, OperandPairIsTheBf16OfEachValue) {
  namespace adamw = kernels::adamw;
  std::vector<float> values;
  for (uint32_t scale_code = 0; scale_code < 0x7F; ++scale_code)
    for (uint32_t e2m1 = 0; e2m1 < 16; ++e2m1)
      values.push_back(codec::e2m1_to_float(e2m1) * codec::e4m3_to_float(static_cast<uint8_t>(scale_code)));
  int64_t checked = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const float low = values[i], high = values[(i * 37 + 11) % values.size()];
    const uint32_t want = adamw::bf16_nearest(low) | (static_cast<uint32_t>(adamw::bf16_nearest(high)) << 16);
    ASSERT_EQ(lanes::operand_bf16_pair(low, high, 0x38), want) << low << " " << high;
    ++checked;
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(lanes::operand_bf16_pair(nan, -nan, codec::kNonFiniteBlockScale),
            adamw::bf16_nearest(nan) | (static_cast<uint32_t>(adamw::bf16_nearest(-nan)) << 16));
  EXPECT_GT(checked, 2000);
}

// One warp of 32 lanes holding several blocks, one of them non-finite: every lane makes the same number of exchanges
// (on the device a full-warp shuffle that some lanes skip is undefined; before 2026-11-28 a non-finite block's lanes
// left the search before its exchanges, which this fails on: checked), and each block gets its own code, the
// codec's. Both modes, every layout.
template <int kPer>
void expect_uniform_exchanges(bool search) {
  constexpr int kLanes = codec::kBlock / kPer, kWarp = 32, kBlocksPerWarp = kWarp / kLanes;
  std::vector<Block> blocks(kBlocksPerWarp);
  for (int b = 0; b < kBlocksPerWarp; ++b)
    for (int i = 0; i < codec::kBlock; ++i) blocks[b][i] = 0.37f * static_cast<float>((b + 1) * (i % 5 - 2));
  blocks[1][3] = std::numeric_limits<float>::infinity();
  std::vector<uint8_t> codes(kWarp);
  test::LaneLockstep warp(kWarp);
  warp.run([&](int lane, const test::LaneLockstep::Exchange& exchange) {
    const int b = lane / kLanes, q = lane % kLanes;
    float x[kPer];
    for (int i = 0; i < kPer; ++i) x[i] = blocks[b][q * kPer + i];
    codes[lane] = lanes::spread_scale_code(x, search, exchange);
  });
  const std::vector<size_t> counts = warp.exchange_counts();
  const std::string what = std::to_string(kLanes) + " lanes a block, " + (search ? "search" : "rne");
  for (int lane = 0; lane < kWarp; ++lane) EXPECT_EQ(counts[lane], counts[0]) << what << ", lane " << lane;
  for (int b = 0; b < kBlocksPerWarp; ++b) {
    uint8_t packed[codec::kBlock / 2];
    const uint8_t want = codec::quantize_block(blocks[b].data(), search, packed);
    for (int q = 0; q < kLanes; ++q) EXPECT_EQ(codes[b * kLanes + q], want) << what << ", block " << b;
  }
}

TEST(Nvfp4BlockLanes, EveryLaneOfAWarpMakesTheSameExchanges) {
  for (const bool search : {false, true}) {
    expect_uniform_exchanges<1>(search);
    expect_uniform_exchanges<4>(search);
    expect_uniform_exchanges<8>(search);
  }
}

TEST(Nvfp4BlockLanes, NonFiniteBlocksGiveTheNanScale) {
  expect_non_finite_scale<1>();
  expect_non_finite_scale<4>();
  expect_non_finite_scale<8>();
}

}  // namespace
}  // namespace qwen3
