// The trainer's checkpoints: what a checkpoint of a run holds (master weights, optimizer state, the random
// stream, the resume flags, the export information and run.json), restoring the newest good one, and the saver
// that writes them during a run (docs/trainer.md "Checkpoints and resume").
#pragma once
#include <ATen/core/Tensor.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "qwen3/checkpoint/checkpoint.h"
#include "qwen3/optim/optim.h"
#include "qwen3/trainer/trainer.h"
#include "train_setup.h"

namespace qwen3::train_detail {

// Names in a checkpoint's tensors: the optimizer state under kOptimPrefix, the random stream's state as kRngKey
// (the master weights under checkpoint.h's kMasterWeightPrefix).
constexpr const char* kOptimPrefix = "optim/";
constexpr const char* kRngKey = "rng/stochastic_rounding";

// The optimizer state of a run whose ranks share it out (--shard-optimizer-state), as the checkpoint writer
// takes it: every tensor's name in order, and the fetch of the k-th, in which every rank takes part (the holder
// sends it); rank 0 writes what it returns and lets it go before the next.
struct StreamedState {
  std::vector<std::string> names;
  std::function<at::Tensor(size_t k)> fetch;
};

// A checkpoint of the run at `step`; `streamed`: the optimizer state when the ranks share it out (its entries
// are then fetched while the file is written).
CheckpointState make_checkpoint(const TrainableSet& set, const AdamW& opt, int64_t step, int64_t skipped,
                                const std::string& hash, const TrainOptions& o, const ExportInfo& export_info,
                                const nlohmann::json& run, int world_size, const StreamedState* streamed);

// Where --resume continues: the newest complete checkpoint whose weights and state are finite (a poisoned one,
// from before that check existed or written by hand, is passed over with a warning), restored into the trainable
// set and the optimizer. None: an error, unless --resume-if-present (then step 0 from the weights).
struct ResumePoint {
  int64_t step = 0, skipped = 0;
  std::string path;  // empty when starting from the weights
  // The options a resume may change (the learning rate, its schedule, ...) that this run did change, against
  // the run that saved the checkpoint: {name: {"checkpoint": then, "now": now}} (changed_since_checkpoint).
  nlohmann::json changed = nlohmann::json::object();
};

// The options of `now` (run.json's "options") that differ from those of the run that saved a checkpoint
// (`saved`, its copy of run.json), but for those that do not change what is trained: paths, the device, the
// memory-for-time choices whose bytes are the same, and the run's length under a constant rate (a cosine or
// linear decay is drawn over it, so there it is named; docs/trainer.md, "Checkpoints and resume").
// A resume must agree on the others (resume_flags) or is refused before this is asked.
nlohmann::json changed_since_checkpoint(const nlohmann::json& saved, const nlohmann::json& now);

ResumePoint restore_newest(const TrainOptions& o, TrainableSet& set, AdamW& opt, const std::string& hash,
                           const std::string& sample_hash, const nlohmann::json& run, int world_size);

// Checkpoints of a run: atomic saves (save_checkpoint), never of a poisoned state, and never twice of one step —
// the step on disk already (the one resumed from, or the last saved) is not rewritten (a signal right after
// --save-every-steps saved, or --steps at or below the resumed step, would only rewrite the same state).
class CheckpointSaver {
 public:
  CheckpointSaver(const TrainOptions& o, const TrainableSet& set, const AdamW& opt, std::string hash,
                  ExportInfo export_info, nlohmann::json run, int world_size, std::string resumed_from,
                  int64_t resumed_step)
      : o_(o), set_(set), opt_(opt), hash_(std::move(hash)), export_info_(std::move(export_info)),
        run_(std::move(run)), world_size_(world_size), last_(std::move(resumed_from)),
        step_on_disk_(last_.empty() ? -1 : resumed_step) {}

  // `streamed`: the optimizer state when the ranks share it out (--shard-optimizer-state). Every rank calls
  // this then, at the same steps; only the one with `write` writes, the others take part in each fetch.
  void save(int64_t step, int64_t skipped, const StreamedState* streamed = nullptr, bool write = true);
  const std::string& last() const { return last_; }  // the newest complete checkpoint of this run (or resumed)
  int64_t saved() const { return saved_; }

 private:
  const TrainOptions& o_;
  const TrainableSet& set_;
  const AdamW& opt_;
  std::string hash_;
  ExportInfo export_info_;
  nlohmann::json run_;
  int world_size_;
  std::string last_;
  int64_t step_on_disk_;
  int64_t saved_ = 0;
};

}  // namespace qwen3::train_detail
