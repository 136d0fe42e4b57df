// AdamW over master weights, the moments in any MomentStorage, one row chunk at a time.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard: ATen.h stopped including it in PyTorch 2.x

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "optim/adamw_step.h"
#include "optim/counter_random.h"
#include "optim/moment_codec.h"
#include "qwen3/base/error.h"
#include "qwen3/base/message_text.h"
#include "qwen3/base/slow_paths.h"
#include "qwen3/optim/optim.h"

namespace qwen3 {
namespace {

constexpr const char* kExpAvg = ".exp_avg";
constexpr const char* kExpAvgSq = ".exp_avg_sq";
constexpr const char* kScale = ".scale";
constexpr const char* kRowScale = ".row_scale";

// On CPU, temporaries above glibc's largest mmap threshold (32 MiB) are mapped fresh and page-faulted on every
// operation, which made whole-tensor steps of a 4096 x 2560 tensor 10-40x slower than 256-row pieces
// (docs/optim.md). Unbounded CPU steps therefore go in pieces of about 2^20 elements: the result is the same
// bytes (any piece size is), only faster.
constexpr int64_t kCpuPieceElements = int64_t{1} << 20;
// On a GPU the bound is memory: a whole-tensor step of Qwen3-4B's embedding (389 M elements) would hold about
// ten fp32 temporaries of 1.5 GB each. 2^24 elements (64 MiB a temporary) costs a few launches more.
constexpr int64_t kDevicePieceElements = int64_t{1} << 24;

}  // namespace

int64_t optimizer_piece_rows(int64_t requested_rows, int64_t rows, int64_t cols, const at::Device& device) {
  if (requested_rows > 0) return std::min(requested_rows, rows);
  const int64_t elements = device.is_cpu() ? kCpuPieceElements : kDevicePieceElements;
  return std::min(rows, std::max<int64_t>(1, elements / std::max<int64_t>(1, cols)));
}

namespace {

std::string describe(const at::Tensor& t) {
  std::string text = std::string(c10::toString(t.scalar_type())) + " [";
  for (int64_t d = 0; d < t.dim(); ++d) text += (d ? ", " : "") + std::to_string(t.size(d));
  return text + "]";
}

void validate(const AdamWOptions& o) {
  if (!(o.beta1 >= 0 && o.beta1 < 1)) throw UsageError("AdamW: beta1 must be in [0, 1), got " + std::to_string(o.beta1));
  if (!(o.beta2 >= 0 && o.beta2 < 1)) throw UsageError("AdamW: beta2 must be in [0, 1), got " + std::to_string(o.beta2));
  if (!(o.eps > 0 && std::isfinite(o.eps))) throw UsageError("AdamW: eps must be positive, got " + std::to_string(o.eps));
  if (!(o.weight_decay >= 0 && std::isfinite(o.weight_decay)))
    throw UsageError("AdamW: weight decay must be >= 0, got " + std::to_string(o.weight_decay));
  if (o.step_chunk_rows < 0)
    throw UsageError("AdamW: step chunk rows must be >= 0 (0: whole tensors), got " + std::to_string(o.step_chunk_rows));
}

void validate(const std::vector<OptimParam>& params) {
  std::set<std::string> names;
  for (const OptimParam& p : params) {
    if (p.name.empty()) throw Error("AdamW: a parameter has no name");
    if (!names.insert(p.name).second) throw Error("AdamW: parameter name '" + p.name + "' appears twice");
    if (!p.param.defined()) throw Error("AdamW: parameter '" + p.name + "' is an undefined tensor");
    const at::ScalarType dtype = p.param.scalar_type();
    if (dtype != at::kFloat && dtype != at::kBFloat16)
      throw Error("AdamW: master weight '" + p.name + "' is " + describe(p.param) + "; float32 or bfloat16 expected");
    if (!p.param.is_contiguous()) throw Error("AdamW: master weight '" + p.name + "' is not contiguous");
  }
}

// Named state tensors of one parameter, in a fixed order.
std::vector<std::pair<std::string, at::Tensor>> named_state(const std::string& name, const AdamW::ParamState& s) {
  std::vector<std::pair<std::string, at::Tensor>> out{{name + kExpAvg, s.exp_avg}};
  if (s.exp_avg_scale.defined()) out.emplace_back(name + kExpAvg + kScale, s.exp_avg_scale);
  if (s.exp_avg_row_scale.defined()) out.emplace_back(name + kExpAvg + kRowScale, s.exp_avg_row_scale);
  out.emplace_back(name + kExpAvgSq, s.exp_avg_sq);
  if (s.exp_avg_sq_scale.defined()) out.emplace_back(name + kExpAvgSq + kScale, s.exp_avg_sq_scale);
  if (s.exp_avg_sq_row_scale.defined()) out.emplace_back(name + kExpAvgSq + kRowScale, s.exp_avg_sq_row_scale);
  return out;
}

}  // namespace

MomentStorage moment_storage_from_name(std::string_view name) {
  if (name == "float32") return MomentStorage::float32;
  if (name == "bfloat16") return MomentStorage::bfloat16;
  if (name == "int8") return MomentStorage::int8;
  if (name == "nvfp4") return MomentStorage::nvfp4;
  throw UsageError("unknown optimizer state mode '" + std::string(name) + "' (float32, bfloat16, int8 or nvfp4)");
}

const char* moment_storage_name(MomentStorage storage) {
  switch (storage) {
    case MomentStorage::float32: return "float32";
    case MomentStorage::bfloat16: return "bfloat16";
    case MomentStorage::int8: return "int8";
    case MomentStorage::nvfp4: return "nvfp4";
  }
  return "?";
}

uint64_t moment_state_bytes(at::IntArrayRef shape, MomentStorage storage) {
  return optim_detail::MomentCodec(storage).state_bytes(shape);
}

AdamW::AdamW(std::vector<OptimParam> params, AdamWOptions options)
    : params_(std::move(params)), options_(options) {
  validate(options_);
  validate(params_);
  codec_ = std::make_unique<const optim_detail::MomentCodec>(options_.moments);
  states_.reserve(params_.size());
  for (const OptimParam& p : params_) states_.push_back(codec_->allocate(p.param.sizes(), p.param.device()));
}

AdamW::~AdamW() = default;
AdamW::AdamW(AdamW&&) noexcept = default;
AdamW& AdamW::operator=(AdamW&&) noexcept = default;

void AdamW::step(double lr, double grad_scale) {
  begin_step();
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& grad = params_[i].param.grad();
    if (grad.defined()) update(i, grad, lr, grad_scale);  // as torch.optim: no gradient, no update (moments keep their values)
  }
}

void AdamW::begin_step() { ++step_count_; }

std::optional<size_t> AdamW::find(const at::Tensor& param) const {
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].param.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return i;
  return std::nullopt;
}

void AdamW::update(size_t i, const at::Tensor& grad, double lr, double grad_scale) {
  update_with(i, grad, lr, grad_scale, nullptr);
}

void AdamW::update(size_t i, const at::Tensor& grad, double lr, const at::Tensor& grad_scale) {
  const OptimParam& p = params_.at(i);
  if (grad_scale.numel() != 1 || grad_scale.scalar_type() != at::kFloat || grad_scale.device() != p.param.device())
    throw Error("AdamW: the clipping factor of '" + p.name + "' is " + describe(grad_scale) +
                ", not one fp32 element on the parameter's device");
  if (!grad_scale.is_cuda()) {  // nothing to wait for on the CPU: read it here
    const float scale = grad_scale.item<float>();
    if (std::isnan(scale)) return;
    return update_with(i, grad, lr, scale, nullptr);
  }
  const at::Tensor factor = grad_scale.contiguous();
  // The factor is freed on the host after the launch; the caching allocator reuses its block only for work queued
  // after the kernel on the same stream.
  update_with(i, grad, lr, 1.0, factor.data_ptr<float>());
}

void AdamW::update_with(size_t i, const at::Tensor& grad, double lr, double grad_scale, const float* grad_scale_on_device) {
  at::NoGradGuard no_grad;
  if (step_count_ == 0) throw Error("AdamW: update() before begin_step()");
  const AdamWOptions& o = options_;
  const OptimParam& p = params_.at(i);
  if (!grad.sizes().equals(p.param.sizes()))
    throw Error("AdamW: gradient of '" + p.name + "' is " + describe(grad) + ", the parameter " + describe(p.param));
  if (grad.device() != p.param.device())
    throw Error("AdamW: gradient of '" + p.name + "' is on " + grad.device().str() + ", the parameter on " +
                p.param.device().str());
  // Host scalars only, rounded to fp32 once (as ATen rounds a double scalar for an fp32 tensor): nothing here
  // waits for the device.
  const double t = static_cast<double>(step_count_);
  const double step_size = lr / (1.0 - std::pow(o.beta1, t));
  const int64_t index = p.stream_index >= 0 ? p.stream_index : static_cast<int64_t>(i);
  kernels::adamw::StepScalars scalars{};
  scalars.beta1 = static_cast<float>(o.beta1);
  scalars.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
  scalars.beta2 = static_cast<float>(o.beta2);
  scalars.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  kernels::adamw::set_bias_correction2(scalars, static_cast<float>(std::sqrt(1.0 - std::pow(o.beta2, t))));
  scalars.eps = static_cast<float>(o.eps);
  scalars.neg_step_size = static_cast<float>(-step_size);
  scalars.decay_factor = p.decay && o.weight_decay != 0.0 ? static_cast<float>(1.0 - lr * o.weight_decay) : 1.0f;
  scalars.grad_scale = static_cast<float>(grad_scale);
  scalars.grad_scale_on_device = grad_scale_on_device;
  scalars.random_key = optim_detail::step_key(o.seed, step_count_, index);

  // The gradient as it is when it is fp32 or bf16 and contiguous (always, from autograd); anything else as fp32.
  const at::ScalarType grad_dtype = grad.scalar_type() == at::kBFloat16 ? at::kBFloat16 : at::kFloat;
  if (grad.is_cuda() && (grad.scalar_type() != grad_dtype || !grad.is_contiguous()))  // a copy first: recorded
    record_slow_path("the AdamW kernel reading the gradient as autograd wrote it",
                     !grad.is_contiguous() ? "a gradient that is not contiguous"
                                           : std::string("a gradient in ") + dtype_text(grad.scalar_type()));
  const at::Tensor g = grad.to(grad_dtype).contiguous();
  kernels::adamw::ParamView view = codec_->view(states_[i]);
  view.master = p.param.data_ptr();
  view.master_bf16 = p.param.scalar_type() == at::kBFloat16 ? 1 : 0;
  view.grad = g.data_ptr();
  view.grad_bf16 = grad_dtype == at::kBFloat16 ? 1 : 0;
  const at::Device device = p.param.device();
  if (p.operand.defined()) {  // the next forward's operand, written by the CUDA kernel in the same pass
    if (!device.is_cuda() ||
        p.operand.scalar_type() != at::kBFloat16 || !p.operand.is_contiguous() ||
        !p.operand.sizes().equals(p.param.sizes()) || p.operand.device() != device)
      throw Error("AdamW: '" + p.name + "' has an operand " + describe(p.operand) +
                  ": the update writes a bf16 operand of the parameter's shape only on CUDA");
    view.operand = static_cast<uint16_t*>(p.operand.data_ptr());
    view.operand_search = p.operand_search ? 1 : 0;
    view.operand_nonfinite_flag =
        p.operand_nonfinite_flag.defined() ? p.operand_nonfinite_flag.data_ptr<int>() : nullptr;
  }
  if (device.is_cpu()) {
    optim_detail::adamw_step_cpu(view, scalars, o.step_chunk_rows);
  } else if (device.is_cuda()) {
    optim_detail::adamw_step_cuda(view, scalars, device.index());
  } else {
    throw Error("AdamW: parameter '" + p.name + "' is on " + device.str() + "; CPU and CUDA are supported");
  }
}

uint64_t AdamW::state_bytes() const {
  uint64_t bytes = 0;
  for (size_t i = 0; i < params_.size(); ++i)
    for (const auto& named : named_state(params_[i].name, states_[i]))
      bytes += static_cast<uint64_t>(named.second.numel()) * named.second.element_size();
  return bytes;
}

std::vector<std::pair<std::string, at::Tensor>> AdamW::state_tensors() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i)
    for (auto& named : named_state(params_[i].name, states_[i])) out.push_back(std::move(named));
  return out;
}

void AdamW::load_state_tensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors, int64_t step_count) {
  if (step_count < 0) throw Error("AdamW: saved step count " + std::to_string(step_count) + " is negative");
  std::map<std::string, at::Tensor> saved;
  for (const auto& [name, tensor] : tensors)
    if (!saved.emplace(name, tensor).second) throw Error("AdamW: saved optimizer state '" + name + "' appears twice");
  const auto live = state_tensors();
  for (const auto& [name, tensor] : live) {
    const auto found = saved.find(name);
    if (found == saved.end())
      throw Error("AdamW: saved optimizer state lacks '" + name + "' (" + moment_storage_name(options_.moments) +
                  " moments; was it saved with another --optimizer-state-mode or model?)");
    if (found->second.scalar_type() != tensor.scalar_type() || !found->second.sizes().equals(tensor.sizes()))
      throw Error("AdamW: saved optimizer state '" + name + "' is " + describe(found->second) + ", expected " +
                  describe(tensor));
  }
  if (saved.size() != live.size()) {
    for (const auto& [name, tensor] : saved) {
      bool known = false;
      for (const auto& named : live) known = known || named.first == name;
      if (!known) throw Error("AdamW: saved optimizer state has '" + name + "', which this optimizer does not hold");
    }
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, tensor] : live) at::Tensor(tensor).copy_(saved.at(name));
  step_count_ = step_count;
}

at::Tensor AdamW::rng_state() const {
  return at::tensor({static_cast<int64_t>(options_.seed)}, at::TensorOptions().dtype(at::kLong));
}

void AdamW::set_rng_state(const at::Tensor& state) {
  if (!state.defined() || state.scalar_type() != at::kLong || state.numel() != 1)
    throw Error("AdamW: the stochastic-rounding state must be one int64 (the seed), got " +
                (state.defined() ? describe(state) : std::string("an undefined tensor")));
  options_.seed = static_cast<uint64_t>(state.to(at::kCPU).reshape({1})[0].item<int64_t>());
}

}  // namespace qwen3
