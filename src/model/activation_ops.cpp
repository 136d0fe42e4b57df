// RMSNorm, RoPE and SwiGLU: libtorch ops (CPU, and the reference), or the fused CUDA kernels through one
// autograd node each.
#include "model/activation_ops.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cstdint>
#include <string>
#include <utility>

#include "fused_ops.cuh"
#include "qwen3/base/error.h"
#include "qwen3/base/message_text.h"
#include "qwen3/base/slow_paths.h"
#include "qwen3/model/model.h"

#include "model/kernel_glue.h"
#ifdef QWEN3_MODEL_KERNELS
#include <c10/cuda/CUDAGuard.h>
#define QWEN3_FUSED_ACTIVATIONS 1
#endif

namespace qwen3 {

namespace reference {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight.to(x.scalar_type()) * normed.to(x.scalar_type());
}

at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  // [T, d] (or [B, T, d] for packed rows) against [B, T, heads, d]: the tables broadcast over heads (and batch).
  const auto c = cos.to(x.scalar_type()).unsqueeze(-2), s = sin.to(x.scalar_type()).unsqueeze(-2);
  return x * c + rotated * s;
}

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) { return at::silu(gate) * up; }

}  // namespace reference

#ifdef QWEN3_FUSED_ACTIVATIONS
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using kernel_glue::activation_dtype;
using kernel_glue::check_launch;
using kernel_glue::current_stream;

// The gradient buffers of a norm's backward kernel (launch_rmsnorm_backward, launch_head_norm_rope_backward) over
// x's rows: dx, the fp32 dw and the workspace of its chunks' partial sums.
struct NormGradients {
  at::Tensor dx, dw, workspace;
  explicit NormGradients(const at::Tensor& x)
      : dx(at::empty_like(x)),
        dw(at::empty({x.size(-1)}, x.options().dtype(at::kFloat))),
        workspace(at::empty({kernels::rmsnorm_backward_workspace_floats(x.numel() / x.size(-1), x.size(-1))},
                            x.options().dtype(at::kFloat))) {}
};

// RMSNorm, its input handed on as a second output ({y, x}; x as a view of itself, through this node). Where the
// residual stream goes on from that output (rms_norm_and_input), the gradient it gives x arrives here with the
// norm's, and the backward kernel writes their sum (launch_rmsnorm_backward's dx_add) where autograd would add the
// two with a pass of its own; rms_norm leaves it unused.
class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    ctx->set_materialize_grads(false);
    const c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor xc = x.contiguous(), w = weight.contiguous();
    const int64_t cols = x.size(-1), rows = xc.numel() / cols;
    at::Tensor y = at::empty_like(xc);
    at::Tensor rstd = at::empty({rows}, xc.options().dtype(at::kFloat));
    check_launch(kernels::launch_rmsnorm_forward(xc.data_ptr(), activation_dtype(xc), w.data_ptr(), activation_dtype(w), rows,
                                                 cols, static_cast<float>(eps), y.data_ptr(), rstd.data_ptr<float>(),
                                                 current_stream(xc)),
                 "rmsnorm forward");
    ctx->save_for_backward({xc, w, rstd});
    return {y, x};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &rstd = saved[2];
    const c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor passed = grads[1].defined() ? grads[1].contiguous() : at::Tensor();
    if (!grads[0].defined()) return {passed, at::Tensor(), at::Tensor()};  // the norm's output reached no loss
    const at::Tensor dy = grads[0].contiguous();
    const int64_t cols = x.size(-1), rows = x.numel() / cols;
    NormGradients g(x);
    check_launch(kernels::launch_rmsnorm_backward(dy.data_ptr(), x.data_ptr(), activation_dtype(x), w.data_ptr(),
                                                  activation_dtype(w), rstd.data_ptr<float>(), rows, cols, g.dx.data_ptr(),
                                                  g.dw.data_ptr<float>(), g.workspace.data_ptr<float>(), current_stream(x),
                                                  passed.defined() ? passed.data_ptr() : nullptr),
                 "rmsnorm backward");
    return {g.dx, g.dw.to(w.scalar_type()), at::Tensor()};
  }
};

class RotaryFunction : public torch::autograd::Function<RotaryFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    const c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor xc = x.contiguous(), c = cos.contiguous().to(at::kFloat), s = sin.contiguous().to(at::kFloat);
    at::Tensor out = at::empty_like(xc);
    // [T, d] tables for every row, or [B, T, d]: a row each (packed rows, positions restarting with each sample).
    const int64_t table_rows = c.dim() == 3 ? xc.size(0) * xc.size(1) : xc.size(1);
    check_launch(kernels::launch_rope(xc.data_ptr(), out.data_ptr(), activation_dtype(xc), xc.size(0), xc.size(1), xc.size(2),
                               xc.size(3), c.data_ptr<float>(), s.data_ptr<float>(), table_rows, 0, current_stream(xc)),
          "rope");
    ctx->save_for_backward({c, s});
    ctx->saved_data["table_rows"] = table_rows;
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor dy = grads[0].contiguous();
    const c10::cuda::CUDAGuard guard(dy.device());
    at::Tensor dx = at::empty_like(dy);
    check_launch(kernels::launch_rope(dy.data_ptr(), dx.data_ptr(), activation_dtype(dy), dy.size(0), dy.size(1), dy.size(2),
                               dy.size(3), saved[0].data_ptr<float>(), saved[1].data_ptr<float>(),
                               ctx->saved_data["table_rows"].toInt(), 1, current_stream(dy)),
          "rope backward");
    return {dx, at::Tensor(), at::Tensor()};
  }
};

// rotary(rms_norm(x, w), cos, sin) over x [B, T, heads, head_dim] as one kernel each way (the q and k norms): the
// norm's saved input and rstd as RmsNormFunction keeps them, the tables as RotaryFunction does.
class HeadNormRopeFunction : public torch::autograd::Function<HeadNormRopeFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps,
                            const at::Tensor& cos, const at::Tensor& sin) {
    const c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor xc = x.contiguous(), w = weight.contiguous(), c = cos.contiguous().to(at::kFloat),
                     s = sin.contiguous().to(at::kFloat);
    const int64_t table_rows = c.dim() == 3 ? xc.size(0) * xc.size(1) : xc.size(1);
    at::Tensor y = at::empty_like(xc);
    at::Tensor rstd = at::empty({xc.numel() / xc.size(3)}, xc.options().dtype(at::kFloat));
    check_launch(kernels::launch_head_norm_rope_forward(xc.data_ptr(), activation_dtype(xc), w.data_ptr(), activation_dtype(w),
                                                        xc.size(0), xc.size(1), xc.size(2), xc.size(3), static_cast<float>(eps),
                                                        c.data_ptr<float>(), s.data_ptr<float>(), table_rows, y.data_ptr(),
                                                        rstd.data_ptr<float>(), current_stream(xc)),
                 "q/k norm and rope");
    ctx->save_for_backward({xc, w, rstd, c, s});
    ctx->saved_data["table_rows"] = table_rows;
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &rstd = saved[2], &c = saved[3], &s = saved[4];
    const c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor dy = grads[0].contiguous();
    NormGradients g(x);
    check_launch(kernels::launch_head_norm_rope_backward(
                     dy.data_ptr(), x.data_ptr(), activation_dtype(x), w.data_ptr(), activation_dtype(w),
                     rstd.data_ptr<float>(), x.size(0), x.size(1), x.size(2), x.size(3), c.data_ptr<float>(),
                     s.data_ptr<float>(), ctx->saved_data["table_rows"].toInt(), g.dx.data_ptr(), g.dw.data_ptr<float>(),
                     g.workspace.data_ptr<float>(), current_stream(x)),
                 "q/k norm and rope backward");
    return {g.dx, g.dw.to(w.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class SwigluFunction : public torch::autograd::Function<SwigluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    const c10::cuda::CUDAGuard guard(gate.device());
    const at::Tensor g = gate.contiguous(), u = up.contiguous();
    at::Tensor out = at::empty_like(g);
    check_launch(kernels::launch_swiglu_forward(g.data_ptr(), u.data_ptr(), out.data_ptr(), activation_dtype(g), g.numel(),
                                         current_stream(g)),
          "swiglu");
    ctx->save_for_backward({g, u});
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &g = saved[0], &u = saved[1];
    const c10::cuda::CUDAGuard guard(g.device());
    const at::Tensor dout = grads[0].contiguous();
    at::Tensor dg = at::empty_like(g), du = at::empty_like(u);
    check_launch(kernels::launch_swiglu_backward(dout.data_ptr(), g.data_ptr(), u.data_ptr(), dg.data_ptr(), du.data_ptr(),
                                          activation_dtype(g), g.numel(), current_stream(g)),
          "swiglu backward");
    return {dg, du};
  }
};

}  // namespace

bool fused_activation_ops_take(const at::Tensor& x) {
  return x.is_cuda() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16);
}

namespace {
// An RMSNorm weight the kernels read: fp32 (a master) or bf16.
bool norm_weight_taken(const at::Tensor& weight) {
  return weight.scalar_type() == at::kFloat || weight.scalar_type() == at::kBFloat16;
}
// RoPE tables the kernels take for x [B, T, heads, d]: of the rows' positions [T, d] or every token's [B, T, d].
bool rope_tables_taken(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const bool shared = cos.dim() == 2 && x.dim() == 4 && cos.size(0) == x.size(1);
  const bool per_row = cos.dim() == 3 && x.dim() == 4 && cos.size(0) == x.size(0) && cos.size(1) == x.size(1);
  return (shared || per_row) && cos.sizes().equals(sin.sizes()) && cos.size(-1) == x.size(-1);
}
bool aligned_16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// A CUDA tensor sent to the reference ops is a slow path (on a CPU they are the path): recorded with its reason.
// Returns true, so that the condition that sends it there can record it.
bool to_reference(const at::Tensor& x, const char* what, const std::string& why) {
  if (x.is_cuda()) record_slow_path(what, why);
  return true;
}
std::string activations_not_taken(const at::Tensor& x) {
  return std::string("activations in ") + dtype_text(x.scalar_type()) + " (the kernels take float32 and bfloat16)";
}
std::string norm_weight_not_taken(const at::Tensor& weight) {
  return std::string("a norm weight in ") + dtype_text(weight.scalar_type()) +
         " (the kernels take float32 and bfloat16)";
}
// Why the fused pass does not take these heads (empty where it does).
std::string head_norm_rope_not_taken(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos,
                                     const at::Tensor& sin) {
  if (!fused_activation_ops_take(x)) return activations_not_taken(x);
  if (!norm_weight_taken(weight)) return norm_weight_not_taken(weight);
  if (weight.dim() != 1 || x.dim() != 4 || weight.size(0) != x.size(3)) return "a norm weight unlike the heads' width";
  if (!rope_tables_taken(x, cos, sin)) return "RoPE tables of another shape than the rows'";
  if (!fused_head_norm_rope_takes(x.size(3)))
    return "heads " + std::to_string(x.size(3)) + " wide (the kernel takes 16, 32, 64, 128 and 256)";
  if (!x.is_contiguous()) return "heads not contiguous";
  if (!aligned_16(x) || !aligned_16(weight)) return "heads or weight not 16-byte aligned";
  return "";
}
}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (!fused_activation_ops_take(x) && to_reference(x, "fused RMSNorm", activations_not_taken(x)))
    return reference::rms_norm(x, weight, eps);
  if (!norm_weight_taken(weight) && to_reference(x, "fused RMSNorm", norm_weight_not_taken(weight)))
    return reference::rms_norm(x, weight, eps);
  return RmsNormFunction::apply(x, weight, eps)[0];
}

std::pair<at::Tensor, at::Tensor> rms_norm_and_input(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (!fused_activation_ops_take(x) || !norm_weight_taken(weight)) return {rms_norm(x, weight, eps), x};
  const variable_list out = RmsNormFunction::apply(x, weight, eps);
  return {out[0], out[1]};
}

at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (!fused_activation_ops_take(x) && to_reference(x, "fused RoPE", activations_not_taken(x)))
    return reference::rotary(x, cos, sin);
  if (!rope_tables_taken(x, cos, sin) && to_reference(x, "fused RoPE", "RoPE tables of another shape than the rows'"))
    return reference::rotary(x, cos, sin);
  return RotaryFunction::apply(x, cos, sin);
}

at::Tensor head_norm_rotary(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& cos,
                            const at::Tensor& sin) {
  // The fused pass where it takes the width (head_norm_rope_lanes) and 16-byte aligned rows (a fresh product's
  // output is; its contiguous view of heads too); anything else, the two nodes it replaces.
  const std::string not_taken = head_norm_rope_not_taken(x, weight, cos, sin);
  if (!not_taken.empty() && to_reference(x, "fused q/k norm with RoPE", not_taken))
    return rotary(rms_norm(x, weight, eps), cos, sin);
  return HeadNormRopeFunction::apply(x, weight, eps, cos, sin);
}

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  if (!fused_activation_ops_take(gate) && to_reference(gate, "fused SwiGLU", activations_not_taken(gate)))
    return reference::swiglu(gate, up);
  if ((gate.scalar_type() != up.scalar_type() || !gate.sizes().equals(up.sizes())) &&
      to_reference(gate, "fused SwiGLU", "gate and up unlike in dtype or shape"))
    return reference::swiglu(gate, up);
  return SwigluFunction::apply(gate, up);
}

#else  // no CUDA kernels or a CPU-only libtorch: libtorch ops everywhere

namespace {
// A CUDA tensor here is a build with a CUDA libtorch but without our kernels (configured without nvcc).
void note_no_kernels(const at::Tensor& x, const char* what) {
  if (x.is_cuda()) record_slow_path(what, "this build has no CUDA kernels (configured without nvcc)");
}
}  // namespace

bool fused_activation_ops_take(const at::Tensor&) { return false; }
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  note_no_kernels(x, "fused RMSNorm");
  return reference::rms_norm(x, weight, eps);
}
at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  note_no_kernels(x, "fused RoPE");
  return reference::rotary(x, cos, sin);
}
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  note_no_kernels(gate, "fused SwiGLU");
  return reference::swiglu(gate, up);
}
at::Tensor head_norm_rotary(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& cos,
                            const at::Tensor& sin) {
  return rotary(rms_norm(x, weight, eps), cos, sin);
}
std::pair<at::Tensor, at::Tensor> rms_norm_and_input(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return {rms_norm(x, weight, eps), x};
}

#endif

namespace {

// a + b's node without the sum: the output's bytes are unspecified, an allocation never written; the gradient goes
// to both inputs as the sum's would.
class UnreadSumFunction : public torch::autograd::Function<UnreadSumFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& a, const at::Tensor& b) {
    return at::empty(a.sizes(), a.options());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], grads[0]};
  }
};

}  // namespace

at::Tensor unread_sum(const at::Tensor& a, const at::Tensor& b) {
  if (!a.sizes().equals(b.sizes()) || a.scalar_type() != b.scalar_type() || a.device() != b.device())
    throw Error("unread_sum: the two terms differ in shape, dtype or device");
  return UnreadSumFunction::apply(a, b);
}

bool fused_head_norm_rope_takes(int64_t head_dim) { return kernels::fused::head_norm_rope_lanes(head_dim) > 0; }

}  // namespace qwen3
