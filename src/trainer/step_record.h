// What one training step did, and the three places it is reported: the progress line (stderr), the metrics record
// (--metrics-jsonl, one JSON object a step) and TensorBoard's scalars (--tensorboard). docs/trainer.md.
#pragma once
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

#include "step_update.h"
#include "tensorboard_writer.h"

namespace qwen3::train_detail {

struct StepRecord {
  int64_t step = 0, steps = 0;  // 1-based step, of the run's total
  StepOutcome outcome;
  double lr = 0, ms = 0;
  int64_t tokens = 0;
  std::optional<double> eval_loss;
  double epoch = 0;            // epochs done after this step (fractional, as HF's Trainer logs it)
  std::optional<double> comm_wait_ms;  // data parallel: time this rank waited in all-reduces during the step
  double tflops = 0;           // model TFLOP/s achieved (model_flops_per_token: no recompute counted)
  std::optional<double> mfu;   // model FLOPs utilization; none on CPU, where there is no meaningful peak
  std::optional<double> peak_mem_mib;  // CUDA: the step's peak of allocated tensor memory
  double rss_mib = 0;                  // the process's resident memory at the step's end
  double tokens_per_second() const { return static_cast<double>(tokens) / (ms / 1000.0); }
};

// Now as ISO 8601 UTC with milliseconds: "2026-11-24T08:15:03.123Z".
std::string utc_timestamp();

void log_progress(const StepRecord& r, double eta_seconds);
// One line of --metrics-jsonl; Error naming `path` when the write fails.
void write_metrics(const StepRecord& r, std::ofstream& metrics, const std::string& path);
// The same scalars under the names Hugging Face's Trainer gives them in TensorBoard.
void write_tensorboard(const StepRecord& r, TensorBoardWriter& tb);

// A resume at `step`: the records of --metrics-jsonl after it are of steps the stopped run took past its last
// checkpoint, which this run trains again; they go (the file rewritten durably), as does a last line cut by the
// kill, so the file holds each step once, as Hugging Face's Trainer restores its log history from the checkpoint.
// Lines that are not records of later steps stay as they are. Returns how many lines went.
int64_t drop_metrics_after(const std::string& path, int64_t step);

}  // namespace qwen3::train_detail
