#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard: ATen.h stopped including it in PyTorch 2.x

#include <algorithm>
#include <cmath>
#include <vector>

#include "qwen3/optim/optim.h"

namespace qwen3 {

at::Tensor square_sum_fp32(const at::Tensor& t) {
  at::NoGradGuard no_grad;
  if (t.is_cuda()) {
    // One read of each element and nothing written: CUDA's norm kernel widens bf16/fp16 to fp32 as it reads and
    // accumulates in fp32 (the path below would write and read an fp32 copy and its square: 12-18 bytes an
    // element more). Squaring the norm rounds once more than summing the squares: a relative 1e-7.
    const at::Tensor norm = at::linalg_vector_norm(t, 2, at::OptionalIntArrayRef{}, false, at::kFloat);
    return norm * norm;
  }
  // On a CPU libtorch widens the whole input first whatever the call, so in row pieces: a bf16 tensor's fp32 copy
  // as a whole (1.5 GB for Qwen3-4B's embedding) would be the largest temporary of the step.
  const at::Tensor rows = t.reshape({t.dim() == 0 ? 1 : t.size(0), -1});
  const int64_t chunk = optimizer_piece_rows(0, rows.size(0), rows.size(1), rows.device());
  at::Tensor sum = at::zeros({}, rows.options().dtype(at::kFloat));
  for (int64_t first = 0; first < rows.size(0); first += chunk) {
    const at::Tensor piece = rows.narrow(0, first, std::min(chunk, rows.size(0) - first)).to(at::kFloat);
    sum.add_(piece.square().sum());
  }
  return sum;
}

at::Tensor grad_square_sum(const std::vector<OptimParam>& params) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> norms;
  for (const OptimParam& p : params) {
    const at::Tensor& grad = p.param.grad();
    // fp32 accumulation even for bf16 gradients; the per-tensor sums stay on the device.
    if (grad.defined()) norms.push_back(square_sum_fp32(grad));
  }
  if (norms.empty()) return at::Tensor();
  // The tensors may sit on several devices; their sums meet on the first one's.
  const at::Device device = norms.front().device();
  for (at::Tensor& n : norms) n = n.to(device);
  return at::stack(norms).sum();
}

double clip_factor(double norm, double max_norm) {
  return std::isfinite(norm) && max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

double clip_grad_norm(const std::vector<OptimParam>& params, double max_norm) {
  at::NoGradGuard no_grad;
  const at::Tensor square = grad_square_sum(params);
  if (!square.defined()) return 0.0;
  const double total = std::sqrt(square.item<double>());  // the one synchronization
  const double scale = clip_factor(total, max_norm);
  if (scale == 1.0) return total;
  for (const OptimParam& p : params) {
    at::Tensor grad = p.param.grad();
    if (grad.defined()) grad.mul_(scale);
  }
  return total;
}

}  // namespace qwen3
