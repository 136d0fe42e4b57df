// What a loaded tokenizer holds (filled by tokenizer_json.cpp, used by tokenizer.cpp).
#pragma once
#include <array>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "bpe.h"
#include "pretokenizer.h"
#include "qwen3/tokenizer/tokenizer.h"

namespace qwen3::tok {

// Finds added tokens in text: at the leftmost position where any matches, the longest (the references'
// leftmost-longest rule).
class AddedTokenMatcher {
 public:
  struct Match {
    size_t begin, end;
    const AddedToken* token;
  };
  // `contents[i]` is what to look for (the NFC form for normalized tokens); `tokens[i]` what it stands for.
  void build(std::vector<std::pair<std::string, const AddedToken*>> contents);
  bool empty() const { return entries_.empty(); }
  // The first match starting at or after `from`, honouring single_word; false when there is none.
  bool find(std::string_view text, size_t from, Match& match) const;

 private:
  std::vector<std::pair<std::string, const AddedToken*>> entries_;  // longest first
  std::array<bool, 256> first_byte_{};
  int only_first_byte_ = -1;  // when every entry starts with the same byte: memchr for it
};

enum class PreTokenizerKind { kWhole, kQwen2Scanner, kRegex };

}  // namespace qwen3::tok

namespace qwen3 {

struct Tokenizer::Impl {
  std::string source;  // the file, for messages
  // Vocabulary: raw bytes of every id (added tokens: their content), and the file's spelling to ids.
  std::string token_bytes;
  std::vector<uint32_t> token_offset;  // id -> start in token_bytes; token_offset[id + 1] its end
  std::vector<uint8_t> token_kind;     // 0 no such id, 1 vocabulary, 2 added, 3 added and special
  std::unordered_map<std::string, TokenId> spelled_to_id;
  std::unordered_map<std::string, TokenId> bytes_to_id;  // only filled with ignore_merges
  std::array<TokenId, 256> byte_ids{};
  tok::MergeTable merges;
  size_t merge_count = 0;
  bool ignore_merges = false;

  std::vector<AddedToken> added;
  tok::AddedTokenMatcher raw_matcher;         // normalized = false: matched in the input as given
  tok::AddedTokenMatcher normalized_matcher;  // normalized = true: matched after NFC
  bool nfc = false;
  tok::PreTokenizerKind pre_tokenizer = tok::PreTokenizerKind::kWhole;
  std::unique_ptr<tok::RegexSplitter> regex;

  // Words merged before. Shared by all users of this tokenizer; a thread that finds it busy merges without it.
  mutable std::mutex cache_mutex;
  mutable tok::WordCache cache;
};

// Parses and checks tokenizer.json text; throws qwen3::Error("tokenizer SOURCE: ...").
std::shared_ptr<Tokenizer::Impl> load_tokenizer_json(std::string_view json_text, const std::string& source);

}  // namespace qwen3
