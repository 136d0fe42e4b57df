// The optimizer module: decoupled AdamW over master weights with compressed moment storage, a step that works
// in row chunks, global-norm gradient clipping, learning-rate schedules and stochastic rounding to bfloat16.
// Design, encodings and measured error: docs/optim.md.
#pragma once
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qwen3 {
namespace optim_detail {
class MomentCodec;
}

// How the two AdamW moments are stored between steps (--optimizer-state-mode). The arithmetic is fp32 in
// every mode; the compressed modes round with stochastic rounding (docs/optim.md says why).
enum class MomentStorage {
  float32,   // 8 bytes a parameter
  bfloat16,  // 4
  int8,      // m: int8 linear codes, v: uint8 log2 codes; one fp32 scale per 64-element block of a row: 2.125
  nvfp4,     // m and sqrt(v): the project's NVFP4 (E2M1 + E4M3 scale per 16 elements of a row) over an fp32 scale
             // per row: 1.125 + 8 / columns
};
MomentStorage moment_storage_from_name(std::string_view name);  // UsageError for an unknown name
const char* moment_storage_name(MomentStorage storage);

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  MomentStorage moments = MomentStorage::float32;
  // R > 0: at most R rows (dim 0) per piece. 0: the device's bound (optimizer_piece_rows). Any R gives the
  // same bytes.
  int64_t step_chunk_rows = 0;
  uint64_t seed = 0;            // the stochastic-rounding stream (bf16 masters, compressed moments)
};

// `param` is the master weight itself (float32 or bfloat16, contiguous); backward fills its .grad().
// `decay`: whether weight decay applies (the trainer passes false for norms and the embedding).
struct OptimParam {
  std::string name;
  at::Tensor param;
  bool decay = true;
  // Which random stream the parameter's stochastic rounding draws from: its position in the optimizer when
  // negative. An optimizer holding a rank's share of the parameters (--shard-optimizer-state) gives each its
  // position in the whole list, so the bytes do not depend on how the parameters are shared out.
  int64_t stream_index = -1;
  // --keep-weight-operands always: the parameter's bf16 operand deq(Q(param)) (its shape, contiguous), which the
  // CUDA update writes beside the stepped parameter (fp32 or bf16 moments only; elsewhere an error); undefined:
  // none. operand_search: the NVFP4 search scale mode (else rne). operand_nonfinite_flag: an int32 device flag
  // raised for a block with an infinite or NaN element, as the quantize kernels raise theirs (may be undefined).
  at::Tensor operand{};
  bool operand_search = false;
  at::Tensor operand_nonfinite_flag{};
};

// Rows of a [rows, cols] parameter that one optimizer piece covers (--optimizer-step-chunk-rows, or the
// default bound of the device: ~2^20 elements on CPU, 2^24 on a GPU). Every piece size gives the same bytes.
int64_t optimizer_piece_rows(int64_t requested_rows, int64_t rows, int64_t cols, const at::Device& device);

// Bytes of moment state (both moments and their scales) that a parameter of this shape takes.
uint64_t moment_state_bytes(at::IntArrayRef shape, MomentStorage storage);

class AdamW {
 public:
  // Validates the options and the parameters and allocates all state now, on each parameter's device.
  AdamW(std::vector<OptimParam> params, AdamWOptions options);
  ~AdamW();
  AdamW(AdamW&&) noexcept;
  AdamW& operator=(AdamW&&) noexcept;

  // One update of every parameter that has a gradient (torch.optim.AdamW semantics, bias-corrected), then the
  // step count is the number of steps taken. Each parameter is one fused pass (kernels/adamw_update.cuh): every
  // byte of gradient, master and state read once and written once; on a GPU one kernel launch, no host
  // synchronization. grad_scale multiplies every gradient first (the clipping factor, see clip_factor).
  void step(double lr, double grad_scale = 1.0);

  // The same step taken one parameter at a time, for the optimizer-in-backward mode (--fused-optimizer):
  // begin_step() counts the step, then update(i, grad, lr) applies it to parameter i with `grad` (which need not
  // be its .grad()). Any order of updates gives the bytes of step(lr), since each parameter's random stream
  // depends only on (seed, step, i).
  void begin_step();
  void update(size_t index, const at::Tensor& grad, double lr, double grad_scale = 1.0);
  // The same with the clipping factor as a one-element fp32 tensor on the parameter's device, NaN meaning "leave
  // this parameter as it is" (its group's gradient was not finite): on a GPU the kernel reads it, so the host
  // never waits for the device to know the factor.
  void update(size_t index, const at::Tensor& grad, double lr, const at::Tensor& grad_scale);
  // The index of `param` among params(), if it is one (with --shard-optimizer-state, a rank's optimizer holds
  // its share of the parameters only).
  std::optional<size_t> find(const at::Tensor& param) const;

  int64_t step_count() const { return step_count_; }

 private:
  void update_with(size_t index, const at::Tensor& grad, double lr, double grad_scale, const float* grad_scale_on_device);

 public:
  uint64_t state_bytes() const;
  const AdamWOptions& options() const { return options_; }
  const std::vector<OptimParam>& params() const { return params_; }

  // Every state tensor by a stable name: "<param>.exp_avg", "<param>.exp_avg_sq", for int8/nvfp4
  // "<param>.exp_avg.scale", "<param>.exp_avg_sq.scale", and for nvfp4 "<param>.exp_avg.row_scale",
  // "<param>.exp_avg_sq.row_scale". The tensors are the live state (not copies).
  std::vector<std::pair<std::string, at::Tensor>> state_tensors() const;
  // Copies saved tensors (any device) into the state; the names, shapes and dtypes must be exactly those of
  // state_tensors(), otherwise an Error names the first mismatch and nothing is changed.
  void load_state_tensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors, int64_t step_count);

  // The stochastic-rounding stream is counter based (a hash of seed, step, parameter and element index), so
  // its whole state is the seed: an int64 CPU tensor of one element. Save it with step_count() to resume.
  at::Tensor rng_state() const;
  void set_rng_state(const at::Tensor& state);

  struct ParamState;  // per-parameter moments (src/optim)

 private:
  std::vector<OptimParam> params_;
  AdamWOptions options_;
  std::unique_ptr<const optim_detail::MomentCodec> codec_;
  std::vector<ParamState> states_;
  int64_t step_count_ = 0;
};

// Global L2 norm of all gradients (computed in fp32, one host synchronization at the end). If max_norm > 0 and
// the norm exceeds it, every gradient is scaled by max_norm / (norm + 1e-6). Returns the norm before clipping;
// a non-finite norm is returned as it is and the gradients are left untouched (the caller skips the step).
// Parameters without a gradient are ignored.
double clip_grad_norm(const std::vector<OptimParam>& params, double max_norm);
// The same without synchronizing or touching the gradients: the squared global norm as a 0-dim fp32 tensor on
// the first gradient's device (undefined when no parameter has a gradient), and the factor clipping applies
// (max_norm / (norm + 1e-6) when norm > max_norm > 0, else exactly 1), to hand to AdamW::step: the trainer
// reads the norm with the loss in its one synchronization a step, and the update scales the gradient as it
// reads it instead of a pass of its own.
at::Tensor grad_square_sum(const std::vector<OptimParam>& params);
double clip_factor(double norm, double max_norm);
// Sum of squares of any float tensor as a 0-dim fp32 tensor on its device, formed in optimizer-sized pieces so
// that no whole-tensor fp32 copy is made.
at::Tensor square_sum_fp32(const at::Tensor& t);
// Each gradient's sum of squares, fp32 [grads.size()] on the first one's device: on CUDA (every gradient on one
// device; fp32 or bf16, the masters' dtypes, else an Error) the clipping kernel's per-tensor fp64 sums (kernels/grad_clip.cu) rounded to
// fp32, one launch a 64 gradients; elsewhere square_sum_fp32 of each. grad_square_sum is their sum; a shared-out
// state's owners form their parameters' entries with it, so that the ranks' sum has the one-process bits.
at::Tensor square_sums_fp32(const std::vector<at::Tensor>& grads);
// One group's clipping for the in-backward update (docs/trainer.md, "Clipping is per group"), without waiting for
// the device. `grads`: the group's gradients (defined, one device); `trainable`: the elements of every trained
// parameter. Returns each gradient's factor, fp32 [grads.size()] on their device: clip_factor of the group's norm
// against its share of max_norm (max_norm * sqrt(group elements / trainable)), NaN for the whole group where its
// norm is not finite (the update skips it). With `ranks_with_gradient` (data parallel: fp32 [grads.size()], how
// many ranks had each gradient) only the gradients some rank had count toward the share, and the others get NaN.
// The group's squared norm (fp64, 0-dim, on the device) is added to `square_sum` (which it becomes when
// undefined). On CUDA one kernel reads each gradient once (kernels/grad_clip.cu: its own fixed summation order,
// fp64); elsewhere square_sum_fp32 per gradient, summed in fp32.
at::Tensor group_clip_factors(const std::vector<at::Tensor>& grads, const at::Tensor& ranks_with_gradient,
                              double max_norm, int64_t trainable, at::Tensor& square_sum);

// Learning rate of step `step` (0-based): linear warmup lr * (step + 1) / warmup_steps over the first
// warmup_steps steps, then constant, or cosine / linear decay from lr to min_lr reached at step total_steps
// (and held after). Bad values are a UsageError.
enum class LrScheduleKind { constant, cosine, linear };
// "constant", "cosine", "linear" (the --lr-schedule names); parse_ throws UsageError naming the choices.
const char* to_string(LrScheduleKind kind);
LrScheduleKind parse_lr_schedule_kind(const std::string& name);

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::constant;
  double lr = 1e-5;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr = 0.0;
  double at(int64_t step) const;
  void validate() const;
};

// fp32 (or any float dtype, viewed as fp32) -> bf16 with stochastic rounding: rounds up with probability equal
// to the distance from the lower bf16 neighbour over the ulp, so E[result] = x. `gen` must be of x's device.
at::Tensor to_bfloat16_stochastic(const at::Tensor& x, at::Generator& gen);

}  // namespace qwen3
