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

#include "gpu/gpu_test_util.h"
#include "optim/adamw_step.h"
#include "qwen3_kernels.h"

namespace qwen3 {
namespace {

namespace ka = kernels::adamw;
using gpu_test::DeviceBuffer;

uint32_t hash32(uint64_t x) { return ka::random_bits(0x5EED5EED12345678ULL, x); }

// Host copies of one parameter's buffers, in the layout the launcher expects.
struct HostParam {
  int64_t rows, cols, stored;
  ka::Moments moments;
  bool bf16_master, bf16_grad;
  std::vector<uint8_t> master, grad, exp_avg, exp_avg_sq, exp_avg_scale, exp_avg_sq_scale, m_row, v_row;

  HostParam(int64_t r, int64_t c, ka::Moments kind, bool bf16m, bool bf16g)
      : rows(r), cols(c), moments(kind), bf16_master(bf16m), bf16_grad(bf16g) {
    const int64_t block = kind == ka::Moments::int8 ? ka::kInt8Block : (kind == ka::Moments::nvfp4 ? ka::kNvfp4Block : 1);
    stored = (cols + block - 1) / block * block;
    master.resize(rows * cols * (bf16m ? 2 : 4));
    grad.resize(rows * cols * (bf16g ? 2 : 4));
    const int64_t state_bytes = kind == ka::Moments::f32 ? 4 * rows * cols
                                : kind == ka::Moments::bf16 ? 2 * rows * cols
                                : kind == ka::Moments::int8 ? rows * stored
                                                            : rows * stored / 2;
    exp_avg.assign(state_bytes, 0);
    exp_avg_sq.assign(state_bytes, 0);
    const int64_t scale_bytes = kind == ka::Moments::int8 ? 4 * rows * stored / block : rows * stored / block;
    if (kind == ka::Moments::int8 || kind == ka::Moments::nvfp4) exp_avg_scale.assign(scale_bytes, 0), exp_avg_sq_scale.assign(scale_bytes, 0);
    if (kind == ka::Moments::nvfp4) {
      m_row.resize(4 * rows), v_row.resize(4 * rows);
      for (int64_t i = 0; i < rows; ++i) {
        const float one = 1.0f;
        std::memcpy(&m_row[4 * i], &one, 4), std::memcpy(&v_row[4 * i], &one, 4);
      }
    }
    for (int64_t i = 0; i < rows * cols; ++i) write(master, bf16m, i, (static_cast<int32_t>(hash32(i)) * 0x1p-31f));
  }
  static void write(std::vector<uint8_t>& buffer, bool bf16, int64_t i, float x) {
    if (bf16) {
      const uint16_t b = ka::bf16_nearest(x);
      std::memcpy(&buffer[2 * i], &b, 2);
    } else {
      std::memcpy(&buffer[4 * i], &x, 4);
    }
  }
  void set_grad(uint64_t step) {
    for (int64_t i = 0; i < rows * cols; ++i) {
      const uint32_t h = hash32(step * 1000003 + i);
      const float scale = static_cast<float>(1u << 20 >> (h % 20)) * 0x1p-20f;
      write(grad, bf16_grad, i, h % 13 == 0 ? 0.0f : static_cast<int32_t>(h) * 0x1p-31f * scale);
    }
  }
  ka::ParamView view(uint8_t* m, uint8_t* g, uint8_t* ea, uint8_t* eas, uint8_t* eas_scale, uint8_t* eass, uint8_t* mr,
                     uint8_t* vr) const {
    ka::ParamView p{};
    p.master = m, p.master_bf16 = bf16_master, p.grad = g, p.grad_bf16 = bf16_grad;
    p.exp_avg = ea, p.exp_avg_sq = eas, p.exp_avg_scale = eas_scale, p.exp_avg_sq_scale = eass;
    p.exp_avg_row_scale = reinterpret_cast<float*>(mr), p.exp_avg_sq_row_scale = reinterpret_cast<float*>(vr);
    p.rows = rows, p.cols = cols, p.stored_cols = stored, p.moments = moments;
    return p;
  }
};

ka::StepScalars scalars_for(int step, bool clip) {
  ka::StepScalars s{};
  s.beta1 = 0.9f, s.one_minus_beta1 = static_cast<float>(1 - 0.9), s.beta2 = 0.999f;
  s.one_minus_beta2 = static_cast<float>(1 - 0.999);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(1 - std::pow(0.999, step)));
  s.eps = 1e-8f, s.neg_step_size = static_cast<float>(-1e-2 / (1 - std::pow(0.9, step)));
  s.decay_factor = static_cast<float>(1 - 1e-2 * 0.05), s.grad_scale = clip ? 0.37f : 1.0f;
  s.master_key = 11 + step, s.exp_avg_key = 22 + step, s.exp_avg_sq_key = 33 + step;
  return s;
}

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
  EXPECT_NE(kernels::launch_adamw_step(p, s, nullptr), 0);  // no pointers at all
  uint8_t dummy[8];
  p.master = p.exp_avg = p.exp_avg_sq = dummy;
  p.grad = dummy;
  EXPECT_NE(kernels::launch_adamw_step(p, s, nullptr), 0);  // int8 without its block scales
  p.stored_cols = 32;
  EXPECT_NE(kernels::launch_adamw_step(p, s, nullptr), 0);  // stored columns fewer than columns
  p.moments = ka::Moments::nvfp4, p.stored_cols = 64, p.exp_avg_scale = p.exp_avg_sq_scale = dummy;
  EXPECT_NE(kernels::launch_adamw_step(p, s, nullptr), 0);  // nvfp4 without its row scales
  p.rows = 0;
  EXPECT_EQ(kernels::launch_adamw_step(p, s, nullptr), 0);  // nothing to do is success
}

}  // namespace
}  // namespace qwen3
