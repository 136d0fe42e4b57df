// Suggestions for unknown flags (flag_suggestion.h).
#include "flag_suggestion.h"

#include <algorithm>
#include <map>

namespace qwen3::cli {
namespace {

// The names people bring from transformers' TrainingArguments, TRL and torchtune, for flags this tool names
// otherwise (with the value where the habit is a bare switch). Only targets that exist on the command are offered.
const std::map<std::string, std::string>& habit_names() {
  static const std::map<std::string, std::string> names = {
      {"--learning-rate", "--lr"},
      {"--max-steps", "--steps"},
      {"--num-train-epochs", "--epochs"},
      {"--num-epochs", "--epochs"},
      {"--per-device-train-batch-size", "--batch-size"},
      {"--train-batch-size", "--batch-size"},
      {"--gradient-accumulation-steps", "--grad-accum-steps"},
      {"--gradient-checkpointing", "--grad-checkpoint"},
      {"--activation-checkpointing", "--grad-checkpoint"},
      {"--max-seq-length", "--seq-len"},
      {"--max-seq-len", "--seq-len"},
      {"--max-length", "--seq-len"},
      {"--block-size", "--seq-len"},
      {"--logging-steps", "--log-every"},
      {"--save-steps", "--save-every-steps"},
      {"--eval-steps", "--eval-every"},
      {"--save-total-limit", "--keep-checkpoints"},
      {"--lr-scheduler-type", "--lr-schedule"},
      {"--max-grad-norm", "--grad-clip"},
      {"--adam-beta1", "--beta1"},
      {"--adam-beta2", "--beta2"},
      {"--adam-epsilon", "--eps"},
      {"--resume-from-checkpoint", "--resume"},
      {"--model-name-or-path", "--model-dir"},
      {"--model-path", "--model-dir"},
      {"--dataset", "--train-data"},
      {"--dataset-path", "--train-data"},
      {"--data-path", "--train-data"},
      {"--packing", "--pack"},
      {"--bf16", "--compute-dtype bfloat16"},
      {"--fp32", "--compute-dtype float32"},
      {"--output-path", "--output-dir"},
      {"--seed-everything", "--seed"},
  };
  return names;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The command's long flags, those of its option groups included (CLI11 keeps a group's options in a nameless
// sub-app).
void collect_long_names(const CLI::App& command, std::vector<std::string>& names) {
  for (const CLI::Option* opt : command.get_options())
    for (const std::string& name : opt->get_lnames()) names.push_back("--" + name);
  for (const CLI::App* group : command.get_subcommands([](const CLI::App* a) { return a->get_name().empty(); }))
    collect_long_names(*group, names);
}

std::vector<std::string> long_names(const CLI::App& command) {
  std::vector<std::string> names;
  collect_long_names(command, names);
  return names;
}

bool names_a_flag(const CLI::App& command, const std::string& flag) {
  const auto names = long_names(command);
  return std::find(names.begin(), names.end(), flag) != names.end();
}

}  // namespace

std::string suggest_flag(const CLI::App& command, const std::string& unknown) {
  std::string flag = unknown.substr(0, unknown.find('='));
  std::replace(flag.begin(), flag.end(), '_', '-');  // --learning_rate, as Python argparse users write it
  const auto habit = habit_names().find(flag);
  // A target may carry its value ("--compute-dtype bfloat16"): its first word must be a flag of the command.
  if (habit != habit_names().end() && names_a_flag(command, habit->second.substr(0, habit->second.find(' '))))
    return habit->second;
  if (flag != unknown.substr(0, unknown.find('=')) && names_a_flag(command, flag)) return flag;
  std::string best;
  size_t best_distance = std::max<size_t>(2, flag.size() / 4) + 1;  // close enough to be the same word mistyped
  for (const std::string& name : long_names(command)) {
    const size_t d = edit_distance(flag, name);
    if (d < best_distance) best = name, best_distance = d;
  }
  return best;
}

std::vector<std::string> unknown_flags(const CLI::App& app, const CLI::App& command, const std::vector<std::string>& args) {
  std::vector<std::string> unknown;
  for (const std::string& arg : args) {
    if (arg.size() < 3 || arg.rfind("--", 0) != 0) continue;
    const std::string flag = arg.substr(0, arg.find('='));
    if (!names_a_flag(command, flag) && !names_a_flag(app, flag)) unknown.push_back(flag);
  }
  return unknown;
}

}  // namespace qwen3::cli
