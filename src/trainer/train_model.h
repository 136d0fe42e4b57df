// The model as training runs it (loaded, its trainable set chosen, its projections installed, the block runner
// set), the --keep-weight-operands checks and buffers that go with it, and the export of what it trained. The
// trainer's setup uses these; nothing here knows of steps, data or checkpoints.
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "block_runner.h"
#include "qwen3/config/config.h"
#include "qwen3/dat/dat.h"
#include "qwen3/trainer/step_prediction.h"
#include "qwen3/trainer/trainer.h"
#include "train_setup.h"

namespace qwen3::train_detail {

// Loaded in the master dtype (a tied config trains one tensor for the embedding and the head, as HF does:
// model_loader.h), computing in the compute dtype, the trainable set chosen, frozen projections held as their
// codes only (no dense copy outlives its use) and trained ones through the straight-through linear from their
// master weights.
struct TrainModel {
  std::shared_ptr<Qwen3Model> model;
  TrainableSet set;
  std::unique_ptr<TrainingBlockRunner> runner;  // activation checkpointing and the in-backward update
  std::shared_ptr<int64_t> frozen_code_products = std::make_shared<int64_t>(0);  // TrainSummary's diagnostic
  // --keep-weight-operands always, or backward under --grad-checkpoint (then remade by each step's first forward:
  // the trainer marks them stale after each update, remade_each_step).
  std::shared_ptr<PersistentOperands> persistent_operands;
  bool operands_remade_each_step = false;
  TrainModel() = default;
  TrainModel(TrainModel&&) = default;
  TrainModel& operator=(TrainModel&&) = default;
  ~TrainModel() {
    if (model) model->set_block_runner(nullptr);  // the model may outlive its runner
  }
};

// Each trained product's bf16 operand held for its dX instead of its codes where `operands` says so, or kept
// across steps (docs/trainer.md, "Weight operands").
TrainModel setup_model(const TrainOptions& o, const Qwen3Config& config, const DatReader& reader,
                       const c10::Device& device, const WeightOperandsChoice& operands);

// --keep-weight-operands other than auto and off asks for an operand this run must make, recompute for
// --grad-checkpoint, and always for an update that writes it: a UsageError where it would change nothing or could
// not be kept current.
void check_weight_operands(const TrainOptions& o, const c10::Device& device, int world_size, const Qwen3Config& config);

// With operands kept across steps and written by the update (always): each of `params` that has one gets its
// buffer, the scale mode and the non-finite flag, so the update writes it. Every kept operand must find its
// parameter (an Error otherwise: one the update does not write would go stale without its weight's version
// moving).
void hand_operands_to_update(const TrainModel& t, nvfp4::ScaleMode mode, const c10::Device& device,
                             std::vector<OptimParam>& params);

// The trained model into a new .dat beside the input's layout (--output-dat): trained tensors re-quantized from
// their masters, a tied head written from the trained embedding, everything else copied (exporter.h).
void export_trained(const TrainOptions& o, const TrainableSet& set, const Qwen3Model& model, const DatReader& reader);

}  // namespace qwen3::train_detail
