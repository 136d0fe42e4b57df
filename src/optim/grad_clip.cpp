#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard: ATen.h stopped including it in PyTorch 2.x

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "grad_clip.cuh"
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

// Where the clipping kernel takes the gradients: all on one CUDA device (their dtype, the masters' fp32 or bf16,
// the glue checks with a clear error).
bool kernel_takes(const std::vector<at::Tensor>& grads) {
  if (grads.empty() || !grads.front().is_cuda()) return false;
  for (const at::Tensor& g : grads)
    if (g.device() != grads.front().device()) return false;
  return true;
}

std::vector<at::Tensor> contiguous(const std::vector<at::Tensor>& grads) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& g : grads) out.push_back(g.contiguous());  // autograd's gradients already are: no copy
  return out;
}

}  // namespace

at::Tensor square_sums_fp32(const std::vector<at::Tensor>& grads) {
  at::NoGradGuard no_grad;
  if (grads.empty()) return at::Tensor();
  if (kernel_takes(grads)) {  // one launch a 64 gradients where the per-tensor form below takes three each
    optim_detail::GroupClipOnDevice squares;
    squares.tensor_squares = at::empty({static_cast<int64_t>(grads.size())}, grads.front().options().dtype(at::kDouble));
    optim_detail::group_clip_cuda(contiguous(grads), squares);
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
  if (grads.front().is_cuda()) {  // on the device, so that nothing waits for it: one kernel
    optim_detail::GroupClipOnDevice group;
    group.max_norm = max_norm;
    group.trainable = static_cast<double>(trainable);
    group.counted_elements = elements;
    if (ranks_with_gradient.defined()) {
      group.ranks_with_gradient = ranks_with_gradient.to(grads.front().device(), at::kFloat).contiguous();
      group.numels = at::tensor(numels, at::TensorOptions().dtype(at::kDouble)).to(grads.front().device());
    }
    group.accumulate = square_sum.defined();
    if (!square_sum.defined()) square_sum = at::empty({}, on_device.dtype(at::kDouble));
    group.sum = square_sum;
    group.factors = at::empty({static_cast<int64_t>(grads.size())}, on_device.dtype(at::kFloat));
    optim_detail::group_clip_cuda(contiguous(grads), group);
    return group.factors;
  }
  // On a CPU nothing is left to wait for: the group's square (fp32 sums, as square_sum_fp32 forms them) is read
  // here and the factor is the kernel's own rule.
  at::Tensor group_square;
  for (const at::Tensor& g : grads) {
    const at::Tensor sq = square_sum_fp32(g);
    group_square = group_square.defined() ? group_square + sq : sq;
  }
  const at::Tensor square = group_square.to(at::kDouble);
  square_sum = square_sum.defined() ? square_sum + square.to(square_sum.device()) : square;
  std::vector<bool> counts(grads.size(), true);
  double counted = elements;
  if (ranks_with_gradient.defined()) {
    const at::Tensor ranks = ranks_with_gradient.to(at::kCPU, at::kFloat).contiguous();
    counted = 0;
    for (size_t i = 0; i < grads.size(); ++i) {
      counts[i] = ranks.data_ptr<float>()[i] > 0;
      counted += counts[i] ? numels[i] : 0.0;
    }
  }
  const float scale =
      kernels::grad_clip::clip_scale(square.item<double>(), counted, static_cast<double>(trainable), max_norm);
  std::vector<float> factors;
  for (size_t i = 0; i < grads.size(); ++i) factors.push_back(counts[i] ? scale : std::numeric_limits<float>::quiet_NaN());
  return at::tensor(factors, on_device.dtype(at::kFloat));
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
