// The sliced loss's kernels (kernels/lm_loss_slice.cu) against their element rules run on the host, on raw
// buffers (any libtorch): the statistics within the bound of a different summation order (the max and the
// target's logit exactly), the gradient within an ulp of exp, on the 16-byte path and the scalar one. The
// argument checks run without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "lm_loss_slice.cuh"
#include "qwen3_kernels.h"

namespace qwen3 {
namespace {

namespace l = kernels::loss;
using gpu_test::DeviceBuffer;
using gpu_test::kInvalidValue;
using kernels::KernelDType;

template <typename T>
void to_device(DeviceBuffer& d, const std::vector<T>& h, size_t offset = 0) {
  ASSERT_EQ(cudaMemcpy(d.at(offset), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}
template <typename T>
void from_device(std::vector<T>& h, const DeviceBuffer& d, size_t offset = 0) {
  ASSERT_EQ(cudaMemcpy(h.data(), d.at(offset), h.size() * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
}

// Logits of a row spread like a trained head's: mostly small, a few large.
float logit_value(uint64_t i) {
  const uint32_t bits = kernels::adamw::random_bits(5, i);
  const float u = static_cast<float>(static_cast<int32_t>(bits)) * 0x1p-31f;
  return (bits % 97 == 0 ? 12.0f : 3.0f) * u;
}

struct Case {
  KernelDType type;
  int64_t width;  // 4096 and 4480 take 16-byte accesses; 1001 does not (rows not whole vectors)
  size_t offset;  // bytes: 2 misaligns a bf16 buffer, taking the scalar path
};

TEST(GpuLossKernels, StatisticsAndGradientFollowTheHostRules) {
  QWEN3_REQUIRE_GPU();
  const int64_t rows = 67, first = 8192;
  for (const Case c : {Case{KernelDType::bf16, 4096, 0}, Case{KernelDType::bf16, 4480, 2}, Case{KernelDType::bf16, 1001, 0},
                       Case{KernelDType::f32, 4096, 0}, Case{KernelDType::f32, 1001, 0}}) {
    const bool bf16 = c.type == KernelDType::bf16;
    const int64_t n = rows * c.width, bytes = n * (bf16 ? 2 : 4);
    std::vector<float> values(n);
    std::vector<uint16_t> raw16(n);
    std::vector<float> raw32(n);
    for (int64_t i = 0; i < n; ++i) {
      raw16[i] = kernels::adamw::bf16_nearest(logit_value(i));
      values[i] = bf16 ? kernels::adamw::bf16_to_float(raw16[i]) : logit_value(i);
      raw32[i] = values[i];
    }
    // Targets in this slice, outside it (below and above) and ignored; running statistics of earlier slices.
    std::vector<int64_t> targets(rows);
    std::vector<float> run_max(rows), run_sum(rows), target_logit(rows, -7.0f);
    for (int64_t r = 0; r < rows; ++r) {
      targets[r] = r % 5 == 0 ? -100 : (r % 5 == 1 ? first - 1 : (r % 5 == 2 ? first + c.width : first + (r * 37) % c.width));
      run_max[r] = r % 3 == 0 ? -INFINITY : 5.0f + 0.1f * r;
      run_sum[r] = r % 3 == 0 ? 0.0f : 1.5f + r;
    }
    DeviceBuffer d_logits(bytes), d_targets(rows * 8), d_max(rows * 4), d_sum(rows * 4), d_target(rows * 4);
    if (bf16) to_device(d_logits, raw16, c.offset); else to_device(d_logits, raw32, c.offset);
    to_device(d_targets, targets), to_device(d_max, run_max), to_device(d_sum, run_sum), to_device(d_target, target_logit);
    const auto* t = reinterpret_cast<const int64_t*>(d_targets.at());
    QWEN3_CUDA_OK(static_cast<cudaError_t>(kernels::launch_loss_slice_stats(
        d_logits.at(c.offset), c.type, rows, c.width, first, t, reinterpret_cast<float*>(d_max.at()),
        reinterpret_cast<float*>(d_sum.at()), reinterpret_cast<float*>(d_target.at()), nullptr)));
    QWEN3_CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> got_max(rows), got_sum(rows), got_target(rows);
    from_device(got_max, d_max), from_device(got_sum, d_sum), from_device(got_target, d_target);
    std::vector<float> lse(rows), scale(rows);
    for (int64_t r = 0; r < rows; ++r) {
      l::SoftmaxStats s = l::empty_stats();
      for (int64_t k = 0; k < c.width; ++k) s = l::add(s, values[r * c.width + k]);
      const l::SoftmaxStats want = l::merge({run_max[r], run_sum[r]}, s);
      EXPECT_EQ(got_max[r], want.max) << r;
      EXPECT_NEAR(got_sum[r], want.sum, 1e-5 * want.sum) << r;
      const bool in_slice = targets[r] >= first && targets[r] < first + c.width;
      EXPECT_EQ(got_target[r], in_slice ? values[r * c.width + targets[r] - first] : -7.0f) << r;
      lse[r] = want.max + std::log(want.sum);
      scale[r] = targets[r] == -100 ? 0.0f : 1.0f / 53;
    }
    // The gradient over the logits in place.
    DeviceBuffer d_lse(rows * 4), d_scale(rows * 4);
    to_device(d_lse, lse), to_device(d_scale, scale);
    QWEN3_CUDA_OK(static_cast<cudaError_t>(kernels::launch_loss_slice_gradient(
        d_logits.at(c.offset), d_logits.at(c.offset), c.type, rows, c.width, first, t,
        reinterpret_cast<const float*>(d_lse.at()), reinterpret_cast<const float*>(d_scale.at()), nullptr)));
    QWEN3_CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> got(n);
    if (bf16) {
      from_device(raw16, d_logits, c.offset);
      for (int64_t i = 0; i < n; ++i) got[i] = kernels::adamw::bf16_to_float(raw16[i]);
    } else {
      from_device(got, d_logits, c.offset);
    }
    int64_t differing = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = i / c.width;
      const bool is_target = first + i % c.width == targets[r];
      const float want = bf16 ? l::logit_gradient<true>(values[i], lse[r], is_target, scale[r])
                              : l::logit_gradient<false>(values[i], lse[r], is_target, scale[r]);
      const float step = bf16 ? 0x1p-7f : 0x1p-22f;  // one bf16 step, or a few fp32 ulps, of |want|
      ASSERT_LE(std::fabs(got[i] - want), step * std::fabs(want) + 1e-30f) << i << " " << got[i] << " " << want;
      differing += got[i] != want;
    }
    if (bf16) {
      EXPECT_LE(differing, n / 100) << "an ulp of exp moves a bf16 rounding only now and then";
    }
  }
}

TEST(LossKernelLaunch, RejectsBadArgumentsWithoutLaunching) {
  float dummy[4] = {};
  const int64_t targets[1] = {0};
  EXPECT_EQ(kInvalidValue, kernels::launch_loss_slice_stats(dummy, KernelDType::f16, 1, 4, 0, targets, dummy, dummy, dummy, nullptr));
  EXPECT_EQ(kInvalidValue, kernels::launch_loss_slice_stats(dummy, KernelDType::f32, 1, 0, 0, targets, dummy, dummy, dummy, nullptr));
  EXPECT_EQ(kInvalidValue, kernels::launch_loss_slice_gradient(dummy, dummy, KernelDType::f32, 1, 4, 0, targets, nullptr, dummy, nullptr));
  EXPECT_EQ(kernels::launch_loss_slice_gradient(dummy, dummy, KernelDType::f32, 0, 4, 0, targets, dummy, dummy, nullptr), 0);
}

}  // namespace
}  // namespace qwen3
