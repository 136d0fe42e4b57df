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

// Checked before tokenizing so the reason names the byte of the line, not of the rendered chat text.
std::optional<std::string> utf8_problem(std::string_view line) {
  const size_t at = first_invalid_utf8_byte(line);
  if (at == std::string_view::npos) return std::nullopt;
  return fmt::format("invalid UTF-8 at byte {} of the line", at + 1);
}

}  // namespace

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

void chat_messages(const nlohmann::json& record, const std::optional<std::string>& system, RecordMessages& out) {
  const auto it = record.find("messages");
  if (!it->is_array()) {
    out.problem = fmt::format("\"messages\" is {}, not an array", it->type_name());
    return;
  }
  bool has_system = false, has_assistant = false;
  for (size_t i = 0; i < it->size(); ++i) {
    const nlohmann::json& m = (*it)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) {
      out.problem = fmt::format("{} is {}, not an object", where, m.type_name());
      return;
    }
    std::string problem;
    const nlohmann::json* role = string_field(m, "role", problem, true);
    const nlohmann::json* content = role ? string_field(m, "content", problem, true) : nullptr;
    if (!content) {
      out.problem = where + ": " + problem;
      return;
    }
    ChatMessage message;
    const std::string& r = role->get_ref<const std::string&>();
    if (r == "system") {
      message.role = ChatRole::system;
      has_system = true;
    } else if (r == "user") {
      message.role = ChatRole::user;
    } else if (r == "assistant") {
      message.role = ChatRole::assistant;
      has_assistant = true;
      if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
        out.problem = where + ": tool calls are not supported";
        return;
      }
      if (const nlohmann::json* reasoning = string_field(m, "reasoning_content", problem, false))
        message.reasoning_content = reasoning->get<std::string>();
      if (!problem.empty()) {
        out.problem = where + ": " + problem;
        return;
      }
    } else {
      out.problem = fmt::format("{}: role '{}' is not system, user or assistant", where, r);
      return;
    }
    message.content = content->get<std::string>();
    out.messages.push_back(std::move(message));
  }
  if (!has_assistant) {
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
  if (record.contains("messages")) return RecordKind::chat;
  if (record.contains("instruction") && record.contains("output")) return RecordKind::alpaca;
  if (record.contains("text")) return RecordKind::text;
  return std::nullopt;
}

RecordMessages record_messages(const nlohmann::json& record, RecordKind kind, const std::optional<std::string>& system) {
  RecordMessages out;
  if (!record.is_object()) {
    out.problem = fmt::format("the record is {}, not an object", record.type_name());
  } else if (kind == RecordKind::chat) {
    if (!record.contains("messages"))
      out.problem = "no \"messages\"";
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
