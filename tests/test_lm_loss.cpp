// linear_cross_entropy (sliced over the vocabulary) against the plain logits + cross_entropy path: value and
// both gradients, with ignored targets and many slice widths.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <torch/autograd.h>

#include "qwen3/model/lm_loss.h"

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

}  // namespace
}  // namespace qwen3
