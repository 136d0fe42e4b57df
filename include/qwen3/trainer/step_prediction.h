// The choices a run's memory decides and the one prediction of a step: --grad-checkpoint-blocks auto and
// --keep-weight-operands auto against the device's memory (the memory model's peak for each candidate), then both
// models of the step as decided. The trainer, its report and `vram-report --predict-only` read them from here.
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <string>

#include "qwen3/config/config.h"
#include "qwen3/trainer/memory_model.h"
#include "qwen3/trainer/step_time_model.h"
#include "qwen3/trainer/trainer.h"

namespace qwen3 {

// --keep-weight-operands for a run: as given, except auto, which takes backward (every trained projection's
// operand held from the forward that makes it to its backward, 2 bytes an element where the codes take 0.5625;
// under --grad-checkpoint that forward is the first one, and the recompute multiplies the same operand) where the
// memory model's peak with it stays within kWeightOperandsMemoryShare of the device's memory (the device's own
// figure; with no device to read, --predict-device's table entry), and otherwise recompute where every block is
// recomputed (each block's recompute makes its operands, held one block at a time), recompute where some are
// (--grad-checkpoint-blocks) and the step fits with the others' held from forward, and off otherwise. A CPU keeps
// nothing (one path). `why` is the log's line. The choice changes what is held and moved, never a byte of the step
// (docs/trainer.md).
struct WeightOperandsChoice {
  KeepWeightOperands decided = KeepWeightOperands::off;  // never auto_select: what the models and the trainer run
  bool grad_checkpoint = false;                          // the run's, which decides what backward holds
  int64_t grad_checkpoint_blocks = TrainOptions::kCheckpointAllBlocks;  // the run's, decided
  std::string why;
  // Where backward or always was asked for and the memory model's peak with it is above
  // kWeightOperandsMemoryShare of the device's memory: a line for the log's warning (auto would not keep them).
  std::string warning;
  bool keep() const;               // dX reads the operand, not the codes
  bool persistent() const;         // in buffers for the whole run (always; backward where a block is recomputed)
  // always (auto's choice only where every update is bound by its bytes: choose_weight_operands): forward makes none
  bool written_by_update() const;
  // The options the three read: the decision with the run's checkpointing.
  TrainOptions decided_options() const;
};

// Both models of one step, from the one entry `vram-report --predict-only` and the trainer's report share:
// the head is separate exactly when the config does not tie it (the trainer ties a tied config's head even when
// the file stores lm_head); attention is sdpa on CUDA (every CUDA build is libtorch 2.x) or when this build has
// it; the memory is `device`'s, the rates are options.predict_device's, else default_rates_name(device).
// --grad-checkpoint-blocks as decided for a run: `decided` is how many blocks, from the first, backward runs again
// (TrainOptions::kCheckpointAllBlocks: every one; never auto); `why` the log's line. auto takes the fewest blocks
// whose recompute keeps the memory model's peak (--keep-weight-operands then decided for it, as
// choose_weight_operands decides) within kWeightOperandsMemoryShare of the device's memory, and every block where
// none does; the other values are taken as given. Never a byte of the step changes (docs/trainer.md).
struct CheckpointBlocksChoice {
  int64_t decided = TrainOptions::kCheckpointAllBlocks;
  std::string why;
};
CheckpointBlocksChoice choose_checkpoint_blocks(const TrainOptions& o, const Qwen3Config& config,
                                                const c10::Device& device, DenseFileType dense_file = {});

struct StepPrediction {
  CheckpointBlocksChoice checkpoint;  // --grad-checkpoint-blocks as decided for the step predicted
  WeightOperandsChoice operands;  // --keep-weight-operands as decided for the step predicted
  StepMemoryPlan memory;
  DeviceRates rates;
  StepTimePlan time;
};
// --grad-checkpoint-blocks auto and --keep-weight-operands auto are decided here, as choose_checkpoint_blocks and
// choose_weight_operands decide them.
StepPrediction predict(const TrainOptions& options, const Qwen3Config& config, const c10::Device& device,
                       DenseFileType dense_file = {});

// Whether the step makes a bf16 operand at all: CUDA, bf16 compute, kNvfp4KernelMaxRows tokens a micro-batch.
bool weight_operands_made(const TrainOptions& o, const c10::Device& device);
// The share of the device's memory the predicted peak may take: the rest for the CUDA context, the caching
// allocator's rounding and the model's own error (docs/trainer.md says what was measured).
constexpr double kWeightOperandsMemoryShare = 0.9;
WeightOperandsChoice choose_weight_operands(const TrainOptions& o, const Qwen3Config& config,
                                            const c10::Device& device, DenseFileType dense_file = {});
// The device's memory in bytes: a CUDA device's own, else the rates table's (predict_device, or the default).
uint64_t device_memory_bytes(const c10::Device& device, const std::string& predict_device);

}  // namespace qwen3
