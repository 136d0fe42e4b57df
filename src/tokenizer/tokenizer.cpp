// Encoding and decoding (the file is read in tokenizer_json.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "qwen3/base/file_io.h"
#include "qwen3/tokenizer/chat_format.h"
#include "qwen3/base/error.h"
#include "tokenizer_impl.h"
#include "unicode_text.h"

namespace qwen3 {
namespace tok {
namespace {

// Start of the code point that ends at `end` (text is well-formed UTF-8, end > 0).
size_t previous_code_point_start(std::string_view text, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) --i;
  return i;
}

// What single_word calls a word character (Rust's char::is_alphanumeric, or '_').
bool is_word_char(char32_t cp) {
  if (cp == '_') return true;
  const auto c = unicode::classify(cp);
  return c == unicode::CharClass::kLetter || c == unicode::CharClass::kNumber;
}

}  // namespace

void AddedTokenMatcher::build(std::vector<std::pair<std::string, const AddedToken*>> contents) {
  std::stable_sort(contents.begin(), contents.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  entries_ = std::move(contents);
  first_byte_.fill(false);
  for (const auto& e : entries_) first_byte_[static_cast<unsigned char>(e.first[0])] = true;
  only_first_byte_ = -1;
  if (std::count(first_byte_.begin(), first_byte_.end(), true) == 1)
    only_first_byte_ = static_cast<unsigned char>(entries_.front().first[0]);
}

bool AddedTokenMatcher::find(std::string_view text, size_t from, Match& match) const {
  if (entries_.empty()) return false;
  for (size_t i = from; i < text.size(); ++i) {
    if (only_first_byte_ >= 0) {
      const void* hit = std::memchr(text.data() + i, only_first_byte_, text.size() - i);
      if (!hit) return false;
      i = static_cast<const char*>(hit) - text.data();
    } else if (!first_byte_[static_cast<unsigned char>(text[i])]) {
      continue;
    }
    for (const auto& [content, token] : entries_) {
      if (text.compare(i, content.size(), content) != 0) continue;
      const size_t end = i + content.size();
      if (token->single_word) {
        size_t after = end;
        const bool word_before = i > 0 && [&] {
          size_t p = previous_code_point_start(text, i);
          return is_word_char(unicode::next_code_point(text, p));
        }();
        const bool word_after = end < text.size() && is_word_char(unicode::next_code_point(text, after));
        // Like the references' leftmost-longest search, a rejected match is skipped as a whole.
        if (word_before || word_after) {
          i = end - 1;
          break;
        }
      }
      match = {i, end, token};
      return true;
    }
  }
  return false;
}

namespace {

// Calls `plain(segment)` for the text between added tokens and `added(id)` for each token, in order.
// lstrip/rstrip widen a match over the whitespace beside it (not into an earlier match).
template <typename Plain, typename Added>
void split_added(std::string_view text, const AddedTokenMatcher& matcher, Plain&& plain, Added&& added) {
  size_t done = 0;
  AddedTokenMatcher::Match m;
  while (matcher.find(text, done, m)) {
    size_t begin = m.begin, end = m.end;
    if (m.token->lstrip) {
      while (begin > done) {
        size_t p = previous_code_point_start(text, begin);
        const size_t start = p;
        if (!unicode::is_white_space(unicode::next_code_point(text, p))) break;
        begin = start;
      }
    }
    if (m.token->rstrip) {
      while (end < text.size()) {
        size_t p = end;
        if (!unicode::is_white_space(unicode::next_code_point(text, p))) break;
        end = p;
      }
    }
    if (begin > done) plain(text.substr(done, begin - done));
    added(m.token->id);
    done = end;
  }
  if (done < text.size()) plain(text.substr(done));
}

}  // namespace
}  // namespace tok

namespace {

// Pre-tokenizes text that holds no added token and merges each piece.
void encode_plain(const Tokenizer::Impl& t, std::string_view text, tok::WordCache* cache, std::vector<TokenId>& out) {
  thread_local std::vector<tok::Piece> pieces;
  pieces.clear();
  switch (t.pre_tokenizer) {
    case tok::PreTokenizerKind::kQwen2Scanner:
      tok::split_qwen2(text, pieces);
      break;
    case tok::PreTokenizerKind::kRegex:
      t.regex->split(text, pieces);
      break;
    case tok::PreTokenizerKind::kWhole:
      pieces.push_back({0, static_cast<uint32_t>(text.size())});
      break;
  }
  for (const tok::Piece& piece : pieces) {
    const std::string_view word = text.substr(piece.begin, piece.end - piece.begin);
    if (word.size() == 1) {
      out.push_back(t.byte_ids[static_cast<unsigned char>(word[0])]);
      continue;
    }
    if (t.ignore_merges) {  // a word that is a token as a whole is taken as is
      const auto it = t.bytes_to_id.find(std::string(word));
      if (it != t.bytes_to_id.end()) {
        out.push_back(it->second);
        continue;
      }
    }
    // Like the JS reference, words of 256 bytes and more are not cached: they are rare and would crowd it.
    if (!cache || word.size() >= 256) {
      tok::merge_word(word, t.byte_ids, t.merges, out);
      continue;
    }
    const uint64_t hash = tok::WordCache::hash(word);
    if (cache->find(word, hash, out)) continue;
    const size_t first = out.size();
    tok::merge_word(word, t.byte_ids, t.merges, out);
    cache->insert(word, hash, out.data() + first, out.size() - first);
  }
}

// A segment between raw-matched added tokens: NFC, then the normalized added tokens, then the rest.
void encode_segment(const Tokenizer::Impl& t, std::string_view segment, tok::WordCache* cache,
                    std::vector<TokenId>& out) {
  std::string normalized;  // allocated only in the rare case that NFC changes something
  std::string_view text = segment;
  if (t.nfc && unicode::nfc_if_changed(segment, normalized)) text = normalized;
  if (t.normalized_matcher.empty()) {
    encode_plain(t, text, cache, out);
    return;
  }
  tok::split_added(
      text, t.normalized_matcher, [&](std::string_view plain) { encode_plain(t, plain, cache, out); },
      [&](TokenId id) { out.push_back(id); });
}

}  // namespace

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::from_json_text(std::string_view json_text, const std::string& source_name) {
  return Tokenizer(load_tokenizer_json(json_text, source_name));
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream in = open_input_file(path, "tokenizer", std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error("tokenizer " + path + ": cannot read the file");
  Tokenizer t = from_json_text(text.str(), path);
  // The chat template beside the tokenizer: chat_template.jinja (transformers 4.43+ save_pretrained; it wins over
  // the config's, as in transformers), else tokenizer_config.json's "chat_template".
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  for (const char* name : {"chat_template.jinja", "tokenizer_config.json"})
    if (std::filesystem::is_regular_file(dir / name, ec)) return t.with_chat_template_of_config((dir / name).string());
  return t;
}

ChatTemplate Tokenizer::chat_template() const {
  if (!chat_template_problem_.empty()) throw Error(chat_template_problem_);
  return chat_template_;
}

Tokenizer Tokenizer::with_chat_template(ChatTemplate t, std::string origin) const {
  Tokenizer out = *this;
  out.chat_template_ = t;
  out.chat_template_origin_ = std::move(origin);
  out.chat_template_problem_.clear();
  return out;
}

Tokenizer Tokenizer::with_chat_template_of_config(const std::string& config_path) const {
  try {
    return with_chat_template(chat_template_from_config_file(config_path), config_path);
  } catch (const Error& e) {
    Tokenizer out = *this;
    out.chat_template_origin_ = config_path;
    out.chat_template_problem_ = std::string(e.what()) + "; pass --chat-template chatml|qwen3-thinking to choose one";
    return out;
  }
}

Tokenizer load_tokenizer(const TokenizerSource& source) {
  Tokenizer t = Tokenizer::from_file(source.path);
  if (source.chat_template) return t.with_chat_template(*source.chat_template, "--chat-template");
  if (!source.config_path.empty()) {
    open_input_file(source.config_path, "tokenizer config (--tokenizer-config)", std::ios::binary);  // names a missing file
    return t.with_chat_template_of_config(source.config_path);
  }
  return t;
}

std::vector<TokenId> Tokenizer::encode(std::string_view text) const {
  const Impl& t = *impl_;
  if (const size_t bad = unicode::first_invalid_utf8(text); bad != std::string_view::npos)
    throw Error("cannot tokenize: the text is not valid UTF-8 (byte " + std::to_string(bad) + ")");
  if (text.size() > UINT32_MAX) throw Error("cannot tokenize: text of 4 GiB or more");
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  // One lock per call, not per word; a thread that finds the cache busy goes without.
  std::unique_lock<std::mutex> lock(t.cache_mutex, std::try_to_lock);
  tok::WordCache* cache = lock.owns_lock() ? &t.cache : nullptr;
  tok::split_added(
      text, t.raw_matcher, [&](std::string_view plain) { encode_segment(t, plain, cache, out); },
      [&](TokenId id) { out.push_back(id); });
  return out;
}

std::string Tokenizer::decode(const std::vector<TokenId>& ids, bool skip_special) const {
  return decode(ids.data(), ids.size(), skip_special);
}

std::string Tokenizer::decode(const TokenId* ids, size_t count, bool skip_special) const {
  const Impl& t = *impl_;
  std::string out, pending;  // pending: bytes of vocabulary tokens, turned into text at once
  for (size_t i = 0; i < count; ++i) {
    const TokenId id = ids[i];
    if (id < 0 || size_t(id) >= t.token_kind.size() || t.token_kind[id] == 0)
      throw Error("cannot decode: token id " + std::to_string(id) + " is not in the vocabulary of " + t.source);
    const std::string_view bytes(t.token_bytes.data() + t.token_offset[id], t.token_offset[id + 1] - t.token_offset[id]);
    if (t.token_kind[id] == 1) {
      pending.append(bytes);
      continue;
    }
    if (skip_special && t.token_kind[id] == 3) continue;
    // Added tokens are text already; the JS reference converts the bytes before one on their own.
    out += unicode::lossy(pending);
    pending.clear();
    out.append(bytes);
  }
  out += unicode::lossy(pending);
  return out;
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& a : impl_->added)
    if (a.content == token) return a.id;
  const auto it = impl_->spelled_to_id.find(std::string(token));
  if (it == impl_->spelled_to_id.end()) return std::nullopt;
  return it->second;
}

TokenId Tokenizer::added_token_id(std::string_view content) const {
  for (const AddedToken& a : impl_->added)
    if (a.content == content) return a.id;
  throw Error("tokenizer " + impl_->source + " has no added token " + std::string(content));
}

void Tokenizer::check_chat_format() const {
  (void)chat_template();  // its problem, named with its file
  for (const char* marker : {"<|im_start|>", "<|im_end|>"}) {
    const auto it = std::find_if(impl_->added.begin(), impl_->added.end(),
                                 [&](const AddedToken& a) { return a.content == marker; });
    if (it == impl_->added.end() || !it->special)
      throw Error("tokenizer " + impl_->source + " has no special added token " + marker +
                  ": the chat format (chat records, alpaca, prompt/target pairs, generate's prompt) needs Qwen3's "
                  "tokenizer.json with its added tokens; without the chat format: --data-format text (train, eval), "
                  "--no-chat (generate)");
  }
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
size_t Tokenizer::vocab_size() const { return impl_->token_kind.size(); }

void Tokenizer::check_fits_model(int64_t model_vocab_size, const std::string& model_origin) const {
  if (static_cast<int64_t>(vocab_size()) > model_vocab_size)
    throw Error(fmt::format("the tokenizer has ids up to {} but the model's vocab_size is {} ({}): a tokenizer of "
                            "another model?",
                            vocab_size() - 1, model_vocab_size, model_origin));
}
size_t Tokenizer::merge_count() const { return impl_->merge_count; }

size_t first_invalid_utf8_byte(std::string_view text) { return unicode::first_invalid_utf8(text); }

std::string nfc_normalize(std::string_view text) {
  if (const size_t bad = unicode::first_invalid_utf8(text); bad != std::string_view::npos)
    throw Error("cannot normalize: the text is not valid UTF-8 (byte " + std::to_string(bad) + ")");
  std::string out;
  return unicode::nfc_if_changed(text, out) ? out : std::string(text);
}

std::string utf8_lossy(std::string_view bytes) { return unicode::lossy(bytes); }

}  // namespace qwen3
