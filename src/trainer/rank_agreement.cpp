// Data-parallel ranks agree on the run before it starts (rank_agreement.h).
#include "rank_agreement.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "qwen3/base/error.h"
#include "qwen3/base/json_limits.h"
#include "qwen3/checkpoint/checkpoint.h"
#include "qwen3/dat/dat.h"
#include "qwen3/export/exporter.h"

namespace qwen3::train_detail {

// Ranks started with another --seq-len, --seed or data file trained and exited 0. Rank 0's hashes go to every rank (one broadcast), each marks what differs, and the marks are summed (one
// all-reduce), so every rank stops with the same message naming every differing option.
void check_ranks_agree(const TrainOptions& o, DataParallel& dp, const std::string& model_hash, const DatReader& reader,
                       const nlohmann::json& run) {
  if (dp.world_size() == 1) return;
  nlohmann::json defining = to_json(o);
  defining.erase("weights");
  defining.erase("config");
  defining["model layout"] = model_hash;
  defining["model weights (a sample of their values)"] = weights_sample_hash(reader);
  defining["tokenizer.json's content"] = file_content_hash(o.tokenizer);
  defining["--train-data's content"] = run["data"]["train"]["hash"];
  defining["--eval-data's content"] = run["data"].value("eval", nlohmann::json::object()).value("hash", "");
  std::vector<std::string> names;
  std::vector<int64_t> hashes;
  for (const auto& [name, value] : defining.items()) {  // sorted by name: the same order on every rank
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char c : value.dump()) h = (h ^ c) * 1099511628211ull;
    names.push_back(name);
    hashes.push_back(static_cast<int64_t>(h >> 1));
  }
  const at::Tensor mine = at::tensor(hashes, at::kLong);
  at::Tensor rank0 = mine.clone();
  dp.broadcast(rank0, 0, "defining options");
  std::vector<at::Tensor> differ = {mine.ne(rank0).to(at::kLong)};
  dp.all_reduce_sum(differ, "defining options");
  const at::Tensor counts = differ[0].to(at::kCPU);
  std::vector<std::string> differing;
  for (size_t i = 0; i < names.size(); ++i)
    if (counts[static_cast<int64_t>(i)].item<int64_t>() > 0) {
      differing.push_back(names[i]);
      if (hashes[i] != rank0[static_cast<int64_t>(i)].item<int64_t>())
        spdlog::error("rank {}: {} = {} differs from rank 0's", dp.rank(), names[i], json_excerpt(defining[names[i]]));
    }
  if (!differing.empty())
    throw Error(fmt::format("data parallel: the ranks were started with different {}: every rank must run the "
                            "same command (its files may sit at other paths, with the same content)",
                            fmt::join(differing, ", ")));
}

void check_ranks_resume_together(DataParallel& dp, int64_t step) {
  const std::vector<int64_t> steps = dp.all_gather(step, "resume step");
  if (std::adjacent_find(steps.begin(), steps.end(), std::not_equal_to<>()) != steps.end())
    throw Error(fmt::format("the ranks would resume at different steps ({}): give them one --checkpoint-dir on a "
                            "shared file system", fmt::join(steps, ", ")));
}

void check_replicas_identical(const TrainableSet& set, DataParallel& dp, int64_t step) {
  if (dp.world_size() == 1) return;
  uint64_t h = 1469598103934665603ull;
  for (const auto& p : set.params) {
    const at::Tensor t = p.param.detach().contiguous().to(at::kCPU);
    const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
    for (size_t i = 0, n = static_cast<size_t>(t.numel()) * t.element_size(); i < n; ++i)
      h = (h ^ bytes[i]) * 1099511628211ull;
  }
  const std::vector<int64_t> hashes = dp.all_gather(static_cast<int64_t>(h >> 1), "replica check");
  if (std::adjacent_find(hashes.begin(), hashes.end(), std::not_equal_to<>()) != hashes.end())
    throw Error("data parallel: the replicas' weights differ after step " + std::to_string(step) +
                " (a rank saw other data or another model?)");
  spdlog::info("data parallel: the {} replicas are bitwise identical", dp.world_size());
}

}  // namespace qwen3::train_detail
