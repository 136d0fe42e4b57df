#include "train_setup.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/utils.h>

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

#include "block_runner.h"
#include "qwen3/base/enum_names.h"
#include "qwen3/model/layout.h"
#include "qwen3/model/lm_loss.h"
#include "qwen3/nvfp4/nvfp4_linear.h"

namespace qwen3 {

const char* to_string(MasterDtype dtype) { return dtype == MasterDtype::bfloat16 ? "bfloat16" : "float32"; }

const char* to_string(ComputeDtype dtype) {
  switch (dtype) {
    case ComputeDtype::auto_select: return "auto";
    case ComputeDtype::float32: return "float32";
    case ComputeDtype::bfloat16: return "bfloat16";
  }
  return "?";
}

const char* to_string(LossKind kind) { return kind == LossKind::scalar_l1 ? "scalar" : "ce"; }

MasterDtype parse_master_dtype(const std::string& name) {
  const MasterDtype all[] = {MasterDtype::float32, MasterDtype::bfloat16};
  return enum_from_name(name, all, "--master-dtype");
}

const char* to_string(KeepWeightOperands keep) {
  switch (keep) {
    case KeepWeightOperands::auto_select: return "auto";
    case KeepWeightOperands::off: return "off";
    case KeepWeightOperands::backward: return "backward";
    case KeepWeightOperands::recompute: return "recompute";
    case KeepWeightOperands::always: return "always";
  }
  return "?";
}

KeepWeightOperands parse_keep_weight_operands(const std::string& name) {
  const KeepWeightOperands all[] = {KeepWeightOperands::auto_select, KeepWeightOperands::off,
                                    KeepWeightOperands::backward, KeepWeightOperands::recompute,
                                    KeepWeightOperands::always};
  return enum_from_name(name, all, "--keep-weight-operands");
}

ComputeDtype parse_compute_dtype(const std::string& name) {
  const ComputeDtype all[] = {ComputeDtype::auto_select, ComputeDtype::float32, ComputeDtype::bfloat16};
  return enum_from_name(name, all, "--compute-dtype");
}

nlohmann::json to_json(const TrainOptions& o) {
  // --grad-checkpoint-blocks as the flag takes it: all, auto or a count.
  const nlohmann::json checkpoint_blocks = o.grad_checkpoint_blocks == TrainOptions::kCheckpointAllBlocks
                                               ? nlohmann::json("all")
                                           : o.grad_checkpoint_blocks == TrainOptions::kCheckpointBlocksAuto
                                               ? nlohmann::json("auto")
                                               : nlohmann::json(o.grad_checkpoint_blocks);
  return {{"weights", o.weights},
          {"config", o.config},
          {"device", o.device},
          {"data_format", to_string(o.data.format)},
          {"chat_template", o.chat_template ? to_string(*o.chat_template) : "from the tokenizer config"},
          {"seq_len", o.data.seq_len},
          {"batch_size", o.data.batch_size},
          {"pack", o.data.pack},
          {"pack_strategy", to_string(o.data.pack_strategy)},
          {"sample_mode", to_string(o.data.sample_mode)},
          {"seed", o.data.seed},
          {"steps", o.steps},
          {"epochs", o.epochs},
          {"lr", o.schedule.lr},
          {"lr_schedule", to_string(o.schedule.kind)},
          {"warmup_steps", o.schedule.warmup_steps},
          {"min_lr", o.schedule.min_lr},
          {"master_dtype", to_string(o.master_dtype)},
          {"compute_dtype", to_string(o.compute_dtype)},
          {"optimizer_state_mode", moment_storage_name(o.adamw.moments)},  // a name (older files: the ordinal)
          {"optimizer_step_chunk_rows", o.adamw.step_chunk_rows},
          {"weight_decay", o.adamw.weight_decay},
          {"grad_clip", o.grad_clip},
          {"grad_checkpoint", o.grad_checkpoint},
          {"grad_checkpoint_blocks", checkpoint_blocks},
          {"fused_optimizer", o.fused_optimizer},
          {"overlap_update", o.overlap_update},
          {"overlap_update_sms", o.overlap_update_sms},
          {"keep_weight_operands", to_string(o.keep_weight_operands)},
          {"grad_accum_steps", o.grad_accum_steps},
          {"train_last_layers", o.train_last_layers},
          {"freeze_embeddings", o.freeze_embeddings},
          {"train_lm_head", o.train_lm_head},
          {"loss", to_string(o.loss)},
          {"scale_mode", nvfp4::scale_mode_name(o.scale_mode)}};
}

LossKind parse_loss_kind(const std::string& name) {
  const LossKind all[] = {LossKind::cross_entropy, LossKind::scalar_l1};
  return enum_from_name(name, all, "--loss");
}

}  // namespace qwen3

namespace qwen3::train_detail {

bool is_trainable(const std::string& key, int64_t layers, const TrainOptions& opt) {
  const bool all = opt.train_last_layers <= 0;
  if (key == "model.embed_tokens.weight") return all && !opt.freeze_embeddings;
  if (key == "lm_head.weight") return all || opt.train_lm_head;  // only untied models have one here
  if (key == "model.norm.weight") return true;  // it sits after every block, so it trains with any of them
  const std::optional<int64_t> layer = layer_of_key(key);
  return all || (layer && *layer >= layers - opt.train_last_layers);
}

at::ScalarType master_scalar_type(MasterDtype dtype) {
  return dtype == MasterDtype::bfloat16 ? at::kBFloat16 : at::kFloat;
}

namespace {
// bf16 dot-product instructions, which oneDNN (x86-64, and aarch64 with the Arm Compute Library) uses for bf16
// products; without them libtorch converts to float and back around each product.
bool cpu_has_bf16_dot_products() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16");
#elif defined(__aarch64__) && defined(__linux__)
  constexpr unsigned long kHwcap2Bf16 = 1ul << 14;  // HWCAP2_BF16 of the kernel's asm/hwcap.h
  return (getauxval(AT_HWCAP2) & kHwcap2Bf16) != 0;
#else
  return false;
#endif
}
}  // namespace

CpuBf16 cpu_bf16() {
  static const CpuBf16 answer = [] {
    try {
      torch::NoGradGuard no_grad;
      // Large enough for libtorch's oneDNN path (small products take the native kernel either way).
      const at::Tensor a = at::ones({64, 64}, at::kBFloat16);
      if (at::mm(a, a).sum().item<float>() != 64.0f * 64 * 64) return CpuBf16::fails;
    } catch (const std::exception&) {
      return CpuBf16::fails;
    }
    return cpu_has_bf16_dot_products() ? CpuBf16::native : CpuBf16::emulated;
  }();
  return answer;
}

namespace {
// The CPU's bf16 capability where a run's dtypes depend on it (bf16 compute asked for, or auto with a bf16
// master, on a CPU), probed only then; elsewhere it does not matter and `native` stands for "not probed".
CpuBf16 cpu_bf16_if_asked(const TrainOptions& o, const c10::Device& device) {
  const bool bf16_on_cpu = !device.is_cuda() && (o.compute_dtype == ComputeDtype::bfloat16 ||
                                                 (o.compute_dtype == ComputeDtype::auto_select &&
                                                  o.master_dtype == MasterDtype::bfloat16));
  return bf16_on_cpu ? cpu_bf16() : CpuBf16::native;
}
}  // namespace

at::ScalarType compute_scalar_type(const TrainOptions& o, const c10::Device& device) {
  return compute_scalar_type(o, device, cpu_bf16_if_asked(o, device));
}

at::ScalarType compute_scalar_type(const TrainOptions& o, const c10::Device& device, CpuBf16 cpu) {
  if (o.compute_dtype == ComputeDtype::float32) return at::kFloat;
  if (o.compute_dtype == ComputeDtype::bfloat16) {
    if (!device.is_cuda() && cpu == CpuBf16::fails)
      throw UsageError("--compute-dtype bfloat16: this libtorch cannot multiply bfloat16 matrices on this CPU "
                       "(its oneDNN has no bf16 product here: Debian's aarch64 libtorch on a CPU with BF16 instructions); "
                       "use --compute-dtype float32 or auto");
    return at::kBFloat16;
  }
  // CUDA: bf16 products on the tensor cores (and the NVFP4 product kernel takes bf16 only). CPU: the master
  // dtype, which measured faster on the small, vocabulary-bound models a CPU trains where the CPU has bf16 dot
  // products (docs/trainer.md), and float32 where it has none (steps are then 6-17x slower in bf16)
  // or where this CPU's libtorch has no bf16 product.
  if (device.is_cuda()) return at::kBFloat16;
  const at::ScalarType master = master_scalar_type(o.master_dtype);
  return master == at::kBFloat16 && cpu != CpuBf16::native ? at::kFloat : master;
}

ComputeDtypeNote compute_dtype_note(const TrainOptions& o, const c10::Device& device) {
  return compute_dtype_note(o, device, cpu_bf16_if_asked(o, device));
}

ComputeDtypeNote compute_dtype_note(const TrainOptions& o, const c10::Device& device, CpuBf16 cpu) {
  if (device.is_cuda() || o.compute_dtype == ComputeDtype::float32) return {};
  if (o.compute_dtype == ComputeDtype::bfloat16)
    return cpu != CpuBf16::emulated
               ? ComputeDtypeNote{}
               : ComputeDtypeNote{"compute bfloat16 on a CPU without bfloat16 dot-product instructions: steps run "
                                  "6-17x slower than in float32 there (docs/trainer.md); --compute-dtype auto or "
                                  "float32 avoids that",
                                  true};
  if (o.master_dtype != MasterDtype::bfloat16 || cpu == CpuBf16::native) return {};
  return {cpu == CpuBf16::fails ? "compute float32 under a bfloat16 master: this CPU's libtorch cannot multiply "
                                  "bfloat16 matrices"
                                : "compute float32 under a bfloat16 master: this CPU has no bfloat16 dot-product "
                                  "instructions, where steps run 6-17x slower in bfloat16 (--compute-dtype "
                                  "bfloat16 still asks for it)",
          false};
}

TrainableSet select_trainable(Qwen3Model& model, const TrainOptions& opt) {
  TrainableSet set;
  const int64_t layers = static_cast<int64_t>(model.blocks.size());
  if (opt.train_last_layers > layers)
    throw UsageError("--train-last-layers " + std::to_string(opt.train_last_layers) + " exceeds the model's " +
                     std::to_string(layers) + " layers");
  if (opt.train_lm_head && !model.has_separate_lm_head())
    throw UsageError("--train-lm-head: this model's head is its embedding (tied), which trains unless "
                     "--freeze-embeddings; drop --train-lm-head");
  for (auto& [key, t] : model.named_weights()) {
    set.total_parameters += t.numel();
    const bool train = is_trainable(key, layers, opt);
    t.requires_grad_(train);
    if (!train) continue;
    set.trainable_parameters += t.numel();
    const bool is_matrix_projection = t.dim() == 2 && key != "model.embed_tokens.weight";
    set.params.push_back({key, t, is_matrix_projection || opt.decay_norms_and_embeddings});
  }
  if (set.params.empty()) throw UsageError("no parameter is trainable with these flags");
  return set;
}

namespace {

class SteProjection final : public ProjectionKernel {
 public:
  SteProjection(nvfp4::ScaleMode mode, bool keep_operand, std::shared_ptr<PersistentOperands> persistent)
      : mode_(mode), keep_operand_(keep_operand), persistent_(std::move(persistent)) {}
  at::Tensor apply(const at::Tensor& x, const at::Tensor& weight) const override {
    if (persistent_)
      if (nvfp4::PersistentOperand* kept = persistent_->find(weight)) return nvfp4::ste_linear_persistent(x, *kept, mode_);
    return nvfp4::ste_linear(x, weight, mode_, keep_operand_);
  }
  // The node without its product: the recompute's last product of a dense block (BlockOutput::differentiated).
  at::Tensor apply_unread(const at::Tensor& x, const at::Tensor& weight) const override {
    if (persistent_)
      if (nvfp4::PersistentOperand* kept = persistent_->find(weight))
        return nvfp4::ste_linear_persistent(x, *kept, mode_, nvfp4::ProductOutput::unread);
    return nvfp4::ste_linear(x, weight, mode_, keep_operand_, nvfp4::ProductOutput::unread);
  }
  // A block's q, k and v (its gate and up) as one node on CUDA: their dX summed by the products themselves. The
  // CPU keeps a node a projection, the reference the GPU test compares the node with.
  bool offers_shared_input(const at::Tensor& x) const override { return x.is_cuda(); }
  std::vector<at::Tensor> apply_shared_input(const std::vector<const Projection*>& group,
                                             const at::Tensor& x) const override {
    std::vector<at::Tensor> weights;
    std::vector<nvfp4::PersistentOperand*> kept;
    for (const Projection* p : group) {
      weights.push_back(p->weight);
      kept.push_back(persistent_ ? persistent_->find(p->weight) : nullptr);
    }
    return nvfp4::ste_linear_shared_input(x, weights, kept, mode_, keep_operand_);
  }
  // A sparse block's experts as one grouped GEMM a projection kind where libtorch has one (CUDA, PyTorch 2.8+);
  // on the CPU one product an expert is as fast and stays the reference.
  bool offers_grouped(const at::Tensor& rows) const override { return nvfp4::native_grouped_product(rows); }
  at::Tensor apply_grouped(const std::vector<const Projection*>& group, const at::Tensor& rows,
                           const RowGroups& groups) const override {
    std::vector<at::Tensor> weights;
    for (const Projection* p : group) weights.push_back(p->weight);
    return nvfp4::ste_grouped_linear(rows, weights, groups.ends, groups.counts, mode_);
  }

 private:
  nvfp4::ScaleMode mode_;
  bool keep_operand_;
  std::shared_ptr<PersistentOperands> persistent_;
};

class FrozenCodesProjection final : public ProjectionKernel {
 public:
  FrozenCodesProjection(nvfp4::Quantized codes, std::shared_ptr<int64_t> products)
      : codes_(std::move(codes)), products_(std::move(products)) {}
  at::Tensor apply(const at::Tensor& x, const at::Tensor&) const override {
    if (products_) ++*products_;
    return nvfp4::frozen_nvfp4_linear(x, codes_);
  }

 private:
  nvfp4::Quantized codes_;
  std::shared_ptr<int64_t> products_;
};

}  // namespace

nvfp4::PersistentOperand* PersistentOperands::find(const at::Tensor& weight) {
  for (nvfp4::PersistentOperand& e : entries)
    if (e.weight.unsafeGetTensorImpl() == weight.unsafeGetTensorImpl()) return &e;
  return nullptr;
}

void PersistentOperands::mark_stale() {
  for (nvfp4::PersistentOperand& e : entries) e.version = -1;
}

std::shared_ptr<PersistentOperands> make_persistent_operands(Qwen3Model& model, int64_t blocks) {
  auto kept = std::make_shared<PersistentOperands>();
  for (size_t l = 0; l < model.blocks.size(); ++l) {
    if (blocks >= 0 && static_cast<int64_t>(l) >= blocks) break;
    Qwen3Block& block = model.blocks[l];
    std::vector<Projection*> projections = {&block.q_proj, &block.k_proj, &block.v_proj, &block.o_proj};
    if (!block.sparse()) projections.insert(projections.end(), {&block.gate_proj, &block.up_proj, &block.down_proj});
    for (Projection* p : projections)
      if (p->weight.defined() && p->weight.requires_grad())
        kept->entries.push_back(
            {p->weight, at::empty(p->weight.sizes(), p->weight.options().dtype(at::kBFloat16)), -1});
  }
  return kept;
}

void use_nvfp4_projections(Qwen3Model& model, nvfp4::ScaleMode mode, bool frozen_as_codes,
                           std::shared_ptr<int64_t> frozen_products, bool keep_operands,
                           std::shared_ptr<PersistentOperands> persistent) {
  const auto ste = std::make_shared<const SteProjection>(mode, keep_operands, std::move(persistent));
  torch::NoGradGuard no_grad;
  for (Projection* p : model.projections()) {
    if (!frozen_as_codes || p->weight.requires_grad()) {
      p->kernel = ste;
      continue;
    }
    p->kernel = std::make_shared<const FrozenCodesProjection>(nvfp4::quantize(p->weight, mode), frozen_products);
    p->weight = at::Tensor();  // the dense copy goes with its last reference
  }
}

at::Tensor compute_loss(Qwen3Model& model, const Batch& batch, LossKind kind) {
  const at::Tensor inputs = batch.input_ids.to(model.device());
  const at::Tensor targets = batch.target_ids.to(model.device());
  // The embedding's gradient goes into its .grad() in place, as the head's does (linear_cross_entropy below):
  // no dense [V, H] gradient and no out-of-place sum of the two for a tied head.
  const bool embedding_trains = at::GradMode::is_enabled() && model.embed_tokens.requires_grad();
  const at::Tensor embeddings = embedding_trains
                                    ? embedding_into_grad(model.embed_tokens, inputs).to(model.compute_dtype())
                                    : model.embed(inputs);
  // Packed rows: positions restart and attention stays within each sample (docs/data.md "Batches").
  const PackedRows packed{batch.position_ids, batch.document_ids};
  const at::Tensor hidden =
      model.hidden_states_from_embeddings(embeddings, nullptr, batch.position_ids.defined() ? &packed : nullptr);
  if (kind == LossKind::cross_entropy)
    return linear_cross_entropy(hidden.reshape({-1, hidden.size(-1)}), model.head_weight(), targets.reshape({-1}),
                                int64_t{1} << 24, /*accumulate_into_weight_grad=*/true);
  // scalar: L1 distance of each position's final hidden state to its target token's embedding.
  const at::Tensor mask = targets.ne(-100);
  const at::Tensor want = at::embedding(model.embed_tokens.detach(), targets.clamp_min(0));
  const at::Tensor per_position = (hidden.to(at::kFloat) - want.to(at::kFloat)).abs().mean(-1);
  return per_position.masked_select(mask).mean();
}

std::string model_hash(const Qwen3Config& config, const DatReader& reader) {
  return stable_hash(config.to_json().dump() + weights_hash(reader));
}

nlohmann::json resume_flags(const TrainOptions& o, int world_size) {
  // What decides the trained state and the data order; the rest (lr, steps, paths, logging) may change. The
  // batch counts as the rows of a step over all ranks and micro-batches: a run of N ranks resumes on M with the
  // same global batch.
  static const char* const kKeys[] = {"master_dtype", "optimizer_state_mode", "train_last_layers", "freeze_embeddings",
                                      "train_lm_head", "loss", "scale_mode", "seed", "seq_len", "pack",
                                      "sample_mode"};
  const nlohmann::json all = to_json(o);
  nlohmann::json flags = nlohmann::json::object();
  for (const char* key : kKeys) flags[key] = all.at(key);
  if (o.data.pack) flags["pack_strategy"] = all.at("pack_strategy");  // the rows' contents (unpacked: no meaning)
  flags["global_batch"] = o.data.batch_size * o.grad_accum_steps * world_size;
  return flags;
}

std::string format_duration(double s) {
  if (!(s >= 0) || s > 1e8) return "?";
  const auto t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

std::string format_count(double n) {
  if (n >= 1e9) return fmt::format("{:.1f}G", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.1f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f}k", n / 1e3);
  return fmt::format("{:.0f}", n);
}

void log_run_setup(const TrainOptions& o, const Qwen3Config& config, const TrainableSet& set, const c10::Device& device,
                   uint64_t optimizer_state_bytes, const TrainingData& data, int64_t steps, int world_size,
                   bool is_main) {
  const DataStats& ds = data.stats();
  // Billions for real models; millions below one, where "0.000 B trainable" read as nothing training.
  const bool billions = set.total_parameters >= 1e9;
  const auto count = [&](double n) {
    return billions ? fmt::format("{:.3f} B", n / 1e9) : fmt::format("{:.2f} M", n / 1e6);
  };
  spdlog::info("model: {} layers, hidden {}, vocab {}; parameters {} trainable of {} ({} tensors)",
               config.num_hidden_layers, config.hidden_size, config.vocab_size,
               count(static_cast<double>(set.trainable_parameters)), count(static_cast<double>(set.total_parameters)),
               set.params.size());
  spdlog::info("device {}{}, master {}, compute {}, moments {:.1f} MiB, scale mode {}, loss {}", device.str(),
               device.is_cpu() ? fmt::format(" ({} threads)", at::get_num_threads()) : std::string(),
               to_string(o.master_dtype), compute_scalar_type(o, device) == at::kFloat ? "float32" : "bfloat16",
               static_cast<double>(optimizer_state_bytes) / 1048576.0, nvfp4::scale_mode_name(o.scale_mode),
               to_string(o.loss));
  if (const ComputeDtypeNote note = compute_dtype_note(o, device); !note.text.empty())
    spdlog::log(note.warn ? spdlog::level::warn : spdlog::level::info, note.text);
  spdlog::info("data: {} samples, {} tokens ({} with loss), {} skipped lines, {} comment lines; {} batches/epoch; "
               "{} steps",
               ds.samples, ds.tokens, ds.loss_tokens, ds.skipped, ds.comments, data.batches_per_epoch(), steps);
  // A step takes what is left of its epoch (steps_per_pass): with fewer batches in an epoch than one step
  // asks for, every step is smaller than the flags say, which the user should not have to infer.
  const int64_t asked = o.grad_accum_steps * world_size;
  if (is_main && asked > data.batches_per_epoch())
    spdlog::warn("--grad-accum-steps {}{}: a step asks for {} batches but an epoch has {}; each step takes the "
                 "epoch's {} (a global batch of {} rows, not {})",
                 o.grad_accum_steps, world_size > 1 ? fmt::format(" over {} ranks", world_size) : "", asked,
                 data.batches_per_epoch(), data.batches_per_epoch(), data.batches_per_epoch() * o.data.batch_size,
                 asked * o.data.batch_size);
}

}  // namespace qwen3::train_detail
