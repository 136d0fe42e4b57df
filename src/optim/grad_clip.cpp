#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "qwen3/optim.h"

namespace qwen3 {

double clip_grad_norm(const std::vector<OptimParam>& params, double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> norms;
  for (const OptimParam& p : params) {
    const at::Tensor& grad = p.param.grad();
    // fp32 accumulation even for bf16 gradients; the per-tensor norms stay on the device.
    if (grad.defined()) norms.push_back(at::linalg_vector_norm(grad, 2, c10::nullopt, false, at::kFloat));
  }
  if (norms.empty()) return 0.0;
  // The tensors may sit on several devices; their norms meet on the first one's.
  const at::Device device = norms.front().device();
  for (at::Tensor& n : norms) n = n.to(device);
  const double total = at::linalg_vector_norm(at::stack(norms), 2).item<double>();  // the one synchronization
  if (!std::isfinite(total) || max_norm <= 0 || total <= max_norm) return total;
  const double scale = max_norm / (total + 1e-6);
  for (const OptimParam& p : params) {
    at::Tensor grad = p.param.grad();
    if (grad.defined()) grad.mul_(scale);
  }
  return total;
}

}  // namespace qwen3
