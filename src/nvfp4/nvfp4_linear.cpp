// The straight-through NVFP4 linear as one custom autograd function (no W + (deq(Q(W)) - W).detach() graph).
#include "qwen3/nvfp4/nvfp4_linear.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/version.h>

#include <ostream>
#include <string>

#include "nvfp4/nvfp4_cuda.h"
#include "qwen3/base/error.h"
#include "qwen3/base/message_text.h"
#include "qwen3/nvfp4/nvfp4_ops.h"

namespace qwen3::nvfp4 {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;


// deq(codes, scales) in `dtype` for one product: on CUDA into the reused scratch buffer (no allocation per
// projection), elsewhere a fresh tensor.
at::Tensor dequantized_for_product(const at::Tensor& codes, const at::Tensor& scales, at::ScalarType dtype) {
  if (codes.is_cuda() && scales.scalar_type() == at::kByte) return dequantize_into_scratch_cuda(codes, scales, dtype);
  return dequantize(codes, scales, dtype);
}

// On CUDA with bf16 activations at training shapes (the dense-operand product): the weight's codes and its bf16
// operand come from one kernel, and the product reads the operand without the codes being read back.
bool operand_in_quantize_pass(const at::Tensor& x2d, const at::Tensor& weight) {
  return weight.is_cuda() && x2d.scalar_type() == at::kBFloat16 && weight.size(1) % kBlock == 0 &&
         (weight.scalar_type() == at::kFloat || weight.scalar_type() == at::kBFloat16) &&
         !(x2d.size(0) < kNvfp4KernelMaxRows && matmul_cuda_supports(x2d));
}

class SteLinearFunction : public torch::autograd::Function<SteLinearFunction> {
 public:
  // recorded: a graph keeps this node (backward may run). keep_operand: save the bf16 operand for dX instead of the
  // codes (no dequantization in backward; 2 bytes an element held instead of 0.5625), where the fused pass makes
  // it. The fused pass writes the codes only when they are saved.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, ScaleMode mode,
                            bool keep_operand, bool recorded) {
    const at::Tensor x2d = x.reshape({-1, x.size(-1)});
    std::vector<int64_t> out_sizes(x.sizes().begin(), x.sizes().end());
    out_sizes.back() = weight.size(0);
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    if (operand_in_quantize_pass(x2d, weight)) {
      const at::Tensor w = weight.detach().contiguous();
      const bool kept = recorded && keep_operand, codes_saved = recorded && !keep_operand;
      const auto bytes = w.options().dtype(at::kByte);
      Quantized q;
      if (codes_saved) q = {at::empty({w.size(0), w.size(1) / 2}, bytes), at::empty({w.size(0), w.size(1) / kBlock}, bytes)};
      const at::Tensor operand = kept ? at::empty(w.sizes(), w.options().dtype(at::kBFloat16))
                                      : scratch_operand_cuda(w.device(), w.size(0), w.size(1));
      quantize_with_operand_cuda(w, mode, q.codes, q.scales, operand);
      if (kept) {
        ctx->save_for_backward({x, operand});
        ctx->saved_data["kept_operand"] = true;
      } else if (codes_saved) {
        ctx->save_for_backward({x, q.codes, q.scales});
      }
      return at::_unsafe_view(x2d.mm(operand.t()), out_sizes);
    }
    const Quantized quantized = quantize(weight.detach(), mode);
    ctx->save_for_backward({x, quantized.codes, quantized.scales});
    // _unsafe_view: an ordinary view as the output of a custom function would be tracked as a view of a
    // temporary and refuse later in-place use; this product has no other user.
    return at::_unsafe_view(quantized_product(x2d, quantized.codes, quantized.scales), out_sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const bool kept = ctx->saved_data.count("kept_operand") > 0;
    const int64_t out_features = saved[1].size(0);
    const at::Tensor grad_y2d = grad_outputs[0].reshape({-1, out_features});
    at::Tensor grad_x, grad_weight;
    if (ctx->needs_input_grad(0)) {
      const at::Tensor w = kept ? saved[1].to(grad_y2d.scalar_type())
                                : dequantized_for_product(saved[1], saved[2], grad_y2d.scalar_type());
      grad_x = grad_y2d.mm(w).view(x.sizes());
    }
    if (ctx->needs_input_grad(1)) {
      const auto weight_dtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
      grad_weight = product_in_dtype(grad_y2d.t(), x.reshape({-1, x.size(-1)}), weight_dtype);
    }
    return {grad_x, grad_weight, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// y = x · deq(codes, scales)ᵀ with a gradient for x only.
class FrozenLinearFunction : public torch::autograd::Function<FrozenLinearFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& codes,
                            const at::Tensor& scales) {
    std::vector<int64_t> out_sizes(x.sizes().begin(), x.sizes().end());
    out_sizes.back() = codes.size(0);
    ctx->save_for_backward({codes, scales});
    ctx->saved_data["x_sizes"] = x.sizes();
    return at::_unsafe_view(quantized_product(x.reshape({-1, x.size(-1)}), codes, scales), out_sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor grad_y2d = grad_outputs[0].reshape({-1, saved[0].size(0)});
    const auto sizes = ctx->saved_data["x_sizes"].toIntVector();
    return {grad_y2d.mm(dequantized_for_product(saved[0], saved[1], grad_y2d.scalar_type())).view(sizes),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor quantized_product(const at::Tensor& x2d, const at::Tensor& codes, const at::Tensor& scales) {
  if (x2d.size(0) < kNvfp4KernelMaxRows && matmul_cuda_supports(x2d)) return matmul_cuda(x2d, codes, scales);
  return x2d.mm(dequantized_for_product(codes, scales, x2d.scalar_type()).t());
}

at::Tensor product_in_dtype(const at::Tensor& a, const at::Tensor& b, at::ScalarType dtype) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
  // aten::mm.dtype (PyTorch 2.8 added it; 2.9 is the oldest libtorch this is compiled against).
  const bool half = a.scalar_type() == at::kBFloat16 || a.scalar_type() == at::kHalf;
  if (a.is_cuda() && half && dtype == at::kFloat && b.scalar_type() == a.scalar_type()) return at::mm(a, b, at::kFloat);
#endif
  return a.mm(b).to(dtype);
}

at::Tensor frozen_nvfp4_linear(const at::Tensor& x, const Quantized& weight) {
  if (x.dim() < 1 || x.size(-1) != weight.codes.size(1) * 2)
    throw Error("nvfp4 linear: input " + shape_text(x.sizes()) + " does not match a frozen weight of " +
                std::to_string(weight.codes.size(1) * 2) + " input columns");
  return FrozenLinearFunction::apply(x, weight.codes, weight.scales);
}

at::Tensor ste_linear(const at::Tensor& x, const at::Tensor& weight, ScaleMode mode, bool keep_operand) {
  if (weight.dim() != 2 || x.dim() < 1 || x.size(-1) != weight.size(1))
    throw Error("nvfp4 linear: input " + shape_text(x.sizes()) + " does not match weight " + shape_text(weight.sizes()) +
                " ([..., in] and [out, in])");
  if (x.device() != weight.device())
    throw Error("nvfp4 linear: input on " + x.device().str() + " but weight on " + weight.device().str());
  // Only a recorded node keeps anything: without a graph the operand goes to the reused scratch buffer and no codes
  // are written.
  const bool recorded = at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
  return SteLinearFunction::apply(x, weight, mode, keep_operand, recorded);
}

}  // namespace qwen3::nvfp4
