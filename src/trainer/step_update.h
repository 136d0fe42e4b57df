// A training step after its batch: forward, backward and the AdamW update, in the plain order or inside backward
// (--fused-optimizer: the FusedUpdater the model's gradient sink calls with each block's gradients), behind one
// interface. Private to the trainer (trainer.cpp includes it once). docs/trainer.md.
#pragma once
#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/utils.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "qwen3/model/model.h"
#include "qwen3/nvfp4/nvfp4_ops.h"
#include "qwen3/optim/optim.h"
#include "qwen3/data/data.h"
#include "block_runner.h"
#include "train_setup.h"

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

// Clears the runner's gradient sink however the step ends.
struct SinkGuard {
  TrainingBlockRunner& runner;
  ~SinkGuard() { runner.set_gradient_sink(nullptr); }
};

// A step after its batch: forward, backward and the AdamW update. Two orders behind one interface, so the loop
// is the same for both: the plain one (backward, one synchronization for loss, norm and the codec's non-finite
// flag, then the update with the clipping factor) and the in-backward one (--fused-optimizer: each block is
// updated, clipped by its share of the limit, as soon as its gradients are complete, and they are freed).
struct StepOutcome {
  double loss = 0, norm = 0;
  bool bad = false;  // non-finite loss or gradients: the plain update was skipped (fused: the bad groups were)
};
using PhaseMark = std::function<void(const char*)>;

class StepUpdate {
 public:
  StepUpdate(const TrainOptions& o, TrainableSet& set, AdamW& opt, const c10::Device& device,
             TrainingBlockRunner& runner)
      : o_(o), set_(set), opt_(opt), device_(device), runner_(runner) {}
  virtual ~StepUpdate() = default;
  // `batches`: the step's micro-batches (one without gradient accumulation).
  virtual StepOutcome forward_backward_update(Qwen3Model& model, const std::vector<Batch>& batches, double lr,
                                              const PhaseMark& mark) = 0;

 protected:
  const TrainOptions& o_;
  TrainableSet& set_;
  AdamW& opt_;
  c10::Device device_;
  TrainingBlockRunner& runner_;
};

class PlainUpdate final : public StepUpdate {
 public:
  using StepUpdate::StepUpdate;
  StepOutcome forward_backward_update(Qwen3Model& model, const std::vector<Batch>& batches, double lr,
                                      const PhaseMark& mark) override {
    // Gradient accumulation: each micro-batch's mean loss weighted by its share of the step's loss tokens, so the
    // gradients add up to those of the mean over all of them (one big batch's), whatever each holds.
    int64_t step_loss_tokens = 0;
    for (const Batch& b : batches) step_loss_tokens += b.loss_tokens;
    at::Tensor loss;
    for (const Batch& batch : batches) {
      const double share = batches.size() == 1 || step_loss_tokens == 0
                               ? 1.0
                               : static_cast<double>(batch.loss_tokens) / static_cast<double>(step_loss_tokens);
      at::Tensor micro = compute_loss(model, batch, o_.loss);
      if (share != 1.0) micro = micro * share;
      mark("forward_done");
      micro.backward();
      loss = loss.defined() ? loss + micro.detach() : micro.detach();
    }
    // One synchronization a step: the loss, the squared gradient norm and the codec's non-finite flag reach
    // the host together; clipping is a factor the update applies as it reads each gradient.
    std::vector<at::Tensor> results;
    results.push_back(loss.detach().reshape({1}).to(at::kDouble));
    const at::Tensor square = grad_square_sum(set_.params);
    results.push_back(square.defined() ? square.reshape({1}).to(at::kDouble) : at::zeros({1}, results[0].options()));
    const at::Tensor flag = nvfp4::take_nonfinite_flag_async(device_);
    if (flag.defined()) results.push_back(flag.to(at::kDouble));
    const at::Tensor host = at::cat(results).to(at::kCPU);
    StepOutcome out;
    out.loss = host[0].item<double>();
    out.norm = std::sqrt(host[1].item<double>());
    loss = at::Tensor();
    mark("backward_done");
    out.bad = !std::isfinite(out.loss) || !std::isfinite(out.norm) || (flag.defined() && host[2].item<double>() != 0);
    if (!out.bad) opt_.step(lr, clip_factor(out.norm, o_.grad_clip));
    for (auto& p : set_.params) p.param.mutable_grad() = at::Tensor();  // free the gradients between steps
    return out;
  }
};

class FusedUpdate final : public StepUpdate {
 public:
  using StepUpdate::StepUpdate;
  StepOutcome forward_backward_update(Qwen3Model& model, const std::vector<Batch>& batches, double lr,
                                      const PhaseMark& mark) override {
    if (batches.size() != 1) throw Error("the in-backward update takes one batch a step (no gradient accumulation)");
    const Batch& batch = batches.front();
    // The sink must be in place before forward, which decides how each block's backward will run.
    FusedUpdater updater(opt_, o_.grad_clip, set_.trainable_parameters, lr);
    SinkGuard guard{runner_};  // cleared at the end of the step, whichever way it ends
    runner_.set_gradient_sink(
        [&](int64_t, const std::vector<std::pair<at::Tensor, at::Tensor>>& grads) { updater.apply(grads); });
    at::Tensor loss = compute_loss(model, batch, o_.loss);
    mark("forward_done");
    StepOutcome out;
    out.loss = loss.item<double>();
    out.norm = std::numeric_limits<double>::quiet_NaN();
    out.bad = !std::isfinite(out.loss);
    if (out.bad) {  // a non-finite loss skips the step before anything is applied
      loss = at::Tensor();
      mark("backward_done");
      return out;
    }
    opt_.begin_step();
    loss.backward();
    loss = at::Tensor();
    mark("backward_done");
    for (auto& p : set_.params) {  // the tensors outside the blocks (embedding, final norm, head)
      at::Tensor& grad = p.param.mutable_grad();
      if (grad.defined()) updater.apply({{p.param, grad}});
      grad = at::Tensor();
    }
    out.norm = updater.norm();
    out.bad = updater.nonfinite() || nvfp4::take_nonfinite_flag(device_);
    return out;
  }
};

}  // namespace qwen3::train_detail
