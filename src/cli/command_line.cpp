// The whole command line (command_line.h): parses argv, runs one subcommand, and turns every failure into one
// `error: ...` line. Exit codes: 0 success, 1 runtime error, 2 bad flag or value.
#include "command_line.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <regex>
#include <string>

#include "cli_common.h"
#include "flag_suggestion.h"
#include <spdlog/spdlog.h>

#include "qwen3/base/cpu_threads.h"
#include "qwen3/base/error.h"

namespace {

std::string first_line_of(const std::string& s) { return s.substr(0, s.find('\n')); }

// The first argument that is not a global option or its value: what the user meant as the command.
std::string command_word(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--log-level" || a == "--threads") {
      ++i;
      continue;
    }
    if (!a.empty() && a[0] != '-') return a;
  }
  return {};
}

int parse_and_run(int argc, char** argv) {
  using namespace qwen3::cli;
  set_command_line(argc, argv);
  CLI::App app{"qwen3-train: full-parameter fine-tuning of NVFP4 Qwen3 models", "qwen3-train"};
  app.set_version_flag("--version", version_text());
  app.require_subcommand(1);
  app.fallthrough();  // global flags such as --log-level may follow the subcommand
  app.get_formatter()->column_width(38);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off (messages go to stderr)")
      ->capture_default_str();
  int threads = 0;
  app.add_option("--threads", threads,
                 "CPU threads for products and the optimizer (default: the physical cores this process may use, "
                 "shared among the ranks on the machine; OMP_NUM_THREADS if set)")
      ->check(integer_in(1, 4096));

  std::vector<Command> commands;
  commands.push_back(add_smoke_command(app));
  commands.push_back(add_train_command(app));
  commands.push_back(add_vram_report_command(app));
  commands.push_back(add_synth_command(app));
  commands.push_back(add_quantize_command(app));
  commands.push_back(add_inspect_command(app));
  commands.push_back(add_tokenize_command(app));
  commands.push_back(add_generate_command(app));
  commands.push_back(add_eval_command(app));
  commands.push_back(add_export_command(app));
  commands.push_back(add_convert_command(app));
  commands.push_back(add_plot_command(app));

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --help-all, --version: CLI11 prints them, exit 0
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const std::string word = command_word(argc, argv);
    std::vector<std::string> names;
    for (const auto& c : commands) names.push_back(c.app->get_name());
    const bool known = std::find(names.begin(), names.end(), word) != names.end();
    if (!known && !word.empty()) {
      fmt::print(stderr, "error: unknown command '{}' (commands: {})\nRun 'qwen3-train --help' for what each does.\n",
                 word, fmt::join(names, ", "));
      return 2;
    }
    // An unknown flag: name it, and what it most likely meant (a Hugging Face habit, or a typo).
    if (known && dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
      const auto it = std::find(names.begin(), names.end(), word);
      const CLI::App& command = *commands[static_cast<size_t>(it - names.begin())].app;
      const std::vector<std::string> unknown = unknown_flags(app, command, std::vector<std::string>(argv + 1, argv + argc));
      if (!unknown.empty()) {
        for (const std::string& flag : unknown) {
          const std::string guess = suggest_flag(command, flag);
          fmt::print(stderr, "error: {} is not a flag of {}{}\n", flag, word,
                     guess.empty() ? std::string() : "; did you mean " + guess + "?");
        }
        fmt::print(stderr, "Run 'qwen3-train {} --help' for the flags.\n", word);
        return 2;
      }
    }
    // A flag given twice (a script's default, then an override): CLI11 says "--seq-len: At Most 1 required but
    // received 2", which reads as a miscount; no occurrence wins, so say that.
    std::string why = e.what();
    static const std::regex repeated("^(--[A-Za-z0-9-]+): At Most 1 required but received ([0-9]+)$");
    std::smatch m;
    if (std::regex_match(why, m, repeated))
      why = fmt::format("{} is given {} times; give it once (neither value is taken over the other)", m[1].str(),
                        m[2].str());
    fmt::print(stderr, "error: {}\nRun '{} --help' for the flags.\n", why,
               known ? "qwen3-train " + word : std::string("qwen3-train"));
    return 2;
  }
  setup_logging(log_level);
  const qwen3::CpuThreadChoice cpu = qwen3::apply_cpu_threads(threads);
  spdlog::debug("CPU threads: {} ({})", at::get_num_threads(), cpu.why);  // what libtorch now uses
  for (auto& c : commands)
    if (c.app->parsed()) {
      const int code = c.run();
      // Results go to stdout; a full device or a closed pipe must not pass for success (tokenize and generate
      // reported nothing on /dev/full). One check here covers every command.
      if (std::fflush(stdout) != 0 || std::ferror(stdout))
        throw qwen3::Error(std::string("cannot write the results to standard output: ") + std::strerror(errno));
      return code;
    }
  return 2;  // unreachable: require_subcommand(1)
}

// libtorch's own log lines (glog in Debian's libtorch, c10's logging in PyTorch's wheels) stay quiet unless the
// user asks for them with TORCH_CPP_LOG_LEVEL: c10d printed its socket warnings ("WARNING: Logging before
// InitGoogleLogging()", "[c10d] The server socket has failed to bind") above this tool's one named error.
void quiet_library_logs() {
  if (std::getenv("TORCH_CPP_LOG_LEVEL")) return;
#if defined(C10_USE_GLOG)
  FLAGS_minloglevel = 3;  // FATAL only
#else
  FLAGS_caffe2_log_level = 3;
#endif
}

}  // namespace

int qwen3::cli::run_command_line(int argc, char** argv) {
  quiet_library_logs();
  try {
    return parse_and_run(argc, argv);
  } catch (const qwen3::UsageError& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  } catch (const qwen3::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const c10::Error& e) {
    fmt::print(stderr, "error: {}\n", first_line_of(e.what_without_backtrace()));
    return 1;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", first_line_of(e.what()));
    return 1;
  }
}
