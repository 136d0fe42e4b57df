// The group clipping kernel (kernels/grad_clip.cu) against its order run on the host (tests/grad_clip_host_run.h):
// the group's square and every factor bit for bit, over both dtypes, partial and misaligned chunks (the element
// path), an empty tensor, more tensors than one launch takes, data parallel's counts, a non-finite gradient and
// the running sum. Raw buffers, no libtorch tensors on the device. The argument checks need no GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "grad_clip_host_run.h"
#include "qwen3_kernels.h"

namespace qwen3 {
namespace {

namespace gc = kernels::grad_clip;
using gpu_test::DeviceBuffer;
using gpu_test::kInvalidValue;
using kernels::KernelDType;

// One gradient on the device: its values as the kernel reads them (bf16 ones already rounded), its buffer and the
// byte offset of its data in it (non-zero: misaligned for the vector loads).
struct DeviceGrad {
  std::vector<float> values;
  KernelDType dtype;
  std::unique_ptr<DeviceBuffer> buffer;
  size_t offset;
  kernels::GradClipTensor view() const { return {buffer->at(offset), static_cast<int64_t>(values.size()), dtype}; }
};

DeviceGrad make_grad(int64_t numel, KernelDType dtype, size_t offset, std::mt19937& rng, float scale = 1e-3f) {
  std::normal_distribution<float> normal(0.0f, scale);
  DeviceGrad g{std::vector<float>(static_cast<size_t>(numel)), dtype, nullptr, offset};
  const size_t element = dtype == KernelDType::bf16 ? 2 : 4;
  g.buffer = std::make_unique<DeviceBuffer>(static_cast<size_t>(numel) * element + 16);
  if (dtype == KernelDType::bf16) {
    std::vector<uint16_t> bits(g.values.size());
    for (size_t i = 0; i < bits.size(); ++i) {
      bits[i] = gpu_test::bf16_bits(normal(rng));
      g.values[i] = gpu_test::bf16_value(bits[i]);
    }
    if (!bits.empty()) gpu_test::upload(bits, g.buffer->at(offset));
  } else {
    for (float& v : g.values) v = normal(rng);
    if (!g.values.empty()) gpu_test::upload(g.values, g.buffer->at(offset));
  }
  return g;
}

struct Outcome {
  double sum;
  std::vector<float> factors;
  std::vector<double> tensor_squares;
};

// `with_sum` false: each tensor's square alone (no group sum; what square_sums_fp32 asks for).
Outcome run_kernel(const std::vector<DeviceGrad>& grads, kernels::GradClipGroup group, double start_sum = 0,
                   const std::vector<float>& ranks = {}, bool with_sum = true) {
  std::vector<kernels::GradClipTensor> views;
  for (const DeviceGrad& g : grads) views.push_back(g.view());
  const int count = static_cast<int>(views.size());
  DeviceBuffer workspace(static_cast<size_t>(kernels::grad_clip_workspace_doubles(views.data(), count)) * 8);
  DeviceBuffer sum(8), factors(static_cast<size_t>(count) * 4), ranks_device(static_cast<size_t>(count) * 4),
      numels(static_cast<size_t>(count) * 8), squares(static_cast<size_t>(count) * 8);
  EXPECT_TRUE(workspace.ok() && sum.ok() && factors.ok());
  gpu_test::upload(std::vector<double>{start_sum}, sum.at());
  group.sum = with_sum ? reinterpret_cast<double*>(sum.at()) : nullptr;
  group.factors = reinterpret_cast<float*>(factors.at());
  group.tensor_squares = reinterpret_cast<double*>(squares.at());
  if (!ranks.empty()) {
    std::vector<double> n;
    for (const DeviceGrad& g : grads) n.push_back(static_cast<double>(g.values.size()));
    gpu_test::upload(ranks, ranks_device.at());
    gpu_test::upload(n, numels.at());
    group.ranks_with_gradient = reinterpret_cast<const float*>(ranks_device.at());
    group.numels_device = reinterpret_cast<const double*>(numels.at());
  }
  EXPECT_EQ(kernels::launch_grad_clip(views.data(), count, group, reinterpret_cast<double*>(workspace.at()), nullptr), 0);
  Outcome out{0, std::vector<float>(static_cast<size_t>(count)), std::vector<double>(static_cast<size_t>(count))};
  std::vector<double> s(1);
  gpu_test::download(sum.at(), s);
  gpu_test::download(factors.at(), out.factors);
  gpu_test::download(squares.at(), out.tensor_squares);
  out.sum = s[0];
  return out;
}

bool same_double(double a, double b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 8) == 0; }

// Each tensor's own square, from its chunks alone, bit for bit.
void expect_tensor_squares(const std::vector<DeviceGrad>& grads, const Outcome& got) {
  for (size_t i = 0; i < grads.size(); ++i) {
    const double expected = grad_clip_test::tensor_square_on_host(grads[i].values);
    EXPECT_TRUE(same_double(got.tensor_squares[i], expected)) << "tensor " << i << ": " << got.tensor_squares[i]
                                                              << " vs " << expected;
  }
}

double host_square(const std::vector<DeviceGrad>& grads) {
  std::vector<std::vector<float>> values;
  for (const DeviceGrad& g : grads) values.push_back(g.values);
  return grad_clip_test::group_square_on_host(values);
}

TEST(GpuGradClipKernel, SquareAndFactorsEqualTheHostRunBitForBit) {
  QWEN3_REQUIRE_GPU();
  std::mt19937 rng(11);
  std::vector<DeviceGrad> grads;
  grads.push_back(make_grad(gc::kChunkElements, KernelDType::f32, 0, rng));          // one whole chunk, vectors
  grads.push_back(make_grad(3 * gc::kChunkElements + 77, KernelDType::f32, 0, rng));  // a partial last chunk
  grads.push_back(make_grad(0, KernelDType::f32, 0, rng));                            // empty: one chunk of nothing
  grads.push_back(make_grad(2 * gc::kChunkElements, KernelDType::bf16, 0, rng));
  grads.push_back(make_grad(gc::kChunkElements, KernelDType::f32, 4, rng));   // misaligned: element loads
  grads.push_back(make_grad(gc::kChunkElements, KernelDType::bf16, 2, rng));  // misaligned bf16
  grads.push_back(make_grad(5, KernelDType::bf16, 0, rng));
  kernels::GradClipGroup group;
  group.max_norm = 1e-3;
  group.trainable = 1e6;
  double counted = 0;
  for (const DeviceGrad& g : grads) counted += static_cast<double>(g.values.size());
  group.counted_elements = counted;
  const Outcome got = run_kernel(grads, group);
  const double expected = host_square(grads);
  EXPECT_TRUE(same_double(got.sum, expected)) << got.sum << " vs " << expected;
  const float scale = gc::clip_scale(expected, counted, group.trainable, group.max_norm);
  ASSERT_LT(scale, 1.0f) << "the case clips";
  for (float f : got.factors) EXPECT_TRUE(gpu_test::same_float(f, scale)) << f << " vs " << scale;
  expect_tensor_squares(grads, got);
}

// More tensors than one launch takes (64): the group's last CTA is in the last launch, and sums every launch's
// chunks; the running sum accumulates; each tensor's own square, with the group's and alone.
TEST(GpuGradClipKernel, ManyTensorsAndTheRunningSum) {
  QWEN3_REQUIRE_GPU();
  std::mt19937 rng(12);
  std::vector<DeviceGrad> grads;
  for (int i = 0; i < 150; ++i)
    grads.push_back(make_grad(1 + (i * 997) % 20'000, i % 3 == 0 ? KernelDType::bf16 : KernelDType::f32, 0, rng));
  kernels::GradClipGroup group;  // max_norm 0: no clipping, factors 1
  group.accumulate = 1;
  const double before = 0.375;
  const Outcome got = run_kernel(grads, group, before);
  const double expected = host_square(grads);
  EXPECT_TRUE(same_double(got.sum, before + expected)) << got.sum << " vs " << before + expected;
  for (float f : got.factors) EXPECT_EQ(f, 1.0f);
  expect_tensor_squares(grads, got);
  // Each tensor's square alone, no group sum (the ordinary step's per-tensor squares).
  const Outcome alone = run_kernel(grads, kernels::GradClipGroup{}, 0, {}, /*with_sum=*/false);
  expect_tensor_squares(grads, alone);
}

TEST(GpuGradClipKernel, RanksChooseWhatCountsAndANonFiniteGroupIsSkipped) {
  QWEN3_REQUIRE_GPU();
  std::mt19937 rng(13);
  std::vector<DeviceGrad> grads;
  grads.push_back(make_grad(4096, KernelDType::f32, 0, rng, 1.0f));
  grads.push_back(make_grad(8192, KernelDType::f32, 0, rng, 1.0f));
  grads.push_back(make_grad(1024, KernelDType::bf16, 0, rng, 1.0f));
  kernels::GradClipGroup group;
  group.max_norm = 1.0;
  group.trainable = 1e5;
  group.counted_elements = 1;  // ignored where the ranks say
  const Outcome got = run_kernel(grads, group, 0, {2.0f, 0.0f, 1.0f});
  const double square = host_square(grads);
  const float scale = gc::clip_scale(square, 4096 + 1024, group.trainable, group.max_norm);
  ASSERT_LT(scale, 1.0f);
  EXPECT_TRUE(gpu_test::same_float(got.factors[0], scale));
  EXPECT_TRUE(std::isnan(got.factors[1])) << "no rank had it";
  EXPECT_TRUE(gpu_test::same_float(got.factors[2], scale));

  // A NaN anywhere: the square is not finite and every factor NaN (the update skips the group).
  std::vector<float> poisoned = grads[1].values;
  poisoned[4000] = std::numeric_limits<float>::quiet_NaN();
  gpu_test::upload(poisoned, grads[1].buffer->at(0));
  kernels::GradClipGroup plain;
  plain.max_norm = 1.0;
  plain.trainable = 1e5;
  plain.counted_elements = 4096 + 8192 + 1024;
  const Outcome bad = run_kernel(grads, plain);
  EXPECT_TRUE(std::isnan(bad.sum));
  for (float f : bad.factors) EXPECT_TRUE(std::isnan(f));
}

TEST(GradClipKernel, RefusesBadArguments) {
  double workspace = 0, sum = 0;
  const float x = 0;
  kernels::GradClipTensor t{&x, 1, KernelDType::f32};
  kernels::GradClipGroup group;
  group.sum = &sum;
  EXPECT_EQ(kernels::launch_grad_clip(&t, 0, group, &workspace, nullptr), kInvalidValue) << "no tensor";
  EXPECT_EQ(kernels::launch_grad_clip(&t, 1, group, nullptr, nullptr), kInvalidValue) << "no workspace";
  kernels::GradClipGroup no_sum;
  EXPECT_EQ(kernels::launch_grad_clip(&t, 1, no_sum, &workspace, nullptr), kInvalidValue) << "neither sum nor squares";
  kernels::GradClipTensor f16{&x, 1, KernelDType::f16};
  EXPECT_EQ(kernels::launch_grad_clip(&f16, 1, group, &workspace, nullptr), kInvalidValue) << "f16";
  kernels::GradClipTensor negative{&x, -1, KernelDType::f32};
  EXPECT_EQ(kernels::launch_grad_clip(&negative, 1, group, &workspace, nullptr), kInvalidValue) << "negative size";
  kernels::GradClipGroup ranks_only = group;
  const float ranks = 1;
  ranks_only.ranks_with_gradient = &ranks;
  EXPECT_EQ(kernels::launch_grad_clip(&t, 1, ranks_only, &workspace, nullptr), kInvalidValue) << "ranks, no numels";
}

}  // namespace
}  // namespace qwen3
