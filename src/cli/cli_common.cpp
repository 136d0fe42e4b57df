#include "cli_common.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "qwen3/error.h"

namespace qwen3::cli {

CLI::Option* add_bool_flag(CLI::App* app, const std::string& names, bool& target, const std::string& help) {
  // "{true}" is the value a bare flag stands for; expected(0, 1) lets an explicit value follow after a space.
  auto* opt = app->add_flag(names + "{true}", target, help)->expected(0, 1);
  opt->type_name("[BOOL]");
  opt->default_str(target ? "true" : "false");
  return opt;
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

}  // namespace qwen3::cli
