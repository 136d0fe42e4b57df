// Pieces of the trainer that are not the loop: which tensors train, the loss, identities for resume checks.
#pragma once
#include <nlohmann/json.hpp>

#include <algorithm>
#include <memory>

#include "qwen3/data/data.h"
#include "qwen3/dat/dat.h"
#include "qwen3/model/model.h"
#include "qwen3/nvfp4/nvfp4_linear.h"
#include "qwen3/nvfp4/nvfp4_ops.h"
#include "qwen3/optim/optim.h"
#include "qwen3/checkpoint/checkpoint.h"
#include "qwen3/trainer/trainer.h"
#include "block_runner.h"

namespace qwen3::train_detail {

struct TrainableSet {
  std::vector<OptimParam> params;  // requires_grad set; everything else frozen (no grad buffer, no state)
  int64_t trainable_parameters = 0;
  int64_t total_parameters = 0;
};
TrainableSet select_trainable(Qwen3Model& model, const TrainOptions& opt);
// The projections as training computes them: each trained one through the NVFP4 straight-through linear of
// its master weight; each frozen one, when `frozen_as_codes`, from its NVFP4 codes alone (quantized once: the
// bytes the straight-through forward would produce every step), its dense weight released. Products from
// codes are counted into `frozen_products` when given (TrainSummary's diagnostic). `keep_operands`: the trained
// projections keep their bf16 product operand for backward instead of their codes where the CUDA pass makes
// one (nvfp4::ste_linear; the trainer's choice: choose_weight_operands); with `persistent`, those of its entries
// across steps instead. Call after select_trainable, which decides what is frozen.
// Each trained projection's bf16 operand in a buffer of its own for the whole run (nvfp4_linear.h's
// PersistentOperand). --keep-weight-operands always: made by the first forward, then written by the CUDA update
// that steps the weight (OptimParam::operand). backward under --grad-checkpoint: made by each step's first
// forward, multiplied again by the recompute and by backward's dX, and marked stale once the step has updated the
// weights (mark_stale: the updates are raw writes, which leave the weights' autograd versions alone). Built once,
// after select_trainable, before the optimizer: entries never move.
struct PersistentOperands {
  std::vector<nvfp4::PersistentOperand> entries;
  nvfp4::PersistentOperand* find(const at::Tensor& weight);
  void mark_stale();  // every entry made again by the next forward that multiplies it
};
// An operand buffer for every trained projection of the model's first `blocks` blocks (all where negative; its
// weight's shape, bf16, on its device), a sparse block's experts excepted: they run as grouped products, which
// make their own.
std::shared_ptr<PersistentOperands> make_persistent_operands(Qwen3Model& model, int64_t blocks = -1);

void use_nvfp4_projections(Qwen3Model& model, nvfp4::ScaleMode mode, bool frozen_as_codes,
                           std::shared_ptr<int64_t> frozen_products = nullptr, bool keep_operands = false,
                           std::shared_ptr<PersistentOperands> persistent = nullptr);

// --grad-checkpoint(-blocks) as the models and the trainer read it (auto not yet decided counting as all): how many
// blocks, from the first, backward runs again, and whether it runs block `layer` again.
inline int64_t recomputed_block_count(const TrainOptions& o, int64_t layers) {
  if (!o.grad_checkpoint) return 0;
  return o.grad_checkpoint_blocks < 0 ? layers : std::min(o.grad_checkpoint_blocks, layers);
}
inline bool recomputes_block(const TrainOptions& o, int64_t layer) {
  return recomputes_block(o.grad_checkpoint, o.grad_checkpoint_blocks, layer);
}

// --keep-weight-operands as the models and the trainer read it, auto not yet decided by choose_weight_operands
// (step_prediction.h) counting as recompute under --grad-checkpoint and off without it: whether dX reads the operand;
// whether the operands are held in buffers of their own for the whole run (PersistentOperands: always, and
// backward under --grad-checkpoint, where the first forward makes each one and the recompute and backward
// multiply it); and whether the update writes them (always: forward makes none).
inline bool keeps_weight_operands(const TrainOptions& o) {
  return o.keep_weight_operands == KeepWeightOperands::backward ||
         o.keep_weight_operands == KeepWeightOperands::recompute ||
         o.keep_weight_operands == KeepWeightOperands::always ||
         (o.keep_weight_operands == KeepWeightOperands::auto_select && o.grad_checkpoint);
}
// With backward, a buffer for each recomputed block's projections; the others' operands are saved by their nodes.
inline bool weight_operand_buffers_in_block(const TrainOptions& o, int64_t layer) {
  return o.keep_weight_operands == KeepWeightOperands::always ||
         (o.keep_weight_operands == KeepWeightOperands::backward && recomputes_block(o, layer));
}
// Blocks, from the first, whose projections have buffers (all where negative).
inline int64_t blocks_with_operand_buffers(const TrainOptions& o) {
  return o.keep_weight_operands == KeepWeightOperands::always ? -1 : o.grad_checkpoint_blocks;
}
inline bool weight_operands_persist(const TrainOptions& o) {
  return o.keep_weight_operands == KeepWeightOperands::always ||
         (o.keep_weight_operands == KeepWeightOperands::backward && o.grad_checkpoint && o.grad_checkpoint_blocks != 0);
}
inline bool weight_operands_written_by_update(const TrainOptions& o) {
  return o.keep_weight_operands == KeepWeightOperands::always;
}

// The rule select_trainable applies to one file key of a model with `layers` blocks.
bool is_trainable(const std::string& key, int64_t layers, const TrainOptions& opt);

// What this CPU does with bf16 matrix products: they fail (Debian's libtorch 1.13 for aarch64 hands them to
// oneDNN whenever the CPU has BF16 instructions, Neoverse V1/V2 and so DGX Spark's Grace, but was built without
// the Arm Compute Library, so oneDNN has no bf16 matmul and throws); they run without bf16 dot-product
// instructions (converted to float and back: 6-17x slower steps than float32 on an AVX2 CPU); or natively
// (x86-64 AVX512-BF16 or AMX-BF16, aarch64 BF16).
enum class CpuBf16 { fails, emulated, native };

// The dtypes of a run: the master weights' (--master-dtype) and the activations' (--compute-dtype; auto is
// bfloat16 on CUDA and on CPU the master dtype where the CPU multiplies bf16 natively, else float32;
// docs/trainer.md). UsageError for an unknown name.
at::ScalarType master_scalar_type(MasterDtype dtype);
at::ScalarType compute_scalar_type(const TrainOptions& opt, const c10::Device& device);
// The same with the CPU's bf16 capability given: an explicit `--compute-dtype bfloat16` is a UsageError
// saying why where the products fail.
at::ScalarType compute_scalar_type(const TrainOptions& opt, const c10::Device& device, CpuBf16 cpu_bf16);

// Why a CPU run's compute dtype is not what its flags alone suggest, for the log: empty where nothing needs
// saying; a warning for an explicit bf16 on a CPU without bf16 instructions.
struct ComputeDtypeNote {
  std::string text;
  bool warn = false;
};
ComputeDtypeNote compute_dtype_note(const TrainOptions& opt, const c10::Device& device);
ComputeDtypeNote compute_dtype_note(const TrainOptions& opt, const c10::Device& device, CpuBf16 cpu_bf16);

// This CPU's bf16 products (probed once: one product, and the CPU's instruction set).
CpuBf16 cpu_bf16();

// The run's opening lines: the model and how much of it trains, the device, dtypes and optimizer state, the
// data and the steps; a warning where an epoch has fewer batches than a step asks for.
void log_run_setup(const TrainOptions& o, const Qwen3Config& config, const TrainableSet& set, const c10::Device& device,
                   uint64_t optimizer_state_bytes, const TrainingData& data, int64_t steps, int world_size,
                   bool is_main);

// Mean loss over the batch's loss tokens: "ce" = next-token cross-entropy on fp32 logits; "scalar" = the
// original's L1 between the final hidden states and the (detached) embeddings of the target tokens.
at::Tensor compute_loss(Qwen3Model& model, const Batch& batch, LossKind kind);

// Ties a checkpoint to its input: the config and the file's keys, types and shapes.
std::string model_hash(const Qwen3Config& config, const DatReader& reader);
// Flags that must agree between a checkpoint and a resumed run.
nlohmann::json resume_flags(const TrainOptions& opt, int world_size);

std::string format_duration(double seconds);  // "3m20s", "1h05m", "12s"
std::string format_count(double n);           // "9.9k", "1.2M"

}  // namespace qwen3::train_detail
