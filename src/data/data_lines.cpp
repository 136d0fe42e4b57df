#include "data/data_lines.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>

#include "qwen3/tokenizer/chat_format.h"
#include "qwen3/base/error.h"

namespace qwen3::data {
namespace {

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

LineSample bad(std::string reason) {
  LineSample s;
  s.kind = LineKind::bad;
  s.reason = std::move(reason);
  return s;
}

}  // namespace

std::optional<std::string> utf8_problem(std::string_view line) {
  const size_t at = first_invalid_utf8_byte(line);
  if (at == std::string_view::npos) return std::nullopt;
  return fmt::format("invalid UTF-8 at byte {} of the line", at + 1);
}

std::string_view trim_ascii_space(std::string_view text) {
  size_t begin = 0, end = text.size();
  while (begin < end && is_ascii_space(text[begin])) ++begin;
  while (end > begin && is_ascii_space(text[end - 1])) --end;
  return text.substr(begin, end - begin);
}

LineKind classify_line(std::string_view line, std::string_view comment_prefix) {
  const std::string_view trimmed = trim_ascii_space(line);
  if (trimmed.empty()) return LineKind::blank;
  if (!comment_prefix.empty() && trimmed.substr(0, comment_prefix.size()) == comment_prefix) return LineKind::comment;
  return LineKind::sample;
}

bool looks_like_json(std::string_view line) {
  const std::string_view t = trim_ascii_space(line);
  if (t.empty() || (t.front() != '{' && t.front() != '[')) return false;
  if (t.size() == 1 || t.substr(0, 2) == "[{" || t.substr(0, 2) == "{\"") return true;
  // A whole object or array on the line (accept builds no value: its parser keeps its own stack, so deep
  // nesting costs no recursion).
  return nlohmann::json::accept(t.begin(), t.end());
}

LineSample tsv_line_sample(const Tokenizer& tokenizer, std::string_view line,
                           const std::optional<std::string>& system, int64_t seq_len) {
  if (auto problem = utf8_problem(line)) return bad(*problem);
  // Split before trimming: a line "\tanswer" has an empty prompt, it does not lack a TAB.
  const size_t tab = line.find('\t');
  if (tab == std::string_view::npos) return bad("no TAB between prompt and target");
  const std::string_view prompt = trim_ascii_space(line.substr(0, tab));
  const std::string_view target = trim_ascii_space(line.substr(tab + 1));
  if (prompt.empty()) return bad("empty prompt");
  if (target.empty()) return bad("empty target");

  const ChatTokens chat = render_chat(tokenizer, ChatTurn{system, std::string(prompt), std::string(target)});
  const auto& mask = chat.loss_mask;
  // render_chat's loss span is one run: the target and its closing <|im_end|>.
  const auto loss_begin = static_cast<int64_t>(std::find(mask.begin(), mask.end(), 1) - mask.begin());
  const auto loss_end = static_cast<int64_t>(mask.rend() - std::find(mask.rbegin(), mask.rend(), 1));
  const int64_t loss_len = loss_end - loss_begin;
  // seq_len + 1 tokens give seq_len targets; the first kept token must precede the loss span.
  if (loss_len > seq_len)
    return bad(fmt::format("the target and its <|im_end|> take {} tokens, more than --seq-len {}", loss_len,
                           seq_len));
  const int64_t window = seq_len + 1;
  const auto total = static_cast<int64_t>(chat.ids.size());
  const int64_t begin = std::max<int64_t>(0, loss_end - window);
  const int64_t end = std::min(total, begin + window);

  LineSample s;
  s.kind = LineKind::sample;
  s.ids.assign(chat.ids.begin() + begin, chat.ids.begin() + end);
  s.loss_mask.assign(mask.begin() + begin, mask.begin() + end);
  s.prompt_truncated = begin > 0;
  return s;
}

LineSample text_line_sample(const Tokenizer& tokenizer, std::string_view line) {
  if (auto problem = utf8_problem(line)) return bad(*problem);
  LineSample s;
  s.ids = tokenizer.encode(trim_ascii_space(line));
  if (s.ids.size() < 2) return bad("a single token: nothing to predict");
  s.kind = LineKind::sample;
  s.loss_mask.assign(s.ids.size(), 1);
  return s;
}

namespace {

const nlohmann::json* string_field(const nlohmann::json& record, const char* key, std::string& problem,
                                   bool required) {
  const auto it = record.find(key);
  if (it == record.end() || it->is_null()) {
    if (required) problem = fmt::format("no \"{}\"", key);
    return nullptr;
  }
  if (!it->is_string()) {
    problem = fmt::format("\"{}\" is {}, not a string", key, it->type_name());
    return nullptr;
  }
  return &*it;
}

// A message's text: a string, or a list of content parts whose text parts are joined (the multimodal form TRL
// and the OpenAI format use); a part that is not text is a problem.
std::optional<std::string> content_text(const nlohmann::json& content, std::string& problem) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    problem = fmt::format("content is {}, not a string or a list of text parts", content.type_name());
    return std::nullopt;
  }
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const nlohmann::json& part = content[k];
    const std::string type = part.is_object() ? part.value("type", std::string()) : std::string();
    if (type != "text" || !part.contains("text") || !part["text"].is_string()) {
      problem = fmt::format("content part {} is {}, not text (qwen3-train trains on text)", k,
                            type.empty() ? std::string(part.type_name()) : "of type '" + type + "'");
      return std::nullopt;
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

// How a list of messages names its fields: {"role", "content"} (chat, TRL) or ShareGPT's {"from", "value"}, whose
// speakers are human/gpt/system (user/assistant too).
struct MessageKeys {
  const char* list;
  const char* role;
  const char* content;
};
constexpr MessageKeys kChatKeys{"messages", "role", "content"};
constexpr MessageKeys kShareGptKeys{"conversations", "from", "value"};

// The messages of one list (`where` names it in problems) appended to out; assistant turns trained or not.
bool append_messages(const nlohmann::json& list, const std::string& where, const MessageKeys& keys, bool trained,
                     RecordMessages& out) {
  if (!list.is_array()) {
    out.problem = fmt::format("\"{}\" is {}, not an array", where, list.type_name());
    return false;
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const nlohmann::json& m = list[i];
    const std::string at = fmt::format("{}[{}]", where, i);
    if (!m.is_object()) {
      out.problem = fmt::format("{} is {}, not an object", at, m.type_name());
      return false;
    }
    std::string problem;
    const nlohmann::json* role = string_field(m, keys.role, problem, true);
    if (!role) {
      out.problem = at + ": " + problem;
      return false;
    }
    const std::string& r = role->get_ref<const std::string&>();
    ChatMessage message;
    if (r == "system") {
      message.role = ChatRole::system;
    } else if (r == "user" || r == "human") {
      message.role = ChatRole::user;
    } else if (r == "assistant" || r == "gpt") {
      message.role = ChatRole::assistant;
      message.trained = trained;
      if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
        out.problem = at + ": tool calls are not rendered by qwen3-train's templates (chatml, qwen3-thinking); "
                           "leave such records out, or give their calls as text";
        return false;
      }
      if (const nlohmann::json* reasoning = string_field(m, "reasoning_content", problem, false))
        message.reasoning_content = reasoning->get<std::string>();
      if (!problem.empty()) {
        out.problem = at + ": " + problem;
        return false;
      }
    } else if (r == "tool" || r == "function" || r == "observation" || r == "function_call") {
      out.problem = fmt::format("{}: role '{}' (a tool turn) is not rendered by qwen3-train's templates (chatml, "
                                "qwen3-thinking); leave such records out",
                                at, r);
      return false;
    } else {
      out.problem = fmt::format("{}: role '{}' is not system, user or assistant", at, r);
      return false;
    }
    const auto it = m.find(keys.content);
    if (it == m.end() || it->is_null()) {
      out.problem = fmt::format("{}: no \"{}\"", at, keys.content);
      return false;
    }
    const std::optional<std::string> text = content_text(*it, problem);
    if (!text) {
      out.problem = at + ": " + problem;
      return false;
    }
    message.content = *text;
    out.messages.push_back(std::move(message));
  }
  return true;
}

// A conversation: {"messages"}, ShareGPT's {"conversations"}, or TRL's prompt/completion, conversational (two
// lists of messages: the completion's assistant turns carry the loss, the prompt's do not, as TRL's
// completion-only loss) or plain (two strings: the pair [user: prompt, assistant: completion], as a TSV line).
void chat_messages(const nlohmann::json& record, const std::optional<std::string>& system, RecordMessages& out) {
  if (record.contains("messages")) {
    if (!append_messages(record["messages"], "messages", kChatKeys, true, out)) return;
  } else if (record.contains("conversations")) {
    if (!append_messages(record["conversations"], "conversations", kShareGptKeys, true, out)) return;
  } else {
    const nlohmann::json &prompt = record["prompt"], &completion = record["completion"];
    if (prompt.is_string() && completion.is_string()) {
      out.messages.push_back({ChatRole::user, prompt.get<std::string>(), {}});
      out.messages.push_back({ChatRole::assistant, completion.get<std::string>(), {}});
    } else if (prompt.is_array() && completion.is_array()) {
      if (!append_messages(prompt, "prompt", kChatKeys, false, out)) return;
      if (!append_messages(completion, "completion", kChatKeys, true, out)) return;
    } else {
      out.problem = fmt::format("\"prompt\" is {} and \"completion\" is {}: both strings, or both lists of messages",
                                prompt.type_name(), completion.type_name());
      return;
    }
  }
  bool has_system = false, has_trained = false;
  for (const ChatMessage& m : out.messages) {
    has_system = has_system || m.role == ChatRole::system;
    has_trained = has_trained || (m.role == ChatRole::assistant && m.trained);
  }
  if (!has_trained) {
    out.problem = "no assistant message: nothing to learn";
    return;
  }
  if (system && !has_system) out.messages.insert(out.messages.begin(), ChatMessage{ChatRole::system, *system, {}});
}

void alpaca_messages(const nlohmann::json& record, const std::optional<std::string>& system, RecordMessages& out) {
  std::string problem;
  const nlohmann::json* instruction = string_field(record, "instruction", problem, true);
  const nlohmann::json* output = instruction ? string_field(record, "output", problem, true) : nullptr;
  const nlohmann::json* input = output ? string_field(record, "input", problem, false) : nullptr;
  const nlohmann::json* own_system = problem.empty() ? string_field(record, "system", problem, false) : nullptr;
  if (!problem.empty()) {
    out.problem = problem;
    return;
  }
  // The instruction, and the input on the next line when there is one (LLaMA-Factory's reading of alpaca).
  std::string prompt = instruction->get<std::string>();
  if (input && !input->get_ref<const std::string&>().empty()) prompt += "\n" + input->get<std::string>();
  if (own_system && !own_system->get_ref<const std::string&>().empty())
    out.messages.push_back({ChatRole::system, own_system->get<std::string>(), {}});
  else if (system)
    out.messages.push_back({ChatRole::system, *system, {}});
  out.messages.push_back({ChatRole::user, std::move(prompt), {}});
  out.messages.push_back({ChatRole::assistant, output->get<std::string>(), {}});
}

}  // namespace

std::optional<RecordKind> record_kind_of(const nlohmann::json& record) {
  if (!record.is_object()) return std::nullopt;
  if (record.contains("messages") || record.contains("conversations") ||
      (record.contains("prompt") && record.contains("completion")))
    return RecordKind::chat;
  if (record.contains("instruction") && record.contains("output")) return RecordKind::alpaca;
  if (record.contains("text")) return RecordKind::text;
  return std::nullopt;
}

RecordMessages record_messages(const nlohmann::json& record, RecordKind kind, const std::optional<std::string>& system) {
  RecordMessages out;
  if (!record.is_object()) {
    out.problem = fmt::format("the record is {}, not an object", record.type_name());
  } else if (kind == RecordKind::chat) {
    if (!record.contains("messages") && !record.contains("conversations") &&
        !(record.contains("prompt") && record.contains("completion")))
      out.problem = "no \"messages\" (nor ShareGPT's \"conversations\", nor \"prompt\" and \"completion\")";
    else
      chat_messages(record, system, out);
  } else if (kind == RecordKind::alpaca) {
    alpaca_messages(record, system, out);
  } else {
    out.problem = "a text record has no messages";
  }
  return out;
}

LineSample record_sample(const Tokenizer& tokenizer, const nlohmann::json& record, RecordKind kind,
                         const std::optional<std::string>& system) {
  if (kind == RecordKind::text) {
    if (!record.is_object()) return bad(fmt::format("the record is {}, not an object", record.type_name()));
    std::string problem;
    const nlohmann::json* text = string_field(record, "text", problem, true);
    if (!text) return bad(problem);
    if (auto utf8 = utf8_problem(text->get_ref<const std::string&>())) return bad("\"text\": " + *utf8);
    LineSample s;
    s.ids = tokenizer.encode(text->get_ref<const std::string&>());
    if (s.ids.size() < 2) return bad("a single token: nothing to predict");
    s.kind = LineKind::sample;
    s.loss_mask.assign(s.ids.size(), 1);
    return s;
  }
  RecordMessages m = record_messages(record, kind, system);
  if (!m.problem.empty()) return bad(m.problem);
  for (const ChatMessage& message : m.messages)
    if (auto utf8 = utf8_problem(message.content)) return bad(std::string(to_string(message.role)) + " content: " + *utf8);
  const ChatTokens chat = render_conversation(tokenizer, m.messages);
  LineSample s;
  s.kind = LineKind::sample;
  s.ids = chat.ids;
  s.loss_mask = chat.loss_mask;
  return s;
}

}  // namespace qwen3::data
