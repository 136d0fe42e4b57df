#include "step_profiler.h"

#include <ATen/record_function.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include "qwen3/base/error.h"
#include "qwen3/dat/durable_file.h"
#include "qwen3/memory/memory_probe.h"

namespace qwen3::train_detail {
namespace {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

constexpr std::string_view kPhasePrefix = "qwen3 phase: ";

// The phase that follows a mark; its scope name is a literal because the profiler keeps the pointer.
const char* phase_after(std::string_view mark) {
  if (mark == "start") return "qwen3 phase: batch";
  if (mark == "batch_ready") return "qwen3 phase: forward";
  if (mark == "forward_done") return "qwen3 phase: backward";
  if (mark == "backward_done") return "qwen3 phase: optimizer";
  return nullptr;  // optimizer_step_done: the step is over
}

// PyTorch 2.x times events in ns (startNs), 1.13 in us (startUs): whichever the libtorch has.
template <typename E>
auto start_ns(const E& e, int) -> decltype(e.startNs()) { return e.startNs(); }
template <typename E>
uint64_t start_ns(const E& e, long) { return static_cast<uint64_t>(e.startUs()) * 1000; }
template <typename E>
auto duration_ns(const E& e, int) -> decltype(e.durationNs()) { return e.durationNs(); }
template <typename E>
uint64_t duration_ns(const E& e, long) { return static_cast<uint64_t>(e.durationUs()) * 1000; }

struct Event {
  std::string name;
  bool on_gpu = false;
  int device = 0;
  uint64_t thread = 0;
  double start_us = 0, dur_us = 0, self_us = 0;
  bool phase = false;
};

// Self time: an op's time minus that of the ops it called, nested on the same thread by their intervals.
void compute_self_times(std::vector<Event>& events) {
  std::map<std::tuple<bool, int, uint64_t>, std::vector<size_t>> lanes;
  for (size_t i = 0; i < events.size(); ++i)
    if (!events[i].phase) lanes[{events[i].on_gpu, events[i].device, events[i].thread}].push_back(i);
  for (auto& [lane, idx] : lanes) {
    std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
      return events[a].start_us != events[b].start_us ? events[a].start_us < events[b].start_us
                                                      : events[a].dur_us > events[b].dur_us;
    });
    std::vector<size_t> open;
    for (size_t i : idx) {
      Event& e = events[i];
      e.self_us = e.dur_us;
      while (!open.empty() && events[open.back()].start_us + events[open.back()].dur_us <= e.start_us) open.pop_back();
      if (!open.empty()) events[open.back()].self_us -= e.dur_us;
      open.push_back(i);
    }
  }
  for (Event& e : events) e.self_us = std::max(0.0, e.self_us);
}

struct OpTotal {
  int64_t calls = 0;
  double self_us = 0;
};

}  // namespace

struct StepProfiler::Impl {
  Impl(std::string trace_path, c10::Device on) : path(std::move(trace_path)), device(on) {}
  std::string path;
  c10::Device device;
  bool running = false;
  std::optional<at::RecordFunction> scope;

  void open_phase(const char* name) {
    scope.reset();
    if (!name) return;
    scope.emplace(at::RecordScope::USER_SCOPE);
    if (scope->isActive()) scope->before(name);
  }
};

StepProfiler::StepProfiler(std::string trace_path, c10::Device device)
    : impl_(std::make_unique<Impl>(std::move(trace_path), device)) {}

StepProfiler::~StepProfiler() {
  if (!impl_->running) return;
  impl_->scope.reset();
  try {
    profiler::disableProfiler();  // a step that threw: stop recording, write nothing
  } catch (...) {
  }
}

void StepProfiler::start() {
  std::set<ActivityType> activities{ActivityType::CPU};
  if (impl_->device.is_cuda()) activities.insert(ActivityType::CUDA);
  const ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/false, /*profile_memory=*/false);
  synchronize_device(impl_->device);
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
  impl_->running = true;
  impl_->open_phase(phase_after("start"));
}

void StepProfiler::mark(const char* phase) {
  if (!impl_->running) return;
  synchronize_device(impl_->device);  // the phase's kernels ran inside its scope
  impl_->open_phase(phase_after(phase));
}

void StepProfiler::finish(int64_t step) {
  if (!impl_->running) return;
  synchronize_device(impl_->device);
  impl_->scope.reset();
  const std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
  impl_->running = false;

  std::vector<Event> events;
  double t0 = -1;
  for (const auto& k : result->events()) {
    Event e;
    e.name = k.name();
    e.on_gpu = k.deviceType() == c10::DeviceType::CUDA;
    e.device = static_cast<int>(k.deviceIndex());
    e.thread = k.startThreadId();
    e.start_us = static_cast<double>(start_ns(k, 0)) / 1000.0;
    e.dur_us = static_cast<double>(duration_ns(k, 0)) / 1000.0;
    e.phase = std::string_view(e.name).substr(0, kPhasePrefix.size()) == kPhasePrefix;
    // On CUDA the profiler also reports each scope as a device-side annotation spanning its kernels: the same
    // phase a second time (the first GPU round's table listed every phase twice and summed both).
    if (e.phase && e.on_gpu) continue;
    if (e.phase) e.name = e.name.substr(kPhasePrefix.size());
    if (t0 < 0 || e.start_us < t0) t0 = e.start_us;
    events.push_back(std::move(e));
  }
  compute_self_times(events);

  // The trace: one process per device kind, phases on a track of their own.
  nlohmann::json trace = nlohmann::json::array();
  const bool any_gpu = std::any_of(events.begin(), events.end(), [](const Event& e) { return e.on_gpu; });
  trace.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 0}, {"args", {{"name", "qwen3-train step"}}}});
  if (any_gpu) trace.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 1}, {"args", {{"name", "GPU"}}}});
  trace.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", 0}, {"args", {{"name", "phases"}}}});
  for (const Event& e : events) {
    trace.push_back({{"name", e.name},
                     {"cat", e.phase ? "phase" : e.on_gpu ? "kernel" : "cpu_op"},
                     {"ph", "X"},
                     {"ts", e.start_us - t0},
                     {"dur", e.dur_us},
                     {"pid", e.on_gpu ? 1 : 0},
                     {"tid", e.phase ? 0 : e.thread + (e.on_gpu ? 0 : 1)}});
  }
  write_file_durably(impl_->path, nlohmann::json{{"traceEvents", trace},
                                                 {"displayTimeUnit", "ms"},
                                                 {"otherData", {{"step", step}, {"device", impl_->device.str()}}}}
                                      .dump() +
                                      "\n");

  // The tables: each phase with the ops that took most of its time, then the step's top ops.
  double step_us = 0;
  for (const Event& e : events)
    if (e.phase) step_us += e.dur_us;
  auto top = [&](auto&& in_scope, size_t n) {
    std::map<std::pair<bool, std::string>, OpTotal> totals;
    for (const Event& e : events)
      if (!e.phase && in_scope(e)) {
        OpTotal& t = totals[{e.on_gpu, e.name}];
        ++t.calls;
        t.self_us += e.self_us;
      }
    std::vector<std::pair<std::pair<bool, std::string>, OpTotal>> v(totals.begin(), totals.end());
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.self_us > b.second.self_us; });
    if (v.size() > n) v.resize(n);
    return v;
  };
  spdlog::info("profile of step {}: {:.1f} ms in its phases, {} events; trace {}", step, step_us / 1000.0,
               events.size(), impl_->path);
  spdlog::info("{:<10} {:>10} {:>7}  most self time (ms)", "phase", "ms", "share");
  for (const Event& p : events) {
    if (!p.phase) continue;
    std::string most;
    for (const auto& [key, t] :
         top([&](const Event& e) { return e.start_us >= p.start_us && e.start_us < p.start_us + p.dur_us; }, 3))
      most += fmt::format("{}{}{} {:.2f}", most.empty() ? "" : ", ", key.first ? "[gpu] " : "", key.second,
                          t.self_us / 1000.0);
    spdlog::info("{:<10} {:>10.2f} {:>6.1f}%  {}", p.name, p.dur_us / 1000.0,
                 step_us > 0 ? 100.0 * p.dur_us / step_us : 0.0, most);
  }
  spdlog::info("{:<48} {:>6} {:>7} {:>10} {:>7}", "op (self time)", "device", "calls", "ms", "share");
  for (const auto& [key, t] : top([](const Event&) { return true; }, 15))
    spdlog::info("{:<48} {:>6} {:>7} {:>10.2f} {:>6.1f}%", key.second.substr(0, 48), key.first ? "gpu" : "cpu",
                 t.calls, t.self_us / 1000.0, step_us > 0 ? 100.0 * t.self_us / step_us : 0.0);
}

}  // namespace qwen3::train_detail
