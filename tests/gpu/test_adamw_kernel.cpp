// The fused AdamW kernel (kernels/adamw_step.cu) against the CPU step (src/optim/adamw_cpu.cpp) on raw buffers:
// every moment storage, both master and gradient dtypes, rows that are not a whole number of blocks, several
// steps with weight decay and clipping; the bytes of master and state must be identical. No libtorch tensors
// on the device, so this runs with any libtorch wherever a GPU is. The argument checks need no GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "adamw_test_buffers.h"
#include "gpu/gpu_test_util.h"
#include "optim/adamw_step.h"
#include "qwen3_kernels.h"

namespace qwen3 {
namespace {

namespace ka = kernels::adamw;
using gpu_test::DeviceBuffer;
using gpu_test::kInvalidValue;

using adamw_test::HostParam;
using adamw_test::scalars_for;

struct KernelCase {
  ka::Moments moments;
  bool bf16_master, bf16_grad;
};

std::string case_name(const KernelCase& c) {
  const char* names[] = {"f32", "bf16", "int8", "nvfp4"};
  return std::string(names[static_cast<int>(c.moments)]) + (c.bf16_master ? "_bf16_master" : "_f32_master") +
         (c.bf16_grad ? "_bf16_grad" : "_f32_grad");
}

class GpuAdamWKernel : public ::testing::TestWithParam<KernelCase> {};

TEST_P(GpuAdamWKernel, ThreeStepsEqualTheCpuStepByteForByte) {
  QWEN3_REQUIRE_GPU();
  const KernelCase c = GetParam();
  for (const auto& shape : {std::pair<int64_t, int64_t>{13, 37}, {1, 29}, {70, 2560}, {300, 80}}) {
    HostParam cpu(shape.first, shape.second, c.moments, c.bf16_master, c.bf16_grad);
    std::vector<std::vector<uint8_t>*> buffers{&cpu.master, &cpu.grad, &cpu.exp_avg, &cpu.exp_avg_sq,
                                               &cpu.exp_avg_scale, &cpu.exp_avg_sq_scale, &cpu.m_row, &cpu.v_row};
    std::vector<std::unique_ptr<DeviceBuffer>> device;
    for (auto* b : buffers) device.push_back(std::make_unique<DeviceBuffer>(b->size() + 16));
    for (size_t i = 0; i < buffers.size(); ++i)
      QWEN3_CUDA_OK(cudaMemcpy(device[i]->at(), buffers[i]->data(), buffers[i]->size(), cudaMemcpyHostToDevice));
    for (int step = 1; step <= 3; ++step) {
      cpu.set_grad(step);
      QWEN3_CUDA_OK(cudaMemcpy(device[1]->at(), cpu.grad.data(), cpu.grad.size(), cudaMemcpyHostToDevice));
      const ka::StepScalars s = scalars_for(step, step == 2);
      optim_detail::adamw_step_cpu(cpu.view(cpu.master.data(), cpu.grad.data(), cpu.exp_avg.data(), cpu.exp_avg_sq.data(),
                                            cpu.exp_avg_scale.data(), cpu.exp_avg_sq_scale.data(), cpu.m_row.data(),
                                            cpu.v_row.data()),
                                   s, 0);
      const auto d = [&](size_t i) { return device[i]->at(); };
      ASSERT_EQ(kernels::launch_adamw_step(cpu.view(d(0), d(1), d(2), d(3), d(4), d(5), d(6), d(7)), s, nullptr), 0);
      QWEN3_CUDA_OK(cudaDeviceSynchronize());
    }
    for (size_t i = 0; i < buffers.size(); ++i) {
      std::vector<uint8_t> back(buffers[i]->size());
      QWEN3_CUDA_OK(cudaMemcpy(back.data(), device[i]->at(), back.size(), cudaMemcpyDeviceToHost));
      EXPECT_EQ(back, *buffers[i]) << "buffer " << i << " of shape " << shape.first << " x " << shape.second;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllStorages, GpuAdamWKernel,
    ::testing::Values(KernelCase{ka::Moments::f32, false, false}, KernelCase{ka::Moments::f32, true, true},
                      KernelCase{ka::Moments::bf16, false, false}, KernelCase{ka::Moments::bf16, true, true},
                      KernelCase{ka::Moments::int8, false, false}, KernelCase{ka::Moments::int8, true, true},
                      KernelCase{ka::Moments::nvfp4, false, false}, KernelCase{ka::Moments::nvfp4, true, true},
                      KernelCase{ka::Moments::nvfp4, false, true}),
    [](const ::testing::TestParamInfo<KernelCase>& info) { return case_name(info.param); });

// Bad sizes and missing buffers are refused before anything is launched (no GPU needed).
TEST(AdamWKernelLaunch, RejectsBadArgumentsWithoutLaunching) {
  ka::ParamView p{};
  ka::StepScalars s{};
  p.rows = 2, p.cols = 64, p.stored_cols = 64, p.moments = ka::Moments::int8;
  EXPECT_EQ(kInvalidValue, kernels::launch_adamw_step(p, s, nullptr));  // no pointers at all
  uint8_t dummy[8];
  p.master = p.exp_avg = p.exp_avg_sq = dummy;
  p.grad = dummy;
  EXPECT_EQ(kInvalidValue, kernels::launch_adamw_step(p, s, nullptr));  // int8 without its block scales
  p.stored_cols = 32;
  EXPECT_EQ(kInvalidValue, kernels::launch_adamw_step(p, s, nullptr));  // stored columns fewer than columns
  p.moments = ka::Moments::nvfp4, p.stored_cols = 64, p.exp_avg_scale = p.exp_avg_sq_scale = dummy;
  EXPECT_EQ(kInvalidValue, kernels::launch_adamw_step(p, s, nullptr));  // nvfp4 without its row scales
  p.rows = 0;
  EXPECT_EQ(kernels::launch_adamw_step(p, s, nullptr), 0);  // nothing to do is success
}

}  // namespace
}  // namespace qwen3
