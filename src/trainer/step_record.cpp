// The step's record as the progress line, the metrics line and TensorBoard's scalars (step_record.h).
#include "step_record.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <utility>
#include <vector>

#include "qwen3/base/error.h"
#include "qwen3/base/file_io.h"
#include "qwen3/dat/durable_file.h"
#include "train_setup.h"

namespace qwen3::train_detail {

// Now as ISO 8601 UTC with milliseconds: "2026-11-24T08:15:03.123Z".
std::string utc_timestamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03d}Z", text, static_cast<int>(ms));
}

void log_progress(const StepRecord& r, double eta_seconds) {
  spdlog::info("step {}/{} | loss {:.4f}{} | norm {:.2f} | lr {:.1e} | {:.0f} ms | {} tok/s | {} | eta {}{}", r.step,
               r.steps, r.outcome.loss,
               r.outcome.router_aux_loss ? fmt::format(" | aux {:.4f}", *r.outcome.router_aux_loss) : "",
               r.outcome.norm, r.lr, r.ms, format_count(r.tokens_per_second()),
               r.mfu ? fmt::format("MFU {:.1f}% ({:.1f} TFLOP/s)", 100 * *r.mfu, r.tflops)
                     : fmt::format("{:.2f} TFLOP/s", r.tflops),
               format_duration(eta_seconds), r.eval_loss ? fmt::format(" | eval {:.4f}", *r.eval_loss) : "");
}

void write_metrics(const StepRecord& r, std::ofstream& metrics, const std::string& path) {
  nlohmann::json m = {{"step", r.step},     {"loss", r.outcome.loss}, {"grad_norm", r.outcome.norm},
                      {"lr", r.lr},         {"step_ms", r.ms},        {"tokens", r.tokens},
                      {"tok_per_s", r.tokens_per_second()},      {"skipped", r.outcome.bad},
                      {"epoch", r.epoch},   {"time", utc_timestamp()}};
  m["tflops"] = r.tflops;
  m["mfu"] = r.mfu ? nlohmann::json(*r.mfu) : nlohmann::json(nullptr);
  if (r.comm_wait_ms) m["comm_wait_ms"] = *r.comm_wait_ms;
  if (r.eval_loss) m["eval_loss"] = *r.eval_loss;
  if (r.peak_mem_mib) m["peak_mem_mib"] = *r.peak_mem_mib;
  if (r.outcome.router_aux_loss) m["router_aux_loss"] = *r.outcome.router_aux_loss;
  m["rss_mib"] = r.rss_mib;
  metrics << m.dump() << "\n" << std::flush;
  if (!metrics) throw Error(path + ": write failed (metrics; the device may be full)");
}

void write_tensorboard(const StepRecord& r, TensorBoardWriter& tb) {
  std::vector<std::pair<std::string, double>> s = {{"train/loss", r.outcome.loss},
                                                   {"train/grad_norm", r.outcome.norm},
                                                   {"train/learning_rate", r.lr},
                                                   {"train/tokens_per_second", r.tokens_per_second()},
                                                   {"train/tflops", r.tflops},
                                                   {"train/rss_mib", r.rss_mib},
                                                   {"train/epoch", r.epoch}};
  if (r.mfu) s.emplace_back("train/mfu", *r.mfu);
  if (r.peak_mem_mib) s.emplace_back("train/peak_mem_mib", *r.peak_mem_mib);
  if (r.eval_loss) s.emplace_back("eval/loss", *r.eval_loss);
  if (r.outcome.router_aux_loss) s.emplace_back("train/router_aux_loss", *r.outcome.router_aux_loss);
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  tb.add_scalars(r.step, now, s);
}

int64_t drop_metrics_after(const std::string& path, int64_t step) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return 0;
  std::ifstream in = open_input_file(path, "--metrics-jsonl");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(std::move(line));
  std::string kept;
  int64_t dropped = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const nlohmann::json record = nlohmann::json::parse(lines[i], nullptr, /*allow_exceptions=*/false);
    const bool torn = record.is_discarded() && i + 1 == lines.size();
    const bool later = record.is_object() && record.contains("step") && record["step"].is_number_integer() &&
                       record["step"].get<int64_t>() > step;
    if (torn || later) {
      ++dropped;
      continue;
    }
    kept += lines[i];
    kept += '\n';
  }
  if (dropped > 0) write_file_durably(path, kept);
  return dropped;
}

}  // namespace qwen3::train_detail
