// The training loop (`qwen3-train train`): data → STE forward → loss → backward → clip → AdamW, with progress
// lines, JSONL metrics, atomic checkpoints, exact resume, signal handling, and an export at the end.
#pragma once
#include <nlohmann/json.hpp>

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "qwen3/base/slow_paths.h"
#include "qwen3/data/data.h"
#include "qwen3/nvfp4/nvfp4.h"
#include "qwen3/optim/optim.h"

namespace qwen3 {

// Options as types: the CLI parses the flag's text once (parse_*: UsageError naming the choices); checkpoints
// and reports store the names (to_string), never ordinals.
enum class MasterDtype { float32, bfloat16 };          // --master-dtype
enum class ComputeDtype { auto_select, float32, bfloat16 };  // --compute-dtype auto|float32|bfloat16
enum class LossKind { cross_entropy, scalar_l1 };      // --loss ce|scalar
// --keep-weight-operands auto|off|backward|recompute|always
enum class KeepWeightOperands { auto_select, off, backward, recompute, always };
const char* to_string(MasterDtype dtype);
const char* to_string(ComputeDtype dtype);
const char* to_string(LossKind kind);
const char* to_string(KeepWeightOperands keep);
MasterDtype parse_master_dtype(const std::string& name);
ComputeDtype parse_compute_dtype(const std::string& name);
LossKind parse_loss_kind(const std::string& name);
KeepWeightOperands parse_keep_weight_operands(const std::string& name);

struct TrainOptions {
  std::string weights, config, tokenizer;
  std::string tokenizer_config;                // --tokenizer-config: else the one beside the tokenizer
  std::optional<ChatTemplate> chat_template;   // --chat-template: overrides the tokenizer config's
  DataOptions data;  // path = --train-data
  int64_t steps = 0;            // total optimizer steps; 0: from epochs
  int64_t epochs = 0;           // with steps == 0: epochs × steps_per_epoch
  int64_t steps_per_epoch = 0;  // 0: one pass over the data per epoch
  LrSchedule schedule;          // lr, kind, warmup, min_lr (total_steps is filled in)
  AdamWOptions adamw;
  MasterDtype master_dtype = MasterDtype::float32;
  // The activations' dtype (products, residual stream); auto is bfloat16 on CUDA and the master dtype on CPU
  // (docs/trainer.md says why).
  ComputeDtype compute_dtype = ComputeDtype::auto_select;
  // The device whose rates the step-time model uses in the memory report (h100 | h200 | gb10 | cpu; empty:
  // cpu on a CPU, h100 on CUDA).
  std::string predict_device;
  double grad_clip = 1.0;                // 0: off
  LossKind loss = LossKind::cross_entropy;
  int64_t train_last_layers = 0;         // <= 0: every parameter
  bool freeze_embeddings = false;
  bool train_lm_head = false;
  bool decay_norms_and_embeddings = false;
  bool grad_checkpoint = false;  // recompute each block in backward instead of keeping its activations
  // --grad-checkpoint-blocks: how many blocks, from the first, --grad-checkpoint recomputes; the others keep their
  // graph (the same gradients either way, bit for bit). kCheckpointAllBlocks: every block. kCheckpointBlocksAuto: as
  // few as keep the memory model's step within kWeightOperandsMemoryShare of the device's memory
  // (choose_checkpoint_blocks, step_prediction.h), decided before the first step; the models read it as all.
  static constexpr int64_t kCheckpointAllBlocks = -1, kCheckpointBlocksAuto = -2;
  int64_t grad_checkpoint_blocks = kCheckpointAllBlocks;
  bool fused_optimizer = false;  // update each block in backward and free its gradients (docs/trainer.md)
  // With fused_optimizer on CUDA: the blocks' updates on a stream of their own, beside the rest of backward.
  bool overlap_update = false;
  // With overlap_update: while backward runs, its cuBLAS products target this many fewer SMs than the device has,
  // leaving them to the updates beside them (0: every SM; libtorch 2.8+; src/trainer/product_sm_carveout.h).
  int64_t overlap_update_sms = 0;
  // Each trained projection's bf16 product operand deq(Q(W)) on CUDA at training shapes (the same bytes trained
  // whatever is chosen; docs/trainer.md, "Weight operands"): off holds its NVFP4 codes for backward, which
  // dequantizes them; backward holds the operand forward made until its backward's dX (2 bytes an element where
  // the codes take 0.5625; under --grad-checkpoint the first forward's, which the recompute multiplies too);
  // recompute (--grad-checkpoint only) holds the operand each block's recompute makes, one block at a time;
  // always keeps it across steps, written by the update that steps the weight, so forward makes none. auto: where
  // the memory model says the step still fits, backward, else under --grad-checkpoint recompute (where only some
  // blocks are recomputed, if the step fits with it) and otherwise off (choose_weight_operands, step_prediction.h).
  KeepWeightOperands keep_weight_operands = KeepWeightOperands::auto_select;
  // Micro-batches per optimizer step; the loss is the mean over all their loss tokens (not with fused_optimizer).
  int64_t grad_accum_steps = 1;
  std::string vram_report;       // write the first step's per-phase memory report (JSON) here
  // Run global step `profile_step` (1-based; 0: none) under libtorch's profiler: a Chrome trace to profile_out
  // and the phase and op tables in the log (docs/trainer.md, "Profiling a step").
  int64_t profile_step = 0;
  std::string profile_out;
  // Frozen block projections held as NVFP4 codes only (the same bytes in forward); false keeps them dense,
  // which only the test comparing the two uses.
  bool frozen_projections_as_codes = true;
  nvfp4::ScaleMode scale_mode = nvfp4::ScaleMode::rne;
  std::string device = "cpu";
  int64_t log_every = 1;
  std::string metrics_jsonl;
  std::string tensorboard_dir;  // --tensorboard: TensorBoard event files of the metrics' scalars, step by step
  std::string eval_data;
  int64_t eval_every = 0;
  std::string checkpoint_dir;
  int64_t save_every_steps = 0;  // 0: only at the end (and on a signal)
  int64_t keep_checkpoints = 2;
  bool resume = false;             // an error when --checkpoint-dir holds no checkpoint ...
  bool resume_if_present = false;  // ... unless this: then training starts from the weights
  int64_t max_skipped_steps = 10;
  std::string output_dat;
  // A resume of a finished run (its newest checkpoint at --steps) whose --output-dat is there, without
  // --overwrite: the export is that run's, left as it is. Nothing trains, so nothing is written; a resume that
  // does train (the newest checkpoint was passed over) refuses the existing file before its first step.
  bool output_dat_of_finished_run = false;
  // run.json is written here too (the CLI's --output-dir, which also defaults the checkpoint folder, the
  // metrics file and the export into it).
  std::string output_dir;
  bool allow_data_change = false;  // --resume on training data that differs from the checkpoint's
  // A previous run's files in the run's folders (--overwrite): removed once setup has succeeded, before the first
  // step, each named in the log (the CLI lists them; docs/trainer.md "Runs as files").
  std::vector<std::string> replace_previous_run;
  // What the caller knows of the run for run.json: the tool, its git hash, the command line, every flag.
  nlohmann::json run_info = nlohmann::json::object();
  std::string mfu_device;  // whose bf16 peak the metrics' MFU is against on CUDA (default: default_rates_name)
  // Data parallel (docs/distributed.md): the ranks come from the launcher's environment; "file://PATH" joins
  // through a file instead of MASTER_ADDR:MASTER_PORT. A collective waits at most dist_timeout_s for the others.
  std::string dist_init;
  int64_t dist_timeout_s = 300;
  // ZeRO-1: each rank keeps the optimizer state of its share of the parameters, updates those, and sends
  // them to the others (docs/distributed.md). Checkpoints stay world-size independent.
  bool shard_optimizer_state = false;
  // The memory model's ranks (vram-report --world-size; the trainer sets its own): with shard_optimizer_state a
  // rank holds 1/N of the moments.
  int64_t predict_world_size = 1;
};

// The options that shape a run, by name (never ordinals): the memory report's "config", and the subset a
// checkpoint stores to refuse an incompatible resume.
nlohmann::json to_json(const TrainOptions& options);

struct TrainSummary {
  int64_t steps_done = 0;        // steps run in this invocation
  int64_t final_step = 0;        // global step count at the end
  int64_t run_steps = 0;         // the step the run ends at (--steps, or what --epochs make)
  int64_t skipped_steps = 0;
  double first_loss = 0, last_loss = 0;
  double mean_step_ms = 0;
  double tokens_per_second = 0;
  int stop_signal = 0;           // SIGINT/SIGTERM that ended training early, else 0
  std::string last_checkpoint;
  int64_t checkpoints_saved = 0;  // in this invocation; a step already on disk is never saved again
  // What the memory options did (diagnostics the tests observe): block forwards re-run in backward by
  // --grad-checkpoint, and forward products that used a frozen projection's NVFP4 codes instead of a master.
  int64_t recomputed_blocks = 0;
  int64_t frozen_code_products = 0;
  std::string exported;
  // Every slower path the run's steps took on a GPU, with its count (docs/trainer.md, "Slow paths").
  std::vector<SlowPath> slow_paths;
};

// Called with the global step count after each step, before the stop request is polled: a caller that sets it
// there stops at an exact step (the tests do; a signal handler stops wherever it lands).
using AfterStep = std::function<void(int64_t step)>;

// How SIGINT/SIGTERM reach a run (the command line's handler, train_cmd.cpp, sets `signal`). While `in_steps`
// (the trainer sets it around its step loop) the run stops at the next point where its state is whole: after
// the step under way, or in one process before the next micro-batch of a step or the next batch of its
// evaluation (an unfinished step is not applied: resuming runs it again), and saves a checkpoint. Outside the
// loop (set-up, the last save, the export) the handler ends the process at once, as it does on a second signal:
// every file a run writes is replaced atomically, so ending there loses nothing saved (kill -9 is as safe).
struct StopRequest {
  std::atomic<int> signal{0};          // 0: keep going
  std::atomic<bool> in_steps{false};
};

TrainSummary run_training(const TrainOptions& options, StopRequest* stop = nullptr, const AfterStep& after_step = {});

}  // namespace qwen3
