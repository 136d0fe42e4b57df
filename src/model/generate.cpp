#include "qwen3/model/generate.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/utils.h>

#include "qwen3/tokenizer/chat_format.h"
#include "qwen3/base/error.h"
#include "qwen3/model/lm_loss.h"

#include <algorithm>
#include <limits>

namespace qwen3 {
namespace {

void check_token_ids(const std::vector<int64_t>& ids, int64_t vocab) {
  for (int64_t id : ids)
    if (id < 0 || id >= vocab)
      throw Error("token id " + std::to_string(id) + " is outside the vocabulary (0.." + std::to_string(vocab - 1) + ")");
}

}  // namespace

Sampler::Sampler(const SamplingOptions& options)
    : opt_(options), gen_(at::detail::createCPUGenerator(options.seed)) {
  if (opt_.temperature < 0) throw UsageError("temperature must be >= 0");
  if (opt_.top_k < 0) throw UsageError("top-k must be >= 0");
  if (!(opt_.top_p > 0 && opt_.top_p <= 1)) throw UsageError("top-p must be in (0, 1]");
}

int64_t Sampler::next(const at::Tensor& logits) {
  at::Tensor l = logits.detach().to(at::kCPU, at::kFloat).reshape({-1});
  if (opt_.temperature == 0.0) return l.argmax().item<int64_t>();
  l = l / opt_.temperature;
  if (opt_.top_k > 0 && opt_.top_k < l.size(0)) {
    const at::Tensor kth = std::get<0>(l.topk(opt_.top_k)).min();
    l = l.masked_fill(l < kth, -std::numeric_limits<float>::infinity());
  }
  at::Tensor probs = at::softmax(l, -1);
  if (opt_.top_p < 1.0) {
    auto [sorted, order] = probs.sort(/*dim=*/-1, /*descending=*/true);
    // Keep a token while the mass before it is below p: the most likely token always survives, even when it
    // alone exceeds p (the original zeroed everything then).
    const at::Tensor mass_before = sorted.cumsum(-1) - sorted;
    const at::Tensor drop_sorted = mass_before >= opt_.top_p;
    const at::Tensor drop = at::zeros_like(drop_sorted).scatter(0, order, drop_sorted);
    probs = probs.masked_fill(drop, 0.0);
  }
  return at::multinomial(probs, 1, false, gen_).item<int64_t>();
}

std::vector<int64_t> generate(Qwen3Model& model, const std::vector<int64_t>& prompt, const GenerateOptions& options,
                              const std::function<void(int64_t)>& on_token) {
  if (prompt.empty()) throw UsageError("the prompt has no tokens");
  if (options.prefill_chunk <= 0) throw UsageError("prefill chunk must be positive");
  check_token_ids(prompt, model.config().vocab_size);
  torch::NoGradGuard no_grad;
  Sampler sampler(options.sampling);
  const int64_t n = static_cast<int64_t>(prompt.size());
  // Positions past max_position_embeddings are outside what the model was trained for: the prompt must fit,
  // and generation stops there (the cache is never sized past it, whatever --max-new-tokens says).
  // (0: the config does not say; then only --max-new-tokens bounds it.)
  const int64_t positions =
      model.config().max_position_embeddings > 0 ? model.config().max_position_embeddings : std::numeric_limits<int64_t>::max();
  if (n >= positions)
    throw UsageError(fmt::format("the prompt has {} tokens; the model's max_position_embeddings {} leaves no room to "
                                 "generate",
                                 n, positions));
  const int64_t new_tokens = std::min(options.max_new_tokens, positions - n);
  if (new_tokens < options.max_new_tokens)
    spdlog::warn("generate: at most {} new tokens: the prompt's {} and max_position_embeddings {}", new_tokens, n,
                 positions);
  KVCache cache = model.make_cache(1, n + std::max<int64_t>(new_tokens, 1));
  const at::Tensor ids = at::tensor(prompt, at::kLong).unsqueeze(0);
  at::Tensor last_hidden;
  for (int64_t start = 0; start < n; start += options.prefill_chunk) {
    const int64_t len = std::min(options.prefill_chunk, n - start);
    last_hidden = model.hidden_states(ids.narrow(1, start, len), &cache).select(1, len - 1);
  }
  std::vector<int64_t> out;
  for (int64_t step = 0; step < new_tokens; ++step) {
    const int64_t next = sampler.next(model.logits(last_hidden)[0]);
    out.push_back(next);
    if (on_token) on_token(next);
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), next) != options.stop_ids.end()) break;
    if (step + 1 == new_tokens) break;
    last_hidden = model.hidden_states(at::tensor({next}, at::kLong).unsqueeze(0), &cache).select(1, 0);
  }
  return out;
}

std::vector<int64_t> chat_stop_ids(const Qwen3Config& config, const Tokenizer& tokenizer) {
  std::vector<int64_t> ids = config.eos_token_ids;
  for (const char* token : {"<|im_end|>", "<|endoftext|>"})
    if (auto id = tokenizer.token_to_id(token)) ids.push_back(*id);
  return ids;
}

std::string chat_reply(Qwen3Model& model, const Tokenizer& tokenizer, const std::optional<std::string>& system,
                       const std::string& prompt, GenerateOptions options) {
  options.stop_ids = chat_stop_ids(model.config(), tokenizer);
  const std::vector<TokenId> ids = chat_generation_prompt(tokenizer, system, prompt);
  std::vector<TokenId> reply;
  for (int64_t id : generate(model, std::vector<int64_t>(ids.begin(), ids.end()), options))
    if (id >= 0 && static_cast<size_t>(id) < tokenizer.vocab_size()) reply.push_back(static_cast<TokenId>(id));
  return tokenizer.decode(reply, /*skip_special=*/true);
}

SequenceLoss sequence_loss(Qwen3Model& model, const std::vector<int64_t>& ids) {
  if (ids.size() < 2) throw Error("a sequence needs at least 2 tokens for a next-token loss");
  check_token_ids(ids, model.config().vocab_size);
  torch::NoGradGuard no_grad;
  const at::Tensor t = at::tensor(ids, at::kLong).unsqueeze(0);
  const int64_t n = t.size(1);
  const at::Tensor hidden = model.hidden_states(t.narrow(1, 0, n - 1))[0];
  const at::Tensor target = t[0].narrow(0, 1, n - 1).to(hidden.device());
  const at::Tensor loss = linear_cross_entropy(hidden, model.head_weight(), target);
  return {n - 1, loss.item<double>()};
}

}  // namespace qwen3
