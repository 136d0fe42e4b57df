#include "cli_common.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>

#include "qwen3/tokenizer/chat_format.h"

#include "qwen3/base/error.h"
#include "qwen3/base/slow_paths.h"

namespace qwen3::cli {

CLI::Option* add_bool_flag(CLI::App* app, const std::string& names, bool& target, const std::string& help) {
  // A bare flag means true; expected(0, 1) lets an explicit value follow after a space, as the original took it.
  auto* opt = app->add_flag(names, target, help)->expected(0, 1);
  // CLI11's own refusal of another word ("Could not convert: --pack = maybe") names neither the values it takes
  // nor which of them a flags file may use; this one runs first. An empty value is the bare flag's.
  opt->check(CLI::Validator(
      [](std::string& value) -> std::string {
        std::string v = value;
        std::transform(v.begin(), v.end(), v.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        static const std::set<std::string> words = {"", "true", "false", "1", "0", "yes", "no", "on", "off"};
        return words.count(v) ? std::string() : "'" + value + "' is not true or false (true, false, 1, 0, yes, no)";
      },
      ""));
  opt->type_name("[BOOL]");
  opt->default_str(target ? "true" : "false");
  return opt;
}

namespace {
std::vector<std::string>& argv_store() {
  static std::vector<std::string> args;
  return args;
}
}  // namespace

void set_command_line(int argc, char** argv) { argv_store().assign(argv, argv + argc); }
const std::vector<std::string>& command_line() { return argv_store(); }

bool is_path_flag(const std::string& name) {
  static const std::set<std::string> paths = {
      "weights",    "config",         "tokenizer",  "tokenizer-config", "model-dir",   "train-data",
      "eval-data",  "output-dat",     "output-dir", "checkpoint-dir",   "metrics-jsonl", "profile-out",
      "vram-report", "tensorboard"};
  return paths.count(name) > 0;
}

FlagValues flag_values(CLI::App* command) {
  FlagValues out;
  std::vector<CLI::App*> apps = {command};
  for (CLI::App* group : command->get_subcommands([](CLI::App* a) { return a->get_name().empty(); }))
    apps.push_back(group);
  std::map<std::string, std::string> values;  // sorted: a stable file
  for (CLI::App* app : apps)
    for (CLI::Option* opt : app->get_options()) {
      const std::string name = opt->get_single_name();
      if (name.empty() || name == "help" || name == "config-file" || opt->get_lnames().empty()) continue;
      std::string value;
      if (opt->count() > 0) {
        const auto& results = opt->results();
        value = results.empty() || results.front().empty() ? "true" : results.back();  // a bare flag is true
      } else {
        value = opt->get_default_str();
      }
      if (!value.empty()) values[name] = value;
    }
  for (const auto& [name, value] : values) {
    out.json[name] = value;
    std::error_code ec;
    const std::string recorded = is_path_flag(name) ? std::filesystem::absolute(value, ec).lexically_normal().string() : value;
    out.toml += name + " = " + nlohmann::json(ec ? value : recorded).dump() + "\n";  // a JSON string is a TOML basic string
  }
  return out;
}

void add_chat_template_flags(CLI::App* app, ChatTemplateFlags& flags) {
  app->add_option("--tokenizer-config", flags.config,
                  "tokenizer_config.json whose chat template renders conversations (default: the one beside "
                  "--tokenizer, else chatml)");
  app->add_option("--chat-template", flags.name, "chatml or qwen3-thinking: overrides the tokenizer config's");
}

TokenizerSource tokenizer_source(const std::string& tokenizer, const ChatTemplateFlags& flags) {
  TokenizerSource source{tokenizer, flags.config, std::nullopt};
  if (!flags.name.empty()) source.chat_template = parse_chat_template(flags.name);
  return source;
}

namespace {

// A validator on the number a flag's text spells: `problem` says what is wrong with a parsed value, or nothing.
// Messages quote the user's text, never a bound printed in full (CLI11's own ranges printed DBL_MAX's 309 digits).
template <typename Problem>
CLI::Validator number_rule(const std::string& name, Problem problem) {
  return CLI::Validator(
      [problem](std::string& value) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(value.c_str(), &end);
        if (value.empty() || end == value.c_str() || *end != '\0') return "must be a number, got '" + value + "'";
        const std::string why = problem(x);
        return why.empty() ? std::string() : why + ", got '" + value + "'";
      },
      name);
}

}  // namespace

CLI::Validator finite_number() {
  return number_rule("FINITE", [](double x) -> std::string {
    if (!std::isfinite(x)) return "must be a finite number";
    // Every float option reaches the step as fp32, where a larger magnitude is infinite.
    if (std::fabs(x) > 3.4028234663852886e38) return "must be within float32's range (|x| <= 3.4e38)";
    return {};
  });
}

CLI::Validator non_negative_number() {
  return number_rule("NONNEGATIVE", [](double x) -> std::string { return x >= 0 ? "" : "must be at least 0"; });
}

CLI::Validator positive_number() {
  return number_rule("POSITIVE", [](double x) -> std::string { return x > 0 ? "" : "must be above 0"; });
}

CLI::Validator below_one() {
  return number_rule("[0,1)", [](double x) -> std::string { return x >= 0 && x < 1 ? "" : "must be in [0, 1)"; });
}

CLI::Validator at_most(double bound, const std::string& why) {
  return number_rule("<=" + fmt::format("{:g}", bound), [bound, why](double x) -> std::string {
    return x <= bound ? "" : fmt::format("must be at most {:g} ({})", bound, why);
  });
}

namespace {

// The integer a flag's text spells, or why it spells none (std::from_chars: no locale, no whitespace, overflow
// reported instead of saturated).
template <typename Int>
std::string parse_integer(const std::string& text, Int& out) {
  const char* begin = text.data() + (text.size() > 1 && text[0] == '+' ? 1 : 0);
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(begin, end, out);
  if (ec == std::errc::result_out_of_range) return "out of range";
  if (text.empty() || ec != std::errc() || ptr != end) return "not an integer";
  return {};
}

}  // namespace

CLI::Validator integer_in(int64_t lo, int64_t hi, const std::string& why) {
  const std::string range = fmt::format("an integer from {} to {}{}", lo, hi, why.empty() ? "" : " (" + why + ")");
  return CLI::Validator(
      [lo, hi, range](std::string& value) -> std::string {
        int64_t x = 0;
        if (!parse_integer(value, x).empty() || x < lo || x > hi) return "must be " + range + ", got '" + value + "'";
        return {};
      },
      fmt::format("[{}, {}]", lo, hi));
}

CLI::Validator seed_integer() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        uint64_t x = 0;
        if (value.empty() || value[0] == '-' || !parse_integer(value, x).empty())
          return "must be an integer from 0 to 18446744073709551615 (2^64 - 1), got '" + value + "'";
        return {};
      },
      "[0, 2^64-1]");
}

void setup_logging(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("qwen3");
  logger->set_pattern("[%T.%e] %^%l%$ %v");
  spdlog::set_default_logger(logger);
  const auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off")
    throw UsageError("--log-level: unknown level '" + level + "' (trace, debug, info, warn, error, off)");
  spdlog::set_level(lvl);
}

void warn_of_slow_paths(const std::string& command) {
  for (const SlowPath& p : take_slow_paths()) spdlog::warn("{}: slower path: {}", command, slow_path_text(p));
}

}  // namespace qwen3::cli
