// --shard-optimizer-state: which rank holds each parameter's optimizer state, and the whole state streamed to the
// checkpoint writer tensor by tensor (docs/distributed.md). Apart from the trainer, which only asks for the two.
#pragma once
#include <vector>

#include "qwen3/dist/data_parallel.h"
#include "qwen3/optim/optim.h"
#include "trainer_checkpoint.h"

namespace qwen3::train_detail {

// The rank holding each parameter's state: largest first to the least loaded rank, so that the shares are within
// one tensor of each other and the same on every rank.
std::vector<int> assign_state_owners(const std::vector<OptimParam>& params, int world_size);

// Every parameter's optimizer state in `params`' order, as the checkpoint writer fetches it: the rank that holds a
// parameter's state (`owners`) broadcasts each of its tensors from `held` (this rank's optimizer); the others
// receive it into a buffer of one parameter's state (a one-parameter optimizer's), made when its first tensor is
// fetched and dropped after its last. `params`, `owners`, `held` and `dp` outlive the returned state.
StreamedState stream_optimizer_state(const std::vector<OptimParam>& params, const std::vector<int>& owners,
                                     const AdamW& held, const AdamWOptions& options, DataParallel& dp);

}  // namespace qwen3::train_detail
