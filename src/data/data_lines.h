// One line of a training file → one tokenized sample, or the reason it is ignored or bad (docs/data.md).
// Pure functions of the line, so the loader can run them on many lines in parallel.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "qwen3/tokenizer/chat_format.h"
#include "qwen3/tokenizer/tokenizer.h"

namespace qwen3::data {

enum class LineKind { blank, comment, sample, bad };

struct LineSample {
  LineKind kind = LineKind::blank;
  std::vector<TokenId> ids;
  std::vector<uint8_t> loss_mask;  // 1 where the token is a target that carries loss; same length as ids
  bool prompt_truncated = false;   // TSV: prompt tokens were dropped on the left to fit seq_len + 1
  std::string reason;              // why a bad line is bad
};

// Strips ASCII whitespace (space, \t, \n, \v, \f, \r) from both ends; other Unicode spaces stay.
std::string_view trim_ascii_space(std::string_view text);
// "invalid UTF-8 at byte N of the line" when it is not UTF-8: checked before tokenizing or parsing JSON, so the
// reason names the byte of the line (nlohmann's, or the rendered chat text's, would be another).
std::optional<std::string> utf8_problem(std::string_view line);

// Blank: empty after trimming. Comment: the trimmed line starts with `comment_prefix` (never when it is empty).
// Otherwise a data line (LineKind::sample).
LineKind classify_line(std::string_view line, std::string_view comment_prefix);

// A trimmed line that starts a JSON file or is a JSON record: "{" or "[" alone, `[{`, `{"`, or a whole JSON
// object or array. Plain text such as "[INST] hi" or "{braces}" is not.
bool looks_like_json(std::string_view line);

// `line` is a physical line without its "\n" (a trailing "\r" is trimmed like any space).
// TSV: split at the first TAB of the raw line, each side trimmed, rendered with the chat format; a sample
// longer than seq_len + 1 tokens keeps its target and closing <|im_end|> and loses the trailing newline,
// then prompt tokens from the left.
LineSample tsv_line_sample(const Tokenizer& tokenizer, std::string_view line,
                           const std::optional<std::string>& system, int64_t seq_len);
// Text: the trimmed line, every token a target except the first (nothing precedes it).
LineSample text_line_sample(const Tokenizer& tokenizer, std::string_view line);

// JSON records (docs/data.md "JSON records"). Each function names what is wrong with a record as a bad
// sample's reason; `system` is the prompt of a record without a system message of its own.
enum class RecordKind { chat, alpaca, text };
// The record's kind by its keys ("messages"; "instruction" and "output"; "text"), or none.
std::optional<RecordKind> record_kind_of(const nlohmann::json& record);
// A chat or alpaca record as messages, or the reason it is not one.
struct RecordMessages {
  std::vector<ChatMessage> messages;
  std::string problem;  // non-empty: malformed
};
RecordMessages record_messages(const nlohmann::json& record, RecordKind kind, const std::optional<std::string>& system);
// A record of `kind` as one sample: conversations rendered by the tokenizer's chat template with loss on the
// assistant turns; text records with loss on every token but the first.
LineSample record_sample(const Tokenizer& tokenizer, const nlohmann::json& record, RecordKind kind,
                         const std::optional<std::string>& system);

}  // namespace qwen3::data
