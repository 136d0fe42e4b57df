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
#include "qwen3/nvfp4/nvfp4.h"
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

// Each shape twice: with the kernels' own grid, and with one CTA, which then strides over every pass of its loop
// (the int8 kernel's resident grid strides so on large parameters; the tests' shapes fit one pass).
TEST_P(GpuAdamWKernel, ThreeStepsEqualTheCpuStepByteForByte) {
  QWEN3_REQUIRE_GPU();
  const KernelCase c = GetParam();
  for (const int max_ctas : {0, 1})
  for (const auto& shape : {std::pair<int64_t, int64_t>{13, 37}, {1, 29}, {70, 2560}, {300, 80}}) {
    SCOPED_TRACE("max_ctas " + std::to_string(max_ctas));
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
      ASSERT_EQ(kernels::launch_adamw_step(cpu.view(d(0), d(1), d(2), d(3), d(4), d(5), d(6), d(7)), s, nullptr, max_ctas),
                0);
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

// --keep-weight-operands always: every kernel writes the stepped master's bf16 operand deq(Q(master)) in the same
// pass, each 16-block's scale from the lanes that hold it (16 of an element for plain moments, 4 of 4 for nvfp4, 2
// of 8 for int8, where 3 x 48 leaves the last two lanes of each 64-block past the row). Master and state bytes as
// without it (the CPU step's); the operand equal to the CPU codec's quantize and dequantize of the master after each
// step, in both scale modes; a non-finite master block gives NaN values and raises the flag.
TEST(GpuAdamWKernelOperand, IsTheCodecsOperandOfTheSteppedMaster) {
  QWEN3_REQUIRE_GPU();
  for (const ka::Moments moments : {ka::Moments::f32, ka::Moments::bf16, ka::Moments::int8, ka::Moments::nvfp4})
    for (const bool bf16_master : {false, true})
      for (const bool search : {false, true})
        for (const auto& shape : {std::pair<int64_t, int64_t>{70, 2560}, {3, 48}, {300, 80}}) {
          const std::string name = case_name({moments, bf16_master, bf16_master}) + (search ? " search " : " rne ") +
                                   std::to_string(shape.first) + " x " + std::to_string(shape.second);
          HostParam cpu(shape.first, shape.second, moments, bf16_master, bf16_master);
          const int64_t n = shape.first * shape.second;
          if (name.find("3 x 48") != std::string::npos) HostParam::write(cpu.master, bf16_master, 17, INFINITY);
          std::vector<std::vector<uint8_t>*> buffers{&cpu.master, &cpu.grad, &cpu.exp_avg, &cpu.exp_avg_sq,
                                                     &cpu.exp_avg_scale, &cpu.exp_avg_sq_scale, &cpu.m_row, &cpu.v_row};
          const bool scaled = moments == ka::Moments::int8 || moments == ka::Moments::nvfp4;
          const bool row_scaled = moments == ka::Moments::nvfp4;
          std::vector<std::unique_ptr<DeviceBuffer>> device;
          for (auto* b : buffers) device.push_back(std::make_unique<DeviceBuffer>(b->size() + 16));
          for (size_t i = 0; i < buffers.size(); ++i)
            QWEN3_CUDA_OK(cudaMemcpy(device[i]->at(), buffers[i]->data(), buffers[i]->size(), cudaMemcpyHostToDevice));
          DeviceBuffer operand(2 * n), flag(sizeof(int));
          QWEN3_CUDA_OK(cudaMemset(flag.at(), 0, sizeof(int)));
          for (int step = 1; step <= 2; ++step) {
            cpu.set_grad(step);
            QWEN3_CUDA_OK(cudaMemcpy(device[1]->at(), cpu.grad.data(), cpu.grad.size(), cudaMemcpyHostToDevice));
            const ka::StepScalars s = scalars_for(step, step == 2);
            optim_detail::adamw_step_cpu(cpu.view(cpu.master.data(), cpu.grad.data(), cpu.exp_avg.data(),
                                                  cpu.exp_avg_sq.data(), scaled ? cpu.exp_avg_scale.data() : nullptr,
                                                  scaled ? cpu.exp_avg_sq_scale.data() : nullptr,
                                                  row_scaled ? cpu.m_row.data() : nullptr,
                                                  row_scaled ? cpu.v_row.data() : nullptr),
                                         s, 0);
            ka::ParamView p = cpu.view(device[0]->at(), device[1]->at(), device[2]->at(), device[3]->at(),
                                       scaled ? device[4]->at() : nullptr, scaled ? device[5]->at() : nullptr,
                                       row_scaled ? device[6]->at() : nullptr, row_scaled ? device[7]->at() : nullptr);
            p.operand = reinterpret_cast<uint16_t*>(operand.at());
            p.operand_search = search ? 1 : 0;
            p.operand_nonfinite_flag = reinterpret_cast<int*>(flag.at());
            ASSERT_EQ(kernels::launch_adamw_step(p, s, nullptr), 0) << name;
            QWEN3_CUDA_OK(cudaDeviceSynchronize());
            std::vector<uint8_t> back(cpu.master.size());
            QWEN3_CUDA_OK(cudaMemcpy(back.data(), device[0]->at(), back.size(), cudaMemcpyDeviceToHost));
            ASSERT_EQ(back, cpu.master) << name << ", step " << step;
            for (size_t i = 2; i < buffers.size(); ++i) {
              std::vector<uint8_t> state(buffers[i]->size());
              QWEN3_CUDA_OK(cudaMemcpy(state.data(), device[i]->at(), state.size(), cudaMemcpyDeviceToHost));
              ASSERT_EQ(state, *buffers[i]) << name << ", step " << step << ", state buffer " << i;
            }
            // The codec on the CPU step's master, block by block (a non-finite block: NaN values, no codes).
            std::vector<float> master(n), want(n);
            for (int64_t i = 0; i < n; ++i) master[i] = HostParam::read(cpu.master, bf16_master, i);
            for (int64_t b = 0; b < n / 16; ++b) {
              bool finite = true;
              for (int i = 0; i < 16; ++i) finite = finite && std::isfinite(master[b * 16 + i]);
              uint8_t codes[8], scale = 0;
              if (finite) {
                nvfp4::quantize_rows_cpu(master.data() + b * 16, 1, 16, codes, &scale,
                                         search ? nvfp4::ScaleMode::search : nvfp4::ScaleMode::rne);
                nvfp4::dequantize_rows_cpu(codes, &scale, 1, 16, want.data() + b * 16);
              } else {
                for (int i = 0; i < 16; ++i) want[b * 16 + i] = NAN;
              }
            }
            std::vector<uint16_t> got(n);
            QWEN3_CUDA_OK(cudaMemcpy(got.data(), operand.at(), 2 * n, cudaMemcpyDeviceToHost));
            int64_t wrong = 0;
            for (int64_t i = 0; i < n; ++i) {
              uint32_t bits;
              std::memcpy(&bits, &want[i], 4);
              const bool same = std::isnan(want[i]) ? (got[i] & 0x7FFF) > 0x7F80 : got[i] == (bits >> 16);
              if (!same && wrong++ < 3) ADD_FAILURE() << name << ", step " << step << ", element " << i;
            }
            EXPECT_EQ(wrong, 0) << name;
          }
          int raised = 0;
          QWEN3_CUDA_OK(cudaMemcpy(&raised, flag.at(), sizeof raised, cudaMemcpyDeviceToHost));
          EXPECT_EQ(raised, name.find("3 x 48") != std::string::npos ? 1 : 0) << name;
        }
}

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
  uint16_t operand[4];
  p.rows = 2, p.operand = operand;
  p.moments = ka::Moments::f32, p.cols = 40, p.stored_cols = 40;
  EXPECT_EQ(kInvalidValue, kernels::launch_adamw_step(p, s, nullptr));  // an operand of rows not whole 16-blocks
  p.moments = ka::Moments::int8, p.stored_cols = 64;
  EXPECT_EQ(kInvalidValue, kernels::launch_adamw_step(p, s, nullptr));  // the same with int8 moments
  float row_scales[2];
  p.moments = ka::Moments::nvfp4, p.stored_cols = 48, p.exp_avg_row_scale = p.exp_avg_sq_row_scale = row_scales;
  EXPECT_EQ(kInvalidValue, kernels::launch_adamw_step(p, s, nullptr));  // and with nvfp4 moments
}

}  // namespace
}  // namespace qwen3
