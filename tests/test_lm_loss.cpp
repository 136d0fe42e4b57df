// linear_cross_entropy (sliced over the vocabulary) against the plain logits + cross_entropy path: value and
// both gradients, with ignored targets and many slice widths. The CUDA kernels' element rules
// (kernels/lm_loss_slice.cuh) run on the host against the libtorch path; on a CUDA libtorch with a device, the
// path that runs those kernels against the CPU's.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gpu_test.h"
#include "lm_loss_slice.cuh"
#include "qwen3/base/slow_paths.h"
#include "qwen3/model/lm_loss.h"
#include "qwen3/nvfp4/nvfp4_linear.h"
#include "trainer/train_setup.h"

namespace qwen3 {
namespace {

TEST(LinearCrossEntropy, MatchesLogitsThenCrossEntropy) {
  at::manual_seed(3);
  const int64_t n = 37, h = 24, vocab = 1000;
  const at::Tensor hidden0 = at::randn({n, h}) * 0.5;
  const at::Tensor weight0 = at::randn({vocab, h}) * 0.3;
  at::Tensor targets = at::randint(0, vocab, {n}, at::kLong);
  targets.index_put_({at::arange(0, n, 5)}, -100);
  targets[1] = vocab - 1;  // the last slice's last entry
  targets[2] = 0;

  const at::Tensor h_ref = hidden0.clone().requires_grad_(true), w_ref = weight0.clone().requires_grad_(true);
  const at::Tensor ref = at::cross_entropy_loss(at::linear(h_ref, w_ref), targets, {}, at::Reduction::Mean, -100);
  ref.backward();
  for (bool into_grad : {false, true})
    for (int64_t slice_elements : {int64_t{1}, int64_t{37 * 300}, int64_t{1} << 24}) {
      const at::Tensor hd = hidden0.clone().requires_grad_(true), wd = weight0.clone().requires_grad_(true);
      const at::Tensor loss = linear_cross_entropy(hd, wd, targets, slice_elements, into_grad);
      loss.backward();
      EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-5 * ref.item<double>()) << slice_elements;
      EXPECT_TRUE(at::allclose(hd.grad(), h_ref.grad(), 1e-4, 1e-6)) << slice_elements << " " << into_grad;
      ASSERT_TRUE(wd.grad().defined()) << into_grad;
      EXPECT_TRUE(at::allclose(wd.grad(), w_ref.grad(), 1e-4, 1e-6)) << slice_elements << " " << into_grad;
    }
}

TEST(LinearCrossEntropy, IntoGradAddsToAnExistingGradientAndReturnsNone) {
  at::manual_seed(4);
  const at::Tensor hidden = at::randn({6, 16}), targets = at::randint(0, 40, {6}, at::kLong);
  const at::Tensor returned = at::randn({40, 16}).requires_grad_(true);
  linear_cross_entropy(hidden, returned, targets, 6 * 10).backward();
  const at::Tensor into = returned.detach().clone().requires_grad_(true);
  into.mutable_grad() = at::ones_like(into);  // an earlier contribution, kept and added to
  const at::Tensor loss = linear_cross_entropy(hidden, into, targets, 6 * 10, /*accumulate_into_weight_grad=*/true);
  EXPECT_TRUE(at::allclose(into.grad(), at::ones_like(into))) << "nothing happens before backward";
  loss.backward();
  EXPECT_TRUE(at::allclose(into.grad(), returned.grad() + 1, 1e-5, 1e-6));
  // Autograd is handed no gradient for the weight: torch::autograd::grad finds none.
  const at::Tensor again = linear_cross_entropy(hidden.clone().requires_grad_(true), into, targets, 60, true);
  const auto via_autograd = torch::autograd::grad({again}, {into}, {}, false, false, /*allow_unused=*/true);
  EXPECT_FALSE(via_autograd[0].defined());
}

TEST(LinearCrossEntropy, AllTargetsIgnoredGivesZeroLossAndGradients) {
  const at::Tensor hidden = at::randn({4, 8}).requires_grad_(true), weight = at::randn({50, 8}).requires_grad_(true);
  const at::Tensor loss = linear_cross_entropy(hidden, weight, at::full({4}, -100, at::kLong));
  loss.backward();
  EXPECT_EQ(loss.item<double>(), 0.0);
  EXPECT_EQ(hidden.grad().abs().sum().item<double>(), 0.0);
  EXPECT_EQ(weight.grad().abs().sum().item<double>(), 0.0);
}

class LossSliceRules : public ::testing::TestWithParam<at::ScalarType> {};

// The rules of lm_loss_slice.cu, a slice at a time over host arrays as the kernels walk them (statistics folded
// element by element and merged into the row's running ones; each logit's gradient in the activation dtype), give
// the loss and both gradients of the libtorch path. Fails when the statistics' rescaling, the merge, the target's
// -1 or the row scale is broken (each checked by breaking it).
TEST_P(LossSliceRules, GiveTheLibtorchPathsLossAndGradients) {
  namespace l = kernels::loss;
  const at::ScalarType dtype = GetParam();
  const bool bf16 = dtype == at::kBFloat16;
  if (bf16 && train_detail::cpu_bf16() == train_detail::CpuBf16::fails)
    GTEST_SKIP() << "this CPU's libtorch has no bf16 product";
  at::manual_seed(11);
  const int64_t n = 37, h = 24, vocab = 1000, slice = 300;  // slices of 300, 300, 300 and 100 columns
  const at::Tensor hidden = (at::randn({n, h}) * 1.5).to(dtype), weight = (at::randn({vocab, h}) * 0.8).to(dtype);
  at::Tensor targets = at::randint(0, vocab, {n}, at::kLong);
  targets.index_put_({at::arange(0, n, 6)}, -100);
  targets[1] = vocab - 1;

  const at::Tensor hr = hidden.clone().requires_grad_(true), wr = weight.clone().requires_grad_(true);
  const at::Tensor ref = linear_cross_entropy(hr, wr, targets, n * slice);
  ref.backward();

  const std::vector<int64_t> t(targets.data_ptr<int64_t>(), targets.data_ptr<int64_t>() + n);
  std::vector<l::SoftmaxStats> running(n, l::empty_stats());
  std::vector<float> target_logit(n, 0.0f);
  for (int64_t v0 = 0; v0 < vocab; v0 += slice) {
    const int64_t w = std::min(slice, vocab - v0);
    const at::Tensor logits = at::matmul(hidden, weight.narrow(0, v0, w).t()).to(at::kFloat).contiguous();
    const float* p = logits.data_ptr<float>();
    for (int64_t r = 0; r < n; ++r) {
      l::SoftmaxStats s = l::empty_stats();
      for (int64_t c = 0; c < w; ++c) s = l::add(s, p[r * w + c]);
      running[r] = l::merge(running[r], s);
      if (t[r] >= v0 && t[r] < v0 + w) target_logit[r] = p[r * w + t[r] - v0];
    }
  }
  std::vector<float> lse(n), row_scale(n);
  int64_t valid = 0;
  for (int64_t r = 0; r < n; ++r) valid += t[r] != -100;
  double loss = 0;
  for (int64_t r = 0; r < n; ++r) {
    lse[r] = running[r].max + std::log(running[r].sum);
    row_scale[r] = t[r] == -100 ? 0.0f : 1.0f / static_cast<float>(valid);
    if (t[r] != -100) loss += (lse[r] - target_logit[r]) / valid;
  }
  EXPECT_NEAR(loss, ref.item<double>(), 2e-6 * ref.item<double>());

  at::Tensor grad_hidden = at::zeros({n, h}), grad_weight = at::zeros({vocab, h});
  for (int64_t v0 = 0; v0 < vocab; v0 += slice) {
    const int64_t w = std::min(slice, vocab - v0);
    const at::Tensor wslice = weight.narrow(0, v0, w);
    const at::Tensor logits = at::matmul(hidden, wslice.t()).to(at::kFloat).contiguous();
    at::Tensor d = at::empty({n, w});
    const float* p = logits.data_ptr<float>();
    float* q = d.data_ptr<float>();
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < w; ++c)
        q[r * w + c] = bf16 ? l::logit_gradient<true>(p[r * w + c], lse[r], v0 + c == t[r], row_scale[r])
                            : l::logit_gradient<false>(p[r * w + c], lse[r], v0 + c == t[r], row_scale[r]);
    const at::Tensor d_typed = d.to(dtype);
    grad_hidden.add_(nvfp4::product_in_dtype(d_typed, wslice, at::kFloat));
    grad_weight.narrow(0, v0, w).copy_(nvfp4::product_in_dtype(d_typed.t(), hidden, at::kFloat));
  }
  // Apart from the summation order and an ulp of exp (which a bf16 rounding can make one bf16 step), the same.
  const double rtol = bf16 ? 1.0 / 64 : 1e-5;
  const auto close = [&](const at::Tensor& got, const at::Tensor& want) {
    const at::Tensor g = got.to(at::kFloat), wt = want.to(at::kFloat);
    return (g - wt).abs().max().item<double>() <= rtol * wt.abs().max().item<double>();
  };
  EXPECT_TRUE(close(grad_hidden, hr.grad()));
  EXPECT_TRUE(close(grad_weight, wr.grad()));
}

INSTANTIATE_TEST_SUITE_P(Fp32AndBf16, LossSliceRules, ::testing::Values(at::kFloat, at::kBFloat16),
                         [](const ::testing::TestParamInfo<at::ScalarType>& info) {
                           return std::string(info.param == at::kFloat ? "float32" : "bfloat16");
                         });

// A slice is the most columns that keep rows x slice within the bound, in multiples of 128 (so a bf16 slice's rows
// are 16-byte aligned at any row count: 2^24 / 2,047 rows was 8,196 columns, whose misaligned rows sent the
// third GPU round's products to slow cuBLAS kernels), at least 256 and at most the vocabulary.
TEST(LinearCrossEntropy, SliceWidthIsAlignedAndWithinItsBound) {
  EXPECT_EQ(loss_slice_width(2047, 151936), 8192);
  EXPECT_EQ(loss_slice_width(2044, 151936), 8192);
  EXPECT_EQ(loss_slice_width(2048, 151936), 8192);
  EXPECT_EQ(loss_slice_width(1, 151936), 151936);       // the whole vocabulary
  EXPECT_EQ(loss_slice_width(1 << 20, 151936), 256);    // never fewer than 256
  EXPECT_EQ(loss_slice_width(64, 300, 1 << 24), 300);   // a small vocabulary, whole
  for (int64_t rows = 1; rows <= 70000; rows += 97) {
    const int64_t w = loss_slice_width(rows, 151936);
    EXPECT_EQ(w % 8, 0) << rows;
    EXPECT_TRUE(w == 256 || w == 151936 || rows * w <= (int64_t{1} << 24)) << rows;
    EXPECT_GE(w, 256) << rows;
  }
}

// On a CUDA libtorch with a device: the fused slices (kernels/lm_loss_slice.cu) against the CPU's libtorch path,
// at a Qwen3 vocabulary width, bf16 and fp32, with ignored targets and an fp32 weight (a master) beside bf16 ones.
TEST(LinearCrossEntropy, GpuFusedSlicesFollowTheCpuPath) {
  QWEN3_GPU_TEST(at::hasCUDA());
  const at::Device cuda(at::kCUDA, 0);
  at::manual_seed(12);
  // Qwen3's vocabulary, or a smaller one under the sanitizers (racecheck ran out of its time on the full one).
  // 125 rows as well as 128: any row count (the slice width, loss_slice_width, keeps the products aligned).
  const int64_t h = 64, vocab = test::small_gpu_shapes() ? 8192 : 151936;
  take_slow_paths();
  for (const int64_t n : {int64_t{128}, int64_t{125}})
  for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    SCOPED_TRACE(n);
    const at::Tensor hidden = at::randn({n, h}).to(dtype);
    const at::Tensor weight = at::randn({vocab, h}) * 0.1;  // fp32, cast a slice at a time
    at::Tensor targets = at::randint(0, vocab, {n}, at::kLong);
    targets.index_put_({at::arange(0, n, 7)}, -100);
    const auto run = [&](const at::Device& device, at::Tensor& dh, at::Tensor& dw) {
      // detach(): to(kCPU) returns the tensor itself, so requires_grad_ would otherwise mark `hidden` and make the
      // CUDA copy a non-leaf without a .grad (the first GPU round met this).
      const at::Tensor hd = hidden.detach().to(device).requires_grad_(true);
      const at::Tensor wd = weight.detach().to(device).requires_grad_(true);
      const at::Tensor loss = linear_cross_entropy(hd, wd, targets.to(device), n * 4096, true);
      loss.backward();
      dh = hd.grad().cpu().to(at::kFloat), dw = wd.grad().cpu();
      return loss.item<double>();
    };
    at::Tensor dh_cpu, dw_cpu, dh_gpu, dw_gpu;
    const double want = run(at::kCPU, dh_cpu, dw_cpu), got = run(cuda, dh_gpu, dw_gpu);
    const double rtol = dtype == at::kBFloat16 ? 1.0 / 64 : 1e-4;
    EXPECT_NEAR(got, want, 1e-5 * want) << at::toString(dtype);
    EXPECT_LE((dh_gpu - dh_cpu).abs().max().item<double>(), rtol * dh_cpu.abs().max().item<double>()) << at::toString(dtype);
    EXPECT_LE((dw_gpu - dw_cpu).abs().max().item<double>(), rtol * dw_cpu.abs().max().item<double>()) << at::toString(dtype);
  }
  // The designed path, products included (an fp32 weight's rows written by cuBLAS from bf16 operands): no record.
  for (const SlowPath& p : take_slow_paths()) ADD_FAILURE() << p.what << " (" << p.why << ")";
}

// On a GPU float16 hidden states are none of the slice kernels' dtypes: the libtorch form runs, and says so,
// forward and backward.
TEST(LinearCrossEntropy, GpuHalfHiddenStatesTakeARecordedSlowerPath) {
  QWEN3_GPU_TEST(at::hasCUDA());
  const at::Device cuda(at::kCUDA, 0);
  at::manual_seed(14);
  const at::Tensor hidden = at::randn({16, 64}).to(cuda, at::kHalf).requires_grad_(true);
  const at::Tensor weight = (at::randn({300, 64}) * 0.1).to(cuda).requires_grad_(true);
  const at::Tensor targets = at::randint(0, 300, {16}, at::kLong).to(cuda);
  take_slow_paths();
  linear_cross_entropy(hidden, weight, targets, 16 * 128).backward();
  const std::vector<SlowPath> taken = take_slow_paths();
  const auto loss = std::find_if(taken.begin(), taken.end(),
                                 [](const SlowPath& p) { return p.what == "the loss's fused slices"; });
  ASSERT_NE(loss, taken.end());
  EXPECT_EQ(loss->why, "hidden states in float16 (the kernels take float32 and bfloat16)");
  EXPECT_EQ(loss->count, 2) << "forward and backward";
}

// On CUDA the head's gradient, made by backward, has each slice's rows written once (no zeroed buffer, no sum):
// every row as the CPU path forms it (within the products' rounding), whether handed to autograd or written into a
// fresh .grad(), for an fp32 (a master) and a bf16 weight; a second backward adds into the .grad() that is there.
TEST(LinearCrossEntropy, GpuGradientRowsAreWrittenOnceThenAddedTo) {
  QWEN3_GPU_TEST(at::hasCUDA());
  const at::Device cuda(at::kCUDA, 0);
  at::manual_seed(13);
  const int64_t n = 64, h = 64, vocab = 5000;  // slices of 4096 rows: the last one short
  const at::Tensor hidden = at::randn({n, h}).to(at::kBFloat16);
  const at::Tensor targets = at::randint(0, vocab, {n}, at::kLong);
  for (const at::ScalarType weight_dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor weight = (at::randn({vocab, h}) * 0.1).to(weight_dtype);
    const at::Tensor on_cpu = weight.clone().requires_grad_(true);
    linear_cross_entropy(hidden.to(at::kFloat), on_cpu, targets, n * 4096).backward();
    const at::Tensor want = on_cpu.grad().to(at::kFloat);
    const double bound = (weight_dtype == at::kBFloat16 ? 1.0 / 32 : 1.0 / 64) * want.abs().max().item<double>();
    const at::Tensor returned = weight.to(cuda).requires_grad_(true);
    linear_cross_entropy(hidden.to(cuda), returned, targets.to(cuda), n * 4096).backward();
    const at::Tensor into = weight.to(cuda).requires_grad_(true);
    linear_cross_entropy(hidden.to(cuda), into, targets.to(cuda), n * 4096, /*accumulate_into_weight_grad=*/true).backward();
    ASSERT_TRUE(into.grad().defined() && returned.grad().defined());
    EXPECT_LE((returned.grad().cpu().to(at::kFloat) - want).abs().max().item<double>(), bound) << at::toString(weight_dtype);
    EXPECT_TRUE(into.grad().equal(returned.grad())) << at::toString(weight_dtype);
    const at::Tensor once = into.grad().clone();
    linear_cross_entropy(hidden.to(cuda), into, targets.to(cuda), n * 4096, true).backward();
    EXPECT_LE((into.grad().cpu().to(at::kFloat) - 2 * want).abs().max().item<double>(), 2 * bound) << at::toString(weight_dtype);
  }
}

}  // namespace
}  // namespace qwen3
