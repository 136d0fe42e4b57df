// The model as training runs it, its weight operands, and the export of what it trained (train_model.h).
#include "train_model.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "qwen3/base/error.h"
#include "qwen3/export/exporter.h"
#include "qwen3/model/model_loader.h"
#include "qwen3/nvfp4/nvfp4_linear.h"
#include "qwen3/nvfp4/nvfp4_ops.h"

namespace qwen3::train_detail {

TrainModel setup_model(const TrainOptions& o, const Qwen3Config& config, const DatReader& reader,
                       const c10::Device& device, const WeightOperandsChoice& operands) {
  TrainModel t;
  t.model = load_model(reader, config, master_scalar_type(o.master_dtype), device,
                       /*tie_head=*/config.tie_word_embeddings);
  Qwen3Model& model = *t.model;
  model.set_compute_dtype(compute_scalar_type(o, device));
  t.set = select_trainable(model, o);
  // Each trained product's bf16 operand held for its dX instead of its codes, which saves their dequantization in
  // backward, or in buffers for the run: made by the first forward, then written by the update that steps the
  // weight (always: the optimizer gets the buffers) or made again by each step's first forward and multiplied by
  // the recompute too (backward under --grad-checkpoint; choose_weight_operands, docs/trainer.md).
  if (operands.persistent())
    t.persistent_operands = make_persistent_operands(model, blocks_with_operand_buffers(operands.decided_options()));
  t.operands_remade_each_step = operands.persistent() && !operands.written_by_update();
  use_nvfp4_projections(model, o.scale_mode, o.frozen_projections_as_codes, t.frozen_code_products, operands.keep(),
                        t.persistent_operands);
  t.runner = std::make_unique<TrainingBlockRunner>(o.grad_checkpoint, o.grad_checkpoint_blocks);
  model.set_block_runner(t.runner.get());
  return t;
}

void check_weight_operands(const TrainOptions& o, const c10::Device& device, int world_size, const Qwen3Config& config) {
  const KeepWeightOperands keep = o.keep_weight_operands;
  if (keep == KeepWeightOperands::auto_select || keep == KeepWeightOperands::off) return;
  const std::string flag = std::string("train: --keep-weight-operands ") + to_string(keep);
  if (keep == KeepWeightOperands::recompute && !o.grad_checkpoint)
    throw UsageError(flag + " holds the operands each block's recompute makes: it needs --grad-checkpoint (without "
                     "it, backward holds forward's)");
  if (!device.is_cuda())
    throw UsageError(flag + " holds the CUDA quantize pass's bf16 operands: it needs --device cuda (a CPU has one "
                     "path: the codes)");
  if (!weight_operands_made(o, device))
    throw UsageError(fmt::format("{}: this run makes no bf16 operand (that takes bf16 compute and {} tokens a "
                                 "micro-batch, --batch-size x --seq-len)",
                                 flag, nvfp4::kNvfp4KernelMaxRows));
  if (keep != KeepWeightOperands::always) return;
  if (world_size > 1)
    throw UsageError(flag + " is for one process (data parallel's collectives change weights outside the update)");
  if (config.is_moe())
    throw UsageError(flag + ": not for mixture-of-experts models yet (their experts run as grouped products)");
}

void hand_operands_to_update(const TrainModel& t, nvfp4::ScaleMode mode, const c10::Device& device,
                             std::vector<OptimParam>& params) {
  if (!t.persistent_operands || t.operands_remade_each_step) return;
  size_t handed = 0;
  for (OptimParam& p : params)
    if (const nvfp4::PersistentOperand* kept = t.persistent_operands->find(p.param)) {
      p.operand = kept->operand;
      p.operand_search = mode == nvfp4::ScaleMode::search;
      p.operand_nonfinite_flag = nvfp4::nonfinite_flag_of(device);
      ++handed;
    }
  const size_t kept = t.persistent_operands->entries.size();
  if (handed != kept)
    throw Error(fmt::format("--keep-weight-operands always: {} of {} kept operands belong to no optimizer parameter",
                            kept - handed, kept));
}

void export_trained(const TrainOptions& o, const TrainableSet& set, const Qwen3Model& model, const DatReader& reader) {
  NamedTensors trained;
  for (const auto& p : set.params) trained.emplace_back(p.name, p.param.detach());
  trained = with_tied_head(std::move(trained), !model.has_separate_lm_head(), reader);
  const ExportReport rep = export_dat(reader, o.output_dat, trained, o.scale_mode);
  spdlog::info("exported {}: {} entries ({} rewritten, {} copied)", o.output_dat, rep.entries, rep.rewritten,
               rep.copied);
}

}  // namespace qwen3::train_detail
