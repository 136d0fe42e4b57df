// The block's elementwise work: RMSNorm, the rotary embedding, SwiGLU. On CUDA tensors (with the kernels built
// into a CUDA libtorch) each is one fused kernel forward and one backward (kernels/fused_ops.md); elsewhere, and
// as the reference the kernels are tested against, libtorch ops as HF computes them.
#pragma once
#include <ATen/core/Tensor.h>

#include <utility>

namespace qwen3 {

// x [..., H]: fp32 mean of squares, the weight applied in x's dtype (cast when the parameter's differs).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
// {rms_norm(x, weight, eps), x}: the input handed on for the residual stream, so that on CUDA the gradient the
// stream gives x and the norm's are summed by the norm's backward kernel, not by a pass of autograd's (the same
// bytes). Elsewhere x itself.
std::pair<at::Tensor, at::Tensor> rms_norm_and_input(const at::Tensor& x, const at::Tensor& weight, double eps);
// x [B, T, heads, head_dim]; cos/sin [T, head_dim] (or [B, T, head_dim]) fp32, applied in x's dtype:
// x cos + rotate_half(x) sin. The fused kernel takes the [T, head_dim] form.
at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
// The q/k norms then RoPE, x [B, T, heads, head_dim]: rotary(rms_norm(x, weight, eps), cos, sin), on CUDA one
// fused kernel each way (the same bytes, the normalized heads never in memory) where fused_head_norm_rope_takes
// the width (qwen3/model/model.h).
at::Tensor head_norm_rotary(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& cos,
                            const at::Tensor& sin);
// silu(gate) * up in their dtype.
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);

// a + b (one shape, dtype and device) as a node for a value nobody reads, only differentiates (a block's output
// run again for its gradients, BlockOutput::differentiated): the sum's gradients, no pass; the output's bytes
// are unspecified.
at::Tensor unread_sum(const at::Tensor& a, const at::Tensor& b);

// The libtorch forms, whatever the device.
namespace reference {
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);
}  // namespace reference

// Whether the fused kernels take this activation (a contiguous fp32/bf16 CUDA tensor in a build with them).
bool fused_activation_ops_take(const at::Tensor& x);

}  // namespace qwen3
