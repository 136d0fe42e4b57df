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

}  // namespace qwen3::data
