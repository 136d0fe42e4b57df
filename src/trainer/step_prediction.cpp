// The choices a run's memory decides (--grad-checkpoint-blocks auto, --keep-weight-operands auto) and the one
// prediction of a step that the trainer's report and `vram-report --predict-only` share: the memory model
// (memory_model.cpp) and the step-time model (step_time_model.cpp) run on the options as decided.
#include "qwen3/trainer/step_prediction.h"

#include <fmt/format.h>

#include <algorithm>

#include "qwen3/memory/memory_probe.h"
#include "qwen3/nvfp4/nvfp4_linear.h"
#include "train_setup.h"

namespace qwen3 {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The step's predicted peak as predict() counts it.
uint64_t predicted_peak(const Qwen3Config& config, const TrainOptions& o, const c10::Device& device,
                        DenseFileType dense_file) {
  return predict_step_memory(config, !config.tie_word_embeddings, o, device, dense_file,
                             device.is_cuda() || build_uses_sdpa())
      .peak();
}

// The device's memory and the share of it an auto choice lets the predicted peak take.
struct MemoryBudget {
  uint64_t memory;
  bool fits(uint64_t peak) const {
    return static_cast<double>(peak) <= kWeightOperandsMemoryShare * static_cast<double>(memory);
  }
  // "<peak> GiB, within|above 90% of the device's <memory> GiB"
  std::string against(uint64_t peak) const {
    return fmt::format("{:.1f} GiB, {} {:.0f}% of the device's {:.1f} GiB", peak / kGiB,
                       fits(peak) ? "within" : "above", 100 * kWeightOperandsMemoryShare, memory / kGiB);
  }
};

}  // namespace

StepPrediction predict(const TrainOptions& options, const Qwen3Config& config, const c10::Device& device,
                       DenseFileType dense_file) {
  const bool separate_head = !config.tie_word_embeddings;
  TrainOptions o = options;
  StepPrediction p;
  p.checkpoint = choose_checkpoint_blocks(options, config, device, dense_file);
  o.grad_checkpoint_blocks = p.checkpoint.decided;
  p.operands = choose_weight_operands(o, config, device, dense_file);
  o.keep_weight_operands = p.operands.decided;
  p.memory = predict_step_memory(config, separate_head, o, device, dense_file, device.is_cuda() || build_uses_sdpa());
  p.rates = device_rates(!o.predict_device.empty() ? o.predict_device : default_rates_name(device));
  p.time = predict_step_time(config, separate_head, o, p.rates);
  return p;
}

uint64_t device_memory_bytes(const c10::Device& device, const std::string& predict_device) {
  if (const auto gpu = cuda_device_info(device)) return gpu->total_memory;
  const DeviceRates rates = device_rates(!predict_device.empty() ? predict_device : default_rates_name(device));
  return rates.memory_gb > 0 ? static_cast<uint64_t>(rates.memory_gb * 1e9) : machine_memory_bytes();  // cpu
}

CheckpointBlocksChoice choose_checkpoint_blocks(const TrainOptions& o, const Qwen3Config& config,
                                                const c10::Device& device, DenseFileType dense_file) {
  const int64_t layers = config.num_hidden_layers;
  if (!o.grad_checkpoint) return {TrainOptions::kCheckpointAllBlocks, "no block recomputed (no --grad-checkpoint)"};
  if (o.grad_checkpoint_blocks == TrainOptions::kCheckpointAllBlocks)
    return {o.grad_checkpoint_blocks, fmt::format("all {} blocks recomputed", layers)};
  if (o.grad_checkpoint_blocks >= 0)
    return {o.grad_checkpoint_blocks, fmt::format("the first {} of {} blocks recomputed (--grad-checkpoint-blocks {})",
                                                  std::min(o.grad_checkpoint_blocks, layers), layers,
                                                  o.grad_checkpoint_blocks)};
  // auto: the fewest recomputed blocks whose step fits, the operands decided for each count as the run would.
  const MemoryBudget budget{device_memory_bytes(device, o.predict_device)};
  uint64_t peak = 0;
  for (int64_t k = 0; k <= layers; ++k) {
    TrainOptions t = o;
    t.grad_checkpoint_blocks = k;
    t.keep_weight_operands = choose_weight_operands(t, config, device, dense_file).decided;
    peak = predicted_peak(config, t, device, dense_file);
    if (budget.fits(peak))
      return {k, fmt::format("the first {} of {} blocks recomputed (auto: the fewest whose step fits, the memory "
                             "model's peak {})",
                             k, layers, budget.against(peak))};
  }
  return {TrainOptions::kCheckpointAllBlocks,
          fmt::format("all {} blocks recomputed (auto: the memory model's peak with all of them {})", layers,
                      budget.against(peak))};
}

// What a decided option means, by the rules the models and the trainer read (train_setup.h).
TrainOptions WeightOperandsChoice::decided_options() const {
  TrainOptions o;
  o.keep_weight_operands = decided;
  o.grad_checkpoint = grad_checkpoint;
  o.grad_checkpoint_blocks = grad_checkpoint_blocks;
  return o;
}
bool WeightOperandsChoice::keep() const { return train_detail::keeps_weight_operands(decided_options()); }
bool WeightOperandsChoice::persistent() const { return train_detail::weight_operands_persist(decided_options()); }
bool WeightOperandsChoice::written_by_update() const {
  return train_detail::weight_operands_written_by_update(decided_options());
}

WeightOperandsChoice choose_weight_operands(const TrainOptions& o, const Qwen3Config& config,
                                            const c10::Device& device, DenseFileType dense_file) {
  const auto choice = [&](KeepWeightOperands decided, std::string why) {
    WeightOperandsChoice c;
    c.decided = decided, c.grad_checkpoint = o.grad_checkpoint, c.grad_checkpoint_blocks = o.grad_checkpoint_blocks;
    c.why = std::move(why);
    return c;
  };
  const auto codes = [&](std::string why) { return choice(KeepWeightOperands::off, std::move(why)); };
  // Under --grad-checkpoint held from the first forward through the recompute (a buffer each for the run);
  // without it from each forward to its backward.
  const auto from_forward = [&](std::string why) { return choice(KeepWeightOperands::backward, std::move(why)); };
  const auto from_recompute = [&](std::string why) { return choice(KeepWeightOperands::recompute, std::move(why)); };
  if (o.keep_weight_operands == KeepWeightOperands::off) return codes("codes (--keep-weight-operands off)");
  if (!device.is_cuda()) return codes("codes (a CPU has one path: the codes, dequantized for each product)");
  if (!weight_operands_made(o, device))
    return codes(fmt::format("codes (no bf16 operand is made to keep: that takes bf16 compute and {} tokens a "
                             "micro-batch, below which the NVFP4 kernel reads the codes)",
                             nvfp4::kNvfp4KernelMaxRows));
  // The step with the operands held as `keep` says, against the device.
  const MemoryBudget budget{device_memory_bytes(device, o.predict_device)};
  const auto peak_with = [&](KeepWeightOperands keep) {
    TrainOptions kept = o;
    kept.keep_weight_operands = keep;
    return predicted_peak(config, kept, device, dense_file);
  };
  const auto fits = [&](uint64_t peak) { return budget.fits(peak); };
  // Asked for where auto would not: the run may still fit (the model's margin is the 10% left), so a warning.
  const auto warn_if_above = [&](WeightOperandsChoice asked) {
    const uint64_t peak = peak_with(asked.decided);
    if (!fits(peak))
      asked.warning = fmt::format(
          "--keep-weight-operands {}: the memory model's peak with the operands held so is {} (auto would not hold "
          "them: an out-of-memory error is likely)",
          to_string(asked.decided), budget.against(peak));
    return asked;
  };
  if (o.keep_weight_operands == KeepWeightOperands::always)
    return warn_if_above(choice(KeepWeightOperands::always,
                                "kept across steps, written by the update (--keep-weight-operands always)"));
  const int64_t layers = config.num_hidden_layers, recomputed = train_detail::recomputed_block_count(o, layers);
  const std::string held =
      recomputed == 0 ? "kept until backward"
      : recomputed >= layers
          ? "kept from the first forward through the recompute to backward"
          : fmt::format("kept until backward (the {} recomputed blocks' from the first forward through the recompute)",
                        recomputed);
  if (o.keep_weight_operands == KeepWeightOperands::backward)
    return warn_if_above(from_forward(held + " (--keep-weight-operands backward)"));
  const std::string recompute = "kept from each block's recompute until its backward";
  if (o.keep_weight_operands == KeepWeightOperands::recompute)
    return from_recompute(recompute + " (--keep-weight-operands recompute)");
  // auto: the step with every trained projection's operand held from the forward that makes it, against the device.
  const auto within_a_step = [&]() {
    const uint64_t peak = peak_with(KeepWeightOperands::backward);
    const std::string because = " (auto: the memory model's peak with them " + budget.against(peak) + ")";
    if (fits(peak)) return from_forward(held + because);
    // Every block recomputed: each recompute's operands, one block's held at a time. Some blocks only
    // (--grad-checkpoint-blocks): the others would hold theirs from forward as under backward, so the recompute's
    // where that fits, else codes. None: codes.
    if (recomputed >= layers) return from_recompute(recompute + because);
    if (recomputed > 0 && fits(peak_with(KeepWeightOperands::recompute)))
      return from_recompute(recompute + " (the other blocks' from forward)" + because);
    return codes("codes" + because);
  };
  const WeightOperandsChoice usual = within_a_step();
  // Across steps, written by the update (always), where the step-time model predicts it faster and every update is
  // bound by its bytes with the operand and without it (a GB10: the update's 2 bytes an element more against
  // forward's and the recompute's operand pass, e + 2): a choice that rests on the bytes the code moves, not on
  // the operand-writing kernels' rates, which no GPU round has measured since their last changes (on an H100 or an
  // H200 they bound the update, and the third round found `always` 1.1% slower there). One process, a dense model
  // (always's own conditions), and the memory to hold the operands for the run.
  if (o.predict_world_size > 1 || config.is_moe()) return usual;
  const DeviceRates rates = device_rates(!o.predict_device.empty() ? o.predict_device : default_rates_name(device));
  TrainOptions as_usual = o, across = o;
  as_usual.keep_weight_operands = usual.decided;
  across.keep_weight_operands = KeepWeightOperands::always;
  const bool separate = !config.tie_word_embeddings;
  const StepTimePlan usual_plan = predict_step_time(config, separate, as_usual, rates);
  const StepTimePlan across_plan = predict_step_time(config, separate, across, rates);
  if (!updates_bound_by_bytes(usual_plan, as_usual, rates) || !updates_bound_by_bytes(across_plan, across, rates) ||
      across_plan.total_ms() >= usual_plan.total_ms())
    return usual;
  const uint64_t peak = peak_with(KeepWeightOperands::always);
  if (!fits(peak)) return usual;
  return choice(KeepWeightOperands::always,
                fmt::format("kept across steps, written by the update (auto: its update is bound by its bytes on {}, "
                            "and the step is predicted {:.1f} ms faster than with the operands {}; the memory model's "
                            "peak with them {})",
                            rates.name, usual_plan.total_ms() - across_plan.total_ms(),
                            usual.keep() ? "made by forward" : "as codes", budget.against(peak)));
}

bool weight_operands_made(const TrainOptions& o, const c10::Device& device) {
  return device.is_cuda() && train_detail::compute_scalar_type(o, device) == at::kBFloat16 &&
         o.data.batch_size * o.data.seq_len >= nvfp4::kNvfp4KernelMaxRows;
}

}  // namespace qwen3
