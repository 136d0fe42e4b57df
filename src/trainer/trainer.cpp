#include "qwen3/base/file_io.h"
#include "qwen3/base/remove_tree.h"
#include "qwen3/trainer/trainer.h"

#include <ATen/ATen.h>
#include <torch/utils.h>
#include <torch/version.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <ctime>
#include <cstring>
#include <map>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>

#include "qwen3/checkpoint/checkpoint.h"
#include "qwen3/dat/dat_tensor.h"
#include "qwen3/dat/durable_file.h"
#include "qwen3/dist/data_parallel.h"
#include "qwen3/trainer/evaluate.h"
#include "rank_agreement.h"
#include "qwen3/export/output_target.h"
#include "qwen3/export/exporter.h"
#include "qwen3/trainer/memory_model.h"
#include "qwen3/trainer/step_prediction.h"
#include "qwen3/memory/memory_probe.h"
#include "qwen3/model/model_loader.h"
#include "qwen3/nvfp4/nvfp4_linear.h"
#include "qwen3/nvfp4/nvfp4_ops.h"
#include "qwen3/trainer/step_time_model.h"
#include "product_sm_carveout.h"
#include "step_update.h"
#include "memory_report.h"
#include "optimizer_shards.h"
#include "step_profiler.h"
#include "step_record.h"
#include "tensorboard_writer.h"
#include "train_model.h"
#include "train_setup.h"
#include "trainer_checkpoint.h"

namespace qwen3 {
namespace {

using namespace train_detail;
using Clock = std::chrono::steady_clock;

// Optimizer steps in one pass over the data: its batches, grad_accum_steps of them per rank a step (the last
// step of an epoch takes what is left).
int64_t steps_per_pass(const TrainOptions& o, const TrainingData& data, int world_size) {
  const int64_t per_step = o.grad_accum_steps * world_size;
  return (data.batches_per_epoch() + per_step - 1) / per_step;
}

int64_t total_steps(const TrainOptions& o, const TrainingData& data, int world_size) {
  if (o.steps > 0) return o.steps;
  const int64_t per_epoch = o.steps_per_epoch > 0 ? o.steps_per_epoch : steps_per_pass(o, data, world_size);
  return std::max<int64_t>(1, o.epochs) * per_epoch;
}

}  // namespace

namespace {

// One run, in torchtitan's shape: the constructor sets up (checkpoint lock, files, data, model, optimizer,
// resume), train() loops over train_step() and record(), finish() saves and exports. The model knows nothing of
// the run; the step's update order is a StepUpdate.
class Trainer {
 public:
  explicit Trainer(const TrainOptions& o)
      : o_(o),
        t_start_(Clock::now()),
        device_(device_for_rank(o.device, dist_env_from_environment())),
        dp_(dist_env_from_environment(), o.dist_init, std::chrono::milliseconds(o.dist_timeout_s * 1000), device_) {
    // Rank 0 writes (checkpoints, metrics, run files, the export, the report) and logs; the others warn only.
    if (!dp_.is_main()) spdlog::set_level(spdlog::level::warn);
    if (dp_.world_size() > 1)
      spdlog::info("data parallel: {} ranks ({}, {}), this is rank {} on {}", dp_.world_size(), dp_.env().launcher,
                   dp_.backend(), dp_.rank(), device_.str());
    if (!o.vram_report.empty() && dp_.is_main()) {
      prepare_output_folder("--vram-report", o.vram_report);  // e.g. inside the --checkpoint-dir not made yet
      report_.emplace(o.vram_report, device_, to_json(o));
    }
    phase("start");
    take_slow_paths();  // what an earlier run in this process left is not this run's (warn_of_slow_paths)
    // One trainer per checkpoint directory, checked (and the directory made) before anything loads.
    if (!o.checkpoint_dir.empty() && dp_.is_main()) checkpoint_lock_.emplace(o.checkpoint_dir);
    if (!o.metrics_jsonl.empty() && dp_.is_main()) prepare_output_folder("--metrics-jsonl", o.metrics_jsonl);
    config_ = load_config(o.config);
    tok_.emplace(load_tokenizer(TokenizerSource{o.tokenizer, o.tokenizer_config, o.chat_template}));
    tok_->check_fits_model(config_.vocab_size, o.config);
    if (config_.max_position_embeddings > 0 && o.data.seq_len > config_.max_position_embeddings)
      throw UsageError(fmt::format("--seq-len {} is beyond the model's max_position_embeddings {} ({})",
                                   o.data.seq_len, config_.max_position_embeddings, o.config));
    data_.emplace(*tok_, o.data);
    if (!o.eval_data.empty()) {
      DataOptions eo = o.data;
      eo.path = o.eval_data;
      eo.sample_mode = SampleMode::sequential;
      eo.pack = false;  // each held-out sample on its own context, as `eval --data` scores it
      eo.role = "eval data (--eval-data)";
      eval_data_.emplace(*tok_, eo);
    }
    reader_.emplace(o.weights);
    hash_ = model_hash(config_, *reader_);
    run_ = run_record(o);
    check_ranks_agree(o, dp_, hash_, *reader_, run_);
    DenseFileType dense;
    if (const DatEntry* e = reader_->find("model.embed_tokens.weight"))
      dense = {static_cast<int>(elem_size(e->type)), scalar_type_of(e->type) == master_scalar_type(o.master_dtype)};
    // What the models count (one rank's share) and the model is set up with: --grad-checkpoint-blocks auto and
    // --keep-weight-operands auto decided once, by the prediction of the step as the models count it (which the
    // one-step report shows beside the measurement).
    check_weight_operands(o, device_, dp_.world_size(), config_);
    TrainOptions per_rank = o;
    per_rank.predict_world_size = dp_.world_size();
    const StepPrediction prediction = predict(per_rank, config_, device_, dense);
    if (o.grad_checkpoint) spdlog::info("activation checkpointing: {}", prediction.checkpoint.why);
    per_rank.grad_checkpoint_blocks = prediction.checkpoint.decided;
    run_["recomputed_blocks"] = train_detail::recomputed_block_count(per_rank, config_.num_hidden_layers);
    const WeightOperandsChoice& operands = prediction.operands;
    if (device_.is_cuda()) spdlog::info("trained projections' product operands for backward: {}", operands.why);
    if (!operands.warning.empty()) spdlog::warn("{}", operands.warning);
    run_["weight_operands"] = operands.written_by_update() ? "kept across steps"
                              : operands.persistent()      ? "kept through the recompute"
                              : operands.keep()            ? "kept"
                                                           : "codes";
    model_ = setup_model(per_rank, config_, *reader_, device_, operands);
    set_up_mfu(o);
    if (report_) {
      report_->set_plan(prediction.memory);
      report_->set_time_plan(prediction.time);
      // Packed rows: the first batch says what the flash node's attention costs, each sample alone, which the
      // report's time prediction then counts (predict_step_time's attention_square) in place of whole rows.
      TrainOptions timed = per_rank;
      timed.keep_weight_operands = operands.decided;
      time_with_attention_ = [this, timed, rates = prediction.rates](double attention_square) {
        return predict_step_time(config_, !config_.tie_word_embeddings, timed, rates, attention_square);
      };
    }
    phase("model_loaded");
    opt_.emplace(optimizer_params(o), o.adamw);
    // --overlap-update: the updates on a CUDA stream of their own; data parallel already overlaps each block's
    // update with the next block's sum, and orders them on the reduction's stream.
    if (o.overlap_update && !device_.is_cuda())
      throw UsageError("train: --overlap-update runs the updates on a CUDA stream: it needs --device cuda");
    if (o.overlap_update && dp_.world_size() > 1)
      throw UsageError("train: --overlap-update is for one process (data parallel overlaps each block's update "
                       "with the next block's gradient sum already)");
    if (o.overlap_update_sms > 0) check_product_sm_carveout(o.overlap_update_sms, device_);
    if (o.fused_optimizer)
      update_ = std::make_unique<FusedUpdate>(o, model_.set, *opt_, device_, *model_.runner, dp_, owners_);
    else
      update_ = std::make_unique<PlainUpdate>(o, model_.set, *opt_, device_, *model_.runner, dp_, owners_);
    if (config_.is_moe() && config_.output_router_logits && config_.router_aux_loss_coef > 0) {
      router_balance_.emplace(config_.num_hidden_layers, config_.num_experts, config_.num_experts_per_tok,
                              config_.router_aux_loss_coef);
      update_->set_router_balance(&*router_balance_);
      spdlog::info("load-balancing loss: trained with coefficient {} (the config's output_router_logits)",
                   config_.router_aux_loss_coef);
    }
    phase("optimizer_state_ready");

    steps_ = total_steps(o, *data_, dp_.world_size());
    run_["total_steps"] = steps_;  // an --epochs run's length, for the same command after it finished (train_flags)
    if (o.epochs > 0 && o.schedule.warmup_steps > steps_)  // with --steps the CLI checked it before loading
      throw UsageError(fmt::format("--warmup-steps {} exceeds the {} steps of --epochs {}: the learning rate would "
                                   "never reach --lr",
                                   o.schedule.warmup_steps, steps_, o.epochs));
    schedule_ = o.schedule;
    schedule_.total_steps = steps_;
    per_epoch_ = o.steps_per_epoch > 0 ? o.steps_per_epoch : steps_per_pass(o, *data_, dp_.world_size());
    std::string resumed_from;
    if (o.resume) {
      const ResumePoint at =
          restore_newest(o, model_.set, *opt_, hash_, weights_sample_hash(*reader_), run_, dp_.world_size());
      step_ = at.step;
      skipped_ = at.skipped;
      resumed_from = at.path;
      // Allowed, never silent: said now and kept in run.json, so the run's record says what changed where.
      if (!at.changed.empty()) {
        std::vector<std::string> said;
        for (const auto& [key, c] : at.changed.items())
          said.push_back(fmt::format("{} {} -> {}", key, c["checkpoint"].dump(), c["now"].dump()));
        spdlog::warn("--resume: options changed since the checkpoint's run: {}", fmt::join(said, ", "));
        run_["changed_on_resume"] = at.changed;
      }
    }
    // The CLI let an existing --output-dat stand as a finished run's export; a resume that trains (its newest
    // checkpoint was passed over for an older one) would replace it, so it is refused as any existing one is.
    if (o.output_dat_of_finished_run && step_ < steps_)
      prepare_output_target("--output-dat", o.output_dat, /*overwrite=*/false, {}, {});  // throws: it exists
    check_ranks_resume_together(dp_, step_);
    if (o.profile_step > steps_)
      throw UsageError(fmt::format("--profile-step {} is beyond the run's {} steps", o.profile_step, steps_));
    if (o.profile_step > 0 && o.profile_step <= step_)
      spdlog::warn("--profile-step {}: the run resumes after it (at step {}); nothing is profiled", o.profile_step,
                   step_);
    log_run_setup(o, config_, model_.set, device_, opt_->state_bytes(), *data_, steps_, dp_.world_size(),
                  dp_.is_main());
    // --overwrite: the previous run's files go now, when this run has loaded and before it writes anything.
    if (dp_.is_main())
      for (const std::string& path : o.replace_previous_run) {
        std::error_code ec;
        remove_tree(path, ec);
        if (ec) throw Error("--overwrite: cannot remove the previous run's " + path + " (" + ec.message() + ")");
        spdlog::info("--overwrite: removed the previous run's {}", path);
      }
    // A resume continues the run's records from its checkpoint: what a stopped run logged past it is of steps
    // this run takes again (bit for bit on CPU), and would show each of them twice.
    if (!o.metrics_jsonl.empty() && dp_.is_main()) {
      if (o.resume)
        if (const int64_t dropped = drop_metrics_after(o.metrics_jsonl, step_); dropped > 0)
          spdlog::info("--resume: removed {} line(s) after step {} from {} (the stopped run's steps past its "
                       "checkpoint, trained again now)", dropped, step_, o.metrics_jsonl);
      metrics_ = open_output_file(o.metrics_jsonl, "--metrics-jsonl", std::ios::app);
    }
    if (!o.tensorboard_dir.empty() && dp_.is_main()) {
      tensorboard_.emplace(o.tensorboard_dir);
      spdlog::info("TensorBoard events: {}", tensorboard_->path());
      if (o.resume)
        tensorboard_->add_session_start(step_ + 1, std::chrono::duration<double>(
                                                       std::chrono::system_clock::now().time_since_epoch()).count());
    }
    // What `qwen3-train export` needs to rebuild a .dat from a checkpoint without the training flags.
    ExportInfo export_info;
    export_info.weights_hash = weights_hash(*reader_);
    export_info.weights_sample_hash = weights_sample_hash(*reader_);
    export_info.tied_head = !model_.model->has_separate_lm_head();
    export_info.scale_mode = o.scale_mode;
    export_info.config = config_.to_json();
    saver_.emplace(o, model_.set, *opt_, hash_, std::move(export_info), run_, dp_.world_size(), resumed_from, step_);
    run_["resumed_from"] = resumed_from.empty() ? nlohmann::json(nullptr) : nlohmann::json(resumed_from);
    // run.toml: the flags again, as the --config-file that repeats the run.
    const std::string toml = run_.value("config_file", std::string());
    for (const std::string& dir : {o.checkpoint_dir, o.output_dir}) {
      if (dir.empty() || !dp_.is_main()) continue;
      write_file_durably((std::filesystem::path(dir) / "run.json").string(), run_.dump(2) + "\n");
      if (!toml.empty()) write_file_durably((std::filesystem::path(dir) / "run.toml").string(), toml);
    }
  }

  TrainSummary train(StopRequest* stop, const AfterStep& after_step) {
    spdlog::info("setup took {:.1f} s", std::chrono::duration<double>(Clock::now() - t_start_).count());
    // Within a step only one process may stop early: ranks leave a step together (the check after it).
    const bool alone = dp_.world_size() == 1;
    stop_now_ = [stop, alone]() { return alone && stop != nullptr && stop->signal.load() != 0; };
    update_->set_stop_check(stop_now_);
    struct InSteps {  // the handler's mode: stop at the next whole state (here) or end the process (outside)
      StopRequest* stop;
      explicit InSteps(StopRequest* s) : stop(s) { if (stop) stop->in_steps.store(true); }
      ~InSteps() { if (stop) stop->in_steps.store(false); }
    } in_steps(stop);
    warn_of_slow_paths(0);  // the set-up's
    for (; step_ < steps_; ++step_) {
      StepRecord record;
      try {
        record = train_step();
      } catch (const StepAbandoned& a) {
        for (auto& p : model_.set.params)  // the unfinished step's partial gradients go with it
          if (p.param.grad().defined()) at::Tensor(p.param).mutable_grad().reset();
        sum_.stop_signal = stop->signal.load();
        spdlog::warn("signal {}: step {} stopped after {} of its {} micro-batches, before its update (resuming runs it "
                     "again); stopping at step {}",
                     sum_.stop_signal, step_ + 1, a.micro_batches_done, a.micro_batches, step_);
        break;
      }
      if (o_.log_every > 0 && (record.step % o_.log_every == 0 || record.step == steps_))
        log_progress(record, total_ms_ / sum_.steps_done * static_cast<double>(steps_ - record.step) / 1000.0);
      if (metrics_.is_open()) write_metrics(record, metrics_, o_.metrics_jsonl);
      if (tensorboard_) write_tensorboard(record, *tensorboard_);
      warn_of_slow_paths(record.step);
      if (skipped_ > o_.max_skipped_steps) {
        save(step_ + 1);
        throw Error(fmt::format("{} steps skipped for non-finite values (limit --max-skipped-steps {}); {}", skipped_,
                                o_.max_skipped_steps, saver_->last().empty() ? "no checkpoint directory given"
                                                                            : "state saved to " + saver_->last()));
      }
      if (o_.save_every_steps > 0 && record.step % o_.save_every_steps == 0 && record.step < steps_) save(record.step);
      if (after_step) after_step(record.step);
      // Data parallel: the ranks stop after the same step (a signal reaches them at different moments), or the
      // first to stop would leave the others waiting in the next collective.
      int signal = stop ? stop->signal.load() : 0;
      if (dp_.world_size() > 1) {
        const std::vector<int64_t> signals = dp_.all_gather(signal, "stop signal");
        signal = static_cast<int>(*std::max_element(signals.begin(), signals.end()));
      }
      if (signal != 0) {
        sum_.stop_signal = signal;
        spdlog::warn("signal {}: stopping after step {}", sum_.stop_signal, record.step);
        ++step_;
        break;
      }
    }
    return finish();
  }

 private:
  // One step: its batch, forward + backward + update, the eval when due; what the record needs.
  StepRecord train_step() {
    std::optional<StepProfiler> profiler;  // --profile-step: this step, on the rank that writes
    if (o_.profile_step == step_ + 1 && dp_.is_main()) profiler.emplace(o_.profile_out, device_);
    if (profiler) profiler->start();
    const auto t0 = Clock::now();
    const double waited_before = dp_.wait_seconds();
    // The step's micro-batches: batches [k·N·W, (k+1)·N·W) of its epoch for the step's index k in it (N =
    // grad_accum_steps, W = ranks), rank r taking micro-batch j as batch k·N·W + j·W + r; so the rows of a step
    // are those of one rank with W times the batch, whatever W is. Wraps within the epoch when
    // --steps-per-epoch asks for more than the data holds. A rank whose batch lies past the epoch's end (the
    // tail of an epoch) runs a stand-in weighted 0, so every rank takes part in every collective.
    const int64_t epoch = step_ / per_epoch_;
    const int64_t world = dp_.world_size();
    const int64_t per_pass = steps_per_pass(o_, *data_, static_cast<int>(world));
    const int64_t first = ((step_ % per_epoch_) % per_pass) * o_.grad_accum_steps * world;
    const int64_t batches_in_epoch = data_->batches_per_epoch();
    std::vector<Batch> batches;
    std::vector<at::Tensor> counts = {at::zeros({2}, at::kLong)};  // the step's loss tokens and tokens
    auto count = counts[0].accessor<int64_t, 1>();
    for (int64_t j = 0; j < o_.grad_accum_steps; ++j) {
      if (j > 0 && stop_now_()) throw StepAbandoned{0, o_.grad_accum_steps};  // a long accumulation's batches
      const int64_t index = first + j * world + dp_.rank();
      if (index < batches_in_epoch) {
        batches.push_back(data_->batch(epoch, index));
        count[0] += batches.back().loss_tokens;
        count[1] += batches.back().tokens;
      } else if (world > 1 && j == 0) {
        batches.push_back(data_->batch(epoch, 0));
        batches.back().loss_tokens = 0;
      }
    }
    dp_.all_reduce_sum(counts, "step's token counts");  // one collective for both, over the ranks
    const int64_t step_loss_tokens = count[0], step_tokens = count[1];
    const bool first_step = sum_.steps_done == 0;
    const PhaseMark mark = [this, first_step, &profiler](const char* name) {
      if (first_step) phase(name);
      if (profiler) profiler->mark(name);
    };
    mark("batch_ready");
    const double lr = schedule_.at(step_);
    const StepOutcome out = update_->forward_backward_update(*model_.model, batches, step_loss_tokens, lr, mark);
    // Operands made by this step's first forward describe the weights before its update (a raw write that leaves
    // their versions alone): the next forward makes them again, whether or not the step was applied.
    if (model_.operands_remade_each_step) model_.persistent_operands->mark_stale();
    mark("optimizer_step_done");
    if (profiler) profiler->finish(step_ + 1);
    if (first_step && report_) {
      const Batch& first = batches.front();  // the models' step is one micro-batch
      if (first.document_ids.defined() && time_with_attention_)
        report_->set_time_plan(time_with_attention_(packed_attention_square(first.document_ids.cpu())));
      report_->finish();
      report_.reset();  // stops its sampling thread
    }
    if (out.bad) {
      ++skipped_;
      const bool loss_finite = std::isfinite(out.loss);
      spdlog::warn("step {}: non-finite {} ({}); {} ({} so far)", step_ + 1, loss_finite ? "gradient" : "loss",
                   loss_finite ? out.norm : out.loss,
                   o_.fused_optimizer && loss_finite ? "the groups with finite gradients were applied" : "step skipped",
                   skipped_);
    }
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    total_ms_ += ms;
    total_tokens_ += step_tokens;
    ++sum_.steps_done;
    if (sum_.steps_done == 1) sum_.first_loss = out.loss;
    sum_.last_loss = out.loss;
    std::optional<double> eval_loss;
    // Every --eval-every steps, and after the last step in any case: --eval-data alone scores once there, and an
    // interval longer than the run (--eval-every 500 of a 200-step run) scored nothing, silently.
    const bool eval_now = (o_.eval_every > 0 && (step_ + 1) % o_.eval_every == 0) || step_ + 1 == steps_;
    if (eval_data_ && eval_now) {  // data parallel: each rank scores its share of the batches, summed over ranks
      const Evaluation e = evaluate(*model_.model, *eval_data_, dp_.rank(), dp_.world_size(), stop_now_);
      // The sum and the token count in one collective (a count is exact in a double up to 2^53).
      std::vector<at::Tensor> totals = {at::tensor({e.loss_sum, static_cast<double>(e.loss_tokens)}, at::kDouble)};
      dp_.all_reduce_sum(totals, "eval loss and token count");
      const double sum = totals[0][0].item<double>(), tokens = totals[0][1].item<double>();
      if (e.stopped)  // the step is whole (its update applied); the loop stops after it
        spdlog::warn("evaluation after step {} stopped by a signal: no eval loss for it", step_ + 1);
      else
        eval_loss = tokens > 0 ? sum / tokens : 0.0;
    }
    StepRecord record;
    record.step = step_ + 1;
    record.steps = steps_;
    record.outcome = out;
    record.lr = lr;
    record.ms = ms;
    record.tokens = step_tokens;
    record.eval_loss = eval_loss;
    record.epoch = static_cast<double>(step_ + 1) / static_cast<double>(per_epoch_);
    if (dp_.world_size() > 1) record.comm_wait_ms = (dp_.wait_seconds() - waited_before) * 1000.0;
    record.tflops = flops_per_token_ * static_cast<double>(step_tokens) / (ms / 1000.0) * 1e-12;
    if (peak_flops_ > 0) record.mfu = record.tflops * 1e12 / peak_flops_;
    if (const auto peak = take_device_peak_bytes(device_)) record.peak_mem_mib = static_cast<double>(*peak) / (1 << 20);
    record.rss_mib = static_cast<double>(process_rss_bytes()) / (1 << 20);
    return record;
  }

  void save(int64_t step) {
    if (owners_.empty()) {
      if (dp_.is_main()) saver_->save(step, skipped_);
      return;
    }
    // A shared-out state reaches rank 0's writer tensor by tensor (every rank takes part in each), so the
    // checkpoint is the one a single process writes, whatever the world size, and no rank holds all of it.
    const StreamedState state = stream_optimizer_state(model_.set.params, owners_, *opt_, o_.adamw, dp_);
    saver_->save(step, skipped_, &state, dp_.is_main());
  }

  // The optimizer's parameters: all of them, or with --shard-optimizer-state this rank's share. Every parameter
  // keeps its position in the whole list as its random stream, so the updates are the unshared ones.
  std::vector<OptimParam> optimizer_params(const TrainOptions& o) {
    const auto& all = model_.set.params;
    const bool shard = o.shard_optimizer_state && dp_.world_size() > 1;
    if (shard) {
      owners_ = assign_state_owners(all, dp_.world_size());
      int64_t held = 0;
      for (size_t i = 0; i < all.size(); ++i) held += owners_[i] == dp_.rank() ? all[i].param.numel() : 0;
      spdlog::info("optimizer state shared out: this rank holds {} of {} parameters' state ({} elements)",
                   std::count(owners_.begin(), owners_.end(), dp_.rank()), all.size(), held);
    }
    std::vector<OptimParam> mine;
    for (size_t i = 0; i < all.size(); ++i) {
      if (shard && owners_[i] != dp_.rank()) continue;
      OptimParam p = all[i];
      p.stream_index = static_cast<int64_t>(i);
      mine.push_back(std::move(p));
    }
    hand_operands_to_update(model_, o.scale_mode, device_, mine);
    return mine;
  }

  // run.json: what the caller knows (tool, git hash, command line, every flag), the options by name, the
  // versions, the device, and the data's identity.
  nlohmann::json run_record(const TrainOptions& o) const {
    nlohmann::json r = o.run_info.is_object() ? o.run_info : nlohmann::json::object();
    r["options"] = to_json(o);
    r["libtorch"] = TORCH_VERSION;
    r["device"] = device_.str();
    r["started"] = utc_timestamp();
    const auto describe = [](const std::string& path) {
      return nlohmann::json{{"path", path}, {"bytes", std::filesystem::file_size(path)}, {"hash", file_content_hash(path)}};
    };
    r["data"] = {{"train", describe(o.data.path)}};
    if (!o.eval_data.empty()) r["data"]["eval"] = describe(o.eval_data);
    // The same lines under another tokenizer are other token ids: part of what the run trains on. So is the
    // template that renders pairs and records (text lines use none), whatever flag or file chose it.
    if (!o.tokenizer.empty()) r["data"]["tokenizer"] = describe(o.tokenizer);
    if (data_ && renders_chat(data_->format())) r["data"]["chat_template"] = to_string(tok_->chat_template());
    r["model"] = {{"weights", o.weights}, {"config", o.config}, {"layout_hash", hash_}};
    return r;
  }

  // Achieved model FLOP/s on every device (model_flops_per_token: no recompute, whatever trains); MFU on CUDA,
  // against the bf16 peak of --mfu-device (default: the GPU it runs on). A CPU has no peak worth the name.
  void set_up_mfu(const TrainOptions& o) {
    flops_per_token_ = model_flops_per_token(config_, o.data.seq_len);
    if (!device_.is_cuda()) return;
    peak_flops_ = device_rates(o.mfu_device.empty() ? default_rates_name(device_) : o.mfu_device).bf16_tflops * 1e12;
  }

  TrainSummary finish() {
    check_replicas_identical(model_.set, dp_, step_);
    save(step_);
    sum_.final_step = step_;
    sum_.run_steps = steps_;
    sum_.skipped_steps = skipped_;
    sum_.mean_step_ms = sum_.steps_done ? total_ms_ / sum_.steps_done : 0;
    sum_.tokens_per_second = total_ms_ > 0 ? total_tokens_ / (total_ms_ / 1000.0) : 0;
    sum_.last_checkpoint = saver_->last();
    sum_.checkpoints_saved = saver_->saved();
    if (o_.output_dat_of_finished_run && sum_.steps_done == 0) {
      // Said as what is known: nothing trained, the file was there (normally the run's own export).
      spdlog::info("nothing trained: --output-dat {}, there already, is left as it is", o_.output_dat);
    } else if (!o_.output_dat.empty() && sum_.stop_signal == 0 && dp_.is_main()) {
      export_trained(o_, model_.set, *model_.model, *reader_);
      sum_.exported = o_.output_dat;
    }
    sum_.recomputed_blocks = model_.runner->recomputed_blocks();
    sum_.frozen_code_products = *model_.frozen_code_products;
    warn_of_slow_paths(step_);  // the last save's and the export's
    return sum_;
  }

  // A GPU step that took a slower path than it is built for says so, once a path a run (what, why); the
  // summary keeps the run's counts.
  void warn_of_slow_paths(int64_t step) {
    for (const std::string& line : slow_path_warnings(step, take_slow_paths(), sum_.slow_paths))
      spdlog::warn("{}", line);
  }

  void phase(const char* name) {
    if (report_) report_->phase(name);
  }

  const TrainOptions& o_;
  Clock::time_point t_start_;
  c10::Device device_;
  std::optional<StepMemoryReport> report_;
  std::function<StepTimePlan(double)> time_with_attention_;  // the report's time prediction for a packed batch
  std::optional<CheckpointDirLock> checkpoint_lock_;
  Qwen3Config config_;
  std::optional<Tokenizer> tok_;
  std::optional<TrainingData> data_, eval_data_;
  std::optional<DatReader> reader_;
  std::string hash_;
  TrainModel model_;
  std::optional<AdamW> opt_;
  std::unique_ptr<StepUpdate> update_;
  // transformers' load-balancing loss, trained when the config asks for it as transformers does
  // (output_router_logits with a coefficient above 0; Qwen3-30B-A3B's config.json says false): router_balance.h.
  std::optional<RouterBalanceLoss> router_balance_;
  int64_t steps_ = 0, per_epoch_ = 1, step_ = 0, skipped_ = 0;
  DataParallel dp_;
  std::vector<int> owners_;  // --shard-optimizer-state: the rank holding each parameter's state; else empty
  nlohmann::json run_;
  double flops_per_token_ = 0, peak_flops_ = 0;
  LrSchedule schedule_;
  std::ofstream metrics_;
  std::optional<TensorBoardWriter> tensorboard_;
  std::optional<CheckpointSaver> saver_;
  TrainSummary sum_;
  double total_ms_ = 0, total_tokens_ = 0;
  std::function<bool()> stop_now_ = [] { return false; };  // a stop requested, in one process (train())
};

}  // namespace

TrainSummary run_training(const TrainOptions& o, StopRequest* stop, const AfterStep& after_step) {
  return Trainer(o).train(stop, after_step);
}

}  // namespace qwen3
