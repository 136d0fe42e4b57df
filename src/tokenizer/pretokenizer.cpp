#include "pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdexcept>

#include "unicode_text.h"

namespace qwen3::tok {

const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

using unicode::CharClass;

// The text decoded once: each code point's class and where it starts (plus the end), so the scanner can
// look ahead and back up by code points.
struct CodePoints {
  std::vector<CharClass> cls;
  std::vector<uint32_t> offset;
  void decode(std::string_view text) {
    cls.clear();
    offset.clear();
    size_t i = 0;
    while (i < text.size()) {
      offset.push_back(static_cast<uint32_t>(i));
      const auto b = static_cast<unsigned char>(text[i]);
      if (b < 0x80) {
        cls.push_back(unicode::classify(b));
        ++i;
      } else {
        cls.push_back(unicode::classify(unicode::next_code_point(text, i)));
      }
    }
    offset.push_back(static_cast<uint32_t>(text.size()));
  }
};

char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

// Length in code points of `(?i:'s|'t|'re|'ve|'m|'ll|'d)` at cp index i (0: no match). All of it is ASCII,
// so bytes and code points coincide.
size_t contraction_length(std::string_view text, const CodePoints& cps, size_t i) {
  const size_t b = cps.offset[i];
  if (text[b] != '\'' || b + 1 >= text.size()) return 0;
  const char c1 = ascii_lower(text[b + 1]);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (b + 2 >= text.size()) return 0;
  const char c2 = ascii_lower(text[b + 2]);
  if ((c1 == 'r' || c1 == 'v') && c2 == 'e') return 3;
  if (c1 == 'l' && c2 == 'l') return 3;
  return 0;
}

// The end (cp index) of the match of the Qwen2 pattern that starts at cp index i; alternatives in order.
size_t qwen2_match_end(std::string_view text, const CodePoints& cps, size_t i) {
  const size_t n = cps.cls.size();
  const auto& cls = cps.cls;
  auto run_of = [&](size_t j, CharClass c) {
    while (j < n && cls[j] == c) ++j;
    return j;
  };
  const CharClass c = cls[i];
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (c == CharClass::kOther) {
    if (const size_t len = contraction_length(text, cps, i)) return i + len;
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c == CharClass::kLetter) return run_of(i + 1, CharClass::kLetter);
  if (c != CharClass::kNewline && c != CharClass::kNumber && i + 1 < n && cls[i + 1] == CharClass::kLetter)
    return run_of(i + 2, CharClass::kLetter);
  // \p{N}
  if (c == CharClass::kNumber) return i + 1;
  // ' '?[^\s\p{L}\p{N}]+[\r\n]*  (the optional part is U+0020 only)
  const size_t k = text[cps.offset[i]] == ' ' ? i + 1 : i;
  if (k < n && cls[k] == CharClass::kOther) return run_of(run_of(k + 1, CharClass::kOther), CharClass::kNewline);
  // Only whitespace is left (c is kSpace or kNewline). The run of it:
  size_t j = i;
  size_t last_newline = n;
  while (j < n && (cls[j] == CharClass::kSpace || cls[j] == CharClass::kNewline)) {
    if (cls[j] == CharClass::kNewline) last_newline = j;
    ++j;
  }
  // \s*[\r\n]+  : backtracks to the run's last newline
  if (last_newline != n) return last_newline + 1;
  // \s+(?!\S)   : the whole run at the end of the text, else all but its last character
  if (j == n) return j;
  if (j - 1 > i) return j - 1;
  // \s+
  return j;
}

}  // namespace

void split_qwen2(std::string_view text, std::vector<Piece>& out) {
  thread_local CodePoints cps;  // reused: pieces are short, text segments are not
  cps.decode(text);
  const size_t n = cps.cls.size();
  size_t i = 0;
  while (i < n) {
    const size_t end = qwen2_match_end(text, cps, i);
    out.push_back({cps.offset[i], cps.offset[end]});
    i = end;
  }
}

std::string onig_to_pcre2(std::string_view pattern) {
  static const std::string kSpaceRanges =
      R"(\t-\r\x20\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
  std::string out;
  std::vector<bool> group_caseless{false};  // a stack: one entry per open group
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char ch = pattern[i];
    const bool caseless = group_caseless.back();
    if (ch == '\\') {
      if (i + 1 >= pattern.size()) throw std::invalid_argument("pattern ends with a backslash");
      const char e = pattern[++i];
      if (e == 's') {
        out += in_class ? kSpaceRanges : "[" + kSpaceRanges + "]";
      } else if (e == 'S') {
        if (in_class) throw std::invalid_argument("\\S inside a character class is not supported");
        out += "[^" + kSpaceRanges + "]";
      } else {
        out += ch;
        out += e;
      }
      continue;
    }
    if (in_class) {
      if (ch == ']') in_class = false;
      if (caseless && ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')))
        throw std::invalid_argument("letters in a class inside (?i:...) are not supported");
      out += ch;
      continue;
    }
    if (ch == '[') {
      in_class = true;
      out += ch;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];  // a literal ] first
    } else if (ch == '(') {
      if (pattern.substr(i, 4) == "(?i:") {
        group_caseless.push_back(true);
        out += "(?:";
        i += 3;
      } else {
        group_caseless.push_back(caseless);
        out += ch;
      }
    } else if (ch == ')') {
      if (group_caseless.size() == 1) throw std::invalid_argument("unbalanced ')'");
      group_caseless.pop_back();
      out += ch;
    } else if (caseless && ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'))) {
      const char lower = ascii_lower(ch);
      out += '[';
      out += lower;
      out += static_cast<char>(lower - 'a' + 'A');
      out += ']';
    } else {
      out += ch;
    }
  }
  if (in_class || group_caseless.size() != 1) throw std::invalid_argument("unbalanced [ or (");
  return out;
}

struct RegexSplitter::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() { pcre2_code_free(code); }
};

RegexSplitter::RegexSplitter(const std::string& onig_pattern) : compiled_(std::make_unique<Compiled>()) {
  const std::string pattern = onig_to_pcre2(onig_pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                  PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (!compiled_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof message);
    throw std::invalid_argument("the pattern does not compile (" + std::string(reinterpret_cast<char*>(message)) +
                                " at offset " + std::to_string(error_offset) + ")");
  }
  compiled_->jit = pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE) == 0;  // the interpreter otherwise
}

RegexSplitter::~RegexSplitter() = default;

void RegexSplitter::split(std::string_view text, std::vector<Piece>& out) const {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(compiled_->code, nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t gap_begin = 0, search_from = 0;
  while (search_from <= text.size()) {
    // The text was validated already; an empty match moves on one code point, as the JS reference does.
    const int rc = pcre2_match(compiled_->code, subject, text.size(), search_from, PCRE2_NO_UTF_CHECK,
                               match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw std::runtime_error("PCRE2 match failed with code " + std::to_string(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match.get());
    const size_t begin = ov[0], end = ov[1];
    if (begin == end) {
      if (begin >= text.size()) break;
      size_t next = begin;
      unicode::next_code_point(text, next);
      search_from = next;
      continue;
    }
    if (begin > gap_begin) out.push_back({static_cast<uint32_t>(gap_begin), static_cast<uint32_t>(begin)});
    out.push_back({static_cast<uint32_t>(begin), static_cast<uint32_t>(end)});
    gap_begin = search_from = end;
  }
  if (gap_begin < text.size())
    out.push_back({static_cast<uint32_t>(gap_begin), static_cast<uint32_t>(text.size())});
}

}  // namespace qwen3::tok
