#include "cli_common.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdlib>

#include "qwen3/error.h"

namespace qwen3::cli {

CLI::Option* add_bool_flag(CLI::App* app, const std::string& names, bool& target, const std::string& help) {
  // A bare flag means true; expected(0, 1) lets an explicit value follow after a space, as the original took it.
  auto* opt = app->add_flag(names, target, help)->expected(0, 1);
  opt->type_name("[BOOL]");
  opt->default_str(target ? "true" : "false");
  return opt;
}

CLI::Validator finite_number() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(value.c_str(), &end);
        if (value.empty() || end == value.c_str() || *end != '\0') return "must be a number, got '" + value + "'";
        if (!std::isfinite(x)) return "must be a finite number, got '" + value + "'";
        return {};
      },
      "FINITE");
}

CLI::Validator non_negative_integer() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos)
          return "must be a non-negative integer, got '" + value + "'";
        return {};
      },
      "UINT");
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
