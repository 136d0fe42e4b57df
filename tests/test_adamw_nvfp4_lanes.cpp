// The GPU's nvfp4-moment AdamW work split (kernels/adamw_nvfp4_lanes.cuh: four lanes a 16-block, four elements a
// lane) run on the host in the kernel's order, against the CPU step (src/optim/adamw_cpu.cpp): the bytes of
// master and state must be identical after three steps. The kernel adds only shuffles and barriers to these
// functions, so its indexing is checked here on every CI run; tests/gpu/test_adamw_kernel.cpp checks the kernel
// itself wherever a GPU is.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "adamw_nvfp4_lanes.cuh"
#include "adamw_test_buffers.h"
#include "lane_lockstep.h"

namespace qwen3 {
namespace {

namespace ka = kernels::adamw;
namespace lanes = kernels::adamw::nvfp4_lanes;

// What nvfp4_kernel does, with its shuffles as a maximum over the block's four lanes and its barriers as the
// order of the loops: every lane of a block reads the old state before any lane of it writes.
// `pieces`: whether lanes move whole pieces where moves_whole_pieces allows (the kernel's choice) or always
// elements; `lanes_in_pieces` counts the lanes that did. With p.operand set, each lane then writes its four
// elements of the next forward's operand, the four lanes of each block on the host in lock-step (the kernel's
// shuffles over lane ^ 1 and lane ^ 2).
void run_nvfp4_split_on_host(const ka::ParamView& p, ka::StepScalars s, bool pieces, int64_t& lanes_in_pieces) {
  if (!ka::take_device_grad_scale(s)) return;
  const bool whole = pieces && lanes::moves_whole_pieces(p);
  const int64_t blocks = p.stored_cols / ka::kNvfp4Block;
  std::vector<lanes::SteppedMasters> stepped;  // [row][block][lane]
  for (int64_t row = 0; row < p.rows; ++row) {
    const float old_m_row = p.exp_avg_row_scale[row], old_v_row = p.exp_avg_sq_row_scale[row];
    float m_max = 0.0f, v_max = 0.0f;
    for (int64_t b = 0; b < blocks; ++b)
      for (int lane = 0; lane < lanes::kLanesPerBlock; ++lane)
        lanes::row_maxima(lanes::fresh(p, s, row, b, lane, old_m_row, old_v_row, whole), m_max, v_max);
    const float m_row = ka::nvfp4_row_scale(m_max), v_row = ka::nvfp4_row_scale(std::sqrt(v_max));
    for (int64_t b = 0; b < blocks; ++b) {
      lanes::LaneMoments moments[lanes::kLanesPerBlock];
      lanes::LaneMasters masters[lanes::kLanesPerBlock];
      lanes::LaneNormalized normalized[lanes::kLanesPerBlock];
      float m_amax = 0.0f, root_amax = 0.0f;
      for (int lane = 0; lane < lanes::kLanesPerBlock; ++lane) {
        moments[lane] = lanes::fresh(p, s, row, b, lane, old_m_row, old_v_row, whole);
        masters[lane] = lanes::load_masters(p, row, b, lane, whole);
        lanes_in_pieces += ka::lane_in_pieces<lanes::kPerLane>(p, lanes::first_column(b, lane), whole) ? 1 : 0;
        normalized[lane] = lanes::normalize(moments[lane], ka::block_divisor(m_row), ka::block_divisor(v_row));
        m_amax = std::max(m_amax, normalized[lane].m_amax);
        root_amax = std::max(root_amax, normalized[lane].root_amax);
      }
      for (int lane = 0; lane < lanes::kLanesPerBlock; ++lane)
        stepped.push_back(lanes::store(p, s, row, b, lane, moments[lane], masters[lane], normalized[lane],
                                       ka::nvfp4_unclipped_scale_code(m_amax),
                                       ka::nvfp4_unclipped_scale_code(root_amax), ka::ComputedSquareGaps{}, whole));
    }
    p.exp_avg_row_scale[row] = m_row;
    p.exp_avg_sq_row_scale[row] = v_row;
  }
  if (p.operand == nullptr) return;
  test::LaneLockstep group(lanes::kLanesPerBlock);
  group.run([&](int lane, const test::LaneLockstep::Exchange& exchange) {
    for (int64_t row = 0; row < p.rows; ++row)
      for (int64_t b = 0; b < blocks; ++b)
        lanes::write_operand(p, row, b, lane, true, stepped[(row * blocks + b) * lanes::kLanesPerBlock + lane], whole,
                             exchange);
  });
}

// --keep-weight-operands always with nvfp4 moments: the operand the four lanes of each block write after each step
// is the CPU codec's quantize and dequantize of the stepped master (adamw_test_buffers.h).
TEST(AdamWNvfp4Lanes, OperandIsTheCodecsQuantizeOfTheSteppedMaster) {
  adamw_test::expect_operand_is_the_codecs(ka::Moments::nvfp4, [](const ka::ParamView& p, const ka::StepScalars& s,
                                                                  bool pieces) {
    int64_t lanes_in_pieces = 0;
    run_nvfp4_split_on_host(p, s, pieces, lanes_in_pieces);
  });
}

struct SplitCase {
  bool bf16_master, bf16_grad, pieces;
};

class AdamWNvfp4Lanes : public ::testing::TestWithParam<SplitCase> {};

// The test shapes' rows of 2560 and 80 columns (multiples of 4) in malloc'ed, 16-byte aligned buffers move most
// lanes as pieces; 37 and 29 columns, and the padded ends, move elements.
TEST_P(AdamWNvfp4Lanes, ThreeStepsEqualTheCpuStepByteForByte) {
  const SplitCase c = GetParam();
  int64_t lanes_in_pieces = 0;
  adamw_test::expect_split_equals_cpu_step(
      ka::Moments::nvfp4, c.bf16_master, c.bf16_grad, [&](const ka::ParamView& p, const ka::StepScalars& s) {
        run_nvfp4_split_on_host(p, s, c.pieces, lanes_in_pieces);
      });
  if (c.pieces) {
    EXPECT_GT(lanes_in_pieces, 0) << "no lane moved whole pieces: the pieces path went untested";
  }
}

INSTANTIATE_TEST_SUITE_P(MasterAndGradientDtypes, AdamWNvfp4Lanes,
                         ::testing::Values(SplitCase{false, false, true}, SplitCase{true, true, true},
                                           SplitCase{false, true, true}, SplitCase{true, false, true},
                                           SplitCase{false, false, false}, SplitCase{true, true, false}),
                         [](const ::testing::TestParamInfo<SplitCase>& info) {
                           return std::string(info.param.bf16_master ? "bf16_master" : "f32_master") +
                                  (info.param.bf16_grad ? "_bf16_grad" : "_f32_grad") +
                                  (info.param.pieces ? "" : "_elements_only");
                         });

}  // namespace
}  // namespace qwen3
