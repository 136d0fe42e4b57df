// One training step under libtorch's profiler (`train --profile-step N`): what the step's time is made of, as a
// Chrome trace (chrome://tracing, ui.perfetto.dev) and as a table in the log. The step's phases (batch, forward,
// backward, optimizer: the trainer's phase marks) are profiler scopes of their own, closed after the device has
// finished their work, so every op and kernel falls in the phase that ran it. The trace is written by this
// module from the profiler's events rather than by libtorch's exporter, which needs a Kineto build (Debian's
// libtorch has none): the same file everywhere, with CUDA kernels where the libtorch records them.
// docs/trainer.md, "Profiling a step".
#pragma once
#include <c10/core/Device.h>

#include <memory>
#include <string>

namespace qwen3::train_detail {

class StepProfiler {
 public:
  StepProfiler(std::string trace_path, c10::Device device);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  void start();                  // before the step's batch
  void mark(const char* phase);  // a phase mark ("batch_ready", "forward_done", ...): the phase so far ends
  // After the step: stops the profiler, writes the trace durably and logs the phase and op tables.
  void finish(int64_t step);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qwen3::train_detail
