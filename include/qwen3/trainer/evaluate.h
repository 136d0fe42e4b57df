// Held-out next-token cross-entropy: the one definition that `eval --data` and training's `eval_loss` share
// (docs/data.md, "Evaluation"). The data's own rules decide what is scored: a TSV pair's target and its
// <|im_end|> (never the prompt), every token of a text line but its first; long text lines are scored in the
// data's windows of seq_len + 1 tokens, each window on its own context.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "qwen3/data/data.h"
#include "qwen3/model/model.h"

namespace qwen3 {

struct SampleLoss {
  int64_t line = 0;         // the file line of the sample (a long text line gives several samples)
  int64_t loss_tokens = 0;  // targets scored
  double loss = 0;          // mean cross-entropy over them (nats)
};

struct Evaluation {
  double mean_loss = 0;              // token-weighted over every sample (0 when nothing is scored)
  double loss_sum = 0;               // the token-weighted sum: mean_loss × loss_tokens, summed as scored
  int64_t loss_tokens = 0;
  std::vector<SampleLoss> samples;   // in batch order: file order for sequential data
  bool stopped = false;              // `stop` said so before the last batch: the figures are partial
};

// Every batch of epoch 0 of padded `data` (packed rows would mix samples: Error), without gradients; each
// row is scored on its own, so the figures do not depend on the batch size beyond float rounding. `part` of
// `parts` scores only the batches i with i % parts == part (data-parallel ranks share the work: summing their
// loss_sum and loss_tokens gives the whole evaluation).
Evaluation evaluate(Qwen3Model& model, const TrainingData& data, int part = 0, int parts = 1,
                    const std::function<bool()>& stop = {});

}  // namespace qwen3
