// Data parallel: every rank must run the same training, or the replicas drift apart from the first step. What
// defines it: the options by name and the content of the model, the tokenizer and the data (their paths may
// differ between machines). Checked once at start; each rank throws the same Error naming every difference.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

#include "qwen3/dist/data_parallel.h"
#include "qwen3/trainer/trainer.h"

namespace qwen3 {
class DatReader;
}

namespace qwen3::train_detail {

// `run`: the run record (its "data" section holds the data files' content hashes); `model_hash`: the layout's.
void check_ranks_agree(const TrainOptions& o, DataParallel& dp, const std::string& model_hash, const DatReader& reader,
                       const nlohmann::json& run);

}  // namespace qwen3::train_detail
