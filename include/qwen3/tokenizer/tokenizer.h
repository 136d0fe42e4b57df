// The Qwen3 tokenizer: byte-level BPE read from a Hugging Face `tokenizer.json` (see docs/tokenizer.md).
// encode: added/special tokens split out first (never merged), NFC, the pre-tokenizer split, the GPT-2 byte
// alphabet, merges by rank, ids; no BOS is added. decode: the reverse, added tokens verbatim, invalid UTF-8 as
// U+FFFD. A Tokenizer is immutable after loading and safe to use from several threads; copies share the data.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qwen3 {

using TokenId = int32_t;

// The chat templates conversations are rendered with (chat_format.h).
enum class ChatTemplate { chatml, qwen3_thinking };

// An entry of `added_tokens` in tokenizer.json, with the flags the reference honours.
struct AddedToken {
  std::string content;
  TokenId id = 0;
  bool special = false;      // dropped by decode(skip_special = true)
  bool lstrip = false;       // swallows the whitespace before it
  bool rstrip = false;       // swallows the whitespace after it
  bool normalized = false;   // matched in the NFC text rather than in the raw input
  bool single_word = false;  // matched only when no letter, digit or '_' touches it
};

class Tokenizer {
 public:
  // Throws qwen3::Error naming the file and what is wrong with it. The chat template is the one of the
  // tokenizer_config.json beside it when there is one (HF's layout), else chatml; a file whose template is not
  // supported loads, and rendering a conversation with it throws that reason.
  static Tokenizer from_file(const std::string& path);
  // `source_name` is what error messages call the text (a path, or "<memory>").
  static Tokenizer from_json_text(std::string_view json_text, const std::string& source_name = "<memory>");

  // Throws qwen3::Error when `text` is not valid UTF-8 (naming the byte offset).
  std::vector<TokenId> encode(std::string_view text) const;
  // Throws qwen3::Error for an id that names no token.
  std::string decode(const std::vector<TokenId>& ids, bool skip_special = false) const;
  std::string decode(const TokenId* ids, size_t count, bool skip_special = false) const;

  // The id of a vocabulary entry (in the file's byte-level spelling, e.g. "ĠWorld") or an added token.
  std::optional<TokenId> token_to_id(std::string_view token) const;
  // The added token with this exact content; throws qwen3::Error when the file has none.
  TokenId added_token_id(std::string_view content) const;
  const std::vector<AddedToken>& added_tokens() const;
  // One more than the largest id, so every valid id is below it.
  size_t vocab_size() const;
  // Error naming `model_origin` when this tokenizer has ids the model's embedding lacks (vocab_size() is more
  // than the model's vocab_size): checked up front instead of an index error in the first forward.
  void check_fits_model(int64_t model_vocab_size, const std::string& model_origin) const;
  size_t merge_count() const;

  // The template chat_format.h renders with; throws qwen3::Error (naming the file) when it was unsupported.
  ChatTemplate chat_template() const;
  // Error naming the file when the chat format cannot render with this tokenizer: its template is unsupported
  // or its tokenizer_config.json unreadable (chat_template()'s reason), or the chat markers <|im_start|> and
  // <|im_end|> are not special added tokens of it (they would be encoded as text, and a model trained so learns
  // to spell its stop token). Called once before data is read: per record, each would be skipped as bad.
  void check_chat_format() const;
  // Where the template came from: "tokenizer_config.json path", "--chat-template", or "default".
  const std::string& chat_template_origin() const { return chat_template_origin_; }
  Tokenizer with_chat_template(ChatTemplate t, std::string origin) const;
  // The template of a tokenizer_config.json (chat_format.h's rule), or its problem kept for chat_template().
  Tokenizer with_chat_template_of_config(const std::string& config_path) const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
  ChatTemplate chat_template_ = ChatTemplate::chatml;
  std::string chat_template_origin_ = "default";
  std::string chat_template_problem_;  // non-empty: the configured template is unsupported
};

// What commands load a tokenizer from: --tokenizer, and optionally --tokenizer-config (a tokenizer_config.json
// other than the one beside it) and --chat-template (a template by name, overriding both).
struct TokenizerSource {
  std::string path;
  std::string config_path;
  std::optional<ChatTemplate> chat_template;
};
Tokenizer load_tokenizer(const TokenizerSource& source);

// NFC of valid UTF-8 (what encode applies before splitting); throws qwen3::Error on invalid UTF-8.
std::string nfc_normalize(std::string_view text);

// Offset of the first byte that is not part of well-formed UTF-8, or npos when all of it is (the data reader
// names it in a bad line's message).
size_t first_invalid_utf8_byte(std::string_view text);

// Bytes to text with every ill-formed sequence replaced by U+FFFD, one per maximal ill-formed subpart (the
// WHATWG/Unicode rule that the reference's TextDecoder follows).
std::string utf8_lossy(std::string_view bytes);

}  // namespace qwen3
