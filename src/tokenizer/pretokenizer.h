// The pre-tokenizer: splits normalized text into the pieces BPE merges within (the `Split` regex with
// behaviour "Isolated": matches and the gaps between them are both pieces).
// The Qwen2/Qwen3 pattern runs on a hand-written scanner (several times faster than the regex); any other
// pattern runs on PCRE2 after `onig_to_pcre2`. The tests check that the two give identical splits.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace qwen3::tok {

// The pattern of Qwen2, Qwen2.5 and Qwen3 tokenizers.
extern const char* const kQwen2Pattern;
// GPT-2's, used by a ByteLevel pre-tokenizer with use_regex = true.
extern const char* const kGpt2Pattern;

struct Piece {
  uint32_t begin, end;  // byte offsets into the split text
};

// The Qwen2 pattern, by hand. `text` must be well-formed UTF-8.
void split_qwen2(std::string_view text, std::vector<Piece>& out);

// Rewrites an Oniguruma-flavoured pattern from tokenizer.json for PCRE2 so that it means what the
// reference means: \s and \S become Unicode White_Space (PCRE2's \s also takes U+180E), and letters inside
// `(?i:...)` match their ASCII case partner only (as the JS reference; PCRE2 would also take U+017F for s).
// Throws std::invalid_argument for constructs it cannot translate faithfully.
std::string onig_to_pcre2(std::string_view pattern);

class RegexSplitter {
 public:
  // Throws std::invalid_argument with PCRE2's message when the pattern does not compile.
  explicit RegexSplitter(const std::string& onig_pattern);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;
  void split(std::string_view text, std::vector<Piece>& out) const;

 private:
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace qwen3::tok
