// Gradient clipping, learning-rate schedules and the optimizer's names for its storage modes.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "gpu_test.h"
#include "optim_test_util.h"
#include "qwen3/base/error.h"
#include "qwen3/memory/memory_probe.h"
#include "qwen3/optim/optim.h"

namespace qwen3 {
namespace {

using optim_test::make_param;
using optim_test::set_grad;

std::vector<OptimParam> params_with_grads(const std::vector<at::Tensor>& grads) {
  std::vector<OptimParam> params;
  for (size_t i = 0; i < grads.size(); ++i) {
    params.push_back(make_param("p" + std::to_string(i), at::zeros(grads[i].sizes(), grads[i].scalar_type())));
    set_grad(params.back(), grads[i]);
  }
  return params;
}

TEST(ClipGradNorm, ReturnsTheGlobalNormAndScalesAboveTheLimit) {
  // 3-4-12 makes 13: (3, 4) in one tensor, 12 in another, a bf16 tensor of zeros.
  const auto params = params_with_grads({at::tensor({3.0f, 4.0f}), at::tensor({{12.0f}}), at::zeros({5}, at::kBFloat16)});
  EXPECT_DOUBLE_EQ(clip_grad_norm(params, 0.0), 13.0);  // 0: measure only
  EXPECT_TRUE(params[0].param.grad().equal(at::tensor({3.0f, 4.0f})));
  EXPECT_DOUBLE_EQ(clip_grad_norm(params, 20.0), 13.0);  // below the limit: unchanged
  EXPECT_TRUE(params[1].param.grad().equal(at::tensor({{12.0f}})));
  EXPECT_DOUBLE_EQ(clip_grad_norm(params, 1.0), 13.0);
  const float scale = static_cast<float>(1.0 / (13.0 + 1e-6));
  EXPECT_TRUE(at::allclose(params[0].param.grad(), at::tensor({3.0f, 4.0f}) * scale, 1e-6, 0));
  EXPECT_TRUE(at::allclose(params[1].param.grad(), at::tensor({{12.0f}}) * scale, 1e-6, 0));
  EXPECT_NEAR(clip_grad_norm(params, 0.0), 1.0, 1e-6);
}

TEST(ClipGradNorm, NonFiniteNormsPassThroughAndLeaveGradientsAlone) {
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    const auto params = params_with_grads({at::tensor({3.0f, 4.0f}), at::tensor({bad, 1.0f})});
    const double norm = clip_grad_norm(params, 1.0);
    EXPECT_FALSE(std::isfinite(norm));
    EXPECT_EQ(std::isnan(norm), std::isnan(bad));
    EXPECT_TRUE(params[0].param.grad().equal(at::tensor({3.0f, 4.0f})));
  }
}

TEST(ClipGradNorm, CountsBf16GradientsAndIgnoresMissingOnes) {
  auto params = params_with_grads({at::ones({64, 64}, at::kBFloat16)});
  params.push_back(make_param("no_grad", at::ones({3})));
  EXPECT_DOUBLE_EQ(clip_grad_norm(params, 0.0), 64.0);
  EXPECT_EQ(clip_grad_norm({}, 1.0), 0.0);
}

// On CUDA the norm reads each gradient once: the CPU path's fp32 copy of a piece and its square (up to 16M
// elements a piece on a device) were 8 bytes an element written and read again, the step's largest temporaries.
TEST(ClipGradNorm, GpuReadsBf16GradientsWithoutAnFp32Copy) {
  QWEN3_GPU_TEST(at::hasCUDA());
  const at::Tensor cpu = at::randn({4096, 4096}).to(at::kBFloat16);  // 32 MB; one piece on a device
  const at::Tensor grad = cpu.to(at::kCUDA);
  const double expected = square_sum_fp32(cpu).item<double>();
  MemoryProbe probe(grad.device());
  probe.reset_peaks();
  const uint64_t before = probe.read().allocated;
  const double got = square_sum_fp32(grad).item<double>();
  const uint64_t extra = probe.read().peak - before;
  EXPECT_NEAR(got, expected, expected * 1e-5);
  EXPECT_LT(extra, static_cast<uint64_t>(grad.numel())) << "bytes allocated beyond the gradient";
}

TEST(LrSchedule, ConstantWithWarmup) {
  const LrSchedule s{LrScheduleKind::constant, 1e-3, 4, 100, 0.0};
  EXPECT_DOUBLE_EQ(s.at(0), 0.25e-3);
  EXPECT_DOUBLE_EQ(s.at(1), 0.5e-3);
  EXPECT_DOUBLE_EQ(s.at(3), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(4), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(1000), 1e-3);
  EXPECT_DOUBLE_EQ((LrSchedule{LrScheduleKind::constant, 2e-5, 0, 1, 0.0}).at(0), 2e-5);
}

TEST(LrSchedule, CosineFromLrToMinLrAtTotalSteps) {
  const LrSchedule s{LrScheduleKind::cosine, 1e-3, 10, 110, 1e-4};
  EXPECT_DOUBLE_EQ(s.at(9), 1e-3);     // the last warmup step
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);    // decay starts from the peak
  EXPECT_NEAR(s.at(60), 5.5e-4, 1e-15);  // half way: the mean of lr and min_lr
  EXPECT_NEAR(s.at(35), 1e-4 + 0.9e-3 * 0.5 * (1 + std::cos(M_PI / 4)), 1e-15);
  EXPECT_DOUBLE_EQ(s.at(110), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(500), 1e-4);
  for (int64_t step = 10; step < 110; ++step) EXPECT_GT(s.at(step), s.at(step + 1)) << step;
}

TEST(LrSchedule, LinearFromLrToMinLrAtTotalSteps) {
  const LrSchedule s{LrScheduleKind::linear, 1e-3, 0, 100, 0.0};
  EXPECT_DOUBLE_EQ(s.at(0), 1e-3);
  EXPECT_NEAR(s.at(25), 0.75e-3, 1e-15);
  EXPECT_NEAR(s.at(99), 1e-5, 1e-15);
  EXPECT_DOUBLE_EQ(s.at(100), 0.0);
  const LrSchedule warm{LrScheduleKind::linear, 1e-3, 20, 100, 2e-4};
  EXPECT_DOUBLE_EQ(warm.at(0), 0.05e-3);
  EXPECT_DOUBLE_EQ(warm.at(20), 1e-3);
  EXPECT_NEAR(warm.at(60), 6e-4, 1e-15);
  EXPECT_DOUBLE_EQ(warm.at(100), 2e-4);
}

TEST(LrSchedule, BadSchedulesAreUsageErrors) {
  EXPECT_THROW(parse_lr_schedule_kind("step"), UsageError);
  EXPECT_EQ(parse_lr_schedule_kind("cosine"), LrScheduleKind::cosine);
  EXPECT_STREQ(to_string(LrScheduleKind::linear), "linear");
  EXPECT_THROW((LrSchedule{LrScheduleKind::cosine, 1e-3, -1, 10, 0.0}).at(0), UsageError);
  EXPECT_THROW((LrSchedule{LrScheduleKind::cosine, 1e-3, 0, 0, 0.0}).at(0), UsageError);
  EXPECT_THROW((LrSchedule{LrScheduleKind::cosine, 1e-3, 0, 10, 2e-3}).at(0), UsageError);
  EXPECT_THROW((LrSchedule{LrScheduleKind::cosine, -1.0, 0, 10, 0.0}).at(0), UsageError);
}

TEST(OptimNames, MomentStorageNamesRoundTrip) {
  for (MomentStorage s : {MomentStorage::float32, MomentStorage::bfloat16, MomentStorage::int8, MomentStorage::nvfp4})
    EXPECT_EQ(moment_storage_from_name(moment_storage_name(s)), s);
  EXPECT_THROW(moment_storage_from_name("fp8"), UsageError);
  EXPECT_THROW(moment_storage_from_name("Float32"), UsageError);
}

}  // namespace
}  // namespace qwen3
