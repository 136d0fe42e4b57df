// Autoregressive generation with a KV cache, and the next-token loss used by `eval`.
#pragma once
#include <ATen/core/Generator.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "qwen3/model/model.h"
#include "qwen3/tokenizer/tokenizer.h"

namespace qwen3 {

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;         // 0: no top-k cut
  double top_p = 1.0;        // 1: no nucleus cut; the most likely token is always kept
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);
  // logits: [V] (any dtype/device). Returns the chosen id.
  int64_t next(const at::Tensor& logits);

 private:
  SamplingOptions opt_;
  at::Generator gen_;
};

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  SamplingOptions sampling;
  std::vector<int64_t> stop_ids;  // generation ends after emitting one of these (it is returned too)
  int64_t prefill_chunk = 512;    // prompt tokens per forward pass while filling the cache
};

// Generates after `prompt`; calls on_token for each new id as soon as it is chosen. Returns the new ids.
std::vector<int64_t> generate(Qwen3Model& model, const std::vector<int64_t>& prompt, const GenerateOptions& options,
                              const std::function<void(int64_t)>& on_token = {});

// Where a chat reply ends: the config's EOS ids, then <|im_end|> and <|endoftext|> where the tokenizer has them.
std::vector<int64_t> chat_stop_ids(const Qwen3Config& config, const Tokenizer& tokenizer);

// The model's reply to one user turn in the chat format (after an optional system prompt): generated with
// `options` (greedy by default) until a chat stop id, decoded without special tokens or ids past the
// tokenizer's vocabulary. What `smoke` checks and `train --test-max-tokens` prints.
std::string chat_reply(Qwen3Model& model, const Tokenizer& tokenizer, const std::optional<std::string>& system,
                       const std::string& prompt, GenerateOptions options);

struct SequenceLoss {
  int64_t tokens = 0;  // predicted tokens (length - 1)
  double loss = 0.0;   // mean next-token cross-entropy over them
};
// Next-token cross-entropy of one sequence, in the model's dtype with fp32 logits, without autograd.
SequenceLoss sequence_loss(Qwen3Model& model, const std::vector<int64_t>& ids);

}  // namespace qwen3
