// The GPU's plain-moment AdamW work split that writes the next forward's operand (kernels/adamw_plain_lanes.cuh:
// four consecutive elements a lane, four lanes a 16-block) run on the host in the kernel's order, against the CPU
// step (src/optim/adamw_cpu.cpp) byte for byte after three steps, and its operand against the CPU codec's
// quantize and dequantize of the stepped master. The kernel adds only shuffles to these functions, so its
// indexing is checked here on every CI run; tests/gpu/test_adamw_kernel.cpp (GpuAdamWKernelOperand.*) checks the
// kernel itself wherever a GPU is.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "adamw_plain_lanes.cuh"
#include "adamw_test_buffers.h"
#include "lane_lockstep.h"

namespace qwen3 {
namespace {

namespace ka = kernels::adamw;
namespace plain_split = kernels::adamw::plain_lanes;

// What plain_operand_kernel does for every lane of every tile: the lane's update, then (with p.operand set) the
// operand, each 16-block's four lanes on LaneLockstep's four host lanes (the kernel's shuffle partners, lane ^ 1
// and lane ^ 2). `pieces`: whether lanes move whole pieces where moves_whole_pieces allows (the kernel's choice)
// or always elements; `lanes_in_pieces` counts the lanes that did.
template <bool kBf16Moments>
void run_plain_split_with_moments(const ka::ParamView& p, ka::StepScalars s, bool pieces, int64_t& lanes_in_pieces) {
  if (!ka::take_device_grad_scale(s)) return;
  const int64_t total = p.rows * p.cols;
  const bool whole_pieces = pieces && plain_split::moves_whole_pieces(p);
  const int64_t lanes = (total + plain_split::kPerLane - 1) / plain_split::kPerLane;
  std::vector<plain_split::SteppedMasters> stepped(static_cast<size_t>(lanes));
  for (int64_t lane = 0; lane < lanes; ++lane) {
    const int64_t first = lane * plain_split::kPerLane;
    const plain_split::LaneState state = plain_split::fresh<kBf16Moments>(p, s, first, total, whole_pieces);
    stepped[static_cast<size_t>(lane)] = plain_split::store<kBf16Moments>(p, s, first, total, state, whole_pieces);
    lanes_in_pieces += whole_pieces && first + plain_split::kPerLane <= total ? 1 : 0;
  }
  if (p.operand == nullptr) return;
  // Host lane t takes lane 4b + t of every 16-block b.
  test::LaneLockstep block(plain_split::kLanesPerBlock);
  block.run([&](int t, const test::LaneLockstep::Exchange& exchange) {
    for (int64_t first_lane = 0; first_lane < lanes; first_lane += plain_split::kLanesPerBlock) {
      const int64_t lane = first_lane + t;
      const int64_t first = lane * plain_split::kPerLane;
      const bool here = first < total;
      plain_split::SteppedMasters values{};
      if (here) values = stepped[static_cast<size_t>(lane)];
      plain_split::write_operand(p, first, t, here, values, whole_pieces, exchange);
    }
  });
}

void run_plain_split_on_host(const ka::ParamView& p, const ka::StepScalars& s, bool pieces, int64_t& lanes_in_pieces) {
  if (p.moments == ka::Moments::bf16) run_plain_split_with_moments<true>(p, s, pieces, lanes_in_pieces);
  else run_plain_split_with_moments<false>(p, s, pieces, lanes_in_pieces);
}

struct PlainSplitCase {
  bool bf16_moments, bf16_master, bf16_grad, pieces;
};

class AdamWPlainLanes : public ::testing::TestWithParam<PlainSplitCase> {};

// Of the test shapes, 7 x 2560 and 300 x 80 (a multiple of four elements, malloc'ed 16-byte aligned buffers) move
// whole pieces; 13 x 37 and 1 x 29 elements, their last lane past the end.
TEST_P(AdamWPlainLanes, ThreeStepsEqualTheCpuStepByteForByte) {
  const PlainSplitCase c = GetParam();
  int64_t lanes_in_pieces = 0;
  adamw_test::expect_split_equals_cpu_step(
      c.bf16_moments ? ka::Moments::bf16 : ka::Moments::f32, c.bf16_master, c.bf16_grad,
      [&](const ka::ParamView& p, const ka::StepScalars& s) {
        run_plain_split_on_host(p, s, c.pieces, lanes_in_pieces);
      });
  if (c.pieces) {
    EXPECT_GT(lanes_in_pieces, 0) << "no lane moved whole pieces: the pieces path went untested";
  }
}

INSTANTIATE_TEST_SUITE_P(MomentMasterAndGradientDtypes, AdamWPlainLanes,
                         ::testing::Values(PlainSplitCase{false, false, false, true},
                                           PlainSplitCase{false, true, true, true},
                                           PlainSplitCase{false, true, false, true},
                                           PlainSplitCase{true, false, true, true},
                                           PlainSplitCase{true, true, true, true},
                                           PlainSplitCase{false, false, false, false},
                                           PlainSplitCase{true, true, true, false}),
                         [](const ::testing::TestParamInfo<PlainSplitCase>& info) {
                           return std::string(info.param.bf16_moments ? "bf16" : "f32") + "_moments_" +
                                  (info.param.bf16_master ? "bf16" : "f32") + "_master_" +
                                  (info.param.bf16_grad ? "bf16" : "f32") + "_grad" +
                                  (info.param.pieces ? "" : "_elements_only");
                         });

// --keep-weight-operands always with plain moments: the operand the lanes write after each step is the CPU
// codec's quantize and dequantize of the stepped master (adamw_test_buffers.h), both moment dtypes.
TEST(AdamWPlainLanes, OperandIsTheCodecsQuantizeOfTheSteppedMaster) {
  for (const ka::Moments moments : {ka::Moments::f32, ka::Moments::bf16}) {
    SCOPED_TRACE(moments == ka::Moments::f32 ? "fp32 moments" : "bf16 moments");
    adamw_test::expect_operand_is_the_codecs(moments,
                                             [](const ka::ParamView& p, const ka::StepScalars& s, bool pieces) {
                                               int64_t lanes_in_pieces = 0;
                                               run_plain_split_on_host(p, s, pieces, lanes_in_pieces);
                                             });
  }
}

TEST(AdamWPlainLanes, WholePiecesNeedWholePiecesAndAlignedBuffers) {
  alignas(16) static uint8_t buffer[64];
  ka::ParamView p{};
  p.master = buffer, p.grad = buffer, p.exp_avg = buffer, p.exp_avg_sq = buffer, p.rows = 3, p.cols = 2560;
  EXPECT_TRUE(plain_split::moves_whole_pieces(p));
  p.cols = 2561;  // 7,683 elements: the last lane would run past the end
  EXPECT_FALSE(plain_split::moves_whole_pieces(p));
  p.cols = 2560, p.master = buffer + 8;  // 8-byte aligned: not enough for an fp32 piece
  EXPECT_FALSE(plain_split::moves_whole_pieces(p));
  p.master = buffer, p.exp_avg_sq = buffer + 4;
  EXPECT_FALSE(plain_split::moves_whole_pieces(p));
  p.exp_avg_sq = buffer, p.operand = reinterpret_cast<uint16_t*>(buffer + 2);  // the operand's 8-byte pieces
  EXPECT_FALSE(plain_split::moves_whole_pieces(p));
  p.operand = reinterpret_cast<uint16_t*>(buffer + 8);
  EXPECT_TRUE(plain_split::moves_whole_pieces(p));
}

}  // namespace
}  // namespace qwen3
