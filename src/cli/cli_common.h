// What every subcommand shares: registration, boolean flags in the original's `--flag true|false` form, and
// logging set-up. Only src/cli knows about argv.
#pragma once
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

#include "qwen3/tokenizer/tokenizer.h"

namespace qwen3::cli {

// A subcommand and what to run once argv parsed cleanly; run returns the exit code.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// `--name`, `--name true|false|1|0|yes|no`, `--name=false` all work.
CLI::Option* add_bool_flag(CLI::App* app, const std::string& names, bool& target, const std::string& help);

// Every integer flag: the text must spell an integer in [lo, hi] (digits with an optional sign: no fraction,
// exponent or empty text). CLI11's own conversion saturates "99999999999999999999" and reads '' as 0, and would
// wrap "-1" around to 2^64 - 1 for an unsigned flag; the bounds are the ones docs/trainer.md's flag table gives.
CLI::Validator integer_in(int64_t lo, int64_t hi, const std::string& why = "");
// Seeds: any integer in [0, 2^64 - 1].
CLI::Validator seed_integer();

// The bounds of the integer flags, shared by every command that has the flag (docs/trainer.md, "Flag ranges").
// Far beyond any real run, and small enough that what the trainer forms of them (tokens a step, samples of a run)
// fits 64 bits.
namespace flag_limit {
constexpr int64_t steps = 1'000'000'000;   // --steps, --warmup-steps, step intervals, step numbers
constexpr int64_t epochs = 1'000'000;
constexpr int64_t seq_len = 1 << 20;        // positions of a row (a model's max_position_embeddings bounds it further)
constexpr int64_t batch_rows = 1 << 16;     // --batch-size
constexpr int64_t accumulation = 1 << 16;   // --grad-accum-steps
constexpr int64_t tokens = 1 << 20;         // tokens to generate, prompt tokens a forward pass
constexpr int64_t layers = 10'000;          // --train-last-layers (either sign)
constexpr int64_t rows = int64_t{1} << 31;  // --optimizer-step-chunk-rows
constexpr int64_t ranks = 1 << 16;          // --world-size
constexpr int64_t week_s = 7 * 24 * 3600;   // --dist-timeout
constexpr int64_t top_k = 1 << 24;          // above any vocabulary
constexpr int64_t micro_batch_tokens = int64_t{1} << 31;  // --batch-size x --seq-len
constexpr int64_t sms = 1 << 16;            // --overlap-update-sms (the device's own count bounds it further)
}  // namespace flag_limit

// For every floating-point flag: NaN and infinity are refused (CLI11's range checks let NaN through, and a NaN
// learning rate or clip poisons every weight in one step).
CLI::Validator finite_number();

// non_negative_number() / PositiveNumber / a bound, with messages that quote the value given (CLI11's print
// the whole of DBL_MAX).
CLI::Validator non_negative_number();
CLI::Validator positive_number();
CLI::Validator at_most(double bound, const std::string& why);
CLI::Validator below_one();  // [0, 1): Adam's betas (1 would divide by a zero bias correction)

// The process's argv, as main saw it (run.json records it).
void set_command_line(int argc, char** argv);
const std::vector<std::string>& command_line();

// Whether a flag's value is a file or folder (by long name, without dashes): --config-file resolves these
// against the file's folder, and run.toml records them as absolute paths.
bool is_path_flag(const std::string& name);

// Every flag of a command after defaults, by long name (without dashes): {name: value} for run.json (as given),
// and the same as TOML that `--config-file` reads back (paths made absolute, so the file repeats the run from
// any folder). Flags without a value (and --help, --config-file) are left out.
struct FlagValues {
  nlohmann::json json = nlohmann::json::object();
  std::string toml;
};
FlagValues flag_values(CLI::App* command);

// --tokenizer-config and --chat-template beside a command's --tokenizer, and the source they make.
struct ChatTemplateFlags {
  std::string config, name;
};
void add_chat_template_flags(CLI::App* app, ChatTemplateFlags& flags);
TokenizerSource tokenizer_source(const std::string& tokenizer, const ChatTemplateFlags& flags);

void setup_logging(const std::string& level);  // trace|debug|info|warn|error|off; progress goes to stderr

// After a command that ran the model without the trainer (eval, generate): a warning on stderr for each slower
// path its forward passes took on a GPU (docs/trainer.md, "Slow paths"), as the trainer warns of a step's. A
// process runs one command, so the records are all this command's.
void warn_of_slow_paths(const std::string& command);

// Registration of each command (one file each).
Command add_inspect_command(CLI::App& app);
Command add_synth_command(CLI::App& app);
Command add_quantize_command(CLI::App& app);
Command add_tokenize_command(CLI::App& app);
Command add_generate_command(CLI::App& app);
Command add_eval_command(CLI::App& app);
Command add_train_command(CLI::App& app);
Command add_vram_report_command(CLI::App& app);
Command add_smoke_command(CLI::App& app);
Command add_export_command(CLI::App& app);
Command add_convert_command(CLI::App& app);
Command add_plot_command(CLI::App& app);

std::string version_text();
// "qwen3-train <version>" and the commit it was built from ("unknown" outside a git checkout), for run records.
std::string tool_name_and_version();
std::string git_hash();

}  // namespace qwen3::cli
