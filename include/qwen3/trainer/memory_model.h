// What one training step should hold in memory, phase by phase, computed from the configuration alone: the
// model's tensors, the optimizer state, the gradients, what autograd saves for backward (by sequence length,
// checkpointing and attention implementation), the NVFP4 codes the straight-through linear keeps, and the
// largest temporaries of each phase. The trainer's one-step report prints it beside the measurement.
// How each term is counted: docs/memory.md.
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "qwen3/config/config.h"
#include "qwen3/trainer/trainer.h"

namespace qwen3 {

// The phases of the report, in order.
inline const std::vector<std::string>& step_phases() {
  static const std::vector<std::string> phases = {"start",       "model_loaded",  "optimizer_state_ready",
                                                  "batch_ready", "forward_done",  "backward_done",
                                                  "optimizer_step_done"};
  return phases;
}

struct PhaseMemory {
  std::string phase;
  uint64_t peak = 0;  // most tensor bytes live at once during the phase
  uint64_t end = 0;   // tensor bytes live when it ends
};

struct StepMemoryPlan {
  std::vector<PhaseMemory> phases;  // step_phases(), in order
  // The terms, for the report's summary and the docs' tables.
  uint64_t weights = 0, moments = 0, gradients = 0, saved_activations = 0;
  // Of the saved activations, what the trained projections keep for their dX: codes, or bf16 operands
  // (--keep-weight-operands without checkpointing).
  uint64_t saved_codes = 0, saved_operands = 0;
  uint64_t peak() const;
};

// What the loader's temporaries depend on: the element size of the file's dense tensors (embedding, norms) and
// whether that is already the master dtype (no conversion copy).
struct DenseFileType {
  int bytes = 2;
  bool is_master_dtype = false;
};

// `separate_head`: the model has its own lm_head (untied). `sdpa`: attention by scaled_dot_product_attention
// (libtorch 2.x) rather than the explicit softmax of 1.13.
StepMemoryPlan predict_step_memory(const Qwen3Config& config, bool separate_head, const TrainOptions& options,
                                   const c10::Device& device, DenseFileType dense_file = {}, bool sdpa = false);

// Whether this build's libtorch attention saves what `sdpa` describes.
bool build_uses_sdpa();

}  // namespace qwen3
