// Conversations rendered as the model's chat template renders them (docs/data.md, "Chat templates"). Two
// templates of the Qwen3 ChatML family are rendered natively, and a tokenizer_config.json whose template is
// neither is refused by name rather than rendered differently:
//   chatml          every message `<|im_start|>{role}\n{content}<|im_end|>\n` (Qwen3-*-Instruct-2507, and the
//                   format when no tokenizer_config.json is found)
//   qwen3-thinking  the hybrid Qwen3 template: as chatml, but an assistant turn after the last user message is
//                   `<|im_start|>assistant\n<think>\n{reasoning}\n</think>\n\n{content}` (the last one always,
//                   with an empty reasoning when it has none), and earlier turns lose their `<think>` part
// The loss covers each assistant turn's reply and its closing <|im_end|> (and its reasoning when it has one),
// never the `<|im_start|>assistant\n` header, an empty think block, or any system/user token.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "qwen3/tokenizer/tokenizer.h"

namespace qwen3 {

const char* to_string(ChatTemplate t);             // "chatml", "qwen3-thinking"
ChatTemplate parse_chat_template(const std::string& name);  // UsageError naming the spellings

// Which template a Jinja chat template is (by the constructs that decide the output: ChatML markers, and the
// think-block emission of the hybrid template); Error naming `origin` when it is neither.
ChatTemplate recognize_chat_template(const std::string& jinja, const std::string& origin);
// The template of a tokenizer_config.json ("chat_template": a string, or a list of {name, template} whose
// "default" entry counts). Error naming the file when it is unreadable, has none, or has an unsupported one.
ChatTemplate chat_template_from_config_file(const std::string& path);

enum class ChatRole { system, user, assistant };
const char* to_string(ChatRole role);

struct ChatMessage {
  ChatRole role = ChatRole::user;
  std::string content;
  std::optional<std::string> reasoning_content;  // assistant only: the thinking, rendered by qwen3-thinking
  bool trained = true;  // assistant only: false keeps its reply out of the loss (a prompt's earlier turns)
};

struct ChatTokens {
  std::vector<TokenId> ids;
  std::vector<uint8_t> loss_mask;  // 1 where the loss counts; same length as ids
};

// The template's text for `messages` (what the Jinja template renders with add_generation_prompt false).
std::string render_chat_text(const std::vector<ChatMessage>& messages, ChatTemplate t);

// The conversation's tokens and loss mask, with the tokenizer's template. Every piece between special tokens
// is encoded as the whole text would be, except that each assistant reply is encoded on its own after its
// header, as generation produces it after the generation prompt (the two differ only for a reply that starts
// with a line break, which would merge with the header's).
ChatTokens render_conversation(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages);

// The prompt for generation: the conversation so far (system? user) and the assistant header, which for
// qwen3-thinking includes the empty think block (non-thinking mode, as training renders the last turn).
std::vector<TokenId> chat_generation_prompt(const Tokenizer& tokenizer, const std::optional<std::string>& system,
                                            const std::string& prompt);

// A single supervised pair (TSV): [system?] user, assistant.
struct ChatTurn {
  std::optional<std::string> system;
  std::string prompt;
  std::string target;
};
ChatTokens render_chat(const Tokenizer& tokenizer, const ChatTurn& turn);

}  // namespace qwen3
