#include "qwen3/trainer/evaluate.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "qwen3/base/error.h"
#include "qwen3/model/lm_loss.h"

namespace qwen3 {

Evaluation evaluate(Qwen3Model& model, const TrainingData& data) {
  if (data.options().pack) throw Error("evaluation needs padded rows: packed rows mix samples");
  c10::NoGradGuard no_grad;
  Evaluation out;
  double weighted = 0;
  for (int64_t i = 0; i < data.batches_per_epoch(); ++i) {
    const Batch b = data.batch(0, i);
    if (b.loss_tokens == 0) continue;
    const at::Tensor hidden = model.hidden_states(b.input_ids.to(model.device()));
    const at::Tensor targets = b.target_ids.to(model.device());
    const at::Tensor counts = b.target_ids.ne(-100).sum(1);
    for (int64_t r = 0; r < hidden.size(0); ++r) {
      const int64_t scored = counts[r].item<int64_t>();
      if (scored == 0) continue;
      const double loss = linear_cross_entropy(hidden[r], model.head_weight(), targets[r]).item<double>();
      out.samples.push_back(SampleLoss{b.lines[static_cast<size_t>(r)], scored, loss});
      weighted += loss * static_cast<double>(scored);
      out.loss_tokens += scored;
    }
  }
  out.mean_loss = out.loss_tokens ? weighted / static_cast<double>(out.loss_tokens) : 0.0;
  return out;
}

}  // namespace qwen3
