// Helpers shared by the optimizer tests: parameters with gradients, and a toy regression to train.
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "qwen3/optim/optim.h"

namespace qwen3::optim_test {

inline OptimParam make_param(const std::string& name, const at::Tensor& value, bool decay = true) {
  at::Tensor p = value.clone().contiguous();
  p.requires_grad_(true);
  return {name, p, decay};
}

inline void set_grad(const OptimParam& p, const at::Tensor& grad) {
  at::Tensor param = p.param;
  param.mutable_grad() = grad.to(param.scalar_type()).clone();
}

// Copies of the parameters' values (detached), to compare or to restart from.
inline std::vector<at::Tensor> values_of(const std::vector<OptimParam>& params) {
  std::vector<at::Tensor> out;
  for (const OptimParam& p : params) out.push_back(p.param.detach().clone());
  return out;
}

inline std::vector<OptimParam> copy_params(const std::vector<OptimParam>& params) {
  std::vector<OptimParam> out;
  for (const OptimParam& p : params) out.push_back(make_param(p.name, p.param.detach(), p.decay));
  return out;
}

// Least squares y = x w^T + b with inputs whose columns span three decades of scale, so that the gradient's
// entries (and v's) span six: the hard case for a block-scaled second moment.
struct ToyRegression {
  at::Tensor inputs, targets;
  explicit ToyRegression(int64_t samples = 256, int64_t in = 128, int64_t out = 48) {
    at::manual_seed(1234);
    const at::Tensor column_scale = at::pow(10.0, at::linspace(-3, 0, in));
    inputs = at::randn({samples, in}) * column_scale;
    const at::Tensor true_weight = at::randn({out, in}) * 0.5;
    targets = at::matmul(inputs, true_weight.t()) + at::randn({samples, out}) * 0.01;
  }
  std::vector<OptimParam> initial_params(at::ScalarType master) const {
    at::manual_seed(99);
    return {make_param("w", (at::randn({targets.size(1), inputs.size(1)}) * 0.02).to(master)),
            make_param("b", at::zeros({targets.size(1)}).to(master), false)};
  }
  // Mean squared error, and the analytic gradients written into the parameters.
  double loss_and_grad(const std::vector<OptimParam>& params) const {
    const at::Tensor w = params[0].param.detach().to(at::kFloat), b = params[1].param.detach().to(at::kFloat);
    const at::Tensor residual = at::matmul(inputs, w.t()) + b - targets;
    const double n = static_cast<double>(residual.numel());
    set_grad(params[0], at::matmul(residual.t(), inputs) * (2.0 / n));
    set_grad(params[1], residual.sum(0) * (2.0 / n));
    return residual.pow(2).mean().item<double>();
  }
};

}  // namespace qwen3::optim_test
