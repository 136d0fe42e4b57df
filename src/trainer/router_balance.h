// The load-balancing loss of a mixture-of-experts model, trained across the blocks' separate autograd segments.
//
// transformers adds router_aux_loss_coef × load_balancing_loss(every sparse block's router logits) to the loss
// when the config says output_router_logits (lm_loss.h has the formula). That loss couples the blocks: its
// gradient with respect to one block's router probabilities is E · f_e / counted for every token, where f_e is the
// share of all blocks' routed (token, choice) pairs that went to expert e, known only after the whole forward.
// Our blocks run as their own segments (recomputed under --grad-checkpoint, applied block by block under
// --fused-optimizer), so there is no single graph to differentiate that sum through. Instead (as Megatron-LM's
// MoE layers do) the observer counts each block's routing as forward runs it, and wraps the router logits in a
// node whose backward adds the loss's gradient — by then every block has been counted — to the gradient coming
// from the language-model loss. The value itself never enters the trained scalar; it is reported as a metric.
//
// Per micro-batch: begin() before its forward, finish() after its backward (which returns its loss value).
// A block is counted once per micro-batch however often it runs (a checkpointed block runs twice); the gradient
// is added wherever a graph is recorded.
#pragma once
#include <ATen/ATen.h>

#include <vector>

#include "qwen3/model/model.h"

namespace qwen3::train_detail {

class RouterBalanceLoss final : public RouterObserver {
 public:
  RouterBalanceLoss(int64_t layers, int64_t experts, int64_t top_k, double coefficient);

  // `token_mask` [B, T] (any dtype; nonzero: a position holding a token, as transformers' attention_mask) or
  // undefined (every position counts); `weight`: this micro-batch's share of the step's loss, which scales its
  // load-balancing loss as it scales its language-model loss.
  void begin(const at::Tensor& token_mask, double weight);
  at::Tensor observe(int64_t layer, const at::Tensor& router_logits) override;
  // The micro-batch's load-balancing loss (unweighted, unscaled: transformers' aux_loss), a 0-dim fp32 tensor on
  // the device; undefined if no sparse block ran.
  at::Tensor finish();

  // For the backward node.
  at::Tensor gradient(const at::Tensor& router_logits) const;

 private:
  int64_t experts_, top_k_;
  double coefficient_, weight_ = 1;
  at::Tensor mask_;                  // fp32 [N] on the device, or undefined: all ones
  std::vector<bool> counted_;        // per layer, this micro-batch
  at::Tensor routed_, probability_;  // fp32 [E]: the masked sums over counted blocks and tokens
  at::Tensor counted_tokens_;        // fp32 0-dim: the masked token count summed over counted blocks
};

}  // namespace qwen3::train_detail
