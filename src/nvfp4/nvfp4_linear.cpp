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
#include "qwen3/base/slow_paths.h"
#include "qwen3/nvfp4/nvfp4_ops.h"

// at::_grouped_mm (PyTorch 2.8+): one grouped GEMM for all the groups of a grouped product.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
#define QWEN3_NATIVE_GROUPED_MM 1
#endif

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
// operand come from one kernel, and the product reads the operand without the codes being read back. Where a CUDA
// weight's product does not take that pass, why (what a slower path records); empty where it does, and
// kKernelRows where the rows are few enough for the NVFP4 kernel, which is then the path.
constexpr const char* kKernelRows = "the NVFP4 kernel's rows";
std::string one_pass_refusal(const at::Tensor& x2d, const at::Tensor& weight) {
  if (x2d.size(0) < kNvfp4KernelMaxRows && matmul_cuda_supports(x2d)) return kKernelRows;
  if (x2d.scalar_type() != at::kBFloat16)
    return "activations in " + dtype_text(x2d.scalar_type()) +
           " (the pass writes a bfloat16 operand: --compute-dtype bfloat16)";
  if (weight.size(1) % kBlock != 0) return "rows that are not whole 16-blocks";
  if (weight.scalar_type() != at::kFloat && weight.scalar_type() != at::kBFloat16)
    return "a master in " + dtype_text(weight.scalar_type());
  return "";
}

// One trained weight's product in forward and what its backward keeps for dX: the bf16 operand (`kept_operand`),
// the codes and scales, or nothing (a forward no graph records, on the fused path).
struct SteProduct {
  at::Tensor y2d;
  std::vector<at::Tensor> saved;
  bool kept_operand = false;
};

// recorded: a graph keeps this node (backward may run). keep_operand: save the bf16 operand for dX instead of the
// codes (no dequantization in backward; 2 bytes an element held instead of 0.5625), where the fused pass makes
// it. The fused pass writes the codes only when they are saved.
// persistent: the weight's operand kept across steps (ste_linear_persistent), made here only when stale.
// computed false (ProductOutput::unread): what backward saves is made as ever, the product is not run.
SteProduct ste_product(const at::Tensor& x2d, const at::Tensor& weight, ScaleMode mode, bool keep_operand,
                       bool recorded, PersistentOperand* persistent, bool computed) {
  SteProduct p;
  // The product `multiply` makes, or where unread its output's allocation alone.
  const auto product = [&](const auto& multiply) {
    return computed ? multiply() : at::empty({x2d.size(0), weight.size(0)}, x2d.options());
  };
  const std::string refusal = weight.is_cuda() ? one_pass_refusal(x2d, weight) : "a weight off the GPU";
  const bool one_pass = refusal.empty();
  if (persistent != nullptr && one_pass) {
    if (persistent->version != weight._version()) {
      quantize_with_operand_cuda(weight.detach().contiguous(), mode, at::Tensor(), at::Tensor(), persistent->operand);
      persistent->version = weight._version();
    }
    if (recorded) p.saved = {persistent->operand}, p.kept_operand = true;
    p.y2d = product([&] { return x2d.mm(persistent->operand.t()); });
    return p;
  }
  if (one_pass) {
    const at::Tensor w = weight.detach().contiguous();
    const bool kept = recorded && keep_operand, codes_saved = recorded && !keep_operand;
    const auto bytes = w.options().dtype(at::kByte);
    Quantized q;
    if (codes_saved) q = {at::empty({w.size(0), w.size(1) / 2}, bytes), at::empty({w.size(0), w.size(1) / kBlock}, bytes)};
    const at::Tensor operand = kept ? at::empty(w.sizes(), w.options().dtype(at::kBFloat16))
                                    : scratch_operand_cuda(w.device(), w.size(0), w.size(1));
    quantize_with_operand_cuda(w, mode, q.codes, q.scales, operand);
    if (kept) p.saved = {operand}, p.kept_operand = true;
    else if (codes_saved) p.saved = {q.codes, q.scales};
    p.y2d = product([&] { return x2d.mm(operand.t()); });
    return p;
  }
  if (weight.is_cuda() && refusal != kKernelRows)
    record_slow_path("a trained weight's codes and bf16 operand in one pass", refusal);
  const Quantized quantized = quantize(weight.detach(), mode);
  p.saved = {quantized.codes, quantized.scales};
  p.y2d = product([&] { return quantized_product(x2d, quantized.codes, quantized.scales); });
  return p;
}

// dX's operand for one weight from what its forward saved (`saved` starting at its first tensor): the kept
// operand, or the codes dequantized (on CUDA into the reused scratch).
at::Tensor input_gradient_operand(const variable_list& saved, size_t first, bool kept, at::ScalarType dtype) {
  return kept ? saved[first].to(dtype) : dequantized_for_product(saved[first], saved[first + 1], dtype);
}

// _unsafe_view: an ordinary view as the output of a custom function would be tracked as a view of a temporary
// and refuse later in-place use; the product has no other user.
at::Tensor shaped_output(const at::Tensor& y2d, const at::Tensor& x) {
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = y2d.size(1);
  return at::_unsafe_view(y2d, sizes);
}

class SteLinearFunction : public torch::autograd::Function<SteLinearFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, ScaleMode mode,
                            bool keep_operand, bool recorded, PersistentOperand* persistent, bool computed) {
    SteProduct p = ste_product(x.reshape({-1, x.size(-1)}), weight, mode, keep_operand, recorded, persistent, computed);
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    if (!p.saved.empty()) {
      p.saved.insert(p.saved.begin(), x);
      ctx->save_for_backward(p.saved);
      if (p.kept_operand) ctx->saved_data["kept_operand"] = true;
    }
    return shaped_output(p.y2d, x);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const bool kept = ctx->saved_data.count("kept_operand") > 0;
    const int64_t out_features = saved[1].size(0);
    const at::Tensor grad_y2d = grad_outputs[0].reshape({-1, out_features});
    at::Tensor grad_x, grad_weight;
    if (ctx->needs_input_grad(0))
      grad_x = grad_y2d.mm(input_gradient_operand(saved, 1, kept, grad_y2d.scalar_type())).view(x.sizes());
    if (ctx->needs_input_grad(1)) {
      const auto weight_dtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
      grad_weight = product_in_dtype(grad_y2d.t(), x.reshape({-1, x.size(-1)}), weight_dtype);
    }
    return {grad_x, grad_weight, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// ste_linear_shared_input's node: x, the weights (an input each), then the kept operands' entries, the mode,
// keep_operand and recorded (not inputs). Saved: x, then each weight's saved tensors (counts and kinds in
// saved_data).
class SteSharedInputFunction : public torch::autograd::Function<SteSharedInputFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList weights,
                               const std::vector<PersistentOperand*>& persistent, ScaleMode mode, bool keep_operand,
                               bool recorded) {
    // An output no loss reaches comes to backward undefined, not as zeros: no product for it, as for a separate node
    // that never ran backward.
    ctx->set_materialize_grads(false);
    const at::Tensor x2d = x.reshape({-1, x.size(-1)});
    variable_list outputs, saved{x};
    std::vector<int64_t> saved_counts, kept, weight_dtypes;
    for (size_t i = 0; i < weights.size(); ++i) {
      SteProduct p = ste_product(x2d, weights[i], mode, keep_operand, recorded, persistent[i], /*computed=*/true);
      outputs.push_back(shaped_output(p.y2d, x));
      saved_counts.push_back(static_cast<int64_t>(p.saved.size()));
      kept.push_back(p.kept_operand ? 1 : 0);
      weight_dtypes.push_back(static_cast<int64_t>(weights[i].scalar_type()));
      saved.insert(saved.end(), p.saved.begin(), p.saved.end());
    }
    if (saved.size() > 1) ctx->save_for_backward(saved);
    ctx->saved_data["saved_counts"] = saved_counts;
    ctx->saved_data["kept"] = kept;
    ctx->saved_data["weight_dtypes"] = weight_dtypes;
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor x2d = x.reshape({-1, x.size(-1)});
    const std::vector<int64_t> counts = ctx->saved_data["saved_counts"].toIntVector();
    const std::vector<int64_t> kept = ctx->saved_data["kept"].toIntVector();
    const std::vector<int64_t> weight_dtypes = ctx->saved_data["weight_dtypes"].toIntVector();
    const size_t n = counts.size();
    variable_list grads(n + 5);  // x, the weights, persistent, mode, keep_operand, recorded
    at::Tensor grad_x;  // [rows, in]: the first product writes it, each later one adds into it (beta = 1)
    size_t first = 1;
    for (size_t i = 0; i < n; first += static_cast<size_t>(counts[i]), ++i) {
      if (!grad_outputs[i].defined()) continue;  // an output no loss reached: no gradient through it
      const at::Tensor grad_y2d = grad_outputs[i].reshape({-1, saved[first].size(0)});
      if (ctx->needs_input_grad(0)) {
        const at::Tensor w = input_gradient_operand(saved, first, kept[i] != 0, grad_y2d.scalar_type());
        if (grad_x.defined()) grad_x.addmm_(grad_y2d, w);
        else grad_x = grad_y2d.mm(w);
      }
      if (ctx->needs_input_grad(i + 1))
        grads[i + 1] = product_in_dtype(grad_y2d.t(), x2d, static_cast<at::ScalarType>(weight_dtypes[i]));
    }
    if (grad_x.defined()) grads[0] = grad_x.view(x.sizes());
    return grads;
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

// Group g's rows of `rows` [M, K] (the counts[g] rows before ends[g]).
at::Tensor group_rows(const at::Tensor& rows, const std::vector<int64_t>& counts, size_t g, int64_t start) {
  return rows.narrow(0, start, counts[g]);
}

// ste_grouped_linear's node: rows, the weights (one input each), ends; counts and the mode are not inputs.
class SteGroupedFunction : public torch::autograd::Function<SteGroupedFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, at::TensorList weights, const at::Tensor& ends,
                            const std::vector<int64_t>& counts, ScaleMode mode, bool recorded) {
    const auto groups = static_cast<int64_t>(weights.size());
    const int64_t out = weights[0].size(0), in = weights[0].size(1);
    const at::ScalarType dtype = rows.scalar_type();
    const auto bytes = rows.options().dtype(at::kByte);
    // Codes are written only where a backward will read them.
    const at::Tensor codes = recorded ? at::empty({groups, out, in / 2}, bytes) : at::Tensor();
    const at::Tensor scales = recorded ? at::empty({groups, out, in / kBlock}, bytes) : at::Tensor();
    const at::Tensor operands = at::empty({groups, out, in}, rows.options());
    std::vector<int64_t> weight_dtypes;
    std::vector<at::Tensor> masters;
    for (const at::Tensor& w : weights) {
      weight_dtypes.push_back(static_cast<int64_t>(w.scalar_type()));
      masters.push_back(w.detach().contiguous());
    }
    const at::ScalarType master_dtype = masters.front().scalar_type();
    if (rows.is_cuda() && dtype == at::kBFloat16 && (master_dtype == at::kFloat || master_dtype == at::kBFloat16)) {
      // Every expert's codes and operand from one launch (each 128 experts); the experts' masters share one dtype
      // (a run has one master dtype), which the launch checks.
      quantize_batch_with_operand_cuda(masters, mode, codes, scales, operands);
    } else {
      if (rows.is_cuda())
        record_slow_path("the experts' codes and bf16 operands in one launch",
                         dtype != at::kBFloat16 ? std::string("activations in ") + dtype_text(dtype) +
                                                      " (the launch writes bfloat16 operands: --compute-dtype bfloat16)"
                                                : std::string("masters in ") + dtype_text(master_dtype));
      for (int64_t g = 0; g < groups; ++g) {
        const Quantized q = quantize(masters[static_cast<size_t>(g)], mode);
        if (recorded) codes[g].copy_(q.codes), scales[g].copy_(q.scales);
        operands[g].copy_(dequantize(q.codes, q.scales, dtype));  // what quantized_product multiplies by here
      }
    }
    if (recorded) ctx->save_for_backward({rows, codes, scales, ends});
    ctx->saved_data["counts"] = counts;
    ctx->saved_data["weight_dtypes"] = weight_dtypes;
    return grouped_product(rows, operands, ends, counts);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &rows = saved[0], &codes = saved[1], &scales = saved[2], &ends = saved[3];
    const std::vector<int64_t> counts = ctx->saved_data["counts"].toIntVector();
    const std::vector<int64_t> weight_dtypes = ctx->saved_data["weight_dtypes"].toIntVector();
    const int64_t groups = codes.size(0), out = codes.size(1), in = codes.size(2) * 2;
    const at::Tensor grad_y = grad_outputs[0].contiguous();
    variable_list grads(static_cast<size_t>(groups) + 5);  // rows, the weights, ends, counts, mode, recorded
    if (ctx->needs_input_grad(0)) {
      // Every group's deq(Q(W)) in one call (one launch on CUDA).
      const at::Tensor operands = dequantize(codes.view({groups * out, in / 2}), scales.view({groups * out, in / kBlock}),
                                             grad_y.scalar_type())
                                      .view({groups, out, in});
      grads[0] = grouped_product(grad_y, operands.transpose(1, 2), ends, counts);
    }
    at::Tensor stacked;  // dW of every group from one grouped GEMM, where that is how products run
    if (native_grouped_product(rows)) {
      bool any = false;
      for (int64_t g = 0; g < groups; ++g) any = any || ctx->needs_input_grad(static_cast<size_t>(g) + 1);
#ifdef QWEN3_NATIVE_GROUPED_MM
      if (any) stacked = at::_grouped_mm(grad_y.t(), rows, ends);
#endif
    }
    int64_t start = 0;
    for (int64_t g = 0; g < groups; ++g) {
      const auto i = static_cast<size_t>(g);
      if (counts[i] > 0 && ctx->needs_input_grad(i + 1)) {
        const auto weight_dtype = static_cast<at::ScalarType>(weight_dtypes[i]);
        grads[i + 1] = stacked.defined() ? stacked[g].to(weight_dtype)
                                         : product_in_dtype(group_rows(grad_y, counts, i, start).t(),
                                                            group_rows(rows, counts, i, start), weight_dtype);
      }
      start += counts[i];
    }
    return grads;
  }
};

}  // namespace

at::Tensor quantized_product(const at::Tensor& x2d, const at::Tensor& codes, const at::Tensor& scales) {
  if (x2d.size(0) < kNvfp4KernelMaxRows && matmul_cuda_supports(x2d)) return matmul_cuda(x2d, codes, scales);
  return x2d.mm(dequantized_for_product(codes, scales, x2d.scalar_type()).t());
}

namespace {
bool half_operand(const at::Tensor& a) { return a.scalar_type() == at::kBFloat16 || a.scalar_type() == at::kHalf; }
}  // namespace

at::Tensor product_in_dtype(const at::Tensor& a, const at::Tensor& b, at::ScalarType dtype) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
  // aten::mm.dtype (PyTorch 2.8 added it; 2.9 is the oldest libtorch this is compiled against).
  if (a.is_cuda() && half_operand(a) && dtype == at::kFloat && b.scalar_type() == a.scalar_type())
    return at::mm(a, b, at::kFloat);
#endif
  // On CUDA a float32 product of half operands is built to be written by cuBLAS in float32; before PyTorch 2.9
  // (aten::mm.dtype) it is the product in the operands' dtype and a copy, rounded and moved twice: recorded.
  if (a.is_cuda() && half_operand(a) && dtype == at::kFloat && b.scalar_type() == a.scalar_type())
    record_slow_path("a float32 product of half operands written by cuBLAS",
                     "this libtorch has no mm with an out dtype (PyTorch 2.9+)");
  return a.mm(b).to(dtype);
}

void product_into(at::Tensor out, const at::Tensor& a, const at::Tensor& b) {
  if (out.is_cuda() && out.is_contiguous() && b.scalar_type() == a.scalar_type()) {
    if (out.scalar_type() == a.scalar_type()) {
      at::mm_out(out, a, b);
      return;
    }
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
    if (half_operand(a) && out.scalar_type() == at::kFloat) {
      at::mm_out(out, a, b, at::kFloat);  // aten::mm.dtype_out: product_in_dtype's mm.dtype, written into out
      return;
    }
#endif
  }
  if (out.is_cuda() && b.scalar_type() == a.scalar_type())  // (operands of two dtypes: mm refuses them below)
    record_slow_path("a product written into its output by cuBLAS",
                     !out.is_contiguous() ? "an output that is not contiguous"
                                          : "a " + dtype_text(out.scalar_type()) + " output of " +
                                                dtype_text(a.scalar_type()) + " operands in this libtorch");
  out.copy_(product_in_dtype(a, b, out.scalar_type()));
}

at::Tensor frozen_nvfp4_linear(const at::Tensor& x, const Quantized& weight) {
  if (x.dim() < 1 || x.size(-1) != weight.codes.size(1) * 2)
    throw Error("nvfp4 linear: input " + shape_text(x.sizes()) + " does not match a frozen weight of " +
                std::to_string(weight.codes.size(1) * 2) + " input columns");
  return FrozenLinearFunction::apply(x, weight.codes, weight.scales);
}

namespace {
void check_linear_input(const at::Tensor& x, const at::Tensor& weight) {
  if (weight.dim() != 2 || x.dim() < 1 || x.size(-1) != weight.size(1))
    throw Error("nvfp4 linear: input " + shape_text(x.sizes()) + " does not match weight " + shape_text(weight.sizes()) +
                " ([..., in] and [out, in])");
  if (x.device() != weight.device())
    throw Error("nvfp4 linear: input on " + x.device().str() + " but weight on " + weight.device().str());
}
void check_kept_operand(const PersistentOperand& kept, const at::Tensor& weight) {
  if (!kept.weight.is_same(weight) || !kept.operand.defined() || kept.operand.scalar_type() != at::kBFloat16 ||
      !kept.operand.is_contiguous() || !kept.operand.sizes().equals(weight.sizes()) ||
      kept.operand.device() != weight.device())
    throw Error("nvfp4 linear: a kept operand of weight " + shape_text(weight.sizes()) +
                " must be a contiguous bf16 tensor of its shape on its device");
}
}  // namespace

at::Tensor ste_linear(const at::Tensor& x, const at::Tensor& weight, ScaleMode mode, bool keep_operand,
                      ProductOutput output) {
  check_linear_input(x, weight);
  // Only a recorded node keeps anything: without a graph the operand goes to the reused scratch buffer and no codes
  // are written.
  const bool recorded = at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
  return SteLinearFunction::apply(x, weight, mode, keep_operand, recorded, static_cast<PersistentOperand*>(nullptr),
                                  output == ProductOutput::computed);
}

at::Tensor ste_linear_persistent(const at::Tensor& x, PersistentOperand& kept, ScaleMode mode, ProductOutput output) {
  const at::Tensor& weight = kept.weight;
  check_linear_input(x, weight);
  check_kept_operand(kept, weight);
  const bool recorded = at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
  return SteLinearFunction::apply(x, weight, mode, /*keep_operand=*/false, recorded, &kept,
                                  output == ProductOutput::computed);
}

std::vector<at::Tensor> ste_linear_shared_input(const at::Tensor& x, const std::vector<at::Tensor>& weights,
                                                const std::vector<PersistentOperand*>& kept, ScaleMode mode,
                                                bool keep_operand) {
  if (weights.empty() || kept.size() != weights.size())
    throw Error("nvfp4 linear: " + std::to_string(weights.size()) + " weights with " + std::to_string(kept.size()) +
                " kept-operand entries for one input");
  bool any_grad = x.requires_grad();
  for (size_t i = 0; i < weights.size(); ++i) {
    check_linear_input(x, weights[i]);
    if (kept[i] != nullptr) check_kept_operand(*kept[i], weights[i]);
    any_grad = any_grad || weights[i].requires_grad();
  }
  const bool recorded = at::GradMode::is_enabled() && any_grad;
  return SteSharedInputFunction::apply(x, at::TensorList(weights), kept, mode, keep_operand, recorded);
}

bool native_grouped_product(const at::Tensor& rows) {
#ifdef QWEN3_NATIVE_GROUPED_MM
  return rows.is_cuda();
#else
  (void)rows;
  return false;
#endif
}

at::Tensor grouped_product(const at::Tensor& rows, const at::Tensor& mats, const at::Tensor& ends,
                           const std::vector<int64_t>& counts) {
  int64_t total = 0;
  for (const int64_t c : counts) total += c;
  if (rows.dim() != 2 || mats.dim() != 3 || mats.size(2) != rows.size(1) || mats.size(0) != static_cast<int64_t>(counts.size()) ||
      ends.numel() != mats.size(0) || total != rows.size(0))
    throw Error("grouped product: rows " + shape_text(rows.sizes()) + " and matrices " + shape_text(mats.sizes()) +
                " do not match " + std::to_string(counts.size()) + " groups of " + std::to_string(total) + " rows");
#ifdef QWEN3_NATIVE_GROUPED_MM
  if (native_grouped_product(rows)) return at::_grouped_mm(rows, mats.transpose(1, 2), ends);
#endif
  if (rows.is_cuda())
    record_slow_path("the experts' grouped product as one grouped GEMM",
                     "this libtorch has no _grouped_mm (PyTorch 2.8+): a product an expert");
  std::vector<at::Tensor> pieces;
  int64_t start = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    if (counts[g] > 0) pieces.push_back(group_rows(rows, counts, g, start).mm(mats[static_cast<int64_t>(g)].t()));
    start += counts[g];
  }
  return pieces.empty() ? rows.new_empty({0, mats.size(1)}) : at::cat(pieces, 0);
}

at::Tensor ste_grouped_linear(const at::Tensor& rows, const std::vector<at::Tensor>& weights, const at::Tensor& ends,
                              const std::vector<int64_t>& counts, ScaleMode mode) {
  if (weights.empty() || weights.size() != counts.size())
    throw Error("nvfp4 grouped linear: " + std::to_string(weights.size()) + " weights for " +
                std::to_string(counts.size()) + " groups");
  for (const at::Tensor& w : weights)
    if (w.dim() != 2 || !w.sizes().equals(weights[0].sizes()) || w.size(1) % kBlock != 0 || rows.dim() != 2 ||
        rows.size(1) != w.size(1) || w.device() != rows.device())
      throw Error("nvfp4 grouped linear: rows " + shape_text(rows.sizes()) + " on " + rows.device().str() +
                  " do not match a weight " + shape_text(w.sizes()) + " on " + w.device().str() +
                  " (all weights [out, in] alike, in a multiple of 16)");
  bool any_grad = rows.requires_grad();
  for (const at::Tensor& w : weights) any_grad = any_grad || w.requires_grad();
  const bool recorded = at::GradMode::is_enabled() && any_grad;
  return SteGroupedFunction::apply(rows, at::TensorList(weights), ends, counts, mode, recorded);
}

}  // namespace qwen3::nvfp4
