// `vram-report`: one training step of the `train` flags, its memory per phase measured beside the memory model's,
// or (--predict-only) the memory and step-time models' figures alone (docs/memory.md, docs/performance.md).
#include <fmt/format.h>

#include <initializer_list>
#include <stdexcept>
#include <string>

#include "qwen3/base/error.h"
#include "qwen3/config/config.h"
#include "qwen3/memory/memory_probe.h"
#include "qwen3/trainer/memory_model.h"
#include "qwen3/trainer/step_prediction.h"
#include "qwen3/trainer/step_time_model.h"
#include "qwen3/trainer/trainer.h"
#include "train_flags.h"

namespace qwen3::cli {
namespace {

void print_memory_plan(const StepMemoryPlan& plan, const c10::Device& device) {
  constexpr double kMiB = 1024.0 * 1024.0;
  fmt::print("predicted memory of one step on {} (tensor MiB):\n", device.str());
  fmt::print("{:<22} {:>12} {:>12}\n", "phase", "peak", "at end");
  for (const auto& p : plan.phases) fmt::print("{:<22} {:>12.1f} {:>12.1f}\n", p.phase, p.peak / kMiB, p.end / kMiB);
  fmt::print("weights {:.1f}, moments {:.1f}, gradients {:.1f}, saved activations {:.1f} (NVFP4 codes {:.1f}, bf16 "
             "weight operands {:.1f}); peak {:.1f} MiB\n",
             plan.weights / kMiB, plan.moments / kMiB, plan.gradients / kMiB, plan.saved_activations / kMiB,
             plan.saved_codes / kMiB, plan.saved_operands / kMiB, plan.peak() / kMiB);
}

// `operand_update_g_per_s`: the element rate of the updates that write their weight's operand (0: none do).
void print_time_plan(const StepTimePlan& plan, const DeviceRates& rates, double update_g_per_s,
                     double operand_update_g_per_s) {
  const std::string operand_rate =
      operand_update_g_per_s > 0 ? fmt::format(" ({:.1f} where it writes the operand)", operand_update_g_per_s) : "";
  fmt::print("predicted time of one step on {} ({:g} bf16 / {:g} fp32 TFLOPS at {:.0f}%, {:g} GB/s at {:.0f}% for the "
             "update and {:.0f}% for the other passes{}{}):\n",
             plan.device, rates.bf16_tflops, rates.fp32_tflops, 100 * rates.matmul_efficiency, rates.memory_gbps,
             100 * rates.memory_efficiency, 100 * rates.pass_efficiency,
             update_g_per_s > 0
                 ? fmt::format(", the update at most {:g} G parameters/s{}", update_g_per_s, operand_rate)
                 : "",
             rates.unified_memory ? ", memory shared with the CPU" : "");
  // Each phase, then its terms as predict_step_time counts them (StepTerm: a term's ms at its kind's rate).
  fmt::print("{:<44} {:>12} {:>12} {:>12}\n", "phase", "GFLOP", "GB moved", "ms");
  for (const auto& p : plan.phases) {
    fmt::print("{:<44} {:>12.1f} {:>12.2f} {:>12.1f}\n", p.phase, p.flops / 1e9, p.bytes / 1e9, p.ms);
    for (const StepTerm& t : p.terms)
      fmt::print("  {:<42} {:>12.1f} {:>12.2f} {:>12.1f}\n", t.name, t.flops / 1e9, t.bytes / 1e9, t.ms);
  }
  fmt::print("step {:.1f} ms; compute floor {:.1f} ms (the products alone at the matmul rate: the step is {:.2f}x it)\n",
             plan.total_ms(), plan.floor_ms(), plan.floor_ms() > 0 ? plan.total_ms() / plan.floor_ms() : 0.0);
  const double with_update = plan.floor_ms() + plan.update_floor_ms;
  fmt::print("with the optimizer's own traffic (gradient, master, moments once each at the memory rate: {:.1f} ms): "
             "{:.1f} ms, the step {:.2f}x it\n",
             plan.update_floor_ms, with_update, with_update > 0 ? plan.total_ms() / with_update : 0.0);
}

// Where the device's memory is the machine's (GB10, or a CPU run): one number to hold against the machine, the
// tensors' predicted peak plus what this process holds before loading anything (libtorch's runtime, measured now).
void print_pool_prediction(const StepMemoryPlan& plan, const DeviceRates& rates) {
  if (!rates.unified_memory && rates.name != "cpu") return;
  const double runtime = static_cast<double>(process_rss_bytes()) / 1e9;
  const double tensors = static_cast<double>(plan.peak()) / 1e9;
  const double machine = rates.memory_gb > 0 ? rates.memory_gb : static_cast<double>(machine_memory_bytes()) / 1e9;
  fmt::print("one memory pool ({}): predicted {:.1f} GB of {:.1f} GB = tensors at their peak {:.1f} GB + {:.1f} GB of "
             "runtime (this process now){}\n",
             rates.unified_memory ? rates.name + ": the GPU's memory is the machine's" : "a CPU run",
             tensors + runtime, machine, tensors, runtime,
             rates.unified_memory ? "; a GPU run's CUDA context and kernels come on top: measure them with vram-report" : "");
}

// Removes flags from a command that shares `train`'s: they are then unknown there (exit 2) and out of its help.
void drop_flags(CLI::App* sub, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    CLI::Option* opt = sub->get_option_no_throw(name);
    if (!opt) throw std::logic_error(std::string("drop_flags: no flag ") + name);
    bool removed = sub->remove_option(opt);
    for (CLI::App* group : sub->get_subcommands([](CLI::App*) { return true; }))
      removed = removed || group->remove_option(opt);
    if (!removed) throw std::logic_error(std::string("drop_flags: cannot remove ") + name);
  }
}

}  // namespace

Command add_vram_report_command(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  f->command = "vram-report";
  auto out = std::make_shared<std::string>();
  auto predict_only = std::make_shared<bool>(false);
  auto* sub = app.add_subcommand(
      "vram-report", "Run one training step of the `train` flags and report memory per phase, measured and predicted");
  auto* run = add_train_flags(sub, f);
  // One step, and only the report written: a run's length, checkpoints, export and evaluation are not its.
  drop_flags(sub, {"--output-dat", "--test-max-tokens", "--test-prompt", "--eval-data", "--steps",
                   "--epochs", "--steps-per-epoch", "--checkpoint-dir", "--save-every-steps", "--keep-checkpoints",
                   "--resume", "--resume-if-present", "--eval-every", "--output-dir", "--allow-data-change",
                   "--mfu-device", "--dist-init", "--dist-timeout", "--tensorboard"});
  run->add_option("--out", *out, "write the report (JSON) here (a new file, or with --overwrite an old report)");
  // train's --overwrite, for what this command writes: the report, and --metrics-jsonl's previous lines.
  sub->get_option("--overwrite")
      ->description("replace an existing --out (never an input), and a previous run's --metrics-jsonl");
  add_bool_flag(run, "--predict-only", *predict_only,
                "print the memory and step-time models' figures for --config and the flags; load nothing, run nothing");
  run->add_option("--world-size", f->o.predict_world_size,
                  "with --predict-only: ranks of a data-parallel job (per-rank memory; with --shard-optimizer-state "
                  "a rank holds 1/N of the moments)")
      ->check(integer_in(1, flag_limit::ranks));
  run->add_option("--predict-device", f->o.predict_device,
                  "the device whose rates the step-time model uses: h100, h200, gb10 or cpu (default: cpu, or with "
                  "--device cuda the GPU it runs on: gb10, h200, else h100); with --predict-only also the memory "
                  "model's device")
      ->check(CLI::IsMember(predict_device_names()));
  return {sub, [f, out, predict_only]() {
            TrainOptions& o = f->o;
            check_shared_flag_combinations(*f);
            o.steps = 1;
            o.epochs = 0;
            if (*predict_only) {
              if (o.config.empty() && !f->model_dir.empty()) o.config = f->model_dir + "/config.json";
              if (o.config.empty()) throw UsageError("vram-report --predict-only: --config is required");
              convert_flag_values(*f);
              const Qwen3Config config = load_config(o.config);
              // With --predict-device the memory is that device's too (a GPU's unless cpu).
              const bool on_cpu = o.predict_device.empty() ? !c10::Device(o.device).is_cuda() : o.predict_device == "cpu";
              const c10::Device device = on_cpu ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA, 0);
              const StepPrediction prediction = predict(o, config, device);
              if (o.grad_checkpoint) fmt::print("activation checkpointing: {}\n", prediction.checkpoint.why);
              if (device.is_cuda()) {
                fmt::print("trained projections' product operands for backward: {}\n", prediction.operands.why);
                if (!prediction.operands.warning.empty()) fmt::print("warning: {}\n", prediction.operands.warning);
              }
              print_memory_plan(prediction.memory, device);
              print_time_plan(prediction.time, prediction.rates,
                              update_elements_per_s(prediction.rates, o.adamw.moments, o.master_dtype),
                              device.is_cuda() && prediction.operands.written_by_update()
                                  ? update_elements_per_s(prediction.rates, o.adamw.moments, o.master_dtype, true)
                                  : 0.0);
              // The memory model holds the update in flight beside backward; the time model has no figure yet for
              // how much of it hides there (docs/build.md, "After the round"), so it says it counts none.
              if (o.overlap_update && device.is_cuda())
                fmt::print("--overlap-update: the time above counts each block's update after its backward, as "
                           "without the flag: how much of it runs hidden beside the rest of backward is not "
                           "measured yet{}\n",
                           o.overlap_update_sms > 0
                               ? fmt::format(", nor what backward's products lose by leaving {} SMs to it "
                                             "(--overlap-update-sms)",
                                             o.overlap_update_sms)
                               : std::string());
              print_pool_prediction(prediction.memory, prediction.rates);
              return 0;
            }
            if (out->empty()) throw UsageError("vram-report: --out is required (or --predict-only)");
            o.vram_report = *out;
            resolve(*f);
            run_training(o);
            return 0;
          }};
}

}  // namespace qwen3::cli
