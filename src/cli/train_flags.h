// The flags `train` and `vram-report` share: their values as given (TrainFlags), their registration, and their
// conversion into the trainer's options (docs/trainer.md, "Flag names", "Flag ranges", "Flag combinations").
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include "cli_common.h"
#include "qwen3/trainer/trainer.h"

namespace qwen3::cli {

struct TrainFlags {
  TrainOptions o;
  std::string model_dir, data_format = "auto", sample_mode = "random", pack_strategy = "best-fit",
              moments = "float32", scale_mode = "rne",
              system, test_prompt = "Who are you?", lr_schedule = "constant", master_dtype = "float32",
              compute_dtype = "auto", loss = "ce", keep_weight_operands = "auto", grad_checkpoint_blocks = "all";
  ChatTemplateFlags chat;
  std::string config_file;
  bool synthetic = false, overwrite = false;
  int64_t test_max_tokens = 0;
  std::string command = "train";  // whose flags these are, as its messages name it: train or vram-report
};

// Each size flag is in its range (flag_limit); their product is what a micro-batch holds. Before anything is
// loaded or made (train and vram-report).
void check_micro_batch(const TrainOptions& o);
// Flags that contradict each other or would be silently ignored, in both commands (docs/trainer.md, "Flag
// combinations"); check_micro_batch among them. `train` checks its run-length flags besides.
void check_shared_flag_combinations(const TrainFlags& f);
// The flags whose text becomes a typed option (shared by `train` and `vram-report --predict-only`).
void convert_flag_values(TrainFlags& f);
// The run's files and folders from the flags (--model-dir, --output-dir, --synthetic's weights), the output targets
// checked before anything loads, and convert_flag_values.
void resolve(TrainFlags& f);
// Every flag of `train`, shared with `vram-report` (which runs one step of the same configuration); returns the
// "Run" group, where a command adds its own.
CLI::Option_group* add_train_flags(CLI::App* sub, const std::shared_ptr<TrainFlags>& f);

}  // namespace qwen3::cli
