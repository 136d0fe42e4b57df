// The flags `train` and `vram-report` share, and what they resolve to (train_flags.h).
#include "train_flags.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

#include "qwen3/base/error.h"
#include "qwen3/base/file_io.h"
#include "qwen3/checkpoint/checkpoint.h"
#include "qwen3/trainer/step_time_model.h"
#include "qwen3/export/output_target.h"
#include "qwen3/model/model_loader.h"
#include "qwen3/model/synth.h"
#include "qwen3/trainer/trainer.h"
#include "runtime_options.h"

namespace qwen3::cli {
namespace {

// The original's `--synthetic true`: train on random weights of the config's shape (the tiny preset without
// --config), written once with `synth` into the checkpoint directory (or a temporary one) and reused on resume
// (synthetic_training_model: only while they are of this config and seed).
void make_synthetic_weights(TrainFlags& f) {
  TrainOptions& o = f.o;
  const Qwen3Config config = o.config.empty() ? preset_config("tiny") : load_config(o.config);
  // A previous run's weights of another config or seed are replaced only where --overwrite replaces that run
  // (never under a resume, whose checkpoints were trained from them).
  const bool replace_other = f.overwrite && !o.resume && !o.resume_if_present;
  const SynthResult model = synthetic_training_model(
      config, o.data.seed, o.checkpoint_dir.empty() ? "" : o.checkpoint_dir + "/synthetic-model", replace_other);
  o.weights = model.dat_path;
  o.config = model.config_path;
  spdlog::info("--synthetic: training random weights in {}", o.weights);
}

// --output-dir: one folder for the run, made with its parents; what it defaults is what was not given.
void apply_output_dir(TrainOptions& o) {
  if (o.output_dir.empty()) return;
  std::error_code ec;
  if (std::filesystem::exists(o.output_dir, ec) && !std::filesystem::is_directory(o.output_dir, ec))
    throw UsageError("--output-dir " + o.output_dir + " is a file");
  std::filesystem::create_directories(o.output_dir, ec);
  if (ec) throw Error("--output-dir " + o.output_dir + ": cannot create (" + ec.message() + ")");
  const std::filesystem::path dir(o.output_dir);
  if (o.checkpoint_dir.empty()) o.checkpoint_dir = (dir / "checkpoints").string();
  if (o.metrics_jsonl.empty()) o.metrics_jsonl = (dir / "metrics.jsonl").string();
  if (o.output_dat.empty()) o.output_dat = (dir / "model.dat").string();
}

// A run folder holds one run. Unless this run resumes, the files a previous run left in --output-dir (run.json,
// run.toml, metrics.jsonl, profile traces), in --checkpoint-dir (its checkpoints and run files) and at
// --metrics-jsonl are refused, or with --overwrite listed here and removed by the trainer before the first step
// (--output-dat's model.dat is prepare_output_target's). Appending to them would mix two runs, and a later
// --resume would continue the old one from its checkpoints.
void claim_run_folders(TrainFlags& f) {
  TrainOptions& o = f.o;
  if (o.resume) return;  // continuing the run these files belong to (the checkpoint checks the data)
  namespace fs = std::filesystem;
  std::vector<std::string> found;
  std::error_code ec;
  // Never this run's own inputs, nor a folder holding one (--synthetic's model is made under --checkpoint-dir).
  std::vector<fs::path> inputs;
  for (const std::string* input : {&o.weights, &o.config, &o.tokenizer, &o.data.path, &o.eval_data})
    if (!input->empty()) inputs.push_back(fs::weakly_canonical(*input, ec));
  const auto holds_an_input = [&](const fs::path& p) {
    const fs::path c = fs::weakly_canonical(p, ec);
    for (const fs::path& input : inputs) {
      const auto [end, rest] = std::mismatch(c.begin(), c.end(), input.begin(), input.end());
      if (end == c.end()) return true;  // p is the input or one of its folders
    }
    return false;
  };
  const auto add = [&](const fs::path& p) {
    if (fs::exists(p, ec) && !holds_an_input(p) && std::find(found.begin(), found.end(), p.string()) == found.end())
      found.push_back(p.string());
  };
  if (!o.output_dir.empty()) {
    for (const char* name : {"run.json", "run.toml", "metrics.jsonl"}) add(fs::path(o.output_dir) / name);
    for (const auto& entry : fs::directory_iterator(o.output_dir, ec))
      if (entry.path().filename().string().rfind("profile-step-", 0) == 0) add(entry.path());
  }
  if (!o.checkpoint_dir.empty() && fs::is_directory(o.checkpoint_dir, ec))
    for (const auto& entry : fs::directory_iterator(o.checkpoint_dir, ec))
      if (entry.path().filename() != ".lock") add(entry.path());  // the lock is the live run's, never removed
  if (!o.metrics_jsonl.empty()) add(o.metrics_jsonl);
  if (!o.tensorboard_dir.empty())  // another run's events would draw as one run with this one's
    for (const auto& entry : fs::directory_iterator(o.tensorboard_dir, ec))
      if (entry.path().filename().string().find("tfevents") != std::string::npos) add(entry.path());
  if (found.empty()) return;
  std::sort(found.begin(), found.end());
  const std::string listed = fmt::format("{}", fmt::join(found, ", "));
  if (!f.overwrite)
    throw UsageError(f.command + ": a previous run's files are here: " + listed +
                     ". Give --resume to continue that run, another --output-dir for a new one, or --overwrite to "
                     "remove them before the first step");
  spdlog::warn("--overwrite: the previous run's {} will be removed before the first step", listed);
  o.replace_previous_run = found;
}

// The steps of the run `checkpoint` was saved by, where that run had these --epochs: its run record's total_steps
// (written since 2026-11-28; an --epochs run's length is known only once its data is read). Nothing for another
// --epochs, an older checkpoint, or one that cannot be read (the resume itself then says why, or passes over it).
std::optional<int64_t> epochs_run_steps(const TrainOptions& o, const std::string& checkpoint) {
  try {
    const nlohmann::json run =
        load_checkpoint(checkpoint, "\x01no tensor").extra.value("run", nlohmann::json::object());
    const nlohmann::json options = run.value("options", nlohmann::json::object());
    if (!run.contains("total_steps") || !run["total_steps"].is_number_integer() || !options.contains("epochs") ||
        options["epochs"] != o.epochs)
      return std::nullopt;
    return run["total_steps"].get<int64_t>();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// --resume (or --resume-if-present) without --overwrite, --output-dat there, and the newest complete checkpoint
// at or past the run's end (--steps, or the steps its run had with the same --epochs): the run finished and
// exported. The trainer checks again with the steps it counts (other data, a damaged newest checkpoint: then the
// existing --output-dat is refused as any is).
bool resumes_a_finished_run(const TrainOptions& o, bool overwrite) {
  std::error_code ec;
  if (!o.resume || overwrite || o.checkpoint_dir.empty() || !std::filesystem::exists(o.output_dat, ec)) return false;
  const std::optional<std::string> newest = latest_checkpoint(o.checkpoint_dir);
  if (!newest) return false;
  const std::optional<int64_t> end = o.steps > 0 ? std::optional<int64_t>(o.steps) : epochs_run_steps(o, *newest);
  // Complete checkpoints are folders named exactly step-NNNNNNNN.
  return end && std::stoll(std::filesystem::path(*newest).filename().string().substr(5)) >= *end;
}

}  // namespace

void check_micro_batch(const TrainOptions& o) {
  if (o.data.batch_size * o.data.seq_len > flag_limit::micro_batch_tokens)
    throw UsageError(fmt::format("--batch-size {} x --seq-len {} = {} tokens a micro-batch, above {} (2^31): "
                                 "beyond any device's memory; use --grad-accum-steps for a larger batch",
                                 o.data.batch_size, o.data.seq_len, o.data.batch_size * o.data.seq_len,
                                 flag_limit::micro_batch_tokens));
}

void check_shared_flag_combinations(const TrainFlags& f) {
  const TrainOptions& o = f.o;
  const std::string& c = f.command;
  check_micro_batch(o);
  if (f.synthetic && !o.weights.empty())
    throw UsageError(c + ": --synthetic trains random weights of --config's shape: drop --weights or --synthetic");
  if (parse_pack_strategy(f.pack_strategy) != PackStrategy::best_fit && !o.data.pack)
    throw UsageError(c + ": --pack-strategy applies with --pack only");
  if (o.grad_accum_steps > 1 && o.fused_optimizer)
    throw UsageError(c + ": --grad-accum-steps needs the plain update: --fused-optimizer applies each block's "
                     "gradient as soon as it exists, so there is nothing to accumulate into (docs/trainer.md)");
  if (o.overlap_update && !o.fused_optimizer)
    throw UsageError(c + ": --overlap-update runs the in-backward updates beside backward: it needs --fused-optimizer");
  if (o.overlap_update_sms > 0 && !o.overlap_update)
    throw UsageError(c + ": --overlap-update-sms leaves SMs to the updates that run beside backward: it needs "
                     "--overlap-update");
  if (o.train_lm_head && o.train_last_layers <= 0)
    throw UsageError(c + ": --train-lm-head applies with --train-last-layers (without it every tensor trains, the "
                     "head included)");
  if (o.schedule.min_lr > o.schedule.lr)
    throw UsageError(fmt::format("{}: --min-lr {:g} exceeds --lr {:g}: a schedule decays from --lr to --min-lr", c,
                                 o.schedule.min_lr, o.schedule.lr));
}

void convert_flag_values(TrainFlags& f) {
  TrainOptions& o = f.o;
  o.data.format = parse_data_format(f.data_format);
  o.data.sample_mode = parse_sample_mode(f.sample_mode);
  o.data.pack_strategy = parse_pack_strategy(f.pack_strategy);
  if (!f.system.empty()) o.data.system = f.system;
  o.adamw.moments = moment_storage_from_name(f.moments);
  o.adamw.seed = o.data.seed;
  o.scale_mode = nvfp4::scale_mode_from_name(f.scale_mode);
  o.schedule.kind = parse_lr_schedule_kind(f.lr_schedule);
  o.master_dtype = parse_master_dtype(f.master_dtype);
  o.compute_dtype = parse_compute_dtype(f.compute_dtype);
  o.keep_weight_operands = parse_keep_weight_operands(f.keep_weight_operands);
  // all | auto | a count (the validator has checked the text).
  o.grad_checkpoint_blocks = f.grad_checkpoint_blocks == "all"    ? TrainOptions::kCheckpointAllBlocks
                             : f.grad_checkpoint_blocks == "auto" ? TrainOptions::kCheckpointBlocksAuto
                                                                  : std::stoll(f.grad_checkpoint_blocks);
  if (f.grad_checkpoint_blocks != "all" && !o.grad_checkpoint)
    throw UsageError("--grad-checkpoint-blocks " + f.grad_checkpoint_blocks +
                     " says how many blocks --grad-checkpoint recomputes: it needs --grad-checkpoint");
  o.loss = parse_loss_kind(f.loss);
  const TokenizerSource source = tokenizer_source(o.tokenizer, f.chat);
  o.tokenizer_config = source.config_path;
  o.chat_template = source.chat_template;
}

void resolve(TrainFlags& f) {
  TrainOptions& o = f.o;
  if (!f.model_dir.empty()) {  // the folder holding config.json, tokenizer.json and the weights (model.dat)
    std::error_code missing;
    if (!std::filesystem::is_directory(f.model_dir, missing))  // it said "--weights is required"
      throw UsageError(f.command + ": --model-dir " + f.model_dir +
                       (std::filesystem::exists(f.model_dir, missing) ? " is not a folder" : ": no such folder"));
    if (o.config.empty()) o.config = f.model_dir + "/config.json";
    if (o.tokenizer.empty()) o.tokenizer = f.model_dir + "/tokenizer.json";
    std::error_code ec;
    if (o.weights.empty() && !f.synthetic) {
      if (std::filesystem::is_regular_file(f.model_dir + "/model.dat", ec)) {
        o.weights = f.model_dir + "/model.dat";
      } else {
        // A Hugging Face folder: its safetensors become a .dat once, with `convert`.
        for (const auto& entry : std::filesystem::directory_iterator(f.model_dir, ec))
          if (entry.path().extension() == ".safetensors")
            throw UsageError(f.command + ": --model-dir " + f.model_dir +
                             " holds Hugging Face safetensors and no model.dat: "
                             "convert it once with `qwen3-train convert --hf-dir " + f.model_dir + " --out " +
                             f.model_dir + "/model.dat --nvfp4` (docs/export.md), then train with --model-dir " +
                             f.model_dir);
      }
    }
  }
  // What the command line lacks is said before anything is made (--synthetic writes its weights).
  for (auto [name, value] : {std::pair{"--weights", &o.weights}, {"--config", &o.config}, {"--tokenizer", &o.tokenizer},
                             {"--train-data", &o.data.path}})
    if (value->empty() && !(f.synthetic && value != &o.tokenizer && value != &o.data.path))  // --synthetic makes two
      throw UsageError(f.command + ": " + name + " is required");
  if (o.steps <= 0 && o.epochs <= 0)
    throw UsageError(f.command + ": give a positive --steps or --epochs (0, their default, means neither was given)");
  if (f.synthetic) make_synthetic_weights(f);
  if (o.resume_if_present) o.resume = true;
  apply_output_dir(o);
  // The run's inputs, which nothing it writes may be: --metrics-jsonl appended to the training
  // data, and the memory report replaced the config, before 2026-11-28. The report is a file like --output-dat
  // (an existing one only with --overwrite); the metrics are appended to (claim_run_folders says whose they are).
  const std::vector<std::string> inputs = {o.weights, o.config, o.tokenizer, o.data.path, o.eval_data};
  if (!o.metrics_jsonl.empty()) refuse_input_as_output("--metrics-jsonl", o.metrics_jsonl, inputs);
  if (!o.vram_report.empty())
    prepare_output_target(f.command == "vram-report" ? "vram-report: --out" : "--vram-report", o.vram_report,
                          f.overwrite, inputs);  // inside --checkpoint-dir too, as the original's users kept it
  claim_run_folders(f);
  convert_flag_values(f);
  resolve_device(o.device);
  // Before the first step: the export target must not replace anything unasked, nor any input of the run. The
  // one exception: the same command again after its run finished (a script that repeats it until it succeeds,
  // a requeued job), whose export is already there; the trainer confirms nothing trains.
  if (!o.output_dat.empty()) {
    if (resumes_a_finished_run(o, f.overwrite)) {
      refuse_input_as_output("--output-dat", o.output_dat, inputs, {o.checkpoint_dir});
      o.output_dat_of_finished_run = true;
    } else {
      prepare_output_target("--output-dat", o.output_dat, f.overwrite, inputs, {o.checkpoint_dir});
    }
  }
  if (o.profile_step > 0) {
    if (o.profile_out.empty() && o.output_dir.empty())
      throw UsageError(f.command + ": --profile-step needs --profile-out FILE (or --output-dir, which holds "
                       "profile-step-N.json)");
    if (o.profile_out.empty())
      o.profile_out = (std::filesystem::path(o.output_dir) / fmt::format("profile-step-{}.json", o.profile_step)).string();
    const bool replaced = std::find(o.replace_previous_run.begin(), o.replace_previous_run.end(), o.profile_out) !=
                          o.replace_previous_run.end();
    std::vector<std::string> not_the_trace = inputs;
    not_the_trace.push_back(o.output_dat);
    prepare_output_target("--profile-out", o.profile_out, replaced, not_the_trace, {o.checkpoint_dir});
  } else if (!o.profile_out.empty()) {
    throw UsageError(f.command + ": --profile-out applies with --profile-step");
  }
}

CLI::Option_group* add_train_flags(CLI::App* sub, const std::shared_ptr<TrainFlags>& f) {
  TrainOptions& o = f->o;
  auto group = [&](const char* name) { return sub->add_option_group(name); };

  auto* files = group("Files");
  files->add_option("--weights,--weight,--input-dat", o.weights, "input model .dat");
  files->add_option("--config", o.config, "config.json");
  files->add_option("--tokenizer", o.tokenizer, "tokenizer.json");
  files->add_option("--model-dir", f->model_dir,
                    "folder with config.json, tokenizer.json and model.dat (fills --config, --tokenizer, --weights)");
  files->add_option("--train-data", o.data.path, "TSV prompt<TAB>target pairs, text lines, or JSON records (docs/data.md)");
  files->add_option("--output-dat", o.output_dat, "export the trained model to this new .dat at the end");
  add_bool_flag(files, "--overwrite", f->overwrite,
                "let --output-dat replace an existing file (never an input), and remove a previous run's files from "
                "--output-dir / --checkpoint-dir / --metrics-jsonl before the first step (listed in the log)");
  files->add_option("--metrics-jsonl", o.metrics_jsonl, "append one JSON object per step");
  add_bool_flag(files, "--synthetic", f->synthetic, "train random weights of --config's shape (tiny without it)");
  files->add_option("--test-max-tokens", f->test_max_tokens, "after export, greedy-reply to --test-prompt with this many tokens")
      ->check(integer_in(0, flag_limit::tokens));
  files->add_option("--test-prompt", f->test_prompt, "prompt of the after-export self-test")->capture_default_str();
  files->add_option("--eval-data", o.eval_data, "held-out data for --eval-every");

  auto* data = group("Data");
  data->add_option("--data-format", f->data_format, "auto, tsv, text, chat, alpaca or text-jsonl")->capture_default_str();
  data->add_option("--system", f->system, "system prompt of pairs and records without one");
  add_chat_template_flags(data, f->chat);
  data->add_option("--seq-len", o.data.seq_len, "tokens per row")->check(integer_in(1, flag_limit::seq_len))->capture_default_str();
  data->add_option("--batch-size", o.data.batch_size, "rows per step")->check(integer_in(1, flag_limit::batch_rows))->capture_default_str();
  add_bool_flag(data, "--pack", o.data.pack, "pack samples into full rows instead of padding");
  data->add_option("--pack-strategy", f->pack_strategy,
                   "with --pack: best-fit (whole samples a row) or stream (cut every seq-len tokens)")
      ->capture_default_str();
  data->add_option("--sample-mode", f->sample_mode, "random or sequential")->capture_default_str();
  data->add_option("--seed", o.data.seed, "data order and stochastic rounding")->check(seed_integer())->capture_default_str();
  add_bool_flag(data, "--strict-data", o.data.strict, "a bad data line is fatal instead of skipped");
  data->add_option("--comment-prefix", o.data.comment_prefix, "lines starting with it are comments ('': none)")
      ->capture_default_str();

  auto* sched = group("Steps and schedule");
  sched->add_option("--steps", o.steps, "optimizer steps (or use --epochs)")->check(integer_in(0, flag_limit::steps));
  sched->add_option("--epochs", o.epochs, "passes over the data")->check(integer_in(0, flag_limit::epochs));
  sched->add_option("--steps-per-epoch", o.steps_per_epoch, "steps per epoch (0: the whole data)")->check(integer_in(0, flag_limit::steps));
  sched->add_option("--lr", o.schedule.lr, "peak learning rate")->check(finite_number())->check(non_negative_number())
      ->check(at_most(1.0, "AdamW learning rates are far below 1"))->capture_default_str();
  sched->add_option("--lr-schedule", f->lr_schedule, "constant, cosine or linear")
      ->check(CLI::IsMember({"constant", "cosine", "linear"}))->capture_default_str();
  sched->add_option("--warmup-steps", o.schedule.warmup_steps, "linear warm-up steps")->check(integer_in(0, flag_limit::steps))->capture_default_str();
  sched->add_option("--min-lr", o.schedule.min_lr, "final learning rate of cosine/linear")->check(finite_number())->check(non_negative_number())
      ->check(at_most(1.0, "AdamW learning rates are far below 1"))->capture_default_str();

  auto* optim = group("Optimizer");
  optim->add_option("--beta1", o.adamw.beta1, "AdamW beta1")->check(finite_number())->check(below_one())->capture_default_str();
  optim->add_option("--beta2", o.adamw.beta2, "AdamW beta2")->check(finite_number())->check(below_one())->capture_default_str();
  optim->add_option("--eps", o.adamw.eps, "AdamW epsilon")->check(finite_number())->check(positive_number())->capture_default_str();
  optim->add_option("--weight-decay", o.adamw.weight_decay, "decoupled weight decay (projections only unless asked)")
      ->check(finite_number())
      ->check(non_negative_number())->capture_default_str();
  add_bool_flag(optim, "--decay-norms-and-embeddings", o.decay_norms_and_embeddings, "apply weight decay to norms and the embedding too");
  optim->add_option("--master-dtype", f->master_dtype, "float32 or bfloat16 (stochastic rounding)")
      ->check(CLI::IsMember({"float32", "bfloat16"}))->capture_default_str();
  optim->add_option("--compute-dtype", f->compute_dtype,
                    "activations and products: auto (bfloat16 on CUDA, the master dtype on CPU), float32, bfloat16")
      ->check(CLI::IsMember({"auto", "float32", "bfloat16"}))
      ->capture_default_str();
  optim->add_option("--optimizer-state-mode", f->moments, "moment storage: float32, bfloat16, int8 or nvfp4")->capture_default_str();
  optim->add_option("--optimizer-step-chunk-rows,--step-chunk-rows", o.adamw.step_chunk_rows,
                    "rows per optimizer piece (0: whole tensors)")->check(integer_in(0, flag_limit::rows))->capture_default_str();
  optim->add_option("--grad-clip", o.grad_clip, "global gradient norm limit (0: off)")->check(finite_number())->check(non_negative_number())->capture_default_str();
  optim->add_option("--max-skipped-steps", o.max_skipped_steps, "abort (with a checkpoint) after this many non-finite steps")
      ->check(integer_in(0, flag_limit::steps))->capture_default_str();

  auto* what = group("What trains");
  what->add_option("--loss,--loss-mode", f->loss, "ce (next-token cross-entropy) or scalar (the original's L1)")
      ->check(CLI::IsMember({"ce", "scalar"}))->capture_default_str();
  what->add_option("--train-last-layers", o.train_last_layers, "train only the last N blocks (<= 0: everything)")
      ->check(integer_in(-flag_limit::layers, flag_limit::layers))->capture_default_str();
  add_bool_flag(what, "--freeze-embeddings", o.freeze_embeddings, "keep the embedding fixed");
  add_bool_flag(what, "--train-lm-head", o.train_lm_head, "with --train-last-layers: also train an untied lm_head (dense; re-quantized at export)");
  what->add_option("--scale-mode", f->scale_mode, "NVFP4 scale choice in the forward and export: rne or search")->capture_default_str();

  auto* run = group("Run");
  run->add_option("--device", o.device, "cpu or cuda")->capture_default_str();
  add_bool_flag(run, "--grad-checkpoint", o.grad_checkpoint, "recompute each block in backward (less activation memory)");
  run->add_option("--grad-checkpoint-blocks", f->grad_checkpoint_blocks,
                  "with --grad-checkpoint: how many blocks, from the first, are recomputed (the others keep their "
                  "activations; the same bytes trained): all, N, or auto, the fewest whose step the memory model "
                  "fits in 90% of the device's memory (docs/trainer.md)")
      ->check(CLI::IsMember({"all", "auto"}) | integer_in(0, flag_limit::layers))
      ->capture_default_str();
  run->add_option("--grad-accum-steps", o.grad_accum_steps, "micro-batches of --batch-size per optimizer step")
      ->check(integer_in(1, flag_limit::accumulation))->capture_default_str();
  run->add_option("--log-every", o.log_every, "progress line every N steps")->check(integer_in(0, flag_limit::steps))->capture_default_str();
  run->add_option("--checkpoint-dir", o.checkpoint_dir, "where checkpoints go (step-NNNNNNNN/)");
  run->add_option("--save-every-steps", o.save_every_steps, "checkpoint every K steps (0: at the end only)")
      ->check(integer_in(0, flag_limit::steps))->capture_default_str();
  run->add_option("--keep-checkpoints", o.keep_checkpoints, "newest checkpoints kept (0: all)")->check(integer_in(0, flag_limit::epochs))->capture_default_str();
  add_bool_flag(run, "--resume", o.resume, "continue from the newest checkpoint in --checkpoint-dir (an error if none)");
  add_bool_flag(run, "--resume-if-present", o.resume_if_present,
                "--resume when --checkpoint-dir holds a checkpoint, else start from the weights");
  run->add_option("--eval-every", o.eval_every, "evaluate --eval-data every K steps")->check(integer_in(0, flag_limit::steps));
  run->add_option("--dist-init", o.dist_init,
                  "data parallel: file://PATH to join through a file (one machine or a shared file system) instead "
                  "of MASTER_ADDR:MASTER_PORT; ranks come from torchrun, Slurm or Open MPI (docs/distributed.md)");
  run->add_option("--dist-timeout", o.dist_timeout_s, "seconds a rank waits for the others before failing")
      ->check(integer_in(1, flag_limit::week_s, "a week"))->capture_default_str();
  add_bool_flag(run, "--shard-optimizer-state", o.shard_optimizer_state,
                "data parallel: each rank keeps and updates its share of the optimizer state (ZeRO-1)");
  run->add_option("--profile-step", o.profile_step,
                  "run this step (1-based, as logged) under libtorch's profiler: a Chrome trace and the time per "
                  "phase and op in the log")
      ->check(integer_in(0, flag_limit::steps));
  run->add_option("--profile-out", o.profile_out, "the --profile-step trace (default: --output-dir/profile-step-N.json)");
  run->add_option("--tensorboard", o.tensorboard_dir,
                  "write TensorBoard event files of the step metrics (loss, eval loss, lr, grad norm, tokens/s, MFU, "
                  "memory) into this folder (TensorBoard, W&B's TensorBoard sync)");
  run->add_option("--output-dir", o.output_dir,
                  "one folder for the run (made with its parents): run.json, and unless given, checkpoints/, "
                  "metrics.jsonl and the export model.dat");
  add_bool_flag(run, "--allow-data-change", o.allow_data_change,
                "--resume even when the training data's or tokenizer.json's content differs from the checkpoint's");
  run->add_option("--mfu-device", o.mfu_device, "on CUDA, the device whose bf16 peak the metrics' MFU uses (default: the GPU it runs on: gb10, h200, else h100)")
      ->check(CLI::IsMember(predict_device_names()));
  add_bool_flag(run, "--fused-optimizer", o.fused_optimizer,
                "update each block during backward and free its gradients (clipping per block: docs/trainer.md)");
  add_bool_flag(run, "--overlap-update", o.overlap_update,
                "with --fused-optimizer on CUDA, one process: each block's update on a CUDA stream of its own, "
                "beside the rest of backward (the same bytes; docs/trainer.md)");
  run->add_option("--overlap-update-sms", o.overlap_update_sms,
                  "with --overlap-update: backward's cuBLAS products target this many fewer SMs than the GPU has, "
                  "leaving them to the updates beside them (cuBLASLt's SM count target; products of other kernels "
                  "may round differently; libtorch 2.8+; default 0: every SM; docs/trainer.md)")
      ->check(integer_in(0, flag_limit::sms));
  run->add_option("--keep-weight-operands", f->keep_weight_operands,
                  "CUDA: what each trained projection holds for backward (the same bytes trained): off its NVFP4 "
                  "codes (dequantized in backward); backward its bf16 product operand from forward (2 bytes an "
                  "element instead of 0.5625, no dequantization; under --grad-checkpoint the first forward's, which "
                  "the recompute multiplies too); recompute (--grad-checkpoint) the operand each block's recompute "
                  "makes, one block at a time; always the operand across steps, written by the update (forward "
                  "makes none); auto: backward where the memory model says the step fits, else recompute under "
                  "--grad-checkpoint (where it fits, if only some blocks are recomputed) and otherwise off "
                  "(docs/trainer.md)")
      ->check(CLI::IsMember({"auto", "off", "backward", "recompute", "always"}))
      ->capture_default_str();
  return run;
}

}  // namespace qwen3::cli
