#include "qwen3/model/lm_loss.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <limits>
#include <string>

#include "qwen3/base/error.h"
#include "qwen3/base/message_text.h"
#include "qwen3/base/slow_paths.h"
#include "qwen3/nvfp4/nvfp4_linear.h"

#include "model/kernel_glue.h"
#ifdef QWEN3_MODEL_KERNELS
#define QWEN3_FUSED_LOSS 1
#endif

namespace qwen3 {
namespace {

// Each slice's logits are read once on CUDA (kernels/lm_loss_slice.cu: the statistics in forward, the gradient
// written over the logits in backward) instead of libtorch's fp32 copy, exponentials and masks (5-6 passes
// over an fp32 [rows, slice]); the libtorch form is the CPU path and the kernels' reference.
// On CUDA the libtorch form is a slow path, recorded (forward and backward each) with its reason.
bool fused_slices_take(const at::Tensor& hidden, const at::Tensor& targets) {
  if (!hidden.is_cuda()) return false;
#ifdef QWEN3_FUSED_LOSS
  if (hidden.scalar_type() != at::kFloat && hidden.scalar_type() != at::kBFloat16) {
    record_slow_path("the loss's fused slices", std::string("hidden states in ") + dtype_text(hidden.scalar_type()) +
                                                    " (the kernels take float32 and bfloat16)");
    return false;
  }
  if (targets.scalar_type() != at::kLong || targets.device() != hidden.device()) {
    record_slow_path("the loss's fused slices", "targets not int64 on the hidden states' device");
    return false;
  }
  return true;
#else
  (void)targets;
  record_slow_path("the loss's fused slices", "this build has no CUDA kernels (configured without nvcc)");
  return false;
#endif
}

#ifdef QWEN3_FUSED_LOSS
using kernel_glue::activation_dtype;
using kernel_glue::current_stream;
void check_kernel(int status, const char* what) { kernel_glue::check_launch(status, std::string("the loss's ") + what); }
#endif

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class LinearCrossEntropy : public torch::autograd::Function<LinearCrossEntropy> {
 public:
  // `into_leaf`: the weight (a leaf) gets its gradient added into its .grad() in place by backward, which
  // returns none for it; the weight stays an input so that the node is recorded whatever else requires grad.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& targets, int64_t slice_elements, bool into_leaf) {
    const int64_t n = hidden.size(0), vocab = weight.size(0);
    const int64_t width = loss_slice_width(n, vocab, slice_elements);
    const auto f32 = hidden.options().dtype(at::kFloat);
    at::Tensor running_max = at::full({n}, -std::numeric_limits<float>::infinity(), f32);
    at::Tensor running_sum = at::zeros({n}, f32);
    at::Tensor target_logit = at::zeros({n}, f32);
    const at::Tensor valid = targets.ne(-100);
    const at::Tensor safe_targets = targets.clamp_min(0);
    [[maybe_unused]] const bool fused = fused_slices_take(hidden, targets);
    const at::Tensor targets_c = targets.contiguous();
    for (int64_t v0 = 0; v0 < vocab; v0 += width) {
      const int64_t w = std::min(width, vocab - v0);
      // The product in the hidden states' dtype (a weight of another dtype is cast a slice at a time).
      const at::Tensor product = at::matmul(hidden, weight.narrow(0, v0, w).to(hidden.scalar_type()).t());
#ifdef QWEN3_FUSED_LOSS
      if (fused) {
        const at::Tensor logits = product.contiguous();
        check_kernel(kernels::launch_loss_slice_stats(logits.data_ptr(), activation_dtype(logits), n, w, v0,
                                                      targets_c.data_ptr<int64_t>(), running_max.data_ptr<float>(),
                                                      running_sum.data_ptr<float>(), target_logit.data_ptr<float>(),
                                                      current_stream(logits)),
                     "statistics");
        continue;
      }
#endif
      const at::Tensor logits = product.to(at::kFloat);
      const at::Tensor slice_max = std::get<0>(logits.max(1));
      const at::Tensor new_max = at::maximum(running_max, slice_max);
      running_sum = running_sum * at::exp(running_max - new_max) + at::exp(logits - new_max.unsqueeze(1)).sum(1);
      running_max = new_max;
      // Targets inside this slice pick their logit from it.
      const at::Tensor in_slice = safe_targets.ge(v0).logical_and(safe_targets.lt(v0 + w));
      const at::Tensor local = (safe_targets - v0).clamp(0, w - 1).unsqueeze(1);
      target_logit = at::where(in_slice, logits.gather(1, local).squeeze(1), target_logit);
    }
    const at::Tensor lse = running_max + at::log(running_sum);
    const at::Tensor count = valid.sum().to(at::kFloat).clamp_min(1.0);
    const at::Tensor loss = ((lse - target_logit) * valid.to(at::kFloat)).sum() / count;
    ctx->save_for_backward({hidden, weight, targets, lse, count});
    ctx->saved_data["width"] = width;
    if (into_leaf) ctx->saved_data["weight_leaf"] = weight;
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &hidden = saved[0], &weight = saved[1], &targets = saved[2], &lse = saved[3], &count = saved[4];
    const int64_t width = ctx->saved_data["width"].toInt();
    const int64_t n = hidden.size(0), vocab = weight.size(0);
    // d loss / d logit = (softmax - onehot) * valid * grad / count
    const at::Tensor row_scale = (targets.ne(-100).to(at::kFloat) * (grad_outputs[0].to(at::kFloat) / count)).unsqueeze(1);
    const at::Tensor safe_targets = targets.clamp_min(0);
    [[maybe_unused]] const bool fused = fused_slices_take(hidden, targets);
    const at::Tensor targets_c = targets.contiguous(), lse_c = lse.contiguous(), row_scale_c = row_scale.contiguous();
    at::Tensor grad_hidden = at::zeros({n, hidden.size(1)}, hidden.options().dtype(at::kFloat));
    // Either the leaf's own .grad() (accumulated into, slice by slice, with no [V, H] temporary), or a returned
    // gradient (only if autograd asks for one).
    at::Tensor grad_weight;
    // On CUDA a gradient made here is not zeroed and then added to: the slices cover its rows once each, and each
    // slice's product is written into its rows (product_into). On the CPU, zeros and sums as before (its bytes).
    bool fresh = false;  // a gradient made here: each slice writes its rows
    const auto new_gradient = [&](const at::Tensor& like) {
      fresh = hidden.is_cuda();
      return fresh ? at::empty_like(like, at::MemoryFormat::Contiguous) : at::zeros_like(like, at::MemoryFormat::Contiguous);
    };
    const bool into_leaf = ctx->saved_data.count("weight_leaf") > 0;
    if (into_leaf) {
      at::Tensor leaf = ctx->saved_data["weight_leaf"].toTensor();
      at::Tensor& g = leaf.mutable_grad();
      if (!g.defined()) g = new_gradient(leaf);
      grad_weight = g;
    } else if (ctx->needs_input_grad(1)) {
      grad_weight = new_gradient(weight);
    }
    for (int64_t v0 = 0; v0 < vocab; v0 += width) {
      const int64_t w = std::min(width, vocab - v0);
      const at::Tensor wslice = weight.narrow(0, v0, w).to(hidden.scalar_type());
      const at::Tensor product = at::matmul(hidden, wslice.t());
      at::Tensor d_typed;
#ifdef QWEN3_FUSED_LOSS
      if (fused) {
        d_typed = product.contiguous();  // the gradient goes over the logits: no second [rows, slice] buffer
        check_kernel(kernels::launch_loss_slice_gradient(d_typed.data_ptr(), d_typed.data_ptr(), activation_dtype(d_typed),
                                                         n, w, v0, targets_c.data_ptr<int64_t>(),
                                                         lse_c.data_ptr<float>(), row_scale_c.data_ptr<float>(),
                                                         current_stream(d_typed)),
                     "gradient");
      }
#endif
      if (!d_typed.defined()) {
        at::Tensor d = at::exp(product.to(at::kFloat) - lse.unsqueeze(1));
        const at::Tensor in_slice = safe_targets.ge(v0).logical_and(safe_targets.lt(v0 + w));
        const at::Tensor local = (safe_targets - v0).clamp(0, w - 1).unsqueeze(1);
        d.scatter_add_(1, local, -in_slice.to(at::kFloat).unsqueeze(1));
        d.mul_(row_scale);
        d_typed = d.to(hidden.scalar_type());
      }
      // fp32 accumulator out of cuBLAS where the libtorch has it, not a bf16 product widened (product_in_dtype).
      grad_hidden.add_(nvfp4::product_in_dtype(d_typed, wslice, at::kFloat));
      if (grad_weight.defined()) {
        at::Tensor target = grad_weight.narrow(0, v0, w);
        if (fresh) {
          nvfp4::product_into(target, d_typed.t(), hidden);
        } else if (target.scalar_type() == hidden.scalar_type()) {
          target.addmm_(d_typed.t(), hidden);
        } else {  // an fp32 master's gradient: the product in fp32 where cuBLAS gives it (product_in_dtype)
          target.add_(nvfp4::product_in_dtype(d_typed.t(), hidden, target.scalar_type()));
        }
      }
    }
    return {grad_hidden.to(hidden.scalar_type()), into_leaf ? at::Tensor() : grad_weight, at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

int64_t loss_slice_width(int64_t rows, int64_t vocab, int64_t slice_elements) {
  constexpr int64_t kColumnMultiple = 128, kFewest = 256;
  const int64_t fits = slice_elements / std::max<int64_t>(rows, 1) / kColumnMultiple * kColumnMultiple;
  return std::min(vocab, std::max(kFewest, fits));
}

at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                int64_t slice_elements, bool accumulate_into_weight_grad) {
  if (accumulate_into_weight_grad && weight.is_leaf() && weight.requires_grad())
    return LinearCrossEntropy::apply(hidden, weight, targets, slice_elements, true);
  return LinearCrossEntropy::apply(hidden, weight, targets, slice_elements, false);
}

at::Tensor load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t top_k, const at::Tensor& token_mask) {
  if (router_logits.empty()) throw Error("load_balancing_loss: no router logits (no sparse block ran)");
  const at::Tensor probs = at::softmax(at::cat(router_logits, 0), -1, at::kFloat);  // [L·N, E]
  const int64_t E = probs.size(1);
  const at::Tensor chosen = std::get<1>(at::topk(probs, top_k, -1));
  // The k experts of a token are distinct: one 1 each in its row.
  const at::Tensor routed = at::zeros_like(probs).scatter_(1, chosen, 1.0);
  const int64_t blocks = static_cast<int64_t>(router_logits.size());
  const at::Tensor weight = token_mask.defined()
                                ? token_mask.reshape({-1}).to(probs.device()).to(at::kFloat).repeat({blocks}).unsqueeze(1)
                                : at::ones({probs.size(0), 1}, probs.options());
  const at::Tensor counted = weight.sum().clamp_min(1.0);
  const at::Tensor f = (routed * weight).sum(0) / counted;
  const at::Tensor p = (probs * weight).sum(0) / counted;
  return (f * p).sum() * static_cast<double>(E);
}

}  // namespace qwen3
