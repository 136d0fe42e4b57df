#include "router_balance.h"

#include <torch/autograd.h>

#include "qwen3/base/error.h"

namespace qwen3::train_detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Identity in forward; in backward the load-balancing loss's gradient with respect to these logits is added to
// the one that came back. The loss object outlives every backward of its micro-batch (the trainer owns it), so it
// travels as an address.
class BalanceGradient : public torch::autograd::Function<BalanceGradient> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, int64_t loss_address) {
    ctx->saved_data["loss"] = loss_address;
    ctx->save_for_backward({logits});
    return logits.clone();  // [tokens, experts]: small
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto* loss = reinterpret_cast<const RouterBalanceLoss*>(ctx->saved_data["loss"].toInt());
    const at::Tensor logits = ctx->get_saved_variables()[0];
    at::Tensor grad = loss->gradient(logits);
    if (grad_outputs[0].defined()) grad = grad_outputs[0] + grad;
    return {grad, at::Tensor()};
  }
};

}  // namespace

RouterBalanceLoss::RouterBalanceLoss(int64_t layers, int64_t experts, int64_t top_k, double coefficient)
    : experts_(experts), top_k_(top_k), coefficient_(coefficient), counted_(static_cast<size_t>(layers), false) {
  if (experts < 1 || top_k < 1 || top_k > experts || !(coefficient >= 0))
    throw Error("load-balancing loss: " + std::to_string(top_k) + " of " + std::to_string(experts) +
                " experts, coefficient " + std::to_string(coefficient));
}

void RouterBalanceLoss::begin(const at::Tensor& token_mask, double weight) {
  mask_ = token_mask.defined() ? token_mask.reshape({-1}).to(at::kFloat) : at::Tensor();
  weight_ = weight;
  std::fill(counted_.begin(), counted_.end(), false);
  routed_ = probability_ = counted_tokens_ = at::Tensor();
}

at::Tensor RouterBalanceLoss::observe(int64_t layer, const at::Tensor& router_logits) {
  if (layer < 0 || layer >= static_cast<int64_t>(counted_.size())) throw Error("load-balancing loss: no layer " + std::to_string(layer));
  if (mask_.defined() && mask_.device() != router_logits.device()) mask_ = mask_.to(router_logits.device());
  if (mask_.defined() && mask_.size(0) != router_logits.size(0))
    throw Error("load-balancing loss: " + std::to_string(router_logits.size(0)) + " tokens routed, " +
                std::to_string(mask_.size(0)) + " positions in the mask");
  if (!counted_[static_cast<size_t>(layer)]) {
    at::NoGradGuard no_grad;
    // As load_balancing_loss (lm_loss.h) and the block's routing: fp32 softmax over the experts, its top k.
    const at::Tensor p = at::softmax(router_logits.detach(), -1, at::kFloat);
    const at::Tensor chosen = std::get<1>(at::topk(p, top_k_, -1));
    const at::Tensor routed = at::zeros_like(p).scatter_(1, chosen, 1.0);
    const at::Tensor w = mask_.defined() ? mask_.unsqueeze(1) : at::ones({p.size(0), 1}, p.options());
    const at::Tensor r = (routed * w).sum(0), q = (p * w).sum(0), n = w.sum();
    routed_ = routed_.defined() ? routed_ + r : r;
    probability_ = probability_.defined() ? probability_ + q : q;
    counted_tokens_ = counted_tokens_.defined() ? counted_tokens_ + n : n;
    counted_[static_cast<size_t>(layer)] = true;
  }
  if (!at::GradMode::is_enabled() || !router_logits.requires_grad() || coefficient_ == 0) return router_logits;
  return BalanceGradient::apply(router_logits, reinterpret_cast<int64_t>(this));
}

// loss = E Σ_e f_e p_e with f_e = routed_e / counted and p_e = Σ_{blocks, tokens} w P / counted; f is a count
// (no gradient), so d loss / d P[t, e] = E f_e w_t / counted, and through the softmax
// d / d z[t, j] = P[t, j] (g_j − Σ_e g_e P[t, e]). Scaled by the coefficient and the micro-batch's weight.
at::Tensor RouterBalanceLoss::gradient(const at::Tensor& router_logits) const {
  at::NoGradGuard no_grad;
  if (!routed_.defined()) throw Error("load-balancing loss: backward before any block was counted");
  const at::Tensor p = at::softmax(router_logits.detach(), -1, at::kFloat);
  const at::Tensor counted = counted_tokens_.clamp_min(1.0);
  const at::Tensor g = routed_ * (coefficient_ * weight_ * static_cast<double>(experts_)) / (counted * counted);
  at::Tensor grad = p * (g - (p * g).sum(-1, /*keepdim=*/true));
  if (mask_.defined()) grad = grad * mask_.unsqueeze(1);
  return grad.to(router_logits.scalar_type());
}

at::Tensor RouterBalanceLoss::finish() {
  at::Tensor value;
  if (routed_.defined()) {
    const at::Tensor counted = counted_tokens_.clamp_min(1.0);
    value = ((routed_ / counted) * (probability_ / counted)).sum() * static_cast<double>(experts_);
  }
  begin(at::Tensor(), 1.0);
  return value;
}

}  // namespace qwen3::train_detail
