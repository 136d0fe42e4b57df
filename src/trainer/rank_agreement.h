// Data parallel: every rank must run the same training, or the replicas drift apart from the first step. What
// defines it: the options by name and the content of the model, the tokenizer and the data (their paths may
// differ between machines). Checked once at start; each rank throws the same Error naming every difference.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

#include "qwen3/dist/data_parallel.h"
#include "qwen3/trainer/trainer.h"
#include "train_setup.h"

namespace qwen3 {
class DatReader;
}

namespace qwen3::train_detail {

// `run`: the run record (its "data" section holds the data files' content hashes); `model_hash`: the layout's.
void check_ranks_agree(const TrainOptions& o, DataParallel& dp, const std::string& model_hash, const DatReader& reader,
                       const nlohmann::json& run);

// Every rank continues from the same step (a checkpoint folder each rank sees differently would not): an Error
// naming each rank's step otherwise.
void check_ranks_resume_together(DataParallel& dp, int64_t step);

// Data parallel keeps the replicas bitwise identical by construction (same data order, summed gradients, a
// stochastic-rounding stream that does not depend on the rank); checked at the end of every run: a hash of every
// trainable tensor's bytes, compared across the ranks. An Error naming `step` where they differ.
void check_replicas_identical(const TrainableSet& set, DataParallel& dp, int64_t step);

}  // namespace qwen3::train_detail
