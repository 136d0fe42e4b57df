// `train`: the command that runs the trainer over the flags of train_flags.h, with the original tool's names as
// aliases (docs/trainer.md, "Flag names", lists them), a TOML file of them (--config-file) and the signals.
#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>

#include "qwen3/base/error.h"
#include "qwen3/checkpoint/checkpoint.h"
#include "qwen3/tokenizer/chat_format.h"
#include "qwen3/model/generate.h"
#include "qwen3/model/model_loader.h"
#include "qwen3/trainer/trainer.h"
#include "flag_file.h"
#include "flag_suggestion.h"
#include "runtime_options.h"
#include "train_flags.h"

namespace qwen3::cli {
namespace {

static_assert(flag_limit::steps == kMaxCheckpointStep, "a run's steps and a checkpoint's bound are one number");

StopRequest g_stop;

// SIGINT/SIGTERM (trainer.h, StopRequest): during the steps, the first one asks the run to stop at its next whole
// state and save it; before them (loading, data preparation, a FIFO's open), after them (the last save, the
// export), and on a second signal, the process ends now, with the shell's code for the signal. Only
// async-signal-safe calls here: an atomic store, write, _exit.
extern "C" void on_stop_signal(int sig) {
  if (g_stop.in_steps.load() && g_stop.signal.load() == 0) {
    g_stop.signal.store(sig);
    return;
  }
  static const char kText[] = "error: stopped by a signal outside the steps (or a second one); files saved so far "
                              "are whole\n";
  (void)!::write(STDERR_FILENO, kText, sizeof kText - 1);
  ::_exit(128 + sig);
}

// The original's after-export self-test: greedy reply of the exported model to one prompt.
void self_test(const TrainFlags& f) {
  const Tokenizer tok = load_tokenizer(TokenizerSource{f.o.tokenizer, f.o.tokenizer_config, f.o.chat_template});
  const Qwen3Config config = load_config(f.o.config);
  DatReader reader(f.o.output_dat);
  auto model = load_model(reader, config, at::kFloat, resolve_device(f.o.device));
  GenerateOptions g;
  g.max_new_tokens = f.test_max_tokens;
  fmt::print("self-test: {} -> {}\n", f.test_prompt, chat_reply(*model, tok, f.o.data.system, f.test_prompt, g));
}

// The flags of a TOML file (--config-file) that the command line did not give, each through its option as if
// given there (so its checks and conversions run). A key that is no flag, a section, or a bad value is a
// UsageError naming the file and the key (flag_file.h reads the file; relative paths are the file's folder's).
void apply_config_file(CLI::App* sub, const std::string& path) {
  const std::string extension = std::filesystem::path(path).extension().string();
  if (extension == ".yaml" || extension == ".yml" || extension == ".json")
    throw UsageError(path + ": --config-file reads TOML, not " + extension.substr(1) +
                     " (keys are the long flag names: seq-len = 48, lr = 2e-5, train-data = \"chat.jsonl\"; "
                     "docs/trainer.md \"Runs as files\")");
  const std::vector<FlagFileEntry> entries = read_flag_file(path, is_path_flag);
  const auto entry = [&](const std::string& flag) -> const FlagFileEntry* {
    const auto it = std::find_if(entries.begin(), entries.end(), [&](const FlagFileEntry& e) { return e.flag == flag; });
    return it == entries.end() ? nullptr : &*it;
  };
  // A file that packs without naming how was written before --pack-strategy (2026-11-26), when every packed run
  // was cut from the stream: repeating it under today's default would silently train on other rows.
  const FlagFileEntry* pack = entry("pack");
  if (pack && pack->values == std::vector<std::string>{"true"} && !entry("pack-strategy") &&
      sub->get_option("--pack-strategy")->count() == 0)
    throw UsageError(path + ": pack = true without pack-strategy: runs before 2026-11-26 packed rows cut from the "
                     "stream of samples; add pack-strategy = \"stream\" to repeat such a run, or \"best-fit\" for "
                     "whole samples a row (docs/data.md)");
  for (const FlagFileEntry& e : entries) {
    if (e.flag == "config-file")
      throw UsageError(fmt::format("{}:{}: config-file: a flags file does not read another; write its flags here",
                                   path, e.line));
    CLI::Option* opt = sub->get_option_no_throw("--" + e.flag);
    if (!opt) {
      const std::string guess = suggest_flag(*sub, "--" + e.flag);
      throw UsageError(fmt::format("{}:{}: '{}' is not a flag of train{} (keys are long flag names, e.g. seq-len)",
                                   path, e.line, e.flag,
                                   guess.empty() ? "" : "; did you mean " + guess.substr(2) + "?"));
    }
    if (opt->count() > 0) continue;  // the command line wins
    // An array is a list flag's; for a flag of one value CLI11 would keep one element of it and drop the others.
    if (e.values.size() > 1 && opt->get_items_expected_max() == 1)
      throw UsageError(fmt::format("{}:{}: {}: one value, not an array of {}", path, e.line, e.flag, e.values.size()));
    try {
      opt->add_result(e.values);
      opt->run_callback();
    } catch (const CLI::Error& error) {
      std::string why = error.what();  // CLI11's text names the flag too: "--steps: must be ..."
      if (why.rfind("--" + e.flag + ": ", 0) == 0) why.erase(0, e.flag.size() + 4);
      throw UsageError(fmt::format("{}:{}: {}: {}", path, e.line, e.flag, why));
    }
  }
}

// Flags that contradict each other or would be silently ignored (docs/trainer.md, "Flag combinations"): those
// vram-report shares, and the run's length, which vram-report has not (it runs one step).
void check_flag_combinations(const TrainFlags& f) {
  const TrainOptions& o = f.o;
  check_shared_flag_combinations(f);
  // Flags of what a run writes or reads back, given where it writes or reads nothing of the kind: each was
  // ignored, silently. By value, not by whether the flag was given: a run.toml repeats every flag, defaults
  // included, and must repeat its run.
  const TrainFlags defaults;
  const bool checkpoints = !o.checkpoint_dir.empty() || !o.output_dir.empty();
  if (!checkpoints && (o.save_every_steps > 0 || o.keep_checkpoints != defaults.o.keep_checkpoints))
    throw UsageError("train: --save-every-steps and --keep-checkpoints apply with --checkpoint-dir (or --output-dir)");
  if (o.allow_data_change && !o.resume && !o.resume_if_present)
    throw UsageError("train: --allow-data-change applies with --resume (or --resume-if-present)");
  if (f.test_prompt != defaults.test_prompt && f.test_max_tokens <= 0)
    throw UsageError("train: --test-prompt applies with --test-max-tokens N (the self-test's reply length)");
  if (f.test_max_tokens > 0 && o.output_dat.empty() && o.output_dir.empty())
    throw UsageError("train: --test-max-tokens replies with the exported model: give --output-dat (or --output-dir)");
  if (o.steps > 0 && o.epochs > 0) throw UsageError("train: give --steps or --epochs, not both");
  if (o.steps_per_epoch > 0 && o.epochs <= 0)
    throw UsageError("train: --steps-per-epoch applies with --epochs only");
  if (o.eval_every > 0 && o.eval_data.empty()) throw UsageError("train: --eval-every needs --eval-data");
  if (o.steps > 0 && o.schedule.warmup_steps > o.steps)
    throw UsageError(fmt::format("train: --warmup-steps {} exceeds --steps {}: the learning rate would never reach --lr",
                                 o.schedule.warmup_steps, o.steps));
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  auto* sub = app.add_subcommand("train", "Fine-tune all (or the last N layers') parameters of an NVFP4 model");
  add_train_flags(sub, f)
      ->add_option("--vram-report,--train-step-vram-report", f->o.vram_report,
                   "write the first step's per-phase memory report (JSON) here and print it");
  // A run as a file: TOML whose keys are the long flag names (seq-len = 48); a flag given on the command line
  // wins over the file's (docs/trainer.md "Runs as files"). CLI11 2.1 reads config files for the top-level app
  // only, so the subcommand applies its file itself, with CLI11's TOML reader and its options' own parsing.
  sub->add_option("--config-file", f->config_file,
                  "a TOML file of train flags (keys: long flag names, e.g. seq-len = 48); command-line flags win");
  return {sub, [f, sub]() {
            // From here a signal is obeyed within a second wherever the run is (on_stop_signal).
            g_stop.signal.store(0);
            g_stop.in_steps.store(false);
            std::signal(SIGINT, on_stop_signal);
            std::signal(SIGTERM, on_stop_signal);
            if (!f->config_file.empty()) apply_config_file(sub, f->config_file);
            check_flag_combinations(*f);
            resolve(*f);
            const FlagValues flags = flag_values(sub);
            f->o.run_info = {{"tool", tool_name_and_version()},
                             {"git", git_hash()},
                             {"command_line", command_line()},
                             {"flags", flags.json},
                             {"config_file", flags.toml}};
            const TrainSummary s = run_training(f->o, &g_stop);
            if (f->test_max_tokens > 0 && !s.exported.empty()) self_test(*f);
            if (s.steps_done == 0 && s.stop_signal == 0)  // resumed at or past its end
              fmt::print("nothing to train: the run is at step {} and ends at step {}{}\n", s.final_step, s.run_steps,
                         s.last_checkpoint.empty() ? "" : ", checkpoint " + s.last_checkpoint);
            else if (s.steps_done == 0)  // stopped inside its first step: no loss or speed to report
              fmt::print("stopped by signal {} before a step completed (still at step {}){}\n", s.stop_signal,
                         s.final_step, s.last_checkpoint.empty() ? "" : ", checkpoint " + s.last_checkpoint);
            else
              fmt::print("trained {} steps (now at step {}, {} skipped): loss {:.4f} -> {:.4f}, {:.0f} ms/step, {:.0f} "
                         "tok/s{}{}\n",
                         s.steps_done, s.final_step, s.skipped_steps, s.first_loss, s.last_loss, s.mean_step_ms,
                         s.tokens_per_second, s.last_checkpoint.empty() ? "" : ", checkpoint " + s.last_checkpoint,
                         s.exported.empty() ? "" : ", exported " + s.exported);
            for (const SlowPath& p : s.slow_paths) fmt::print("slower path: {}\n", slow_path_text(p));
            return s.stop_signal ? 128 + s.stop_signal : 0;
          }};
}

}  // namespace qwen3::cli
