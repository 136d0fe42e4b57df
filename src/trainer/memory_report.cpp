#include "memory_report.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "qwen3/dat/durable_file.h"
#include "qwen3/base/error.h"

namespace qwen3::train_detail {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// "2026-02-26T00:46:03.3073970Z", the original's format (seven fractional digits).
std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const auto since = now.time_since_epoch();
  const std::time_t seconds = std::chrono::duration_cast<std::chrono::seconds>(since).count();
  const auto ticks = std::chrono::duration_cast<std::chrono::nanoseconds>(since).count() % 1000000000 / 100;
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:07d}Z", text, ticks);
}

double mib(uint64_t bytes) { return static_cast<double>(bytes) / kMiB; }
double round1(double v) { return std::round(v * 10.0) / 10.0; }

nlohmann::json optional_mib(const std::optional<uint64_t>& bytes) {
  return bytes ? nlohmann::json(round1(mib(*bytes))) : nlohmann::json();
}

std::string cell(const nlohmann::json& v) { return v.is_null() ? "-" : fmt::format("{:.1f}", v.get<double>()); }

}  // namespace

StepMemoryReport::StepMemoryReport(std::string path, const c10::Device& device, nlohmann::json config)
    : path_(std::move(path)), probe_(device), last_(std::chrono::steady_clock::now()) {
  report_ = {{"Pid", static_cast<int64_t>(::getpid())},
             {"CreatedUtc", utc_now()},
             {"Device", device.str()},
             {"Config", std::move(config)},
             {"Samples", nlohmann::json::array()}};
  // Fail before the step, not after it.
  const std::string probe_file = path_ + ".tmp";
  if (!std::ofstream(probe_file)) throw Error(path_ + ": cannot open for writing (memory report)");
  std::filesystem::remove(probe_file);
}

void StepMemoryReport::phase(const std::string& name) {
  synchronize_device(probe_.device());  // the phase's kernels are done: its duration, not its launches
  const auto now = std::chrono::steady_clock::now();
  const MemoryReading r = probe_.read();
  const bool cpu = probe_.device().is_cpu();
  report_["Samples"].push_back({
      {"TimestampUtc", utc_now()},
      {"Phase", name},
      {"DurationMs", round1(std::chrono::duration<double, std::milli>(now - last_).count())},
      {"AllocatedMiB", round1(mib(r.allocated))},
      {"ReservedMiB", optional_mib(r.reserved)},
      {"PeakMiB", round1(mib(r.peak))},
      {"RssMiB", round1(mib(r.rss))},
      {"RssPeakMiB", round1(mib(r.rss_peak))},
      {"PredictedMiB", nullptr},  // filled by finish(): the plan is made after the first phases
      {"PredictedMs", nullptr},
      // The original's two fields: the process's memory (RSS on CPU, what the CUDA allocator holds on a GPU) and
      // the whole machine's (device) use.
      {"PidMemoryMiB", round1(mib(cpu ? r.rss : r.reserved.value_or(0)))},
      {"TotalMemoryMiB", optional_mib(r.device_used)},
      // The one number to hold against the machine's memory where the CPU and the device share it (a CPU run;
      // GB10): null on a discrete GPU.
      {"PoolPeakMiB", optional_mib(r.pool_peak)},
  });
  if (r.pool_total) report_["PoolTotalMiB"] = round1(mib(*r.pool_total));
  probe_.reset_peaks();
  last_ = std::chrono::steady_clock::now();
}

void StepMemoryReport::finish() {
  for (auto& sample : report_["Samples"])
    for (const auto& p : plan_.phases)
      if (sample["Phase"] == p.phase) sample["PredictedMiB"] = round1(mib(p.peak));
  for (auto& sample : report_["Samples"])
    for (const auto& p : time_plan_.phases)
      if (sample["Phase"] == p.phase) sample["PredictedMs"] = round1(p.ms);
  if (!time_plan_.device.empty()) {
    report_["PredictedTimeDevice"] = time_plan_.device;
    // Attention as the prediction counts it: packed rows' samples alone (the first batch's), or whole rows.
    report_["PredictedAttentionSquare"] = time_plan_.attention_square;
    report_["PredictedWholeRowsSquare"] = time_plan_.whole_rows_square;
    // The compute floor (the step's products alone at the matmul rate): what issue 28 holds the step against.
    report_["PredictedFloorMs"] = round1(time_plan_.floor_ms());
  }
  report_["RssPeakSinceStartMiB"] = round1(mib(probe_.read().rss_peak_since_start));
  report_["Predicted"] = {{"WeightsMiB", round1(mib(plan_.weights))},
                          {"MomentsMiB", round1(mib(plan_.moments))},
                          {"GradientsMiB", round1(mib(plan_.gradients))},
                          {"SavedActivationsMiB", round1(mib(plan_.saved_activations))},
                          {"PeakMiB", round1(mib(plan_.peak()))}};
  if (report_.contains("PoolTotalMiB")) {
    double pool_peak = 0;
    for (const auto& sample : report_["Samples"]) pool_peak = std::max(pool_peak, sample["PoolPeakMiB"].get<double>());
    report_["PoolPeakMiB"] = pool_peak;
  }
  write_file_durably(path_, report_.dump(2) + "\n");

  fmt::print("memory report ({}; tensor MiB: the {}):\n", report_["Device"].get<std::string>(),
             probe_.device().is_cpu() ? "counting CPU allocator" : "CUDA caching allocator");
  fmt::print("{:<22} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n", "phase", "ms",
             time_plan_.device.empty() ? "pred ms" : ("pred " + time_plan_.device).substr(0, 10), "allocated",
             "reserved", "peak", "predicted", "rss", "rss peak");
  for (const auto& s : report_["Samples"])
    fmt::print("{:<22} {:>10.1f} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n", s["Phase"].get<std::string>(),
               s["DurationMs"].get<double>(), cell(s["PredictedMs"]), cell(s["AllocatedMiB"]), cell(s["ReservedMiB"]),
               cell(s["PeakMiB"]), cell(s["PredictedMiB"]), cell(s["RssMiB"]), cell(s["RssPeakMiB"]));
  if (report_.contains("PoolTotalMiB")) {
    const double pool_peak = report_["PoolPeakMiB"].get<double>();
    const double total = report_["PoolTotalMiB"].get<double>();
    const bool cpu = probe_.device().is_cpu();
    fmt::print("one memory pool{}: this process's peak {:.1f} GB of the machine's {:.1f} GB (its RSS peak{})\n",
               cpu ? "" : " (the GPU's memory is the machine's)", pool_peak * kMiB / 1e9, total * kMiB / 1e9,
               cpu ? "" : " + the CUDA allocator's reserve");
  }
  fmt::print("report written to {}\n", path_);
}

}  // namespace qwen3::train_detail
