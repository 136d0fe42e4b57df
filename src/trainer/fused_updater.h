// The optimizer inside backward (--fused-optimizer): what the model's gradient sink calls with each block's
// gradients, and what the trainer calls for the tensors outside the blocks afterwards. docs/trainer.md.
#pragma once
#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <utility>
#include <vector>

#include "qwen3/model/model.h"
#include "qwen3/optim/optim.h"

namespace qwen3::train_detail {

// Gradient clipping and non-finite checks when the optimizer runs inside backward (--fused-optimizer): the
// global norm is known only after the last update, so each group (a block, or a tensor outside the blocks) is
// clipped to its share of --grad-clip, max_norm * sqrt(group elements / trainable elements); the clipped global
// norm then never exceeds max_norm, as with global clipping. A group with a non-finite gradient is not applied.
class FusedUpdater {
 public:
  FusedUpdater(AdamW& opt, double max_norm, int64_t trainable_elements, double lr)
      : opt_(opt), max_norm_(max_norm), trainable_(static_cast<double>(trainable_elements)), lr_(lr) {}

  void apply(const std::vector<std::pair<at::Tensor, at::Tensor>>& group) {
    torch::NoGradGuard no_grad;
    at::Tensor square_sum;
    double elements = 0;
    for (const auto& [param, grad] : group) {
      if (!grad.defined()) continue;
      const at::Tensor sq = square_sum_fp32(grad);
      square_sum = square_sum.defined() ? square_sum + sq : sq;
      elements += static_cast<double>(grad.numel());
    }
    if (!square_sum.defined()) return;
    const double square = square_sum.item<double>();  // one synchronization a group
    sum_of_squares_ += square;
    if (!std::isfinite(square)) {
      nonfinite_ = true;
      return;
    }
    const double norm = std::sqrt(square), limit = max_norm_ * std::sqrt(elements / trainable_);
    const double scale = clip_factor(norm, limit);  // applied by the update as it reads the gradient
    for (const auto& [param, grad] : group)
      if (grad.defined()) opt_.update(opt_.index_of(param), grad, lr_, scale);
  }
  double norm() const { return std::sqrt(sum_of_squares_); }
  bool nonfinite() const { return nonfinite_; }

 private:
  AdamW& opt_;
  double max_norm_, trainable_, lr_;
  double sum_of_squares_ = 0;
  bool nonfinite_ = false;
};

// Clears the model's gradient sink however the step ends.
struct SinkGuard {
  Qwen3Model& model;
  ~SinkGuard() { model.set_block_gradient_sink(nullptr); }
};

}  // namespace qwen3::train_detail
