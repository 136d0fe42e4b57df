// The Qwen3 chat format for supervised pairs (qwen3.md, "Chat format"):
//   <|im_start|>system\n{system}<|im_end|>\n      (only when a system prompt is given)
//   <|im_start|>user\n{prompt}<|im_end|>\n
//   <|im_start|>assistant\n{target}<|im_end|>\n
// The loss covers the target's tokens and the closing <|im_end|>, nothing else.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "qwen3/tokenizer/tokenizer.h"

namespace qwen3 {

struct ChatTurn {
  std::optional<std::string> system;
  std::string prompt;
  std::string target;
};

struct ChatTokens {
  std::vector<TokenId> ids;
  std::vector<uint8_t> loss_mask;  // 1 where the loss counts; same length as ids
};

// The whole supervised example. Its first tokens are exactly chat_generation_prompt(turn.system,
// turn.prompt): the target is encoded on its own after "assistant\n", as generation will produce it.
ChatTokens render_chat(const Tokenizer& tokenizer, const ChatTurn& turn);

// The prompt for generation, ending in `<|im_start|>assistant\n`.
std::vector<TokenId> chat_generation_prompt(const Tokenizer& tokenizer, const std::optional<std::string>& system,
                                            const std::string& prompt);

}  // namespace qwen3
