#include "qwen3/tokenizer/chat_format.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>

#include "qwen3/base/enum_names.h"
#include "qwen3/base/error.h"
#include "qwen3/base/json_limits.h"
#include "qwen3/base/file_io.h"

namespace qwen3 {
namespace {

// Python's str.lstrip / rstrip / strip with a character set, as the Jinja template calls them.
std::string_view lstrip(std::string_view s, std::string_view chars) {
  const size_t b = s.find_first_not_of(chars);
  return b == std::string_view::npos ? std::string_view() : s.substr(b);
}
std::string_view rstrip(std::string_view s, std::string_view chars) {
  const size_t e = s.find_last_not_of(chars);
  return e == std::string_view::npos ? std::string_view() : s.substr(0, e + 1);
}
std::string_view strip(std::string_view s, std::string_view chars) { return rstrip(lstrip(s, chars), chars); }
bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) { return s.size() >= p.size() && s.substr(s.size() - p.size()) == p; }

// A rendered conversation as pieces: text the template emits, and whether it carries loss. Consecutive pieces
// concatenate to the template's output; each loss piece is encoded on its own.
struct Piece {
  std::string text;
  bool loss = false;
};

void append(std::vector<Piece>& pieces, std::string text, bool loss) {
  if (!pieces.empty() && !loss && !pieces.back().loss) {
    pieces.back().text += text;  // no-loss text is encoded together (its joints are special tokens or new text)
    return;
  }
  pieces.push_back(Piece{std::move(text), loss});
}

void plain_message(std::vector<Piece>& pieces, const ChatMessage& m) {
  append(pieces, std::string("<|im_start|>") + to_string(m.role) + "\n" + m.content + "<|im_end|>\n", false);
}

// An assistant turn: the header without loss, then the reply and <|im_end|> with loss, then the line break.
void assistant_message(std::vector<Piece>& pieces, std::string header, std::string reply, bool trained = true) {
  append(pieces, "<|im_start|>assistant\n" + header, false);
  append(pieces, reply + "<|im_end|>", trained);
  append(pieces, "\n", false);
}

// The index of the last user message that is not a wrapped tool response (the hybrid template's
// ns.last_query_index), or the last index when there is none.
size_t last_query_index(const std::vector<ChatMessage>& messages) {
  for (size_t i = messages.size(); i-- > 0;) {
    const ChatMessage& m = messages[i];
    if (m.role == ChatRole::user &&
        !(starts_with(m.content, "<tool_response>") && ends_with(m.content, "</tool_response>")))
      return i;
  }
  return messages.empty() ? 0 : messages.size() - 1;
}

std::vector<Piece> render_pieces(const std::vector<ChatMessage>& messages, ChatTemplate t) {
  std::vector<Piece> pieces;
  const size_t last_query = last_query_index(messages);
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != ChatRole::assistant) {
      plain_message(pieces, m);
      continue;
    }
    if (t == ChatTemplate::chatml) {
      assistant_message(pieces, "", m.content, m.trained);
      continue;
    }
    // qwen3-thinking: the reasoning is reasoning_content, else what precedes a "</think>" in the content.
    std::string_view content = m.content;
    std::string_view reasoning;
    if (m.reasoning_content) {
      reasoning = *m.reasoning_content;
    } else if (const size_t close = content.find("</think>"); close != std::string_view::npos) {
      const std::string_view before = rstrip(content.substr(0, close), "\n");
      const size_t open = before.rfind("<think>");
      reasoning = lstrip(open == std::string_view::npos ? before : before.substr(open + 7), "\n");
      content = lstrip(content.substr(content.rfind("</think>") + 8), "\n");
    }
    const bool after_last_query = i > last_query;
    if (after_last_query && (i + 1 == messages.size() || !reasoning.empty())) {
      const std::string_view thought = strip(reasoning, "\n");
      const std::string think = "<think>\n" + std::string(thought) + "\n</think>\n\n";
      const std::string reply(lstrip(content, "\n"));
      // An empty think block is format, not something the model says: it stays with the header (and in the
      // generation prompt); a real one is part of the reply.
      if (thought.empty())
        assistant_message(pieces, think, reply, m.trained);
      else
        assistant_message(pieces, "", think + reply, m.trained);
    } else {
      assistant_message(pieces, "", std::string(content), m.trained);
    }
  }
  return pieces;
}

}  // namespace

const char* to_string(ChatTemplate t) { return t == ChatTemplate::chatml ? "chatml" : "qwen3-thinking"; }

ChatTemplate parse_chat_template(const std::string& name) {
  static const ChatTemplate kAll[] = {ChatTemplate::chatml, ChatTemplate::qwen3_thinking};
  return enum_from_name(name, kAll, "--chat-template");
}

const char* to_string(ChatRole role) {
  switch (role) {
    case ChatRole::system: return "system";
    case ChatRole::user: return "user";
    case ChatRole::assistant: return "assistant";
  }
  return "?";
}

ChatTemplate recognize_chat_template(const std::string& jinja, const std::string& origin) {
  // The constructs that decide the output for system/user/assistant messages. ChatML markers with the role
  // written after <|im_start|>; the hybrid template adds the think block after the last query.
  const bool chatml = jinja.find("'<|im_start|>' + message.role + '\\n'") != std::string::npos &&
                      jinja.find("<|im_end|>") != std::string::npos;
  const bool thinks = jinja.find("<think>") != std::string::npos;
  const bool hybrid = jinja.find("last_query_index") != std::string::npos &&
                      jinja.find("'\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + "
                                 "content.lstrip('\\n')") != std::string::npos;
  if (chatml && !thinks) return ChatTemplate::chatml;
  if (chatml && hybrid) return ChatTemplate::qwen3_thinking;
  throw Error(origin + ": its chat template is not one qwen3-train renders (it renders Qwen3's ChatML "
                       "templates: chatml, and qwen3-thinking, the hybrid template with think blocks)");
}

ChatTemplate chat_template_from_config_file(const std::string& path) {
  std::ifstream in = open_input_file(path, "tokenizer config", std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  // transformers 4.43+ save_pretrained writes the template as chat_template.jinja, the template's own text.
  if (std::filesystem::path(path).extension() == ".jinja") return recognize_chat_template(text.str(), path);
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": not valid JSON (" + json_error_text(e) + ")");
  }
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    // A config saved by transformers 4.43+ keeps its template beside it, in chat_template.jinja.
    const std::filesystem::path beside = std::filesystem::path(path).parent_path() / "chat_template.jinja";
    std::error_code ec;
    if (std::filesystem::is_regular_file(beside, ec)) return chat_template_from_config_file(beside.string());
    throw Error(path + ": has no \"chat_template\" (nor a chat_template.jinja beside it)");
  }
  if (it->is_string()) return recognize_chat_template(it->get<std::string>(), path);
  if (it->is_array())  // [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
    for (const auto& entry : *it)
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string())
        return recognize_chat_template(entry["template"].get<std::string>(), path);
  throw Error(path + ": \"chat_template\" is neither a string nor a list with a \"default\" entry");
}

std::string render_chat_text(const std::vector<ChatMessage>& messages, ChatTemplate t) {
  std::string out;
  for (const Piece& p : render_pieces(messages, t)) out += p.text;
  return out;
}

ChatTokens render_conversation(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages) {
  tokenizer.check_chat_format();
  ChatTokens out;
  for (const Piece& p : render_pieces(messages, tokenizer.chat_template())) {
    const std::vector<TokenId> ids = tokenizer.encode(p.text);
    out.ids.insert(out.ids.end(), ids.begin(), ids.end());
    out.loss_mask.resize(out.ids.size(), p.loss ? 1 : 0);
  }
  return out;
}

std::vector<TokenId> chat_generation_prompt(const Tokenizer& tokenizer, const std::optional<std::string>& system,
                                            const std::string& prompt) {
  tokenizer.check_chat_format();
  std::vector<ChatMessage> messages;
  if (system) messages.push_back({ChatRole::system, *system, std::nullopt});
  messages.push_back({ChatRole::user, prompt, std::nullopt});
  std::string text = render_chat_text(messages, tokenizer.chat_template()) + "<|im_start|>assistant\n";
  if (tokenizer.chat_template() == ChatTemplate::qwen3_thinking) text += "<think>\n\n</think>\n\n";
  return tokenizer.encode(text);
}

ChatTokens render_chat(const Tokenizer& tokenizer, const ChatTurn& turn) {
  std::vector<ChatMessage> messages;
  if (turn.system) messages.push_back({ChatRole::system, *turn.system, std::nullopt});
  messages.push_back({ChatRole::user, turn.prompt, std::nullopt});
  messages.push_back({ChatRole::assistant, turn.target, std::nullopt});
  return render_conversation(tokenizer, messages);
}

}  // namespace qwen3
