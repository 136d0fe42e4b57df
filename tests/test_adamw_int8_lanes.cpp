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

#include "adamw_int8_lanes.cuh"
#include "adamw_test_buffers.h"

namespace qwen3 {
namespace {

namespace ka = kernels::adamw;
namespace int8_split = kernels::adamw::int8_lanes;

// What int8_kernel does, with its shuffles as a maximum over the block's eight lanes: every lane of a block reads
// the old state (the block's step and maximum among it) before any lane of it writes.
void run_int8_split_on_host(const ka::ParamView& p, ka::StepScalars s, bool narrow) {
  if (!ka::take_device_grad_scale(s)) return;
  const int64_t total_blocks = p.rows * (p.stored_cols / ka::kInt8Block);
  for (int64_t block = 0; block < total_blocks; ++block) {
    int8_split::LanePosition at[int8_split::kLanesPerBlock];
    int8_split::LaneState state[int8_split::kLanesPerBlock];
    float m_amax = 0.0f, v_max = 0.0f;
    for (int lane = 0; lane < int8_split::kLanesPerBlock; ++lane) {
      at[lane] = int8_split::position(p, block, lane, narrow);
      state[lane] = int8_split::fresh(p, s, block, at[lane], ka::ComputedLevels{});
      m_amax = std::max(m_amax, state[lane].m_amax);
      v_max = std::max(v_max, state[lane].v_max);
    }
    for (int lane = 0; lane < int8_split::kLanesPerBlock; ++lane)
      int8_split::store(p, s, block, at[lane], lane, state[lane], m_amax, v_max, ka::ComputedLevels{});
  }
}

struct Int8SplitCase {
  bool bf16_master, bf16_grad, narrow;
};

class AdamWInt8Lanes : public ::testing::TestWithParam<Int8SplitCase> {};

TEST_P(AdamWInt8Lanes, ThreeStepsEqualTheCpuStepByteForByte) {
  const Int8SplitCase c = GetParam();
  adamw_test::expect_split_equals_cpu_step(
      ka::Moments::int8, c.bf16_master, c.bf16_grad,
      [&](const ka::ParamView& p, const ka::StepScalars& s) { run_int8_split_on_host(p, s, c.narrow); });
}

INSTANTIATE_TEST_SUITE_P(MasterAndGradientDtypes, AdamWInt8Lanes,
                         ::testing::Values(Int8SplitCase{false, false, true}, Int8SplitCase{true, true, true},
                                           Int8SplitCase{false, true, false}, Int8SplitCase{true, false, false}),
                         [](const ::testing::TestParamInfo<Int8SplitCase>& info) {
                           return std::string(info.param.bf16_master ? "bf16" : "f32") + "_master_" +
                                  (info.param.bf16_grad ? "bf16" : "f32") + "_grad_" +
                                  (info.param.narrow ? "narrow" : "wide") + "_division";
                         });

}  // namespace
}  // namespace qwen3
