// --shard-optimizer-state's two pieces (optimizer_shards.h).
#include "optimizer_shards.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

namespace qwen3::train_detail {

std::vector<int> assign_state_owners(const std::vector<OptimParam>& params, int world_size) {
  std::vector<size_t> order(params.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return params[a].param.numel() > params[b].param.numel(); });
  std::vector<int64_t> load(static_cast<size_t>(world_size), 0);
  std::vector<int> owners(params.size(), 0);
  for (size_t i : order) {
    const auto least = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owners[i] = least;
    load[static_cast<size_t>(least)] += params[i].param.numel();
  }
  return owners;
}

StreamedState stream_optimizer_state(const std::vector<OptimParam>& params, const std::vector<int>& owners,
                                     const AdamW& held_by_rank, const AdamWOptions& options, DataParallel& dp) {
  // The state tensors' names are the parameter's name and a suffix the moment storage decides, not the shape.
  std::vector<std::string> suffixes;
  for (auto& [name, t] : AdamW({OptimParam{"p", at::zeros({1}), false}}, options).state_tensors())
    suffixes.push_back(name.substr(1));
  const size_t per_param = suffixes.size();
  StreamedState s;
  std::vector<size_t> held_at(params.size(), 0);  // where a parameter of this rank starts in `held`
  size_t next_held = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    for (const std::string& suffix : suffixes) s.names.push_back(params[i].name + suffix);
    if (owners[i] == dp.rank()) {
      held_at[i] = next_held;
      next_held += per_param;
    }
  }
  auto held = std::make_shared<std::vector<std::pair<std::string, at::Tensor>>>(held_by_rank.state_tensors());
  auto receiving = std::make_shared<std::vector<std::pair<std::string, at::Tensor>>>();
  s.fetch = [&params, &owners, &dp, options, per_param, held_at, held, receiving](size_t k) {
    const size_t i = k / per_param, j = k % per_param;
    const OptimParam& p = params[i];
    const bool mine = owners[i] == dp.rank();
    if (!mine && j == 0) *receiving = AdamW({OptimParam{p.name, p.param.detach(), p.decay}}, options).state_tensors();
    at::Tensor t = mine ? (*held)[held_at[i] + j].second : (*receiving)[j].second;
    dp.broadcast(t, owners[i], "optimizer state");
    if (!mine && j + 1 == per_param) receiving->clear();  // the caller's handle is the last one
    return t;
  };
  return s;
}

}  // namespace qwen3::train_detail
