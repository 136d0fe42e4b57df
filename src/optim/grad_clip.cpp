#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard: ATen.h stopped including it in PyTorch 2.x

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "optim/grad_clip_cuda.h"
#include "qwen3/base/error.h"
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

namespace {

// Where the clipping kernel takes the gradients: all on one CUDA device, contiguous fp32 or bf16.
bool kernel_takes(const std::vector<at::Tensor>& grads) {
  if (grads.empty() || !grads.front().is_cuda()) return false;
  for (const at::Tensor& g : grads)
    if (g.device() != grads.front().device() || !g.is_contiguous() ||
        (g.scalar_type() != at::kFloat && g.scalar_type() != at::kBFloat16))
      return false;
  return true;
}

}  // namespace

at::Tensor square_sums_fp32(const std::vector<at::Tensor>& grads) {
  at::NoGradGuard no_grad;
  if (grads.empty()) return at::Tensor();
  if (kernel_takes(grads)) {  // one launch a 64 gradients where the per-tensor form below takes three each
    optim_detail::GroupClipOnDevice squares;
    squares.tensor_squares = at::empty({static_cast<int64_t>(grads.size())}, grads.front().options().dtype(at::kDouble));
    optim_detail::group_clip_cuda(grads, squares);
    return squares.tensor_squares.to(at::kFloat);
  }
  // fp32 accumulation even for bf16 gradients; the sums stay on the device. The tensors may sit on several
  // devices; their sums meet on the first one's.
  std::vector<at::Tensor> sums;
  for (const at::Tensor& grad : grads) sums.push_back(square_sum_fp32(grad).to(grads.front().device()));
  return at::stack(sums);
}

at::Tensor grad_square_sum(const std::vector<OptimParam>& params) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const OptimParam& p : params)
    if (p.param.grad().defined()) grads.push_back(p.param.grad());
  if (grads.empty()) return at::Tensor();
  return square_sums_fp32(grads).sum();
}

at::Tensor group_clip_factors(const std::vector<at::Tensor>& grads, const at::Tensor& ranks_with_gradient,
                              double max_norm, int64_t trainable, at::Tensor& square_sum) {
  at::NoGradGuard no_grad;
  if (grads.empty()) throw Error("gradient clipping: a group without gradients");
  const at::TensorOptions on_device = grads.front().options();
  double elements = 0;
  std::vector<double> numels;
  for (const at::Tensor& g : grads) {
    numels.push_back(static_cast<double>(g.numel()));
    elements += numels.back();
  }
  const at::Tensor ranks =
      ranks_with_gradient.defined() ? ranks_with_gradient.to(grads.front().device(), at::kFloat).contiguous() : at::Tensor();
  if (kernel_takes(grads)) {
    optim_detail::GroupClipOnDevice group;
    group.max_norm = max_norm;
    group.trainable = static_cast<double>(trainable);
    group.counted_elements = elements;
    if (ranks.defined()) {
      group.ranks_with_gradient = ranks;
      group.numels = at::tensor(numels, at::TensorOptions().dtype(at::kDouble)).to(grads.front().device());
    }
    group.accumulate = square_sum.defined();
    if (!square_sum.defined()) square_sum = at::empty({}, on_device.dtype(at::kDouble));
    group.sum = square_sum;
    group.factors = at::empty({static_cast<int64_t>(grads.size())}, on_device.dtype(at::kFloat));
    optim_detail::group_clip_cuda(grads, group);
    return group.factors;
  }
  // Tensor operations on the device (fp64, clip_factor's operations: the host formula's bytes).
  at::Tensor group_square;
  for (const at::Tensor& g : grads) {
    const at::Tensor sq = square_sum_fp32(g);
    group_square = group_square.defined() ? group_square + sq : sq;
  }
  const at::Tensor square = group_square.to(at::kDouble);  // exact, as the host's .item<double>() was
  square_sum = square_sum.defined() ? square_sum + square.to(square_sum.device()) : square;
  const at::Tensor norm = square.sqrt();
  const at::TensorOptions options = norm.options();
  const at::Tensor nan = at::full({}, std::numeric_limits<double>::quiet_NaN(), options);
  // The group's share of the limit: on the host, or on the device when which gradients count is known there only.
  at::Tensor limit = at::full({}, max_norm * std::sqrt(elements / static_cast<double>(trainable)), options);
  at::Tensor used;
  if (ranks.defined()) {
    used = ranks.to(norm.device()).gt(0);
    limit = (at::tensor(numels, options) * used).sum().div(static_cast<double>(trainable)).sqrt().mul(max_norm);
  }
  at::Tensor scale = max_norm > 0 ? at::where(limit.gt(0).logical_and(norm > limit), limit.div(norm + 1e-6),
                                              at::ones({}, options))
                                  : at::ones({}, options);
  scale = at::where(at::isfinite(norm), scale, nan).to(at::kFloat);
  return used.defined() ? at::where(used, scale, nan.to(at::kFloat))
                        : scale.expand({static_cast<int64_t>(grads.size())});
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
