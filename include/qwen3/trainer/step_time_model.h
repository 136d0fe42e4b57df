// What one training step should take, phase by phase, from the configuration and a named device's rates: the
// FLOPs of every product and the bytes every pass moves, each turned into time at a documented fraction of the
// device's peak. The companion of the memory model (memory_model.h); `vram-report --predict-only
// --predict-device D` prints it, the real report prints it beside the measured durations. The model, its
// rates and how close it is: docs/performance.md.
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "qwen3/config/config.h"
#include "qwen3/trainer/trainer.h"

namespace qwen3 {

// How many parameters a second the fused AdamW update can step, by moment storage and master dtype, in G
// elements/s, where the update's arithmetic rather than its bytes bounds it (0: no bound beyond the bytes). The
// compressed moments' stochastic rounding costs hashes, divisions and square roots an element: measured on an
// H200 at 38 G/s for nvfp4 moments, a fourteenth of what their bytes allow (docs/performance.md).
struct UpdateRates {
  double plain = 0;  // fp32 or bf16 moments, either master
  double int8_fp32_master = 0, int8_bf16_master = 0;
  double nvfp4_fp32_master = 0, nvfp4_bf16_master = 0;
  // The plain update that also writes the element's bf16 operand (--keep-weight-operands always): each
  // 16-block's scale chosen by its lanes' exchanges, an arithmetic its two more bytes do not show.
  double plain_with_operand = 0;
  // The compressed moments' updates that also write the operand, by master dtype.
  double int8_fp32_master_with_operand = 0, int8_bf16_master_with_operand = 0;
  double nvfp4_fp32_master_with_operand = 0, nvfp4_bf16_master_with_operand = 0;
};

// A device as the model sees it. Peak rates are the vendor's dense figures (or, for `cpu`, measured on the
// development machine); the efficiencies are the fractions of them that training-shaped work reaches.
struct DeviceRates {
  std::string name;
  double bf16_tflops = 0;       // dense bf16 products (tensor cores)
  double fp32_tflops = 0;       // fp32 products
  double memory_gbps = 0;       // DRAM (or unified memory) bandwidth, GB/s
  double matmul_efficiency = 0;
  double memory_efficiency = 0;  // the optimizer's update: long streams of a few dtypes
  bool unified_memory = false;  // GPU memory and process memory are one pool (GB10)
  double memory_gb = 0;         // the device's memory by the vendor (GB); 0 for cpu: the machine's MemTotal
  // The other passes (quantize and dequantize, norms, RoPE, SwiGLU, residual adds, the loss's slices): short
  // kernels over activations and weights, which reach a smaller share of the bandwidth than the update.
  double pass_efficiency = 0;
  UpdateRates update;
};

// The update's element rate (G elements/s) for this storage and master, with or without writing the operand;
// 0 where only bytes bound it.
double update_elements_per_s(const DeviceRates& device, MomentStorage moments, MasterDtype master,
                             bool writes_operand = false);

// h100 | h200 | gb10 | cpu; UsageError naming the known ones otherwise.
DeviceRates device_rates(std::string_view name);
const std::vector<std::string>& predict_device_names();

// The rates a run on `device` is predicted and its MFU measured with when no flag names them: cpu on a CPU; on a
// GPU the one it is — gb10 for compute capability 12.1, h200 for a 9.0 with more than 100 GiB — else h100.
std::string rates_name_for_gpu(int major, int minor, uint64_t total_memory);
std::string default_rates_name(const c10::Device& device);

// One named share of a phase's work, the place in predict_step_time that counts it named alike: the products of a
// kind (flops), or a pass's bytes (the weights' operands, the activations' kernels, the loss's logits, ...), or the
// update's. A phase's terms add up to its flops and bytes; `ms` is the term's share of the phase's time at the
// rate its kind runs at (the update's at its bound). `vram-report --predict-only` prints them.
struct StepTerm {
  enum class Kind { products, passes, norm, update };
  std::string name;
  Kind kind = Kind::passes;
  double flops = 0, bytes = 0, ms = 0;
};

struct PhaseTime {
  std::string phase;     // forward_done | backward_done | optimizer_step_done
  double flops = 0;      // products
  double bytes = 0;      // memory traffic outside the products' operands, the update's included
  double update_bytes = 0;  // of which the optimizer's update (gradient norm, gradient, master, moments)
  double norm_bytes = 0;    // of which the gradient norm's read: a kernel of its own, at the memory rate
  double updated = 0;       // parameters the update steps in this phase
  // Of those, the ones whose update also writes their bf16 operand (--keep-weight-operands always), and the
  // bytes of their update, operand included.
  double operand_updated = 0, operand_update_bytes = 0;
  // The terms' sum: flops at the matmul rate, plus the passes' bytes at the pass rate, plus the norm's read at the
  // memory rate, plus the update at the slower of its other bytes at the memory rate and its elements at the update
  // rate (no overlap assumed), the operand-writing elements' part at their own element rate.
  double ms = 0;
  std::vector<StepTerm> terms;  // in the order counted; they add up to flops and bytes
};

struct StepTimePlan {
  std::string device;
  std::vector<PhaseTime> phases;
  double matmul_flops_per_s = 0;  // the rate the products run at: the device's peak times its matmul efficiency
  double total_ms() const;
  // The compute floor: every product of the step (recompute included, as the code runs it) at the matmul rate
  // and nothing else, no memory traffic. What the step could take if all the work around the products vanished.
  double floor_ms() const;
  // The memory floor of the optimizer's update at the memory rate: gradient read, master and both moments read
  // and written once, nothing else (what the fused update kernel moves when it is not re-reading). An fp32 AdamW
  // of billions of parameters cannot step faster than floor_ms() + this: the two do not overlap in this code.
  double update_floor_ms = 0;
  // What attention was counted over: the sum of its sequences' squared lengths, and B·T² of rows attending whole
  // (equal unless packed rows' samples run alone: predict_step_time's attention_square).
  double attention_square = 0, whole_rows_square = 0;
};

// The device's dtype rules follow the trainer's (compute dtype auto: bf16 on a GPU device, the master dtype
// on cpu). `separate_head`: the model has its own lm_head. `attention_square`: for packed rows where the flash
// node runs each sample alone (a GPU, bf16), the sum over the batch's rows of their segments' squared lengths
// (packed_attention_square); 0, or elsewhere: every row attends over all seq_len positions (B·T²).
StepTimePlan predict_step_time(const Qwen3Config& config, bool separate_head, const TrainOptions& options,
                               const DeviceRates& device, double attention_square = 0);

// Whether every update of the plan is bound by its bytes at the device's memory rate rather than by its elements at
// the update kernels' rates (the operand-writing ones' apart): then the plan's update time rests on the bytes the
// code moves, not on a kernel's measured or estimated rate (a GB10's 273 GB/s; an H100's instruction-bound int8
// update is not). `options`: the ones the plan was predicted with.
bool updates_bound_by_bytes(const StepTimePlan& plan, const TrainOptions& options, const DeviceRates& device);

// The model FLOPs of one trained token, what MFU divides by the peak (docs/performance.md, "MFU"), the same count
// for qwen3-train and for the peer (bench/hf_peer.py): 6 per parameter a token's products use — every parameter
// but the input embedding, a tied head counted once, as the head — plus 12·L·(heads·head_dim)·T for attention over
// a row of T = seq_len positions (PaLM's count, as torchtitan and nanoGPT make it, not halved for the causal
// mask). Never recompute, never what --train-last-layers leaves frozen: what the model does per token, not what
// this run chose to spend on it.
double model_flops_per_token(const Qwen3Config& config, int64_t seq_len);

}  // namespace qwen3
