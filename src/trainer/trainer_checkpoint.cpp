#include "trainer_checkpoint.h"

#include <torch/utils.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <set>

namespace qwen3::train_detail {
namespace {

void restore_checkpoint(const CheckpointState& s, TrainableSet& set, AdamW& opt, const std::string& hash,
                        const std::string& sample_hash, const TrainOptions& o, const std::string& path,
                        const nlohmann::json& run, int world_size) {
  if (s.model_hash != hash)
    throw Error(path + ": this checkpoint belongs to another model (config or weight file differ)");
  // Other training data would silently continue another run's data order on other samples. Checkpoints from
  // before run records are not checked.
  const nlohmann::json saved_data = s.extra.value("run", nlohmann::json::object()).value("data", nlohmann::json::object());
  if (saved_data.contains("train") && !o.allow_data_change) {
    const std::string then = saved_data["train"].value("hash", ""), now = run["data"]["train"]["hash"];
    if (then != now)
      throw Error(fmt::format("{}: was trained on other data ({} had content hash {}, {} has {}); pass "
                              "--allow-data-change to resume on it anyway",
                              path, saved_data["train"].value("path", "?"), then, o.data.path, now));
  }
  // Another tokenizer makes other token ids of the same lines (a resume with the wrong --tokenizer continued on
  // another vocabulary without a word). Checkpoints from before 2026-11-28 did not record it.
  const nlohmann::json tokenizer_now = run["data"].value("tokenizer", nlohmann::json::object());
  if (saved_data.contains("tokenizer") && !o.allow_data_change &&
      saved_data["tokenizer"].value("hash", "") != tokenizer_now.value("hash", ""))
    throw Error(fmt::format("{}: was trained with another tokenizer ({} had content hash {}, {} has {}): the same "
                            "data would be other token ids; pass --allow-data-change to resume with it anyway",
                            path, saved_data["tokenizer"].value("path", "?"), saved_data["tokenizer"].value("hash", ""),
                            o.tokenizer, tokenizer_now.value("hash", "")));
  // The layout hash cannot tell two models of one shape apart; the frozen tensors would come from the other
  // one. The sample hash of the stored values (as `export` checks it) can; checkpoints from before it carry
  // only the layout hash and are checked as far as that goes.
  const std::optional<ExportInfo> info = ExportInfo::from_json(s.extra, path + "/checkpoint.json");
  if (info && info->weights_sample_hash && *info->weights_sample_hash != sample_hash)
    throw Error(path + ": was not trained from " + o.weights +
                " (same layout, but the stored values differ from the checkpoint's input)");
  const nlohmann::json now = resume_flags(o, world_size);
  nlohmann::json saved = s.flags;
  // Checkpoints written before the moment storage was stored by name hold its ordinal (float32 0, bfloat16 1,
  // int8 2, nvfp4 3).
  if (saved.contains("optimizer_state_mode") && saved["optimizer_state_mode"].is_number_integer()) {
    const int ordinal = saved["optimizer_state_mode"].get<int>();
    if (ordinal >= 0 && ordinal <= 3) saved["optimizer_state_mode"] = moment_storage_name(static_cast<MomentStorage>(ordinal));
  }
  // Checkpoints from before data parallel stored the batch of one process (and, for a while, its micro-batches).
  if (!saved.contains("global_batch") && saved.contains("batch_size") && saved["batch_size"].is_number_integer())
    saved["global_batch"] = saved["batch_size"].get<int64_t>() * saved.value("grad_accum_steps", int64_t{1});
  // Checkpoints from before --pack-strategy packed every run by cutting the stream.
  if (saved.value("pack", false) && !saved.contains("pack_strategy")) saved["pack_strategy"] = "stream";
  std::string diff;
  for (auto& [k, v] : now.items())
    if (!saved.contains(k) || saved.at(k) != v)
      diff += fmt::format(" {} (checkpoint {}, now {})", k, saved.value(k, nlohmann::json()).dump(), v.dump());
  if (!diff.empty()) throw Error(path + ": flags differ from the checkpoint's:" + diff);
  std::map<std::string, at::Tensor> by_name(s.tensors.begin(), s.tensors.end());
  torch::NoGradGuard no_grad;
  for (auto& p : set.params) {
    auto it = by_name.find(std::string(kMasterWeightPrefix) + p.name);
    if (it == by_name.end()) throw Error(path + ": no master weight for '" + p.name + "'");
    p.param.copy_(it->second);
  }
  std::vector<std::pair<std::string, at::Tensor>> optim;
  for (const auto& [name, t] : s.tensors)
    if (name.rfind(kOptimPrefix, 0) == 0) optim.emplace_back(name.substr(std::strlen(kOptimPrefix)), t);
  if (opt.params().size() < set.params.size()) {  // a rank's share (--shard-optimizer-state): its parameters' state
    std::set<std::string> held;
    for (const auto& [name, t] : opt.state_tensors()) held.insert(name);
    std::vector<std::pair<std::string, at::Tensor>> mine;
    for (auto& named : optim)
      if (held.count(named.first)) mine.push_back(std::move(named));
    optim = std::move(mine);
  }
  opt.load_state_tensors(optim, s.optimizer_steps);
  auto rng = by_name.find(kRngKey);
  if (rng == by_name.end()) throw Error(path + ": no random-number state");
  opt.set_rng_state(rng->second);
}

}  // namespace

CheckpointState make_checkpoint(const TrainableSet& set, const AdamW& opt, int64_t step, int64_t skipped,
                                const std::string& hash, const TrainOptions& o, const ExportInfo& export_info,
                                const nlohmann::json& run, int world_size, const StreamedState* streamed) {
  CheckpointState s;
  s.extra = export_info.to_json();
  s.extra["run"] = run;  // run.json of the run that wrote it
  s.step = step;
  s.optimizer_steps = opt.step_count();
  s.skipped_steps = skipped;
  s.model_hash = hash;
  s.flags = resume_flags(o, world_size);
  for (const auto& p : set.params) s.tensors.emplace_back(std::string(kMasterWeightPrefix) + p.name, p.param.detach());
  if (streamed) {
    const size_t first = s.tensors.size();
    for (const std::string& name : streamed->names) s.tensors.emplace_back(kOptimPrefix + name, at::Tensor());
    s.fetch = [streamed, first](size_t index) { return streamed->fetch(index - first); };
  } else {
    for (auto& [name, t] : opt.state_tensors()) s.tensors.emplace_back(kOptimPrefix + name, t);
  }
  s.tensors.emplace_back(kRngKey, opt.rng_state());
  return s;
}

nlohmann::json changed_since_checkpoint(const nlohmann::json& saved, const nlohmann::json& now) {
  static const std::set<std::string> same_training = {
      "config", "weights", "device", "keep_weight_operands", "overlap_update", "optimizer_step_chunk_rows",
      "grad_checkpoint", "grad_checkpoint_blocks"};
  // The run's length (--steps, or --epochs over the same data) changes what is trained only where the schedule
  // is drawn over it: a cosine or linear decay over another length gives every later step another learning rate.
  static const std::set<std::string> run_length = {"steps", "epochs"};
  const nlohmann::json then = saved.value("options", nlohmann::json::object());
  const nlohmann::json current = now.value("options", nlohmann::json::object());
  nlohmann::json changed = nlohmann::json::object();
  if (!then.is_object() || !current.is_object()) return changed;  // checkpoints from before run records
  const bool length_shapes_lr = current.value("lr_schedule", std::string("constant")) != "constant";
  for (const auto& [key, value] : current.items()) {
    if (same_training.count(key) || (run_length.count(key) && !length_shapes_lr)) continue;
    if (then.contains(key) && then.at(key) != value) changed[key] = {{"checkpoint", then.at(key)}, {"now", value}};
  }
  // From run.json's data records: other --eval-data (another file, or none before), whose eval loss measures other
  // samples, named by content hash ("" for none); and the template that rendered the pairs and records however it
  // was chosen (a tokenizer_config.json replaced beside the tokenizer changed every sample's ids with no flag
  // changed; recorded since 2026-11-28).
  const nlohmann::json none = nlohmann::json::object();
  const nlohmann::json& data_then = saved.contains("data") ? saved["data"] : none;
  const nlohmann::json& data_now = now.contains("data") ? now["data"] : none;
  const std::string eval_then = data_then.value("eval", none).value("hash", ""),
                    eval_now = data_now.value("eval", none).value("hash", "");
  if (saved.contains("data") && eval_then != eval_now)
    changed["eval_data_content"] = {{"checkpoint", eval_then}, {"now", eval_now}};
  const std::string template_then = data_then.value("chat_template", ""),
                    template_now = data_now.value("chat_template", "");
  if (!template_then.empty() && template_then != template_now)
    changed["chat_template_rendered"] = {{"checkpoint", template_then}, {"now", template_now}};
  return changed;
}

ResumePoint restore_newest(const TrainOptions& o, TrainableSet& set, AdamW& opt, const std::string& hash,
                           const std::string& sample_hash, const nlohmann::json& run, int world_size) {
  if (o.checkpoint_dir.empty()) throw UsageError("--resume needs --checkpoint-dir");
  const std::vector<std::string> paths = complete_checkpoint_paths(o.checkpoint_dir);
  for (auto it = paths.rbegin(); it != paths.rend(); ++it) {
    CheckpointState s;
    try {
      s = load_checkpoint(*it);
    } catch (const CheckpointDamaged& e) {  // changed since it was written: never resumed from, as a poisoned one
      spdlog::warn("--resume: {}; trying an older checkpoint", e.what());
      continue;
    }
    if (const auto bad = first_nonfinite_tensor(s)) {
      spdlog::warn("--resume: {} holds non-finite values ('{}'); trying an older checkpoint", *it, *bad);
      continue;
    }
    restore_checkpoint(s, set, opt, hash, sample_hash, o, *it, run, world_size);
    spdlog::info("resumed from {} at step {}", *it, s.step);
    return ResumePoint{s.step, s.skipped_steps, *it,
                       changed_since_checkpoint(s.extra.value("run", nlohmann::json::object()), run)};
  }
  if (!paths.empty())
    throw Error("--resume: every checkpoint in " + o.checkpoint_dir +
                " holds non-finite values or changed since it was written (above); nothing to resume");
  if (!o.resume_if_present) {
    const bool is_a_step = std::filesystem::path(o.checkpoint_dir).filename().string().rfind("step-", 0) == 0;
    throw Error("--resume: no checkpoint in " + o.checkpoint_dir +
                (is_a_step ? " (that is a checkpoint itself: give its parent folder)" : "") +
                "; --resume-if-present starts from the weights when there is none");
  }
  spdlog::warn("--resume-if-present: no checkpoint in {}; starting from the weights", o.checkpoint_dir);
  return {};
}

void CheckpointSaver::save(int64_t step, int64_t skipped, const StreamedState* streamed, bool write) {
  if (o_.checkpoint_dir.empty()) return;
  if (step == step_on_disk_) {
    if (write) spdlog::info("checkpoint: step {} is saved already ({})", step, last_);
    return;
  }
  if (!write) {
    for (size_t k = 0; streamed && k < streamed->names.size(); ++k) streamed->fetch(k);
    step_on_disk_ = step;
    return;
  }
  CheckpointState state =
      make_checkpoint(set_, opt_, step, skipped, hash_, o_, export_info_, run_, world_size_, streamed);
  const auto refuse = [&](const std::string& bad) {
    return Error(fmt::format("refusing to save step {}: '{}' holds non-finite values (the training diverged); {}",
                             step, bad, last_.empty() ? "no earlier checkpoint" : "the last good one is " + last_));
  };
  if (const auto bad = first_nonfinite_tensor(state)) throw refuse(*bad);
  if (state.fetch)
    state.fetch = [fetch = state.fetch, &state, &refuse](size_t index) {
      at::Tensor t = fetch(index);
      if (t.is_floating_point() && !at::isfinite(t).all().item<bool>()) throw refuse(state.tensors[index].first);
      return t;
    };
  last_ = save_checkpoint(o_.checkpoint_dir, state, static_cast<int>(o_.keep_checkpoints));
  step_on_disk_ = step;
  ++saved_;
  spdlog::info("checkpoint: {}", last_);
}

}  // namespace qwen3::train_detail
