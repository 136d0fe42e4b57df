#include "qwen3/tokenizer/chat_format.h"

namespace qwen3 {
namespace {

// One `<|im_start|>{role}\n{text}<|im_end|>\n` block. The role line and the text are encoded as one string,
// as a chat template rendered to text and then tokenized would be.
void append_block(const Tokenizer& tokenizer, TokenId im_start, TokenId im_end, const std::string& role,
                  const std::string& text, std::vector<TokenId>& ids) {
  ids.push_back(im_start);
  const std::vector<TokenId> body = tokenizer.encode(role + "\n" + text);
  ids.insert(ids.end(), body.begin(), body.end());
  ids.push_back(im_end);
  const std::vector<TokenId> newline = tokenizer.encode("\n");
  ids.insert(ids.end(), newline.begin(), newline.end());
}

}  // namespace

std::vector<TokenId> chat_generation_prompt(const Tokenizer& tokenizer, const std::optional<std::string>& system,
                                            const std::string& prompt) {
  const TokenId im_start = tokenizer.added_token_id("<|im_start|>");
  const TokenId im_end = tokenizer.added_token_id("<|im_end|>");
  std::vector<TokenId> ids;
  if (system) append_block(tokenizer, im_start, im_end, "system", *system, ids);
  append_block(tokenizer, im_start, im_end, "user", prompt, ids);
  ids.push_back(im_start);
  const std::vector<TokenId> role = tokenizer.encode("assistant\n");
  ids.insert(ids.end(), role.begin(), role.end());
  return ids;
}

ChatTokens render_chat(const Tokenizer& tokenizer, const ChatTurn& turn) {
  ChatTokens out;
  out.ids = chat_generation_prompt(tokenizer, turn.system, turn.prompt);
  out.loss_mask.assign(out.ids.size(), 0);
  // The target on its own: generation starts right after "assistant\n", so a target that begins with a
  // newline must not merge with that one into a token the prompt never ends with.
  const std::vector<TokenId> target = tokenizer.encode(turn.target);
  out.ids.insert(out.ids.end(), target.begin(), target.end());
  out.ids.push_back(tokenizer.added_token_id("<|im_end|>"));
  out.loss_mask.resize(out.ids.size(), 1);  // the target and the closing <|im_end|>: the model learns to stop
  const std::vector<TokenId> newline = tokenizer.encode("\n");
  out.ids.insert(out.ids.end(), newline.begin(), newline.end());
  out.loss_mask.resize(out.ids.size(), 0);
  return out;
}

}  // namespace qwen3
