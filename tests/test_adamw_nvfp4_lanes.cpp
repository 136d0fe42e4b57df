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
#include "optim/adamw_step.h"

namespace qwen3 {
namespace {

namespace ka = kernels::adamw;
namespace lanes = kernels::adamw::nvfp4_lanes;
using adamw_test::HostParam;
using adamw_test::scalars_for;

// What nvfp4_kernel does, with its shuffles as a maximum over the block's four lanes and its barriers as the
// order of the loops: every lane of a block reads the old state before any lane of it writes.
void run_nvfp4_split_on_host(const ka::ParamView& p, ka::StepScalars s) {
  if (!ka::take_device_grad_scale(s)) return;
  const int64_t blocks = p.stored_cols / ka::kNvfp4Block;
  for (int64_t row = 0; row < p.rows; ++row) {
    const float old_m_row = p.exp_avg_row_scale[row], old_v_row = p.exp_avg_sq_row_scale[row];
    float m_max = 0.0f, v_max = 0.0f;
    for (int64_t b = 0; b < blocks; ++b)
      for (int lane = 0; lane < lanes::kLanesPerBlock; ++lane)
        lanes::row_maxima(lanes::fresh(p, s, row, b, lane, old_m_row, old_v_row), m_max, v_max);
    const float m_row = ka::nvfp4_row_scale(m_max), v_row = ka::nvfp4_row_scale(std::sqrt(v_max));
    for (int64_t b = 0; b < blocks; ++b) {
      lanes::LaneMoments moments[lanes::kLanesPerBlock];
      lanes::LaneMasters masters[lanes::kLanesPerBlock];
      lanes::LaneNormalized normalized[lanes::kLanesPerBlock];
      float m_amax = 0.0f, root_amax = 0.0f;
      for (int lane = 0; lane < lanes::kLanesPerBlock; ++lane) {
        moments[lane] = lanes::fresh(p, s, row, b, lane, old_m_row, old_v_row);
        masters[lane] = lanes::load_masters(p, row, b, lane);
        normalized[lane] = lanes::normalize(moments[lane], ka::block_divisor(m_row), ka::block_divisor(v_row));
        m_amax = std::max(m_amax, normalized[lane].m_amax);
        root_amax = std::max(root_amax, normalized[lane].root_amax);
      }
      for (int lane = 0; lane < lanes::kLanesPerBlock; ++lane)
        lanes::store(p, s, row, b, lane, moments[lane], masters[lane], normalized[lane], ka::nvfp4_unclipped_scale_code(m_amax),
                     ka::nvfp4_unclipped_scale_code(root_amax));
    }
    p.exp_avg_row_scale[row] = m_row;
    p.exp_avg_sq_row_scale[row] = v_row;
  }
}

struct SplitCase {
  bool bf16_master, bf16_grad;
};

class AdamWNvfp4Lanes : public ::testing::TestWithParam<SplitCase> {};

TEST_P(AdamWNvfp4Lanes, ThreeStepsEqualTheCpuStepByteForByte) {
  const SplitCase c = GetParam();
  // Rows shorter than a block, padded rows, a row of 160 blocks (Qwen3-4B's hidden size), many short rows.
  for (const auto& shape : {std::pair<int64_t, int64_t>{13, 37}, {1, 29}, {7, 2560}, {300, 80}}) {
    HostParam cpu(shape.first, shape.second, ka::Moments::nvfp4, c.bf16_master, c.bf16_grad);
    HostParam split = cpu;
    const auto view = [](HostParam& h) {
      return h.view(h.master.data(), h.grad.data(), h.exp_avg.data(), h.exp_avg_sq.data(), h.exp_avg_scale.data(),
                    h.exp_avg_sq_scale.data(), h.m_row.data(), h.v_row.data());
    };
    for (int step = 1; step <= 3; ++step) {
      cpu.set_grad(step);
      split.set_grad(step);
      const ka::StepScalars s = scalars_for(step, step == 2);
      optim_detail::adamw_step_cpu(view(cpu), s, 0);
      run_nvfp4_split_on_host(view(split), s);
    }
    const auto shape_text = std::to_string(shape.first) + " x " + std::to_string(shape.second);
    EXPECT_EQ(split.master, cpu.master) << shape_text;
    EXPECT_EQ(split.exp_avg, cpu.exp_avg) << shape_text;
    EXPECT_EQ(split.exp_avg_sq, cpu.exp_avg_sq) << shape_text;
    EXPECT_EQ(split.exp_avg_scale, cpu.exp_avg_scale) << shape_text;
    EXPECT_EQ(split.exp_avg_sq_scale, cpu.exp_avg_sq_scale) << shape_text;
    EXPECT_EQ(split.m_row, cpu.m_row) << shape_text;
    EXPECT_EQ(split.v_row, cpu.v_row) << shape_text;
  }
}

INSTANTIATE_TEST_SUITE_P(MasterAndGradientDtypes, AdamWNvfp4Lanes,
                         ::testing::Values(SplitCase{false, false}, SplitCase{true, true}, SplitCase{false, true},
                                           SplitCase{true, false}),
                         [](const ::testing::TestParamInfo<SplitCase>& info) {
                           return std::string(info.param.bf16_master ? "bf16_master" : "f32_master") +
                                  (info.param.bf16_grad ? "_bf16_grad" : "_f32_grad");
                         });

}  // namespace
}  // namespace qwen3
