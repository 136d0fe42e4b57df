// The one-step memory report (`vram-report`, `train --vram-report`): a sample per phase of the first step with
// its duration, the measured figures (memory_probe.h) and the memory model's prediction, written as JSON in the
// original tool's shape (Pid, CreatedUtc, Samples[Phase, TimestampUtc, PidMemoryMiB, TotalMemoryMiB]) plus this
// tool's fields, and printed as a table.
#pragma once
#include <nlohmann/json.hpp>

#include <chrono>
#include <string>

#include "qwen3/trainer/memory_model.h"
#include "qwen3/memory/memory_probe.h"
#include "qwen3/trainer/step_time_model.h"

namespace qwen3::train_detail {

class StepMemoryReport {
 public:
  StepMemoryReport(std::string path, const c10::Device& device, nlohmann::json config);
  void set_plan(StepMemoryPlan plan) { plan_ = std::move(plan); }
  // The step-time model's figures, printed beside the measured durations (PredictedMs in the JSON).
  void set_time_plan(StepTimePlan plan) { time_plan_ = std::move(plan); }
  // Samples the phase that ends now, then resets the peaks for the next one.
  void phase(const std::string& name);
  // Writes the JSON file (atomically) and prints the table to stdout.
  void finish();
  const nlohmann::json& json() const { return report_; }

 private:
  std::string path_;
  MemoryProbe probe_;
  nlohmann::json report_;
  StepMemoryPlan plan_;
  StepTimePlan time_plan_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace qwen3::train_detail
