#include "qwen3/trainer/evaluate.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <vector>

#include "qwen3/base/error.h"
#include "qwen3/model/lm_loss.h"

namespace qwen3 {

Evaluation evaluate(Qwen3Model& model, const TrainingData& data, int part, int parts,
                    const std::function<bool()>& stop) {
  if (data.options().pack) throw Error("evaluation needs padded rows: packed rows mix samples");
  c10::NoGradGuard no_grad;
  Evaluation out;
  double weighted = 0;
  for (int64_t i = part; i < data.batches_per_epoch(); i += std::max(parts, 1)) {
    if (stop && stop()) {
      out.stopped = true;
      break;
    }
    const Batch b = data.batch(0, i);
    if (b.loss_tokens == 0) continue;
    const at::Tensor hidden = model.hidden_states(b.input_ids.to(model.device()));
    const at::Tensor targets = b.target_ids.to(model.device());
    // Counted on the host copy of the targets; the rows' losses reach the host together (one synchronization a
    // batch, not one a row).
    const at::Tensor counts = b.target_ids.ne(-100).sum(1);
    const auto count = counts.accessor<int64_t, 1>();
    std::vector<int64_t> rows;
    std::vector<at::Tensor> losses;
    for (int64_t r = 0; r < hidden.size(0); ++r) {
      if (count[r] == 0) continue;
      rows.push_back(r);
      losses.push_back(linear_cross_entropy(hidden[r], model.head_weight(), targets[r]).to(at::kDouble).reshape({1}));
    }
    const at::Tensor host = at::cat(losses).to(at::kCPU);
    for (size_t k = 0; k < rows.size(); ++k) {
      const int64_t r = rows[k], scored = count[r];
      const double loss = host[static_cast<int64_t>(k)].item<double>();
      out.samples.push_back(SampleLoss{b.lines[static_cast<size_t>(r)], scored, loss});
      weighted += loss * static_cast<double>(scored);
      out.loss_tokens += scored;
    }
  }
  out.loss_sum = weighted;
  out.mean_loss = out.loss_tokens ? weighted / static_cast<double>(out.loss_tokens) : 0.0;
  return out;
}

}  // namespace qwen3
