// Causal attention on CUDA through the flash node (src/model/attention.cpp): the math of a plain fp32 reference,
// the same bytes every run in backward, heads that merge for o_proj without a copy, and ATen's global
// deterministic flag left as it was.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "gpu_test.h"
#include "qwen3/base/slow_paths.h"
#include "qwen3/model/model.h"

namespace qwen3 {
namespace {

struct AttentionShape {
  int64_t rows, length, heads, kv_heads, width;
};

// softmax(q kᵀ / sqrt(d)) v in fp32, each query head with its group's k and v, causal within each row or, given
// document ids, within each document of a row.
at::Tensor reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& documents) {
  const int64_t groups = q.size(1) / k.size(1), T = q.size(2);
  const at::Tensor kf = k.to(at::kFloat).repeat_interleave(groups, 1), vf = v.to(at::kFloat).repeat_interleave(groups, 1);
  at::Tensor scores = at::matmul(q.to(at::kFloat), kf.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(3)));
  const auto idx = at::TensorOptions().dtype(at::kLong).device(q.device());
  const at::Tensor allowed = documents.defined() ? packed_attention_mask(documents.to(q.device()))
                                                 : at::arange(T, idx).unsqueeze(0) <= at::arange(T, idx).unsqueeze(1);
  scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  return at::matmul(at::softmax(scores, -1), vf);
}

double relative_error(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor w = want.to(at::kFloat);
  return ((got.to(at::kFloat) - w).abs().max() / w.abs().max()).item<double>();
}

// Three forward and backward runs of causal_attention with the same inputs and output gradient: the bytes of
// the output and of dq, dk, dv the same each time, and within bf16's rounding of the fp32 reference's. On CUDA
// the flash node runs (segments for packed rows, and an output whose heads merge as a view); on the CPU
// libtorch's path in fp32 (some CPUs' libtorch has no bf16 product), which the same checks hold the test itself to.
void expect_attention_is_the_reference_every_run(const AttentionShape& s, bool packed, at::Device device) {
  at::manual_seed(7);
  take_slow_paths();
  const bool cuda = device.is_cuda();
  const at::ScalarType dtype = cuda ? at::kBFloat16 : at::kFloat;
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  // The rows as the block makes them: [B, T, heads, d], attention taking them heads first (views).
  const at::Tensor q_rows = at::randn({s.rows, s.length, s.heads, s.width}, options).requires_grad_(true);
  const at::Tensor k_rows = at::randn({s.rows, s.length, s.kv_heads, s.width}, options).requires_grad_(true);
  const at::Tensor v_rows = at::randn({s.rows, s.length, s.kv_heads, s.width}, options).requires_grad_(true);
  const at::Tensor grad_out = at::randn({s.rows, s.heads, s.length, s.width}, options);
  at::Tensor documents, layout;
  if (packed) {  // three documents a row: half the row, then two quarters
    const int64_t half = s.length / 2, quarter = s.length / 4;
    const at::Tensor row = at::cat({at::zeros({half}, at::kLong), at::ones({quarter}, at::kLong),
                                    at::full({s.length - half - quarter}, 2, at::kLong)});
    documents = row.unsqueeze(0).repeat({s.rows, 1});
    layout = packed_attention_layout(documents, device, dtype, s.width);
    if (cuda) {
      ASSERT_EQ(layout.scalar_type(), at::kInt) << "packed rows did not take the flash kernel's segments";
    }
  }
  std::vector<std::vector<at::Tensor>> runs;
  for (int run = 0; run < 3; ++run) {
    const at::Tensor out =
        causal_attention(q_rows.transpose(1, 2), k_rows.transpose(1, 2), v_rows.transpose(1, 2), layout);
    // The block merges the heads as out.transpose(1, 2).reshape(B, T, nh·d): a view where this holds.
    if (cuda) {
      EXPECT_TRUE(out.transpose(1, 2).is_contiguous()) << "merging the output's heads would copy it";
    }
    out.backward(grad_out);
    runs.push_back({out.detach().clone(), q_rows.grad().clone(), k_rows.grad().clone(), v_rows.grad().clone()});
    for (const at::Tensor* t : {&q_rows, &k_rows, &v_rows}) t->mutable_grad().reset();
  }
  const char* names[] = {"output", "dq", "dk", "dv"};
  for (int run = 1; run < 3; ++run)
    for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(runs[run][i].equal(runs[0][i])) << names[i] << ", run " << run;
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms()) << "the deterministic flag was left on";
  EXPECT_TRUE(take_slow_paths().empty()) << "the flash node (CUDA) or the reference (CPU) is the designed path";

  const at::Tensor qf = q_rows.detach().to(at::kFloat).requires_grad_(true);
  const at::Tensor kf = k_rows.detach().to(at::kFloat).requires_grad_(true);
  const at::Tensor vf = v_rows.detach().to(at::kFloat).requires_grad_(true);
  const at::Tensor want = reference_attention(qf.transpose(1, 2), kf.transpose(1, 2), vf.transpose(1, 2), documents);
  want.backward(grad_out.to(at::kFloat));
  const double errors[] = {relative_error(runs[0][0], want), relative_error(runs[0][1], qf.grad()),
                           relative_error(runs[0][2], kf.grad()), relative_error(runs[0][3], vf.grad())};
  std::printf("attention on %s (%s, %lld x %lld, %lld/%lld heads of %lld) vs fp32: output %.3g, dq %.3g, dk %.3g, dv %.3g\n",
              cuda ? "CUDA" : "the CPU", packed ? "packed" : "dense", static_cast<long long>(s.rows), static_cast<long long>(s.length),
              static_cast<long long>(s.heads), static_cast<long long>(s.kv_heads), static_cast<long long>(s.width),
              errors[0], errors[1], errors[2], errors[3]);
  for (size_t i = 0; i < 4; ++i) EXPECT_LT(errors[i], 2e-2) << names[i];
}

AttentionShape gpu_shape() {
  // Long enough rows that several key blocks add into each query block's gradient (where atomics would race).
  return test::small_gpu_shapes() ? AttentionShape{1, 256, 4, 2, 64} : AttentionShape{2, 1024, 16, 4, 128};
}

TEST(Attention, CpuIsTheReferenceAndTheSameBytesEveryRun) {
  for (const bool packed : {false, true})
    expect_attention_is_the_reference_every_run({2, 64, 4, 2, 16}, packed, at::kCPU);
}

TEST(Attention, GpuFlashNodeIsTheReferenceAndTheSameBytesEveryRun) {
  QWEN3_GPU_TEST(at::hasCUDA());
  expect_attention_is_the_reference_every_run(gpu_shape(), /*packed=*/false, at::kCUDA);
}

TEST(Attention, GpuPackedRowsFlashNodeIsTheReferenceAndTheSameBytesEveryRun) {
  QWEN3_GPU_TEST(at::hasCUDA());
  expect_attention_is_the_reference_every_run(gpu_shape(), /*packed=*/true, at::kCUDA);
}

// On a GPU float32 rows are off the flash kernel: packed ones go as a [B, 1, T, T] mask, which is recorded with
// its reason (docs/trainer.md, "Slow paths"), once a call.
TEST(Attention, GpuFloat32PackedRowsRecordTheMaskPath) {
  QWEN3_GPU_TEST(at::hasCUDA());
  take_slow_paths();
  const auto options = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  const at::Tensor q = at::randn({1, 4, 32, 16}, options), k = at::randn({1, 2, 32, 16}, options);
  const at::Tensor documents = at::cat({at::zeros({16}, at::kLong), at::ones({16}, at::kLong)}).unsqueeze(0);
  const at::Tensor layout = packed_attention_layout(documents, at::kCUDA, at::kFloat, 16);
  ASSERT_EQ(layout.scalar_type(), at::kBool);
  for (int call = 0; call < 2; ++call) causal_attention(q, k, k, layout);
  const std::vector<SlowPath> taken = take_slow_paths();
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_NE(taken[0].what.find("packed rows"), std::string::npos) << taken[0].what;
  EXPECT_NE(taken[0].why.find("activations in float32"), std::string::npos) << taken[0].why;
  EXPECT_EQ(taken[0].count, 2);
}

}  // namespace
}  // namespace qwen3
