// The Unicode facts the tokenizer needs: UTF-8 decoding, the character classes of the pre-tokenizer pattern
// (\p{L}, \p{N}, \s as Unicode White_Space), NFC with a fast path for text that NFC leaves alone, and lossy
// UTF-8 for decoding.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qwen3::unicode {

// Decodes the code point at s[i] (which must be the start of a well-formed sequence); advances i.
inline char32_t next_code_point(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  auto cont = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[i + k]) & 0x3F); };
  char32_t cp;
  if (b0 < 0xE0) {
    cp = (static_cast<char32_t>(b0 & 0x1F) << 6) | cont(1);
    i += 2;
  } else if (b0 < 0xF0) {
    cp = (static_cast<char32_t>(b0 & 0x0F) << 12) | (cont(1) << 6) | cont(2);
    i += 3;
  } else {
    cp = (static_cast<char32_t>(b0 & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3);
    i += 4;
  }
  return cp;
}

void append_utf8(std::string& out, char32_t cp);

// Length of the well-formed UTF-8 sequence starting at s[i], or 0 when it is ill-formed or truncated.
size_t well_formed_length(std::string_view s, size_t i);

// Offset of the first byte that is not part of well-formed UTF-8, or npos when all of it is.
size_t first_invalid_utf8(std::string_view s);

// Classes of the Qwen2 pre-tokenizer pattern. Newline is \r or \n (both also whitespace).
enum class CharClass : uint8_t { kOther, kLetter, kNumber, kSpace, kNewline };

CharClass classify(char32_t cp);

// Unicode White_Space: what Oniguruma (the Rust reference) and the JS reference take \s to mean. PCRE2's own
// \s adds U+180E, so the regex path spells the class out instead.
bool is_white_space(char32_t cp);

// NFC of well-formed UTF-8 into `out`, or false (and `out` untouched) when NFC leaves the text as it is, the
// common case. Runs of characters that NFC cannot change are copied; only the rest goes through libutf8proc.
bool nfc_if_changed(std::string_view text, std::string& out);

// True when NFC can neither change this character nor combine it with the one before: canonical combining
// class 0, no canonical decomposition (Hangul syllables excepted: they recompose to themselves) and not the
// second half of any canonical composition. Exposed for the exhaustive test.
bool nfc_inert(char32_t cp);

// Lossy UTF-8: every maximal ill-formed subpart becomes one U+FFFD.
std::string lossy(std::string_view bytes);

}  // namespace qwen3::unicode
