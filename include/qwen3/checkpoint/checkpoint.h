// Training checkpoints: a directory `step-NNNNNNNN/` holding `checkpoint.json` (magic, format version, model
// hash, counters, flags that must match on resume) and `tensors.dat` (master weights, optimizer state, RNG
// states, in the project's own .dat container). Written to a temporary directory beside it, fsynced, then
// renamed: a crash or kill -9 at any moment leaves the previous checkpoints intact and never a partial one
// under a `step-*` name.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "qwen3/base/error.h"
#include "qwen3/nvfp4/nvfp4.h"

namespace qwen3 {

class DatReader;

constexpr const char* kCheckpointMagic = "qwen3-train-checkpoint";
constexpr int kCheckpointFormatVersion = 1;
// The most steps a run has (train's --steps range, docs/trainer.md): a checkpoint counting more is damaged.
constexpr int64_t kMaxCheckpointStep = 1'000'000'000;
// The tensor names the trainer gives the master weights of the trained tensors: prefix + model key.
constexpr const char* kMasterWeightPrefix = "master/";

// load_checkpoint's refusal of a tensor whose bytes differ from the hash saved with them: the file changed after
// it was written (a disk, a copy). --resume passes over such a checkpoint to an older one, as over one holding
// non-finite values; anything else reading it stops with exit 1.
class CheckpointDamaged : public Error {
 public:
  using Error::Error;
};

// The hash checkpoint.json keeps of each tensor's stored bytes ("tensor_hashes", 16 hex digits). Written by hand:
// one function, four multiply-rotate lanes over 64-bit words (21 GB/s on one dev-2c core, above a copy of the same
// bytes: bench_dat's BM_TensorBytesHash; so a 4B model's 48 GB of master and moments add about 2 s to a save and
// to a resume), where a hashing library would be one more package for every build
// lane and for the GPU machine, which has no network. It finds a disk's or a copy's changes; it is no defence
// against someone who means to forge a file.
std::string tensor_bytes_hash(const void* data, size_t bytes);

struct CheckpointState {
  int64_t step = 0;            // optimizer steps completed (including skipped ones)
  int64_t optimizer_steps = 0; // steps the optimizer applied
  int64_t skipped_steps = 0;
  std::string model_hash;      // ties the checkpoint to its input .dat + config
  nlohmann::json flags;        // training flags that must agree on resume (dtypes, trainable set, ...)
  nlohmann::json extra;        // anything else worth keeping (loss history tail, timing)
  std::vector<std::pair<std::string, at::Tensor>> tensors;  // CPU or device tensors; saved as they are
  // Entries of `tensors` left undefined are fetched while the file is written, in order, one at a time, and let
  // go once written: a state gathered from other ranks never lies whole in one process (--shard-optimizer-state).
  // Called with the entry's index.
  std::function<at::Tensor(size_t index)> fetch;
};

// What `export` needs to rebuild a .dat from a checkpoint without the training flags. The trainer writes it into
// checkpoint.json's "extra"; `export` and resume read it back typed (older checkpoints lack it, or its sample hash).
struct ExportInfo {
  std::string weights_hash;                        // the input .dat's keys, types and shapes
  std::optional<std::string> weights_sample_hash;  // a sample of its stored values
  bool tied_head = false;                          // lm_head is written from the trained embedding
  nvfp4::ScaleMode scale_mode = nvfp4::ScaleMode::rne;
  nlohmann::json config;                           // the model's config.json as trained (for the record)

  nlohmann::json to_json() const;
  // nullopt when `extra` holds no export information (an older checkpoint); Error naming `origin` for a field of
  // the wrong type or an unknown scale mode.
  static std::optional<ExportInfo> from_json(const nlohmann::json& extra, const std::string& origin);
};

// Writes `dir/step-<step>/` atomically and removes all but the newest `keep` complete checkpoints (keep <= 0:
// keep all). Returns the checkpoint's path.
std::string save_checkpoint(const std::string& dir, const CheckpointState& state, int keep);

// The newest complete checkpoint in `dir`, if any.
std::optional<std::string> latest_checkpoint(const std::string& dir);
// An exclusive lock on a checkpoint directory for as long as it lives (flock on `dir/.lock`, which holds the
// holder's pid): two trainers on one directory would delete each other's checkpoints. Creates the directory;
// Error naming the holder's pid when another process has it, or why the directory is not usable.
class CheckpointDirLock {
 public:
  explicit CheckpointDirLock(const std::string& dir);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  int fd_ = -1;
};

// Every complete checkpoint of `dir`, oldest first.
std::vector<std::string> complete_checkpoint_paths(const std::string& dir);

// The first floating-point tensor of `state` holding a NaN or an infinity, or nothing: a state that must not be
// saved (it would rotate out the good checkpoints) nor resumed from. Entries still to be fetched are not looked at.
std::optional<std::string> first_nonfinite_tensor(const CheckpointState& state);

// Reads a checkpoint directory; tensors come back as CPU tensors in their saved dtypes, only those whose name
// starts with `tensor_prefix` (e.g. kMasterWeightPrefix: export needs no optimizer state, which can be twice
// the model). Throws Error naming the path for a missing/corrupt file, a wrong magic or an unknown version.
CheckpointState load_checkpoint(const std::string& path, const std::string& tensor_prefix = "");

// FNV-1a 64 of a string, as 16 hex digits: stable across builds and machines.
std::string stable_hash(const std::string& text);

// FNV-1a 64 of a file's bytes (streamed), as 16 hex digits: what run.json and a checkpoint record of the
// training data, so that --resume notices other data. Error naming the file when it cannot be read.
std::string file_content_hash(const std::string& path);

// A .dat file's layout (keys, element types, shapes) as a stable hash: how a checkpoint names its input file.
std::string weights_hash(const DatReader& reader);

}  // namespace qwen3
