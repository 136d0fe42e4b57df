// The GPU's int8-moment AdamW work split (kernels/adamw_int8_lanes.cuh: eight lanes a 64-block, eight elements a
// lane) run on the host in the kernel's order, against the CPU step (src/optim/adamw_cpu.cpp): the bytes of
// master and state must be identical after three steps, with the block's row from the 32-bit division and from
// the 64-bit one. The kernel adds only shuffles to these functions (and, on the device, tabled levels and the
// approximate-log2 code, which give the same values: AdamWRules.*), so its indexing is checked here on every CI
// run; tests/gpu/test_adamw_kernel.cpp checks the kernel itself wherever a GPU is.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "adamw_int8_lanes.cuh"
#include "adamw_test_buffers.h"
#include "lane_lockstep.h"

namespace qwen3 {
namespace {

namespace ka = kernels::adamw;
namespace int8_split = kernels::adamw::int8_lanes;

// What int8_kernel does, with its shuffles as a maximum over the block's eight lanes: every lane of a block reads
// the old state (the block's step and maximum among it) before any lane of it writes. `pieces`: whether lanes move
// whole pieces where moves_whole_pieces allows (the kernel's choice) or always elements; `lanes_in_pieces` counts
// the lanes that did. With p.operand set, each lane then writes its half of the next forward's operand, the two
// lanes of each 16-block's pair on two host threads in lock-step (the kernel's shuffle partner, lane ^ 1).
void run_int8_split_on_host(const ka::ParamView& p, ka::StepScalars s, bool narrow, bool pieces,
                            int64_t& lanes_in_pieces) {
  if (!ka::take_device_grad_scale(s)) return;
  const int64_t total_blocks = p.rows * (p.stored_cols / ka::kInt8Block);
  const bool whole_pieces = pieces && int8_split::moves_whole_pieces(p);
  std::vector<int8_split::LanePosition> positions;
  std::vector<int8_split::SteppedMasters> stepped_lanes;
  for (int64_t block = 0; block < total_blocks; ++block) {
    int8_split::LanePosition at[int8_split::kLanesPerBlock];
    int8_split::LaneState state[int8_split::kLanesPerBlock];
    float m_amax = 0.0f, v_max = 0.0f;
    for (int lane = 0; lane < int8_split::kLanesPerBlock; ++lane) {
      at[lane] = int8_split::position(p, block, lane, narrow);
      state[lane] = int8_split::fresh(p, s, block, at[lane], ka::ComputedLevels{}, whole_pieces);
      lanes_in_pieces += ka::lane_in_pieces<int8_split::kPerLane>(p, at[lane].col0, whole_pieces) ? 1 : 0;
      m_amax = std::max(m_amax, state[lane].m_amax);
      v_max = std::max(v_max, state[lane].v_max);
    }
    for (int lane = 0; lane < int8_split::kLanesPerBlock; ++lane) {
      const int8_split::SteppedMasters stepped = int8_split::store(p, s, block, at[lane], lane, state[lane], m_amax,
                                                                   v_max, ka::ComputedLevels{}, whole_pieces);
      positions.push_back(at[lane]);
      stepped_lanes.push_back(stepped);
    }
  }
  if (p.operand == nullptr) return;
  // Thread t takes lane 2j + t of every pair j of every block.
  test::LaneLockstep pair(2);
  pair.run([&](int t, const test::LaneLockstep::Exchange& exchange) {
    for (size_t first = 0; first < positions.size(); first += 2) {
      const int8_split::LanePosition& at = positions[first + t];
      const int lane = static_cast<int>((first + t) % int8_split::kLanesPerBlock);
      int8_split::write_operand(p, at, lane, at.col0 < p.cols, stepped_lanes[first + t], whole_pieces, exchange);
    }
  });
}

struct Int8SplitCase {
  bool bf16_master, bf16_grad, narrow, pieces;
};

class AdamWInt8Lanes : public ::testing::TestWithParam<Int8SplitCase> {};

// The test shapes' rows of 2560 and 80 columns (multiples of 8) in malloc'ed, 16-byte aligned buffers move most
// lanes as pieces; 37 and 29 columns, and the 80-column rows' padded end, move elements.
TEST_P(AdamWInt8Lanes, ThreeStepsEqualTheCpuStepByteForByte) {
  const Int8SplitCase c = GetParam();
  int64_t lanes_in_pieces = 0;
  adamw_test::expect_split_equals_cpu_step(
      ka::Moments::int8, c.bf16_master, c.bf16_grad, [&](const ka::ParamView& p, const ka::StepScalars& s) {
        run_int8_split_on_host(p, s, c.narrow, c.pieces, lanes_in_pieces);
      });
  if (c.pieces) {
    EXPECT_GT(lanes_in_pieces, 0) << "no lane moved whole pieces: the pieces path went untested";
  }
}

INSTANTIATE_TEST_SUITE_P(MasterAndGradientDtypes, AdamWInt8Lanes,
                         ::testing::Values(Int8SplitCase{false, false, true, true},
                                           Int8SplitCase{true, true, true, true},
                                           Int8SplitCase{false, true, false, true},
                                           Int8SplitCase{true, false, false, true},
                                           Int8SplitCase{false, false, true, false},
                                           Int8SplitCase{true, true, true, false}),
                         [](const ::testing::TestParamInfo<Int8SplitCase>& info) {
                           return std::string(info.param.bf16_master ? "bf16" : "f32") + "_master_" +
                                  (info.param.bf16_grad ? "bf16" : "f32") + "_grad_" +
                                  (info.param.narrow ? "narrow" : "wide") + "_division" +
                                  (info.param.pieces ? "" : "_elements_only");
                         });

// --keep-weight-operands always with int8 moments: the operand the lane pairs write after each step is the CPU
// codec's quantize and dequantize of the stepped master (adamw_test_buffers.h).
TEST(AdamWInt8Lanes, OperandIsTheCodecsQuantizeOfTheSteppedMaster) {
  adamw_test::expect_operand_is_the_codecs(ka::Moments::int8, [](const ka::ParamView& p, const ka::StepScalars& s,
                                                                 bool pieces) {
    int64_t lanes_in_pieces = 0;
    run_int8_split_on_host(p, s, /*narrow=*/true, pieces, lanes_in_pieces);
  });
}

TEST(AdamWInt8Lanes, WholePiecesNeedRowsOfEightsAndAlignedBuffers) {
  alignas(16) static uint8_t buffer[64];
  ka::ParamView p{};
  p.master = buffer, p.grad = buffer, p.exp_avg = buffer, p.exp_avg_sq = buffer, p.cols = 2560;
  EXPECT_TRUE(int8_split::moves_whole_pieces(p));
  p.cols = 2561;  // a row's lanes would start off the 8-element grid
  EXPECT_FALSE(int8_split::moves_whole_pieces(p));
  p.cols = 2560, p.master = buffer + 8;  // 8-byte aligned: not enough for the 16-byte master pieces
  EXPECT_FALSE(int8_split::moves_whole_pieces(p));
  p.master = buffer, p.exp_avg_sq = buffer + 4;
  EXPECT_FALSE(int8_split::moves_whole_pieces(p));
}

}  // namespace
}  // namespace qwen3
