#include "unicode_text.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <memory>

#include "qwen3/base/error.h"

namespace qwen3::unicode {
namespace {

// Unicode Table 3-7: the range the second byte must fall in, per lead byte; later bytes are 80..BF.
struct LeadRule {
  uint8_t length, second_lo, second_hi;
};

LeadRule lead_rule(unsigned char b) {
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};  // no surrogates
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};  // nothing above U+10FFFF
  return {0, 0, 0};                       // 80..C1 and F5..FF never start a sequence
}

// Bytes of the longest well-formed prefix of the sequence at s[i] (0 when the lead byte is invalid);
// `complete` says whether that prefix is the whole sequence.
size_t valid_prefix(std::string_view s, size_t i, bool& complete) {
  const auto rule = lead_rule(static_cast<unsigned char>(s[i]));
  complete = false;
  if (rule.length == 0) return 0;
  size_t n = 1;
  for (; n < rule.length && i + n < s.size(); ++n) {
    const auto b = static_cast<unsigned char>(s[i + n]);
    const unsigned lo = n == 1 ? rule.second_lo : 0x80, hi = n == 1 ? rule.second_hi : 0xBF;
    if (b < lo || b > hi) return n;
  }
  complete = n == rule.length;
  return n;
}

bool white_space_uncached(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

CharClass classify_uncached(char32_t cp) {
  if (cp == '\r' || cp == '\n') return CharClass::kNewline;
  if (white_space_uncached(cp)) return CharClass::kSpace;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return CharClass::kLetter;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return CharClass::kNumber;
    default:
      return CharClass::kOther;
  }
}

bool nfc_inert_uncached(char32_t cp) {
  if (cp < 0x80) return true;
  const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
  if (p->combining_class != 0) return false;
  // libutf8proc marks characters that can be the second of a composition pair with comb_index >= 0x8000.
  if (p->comb_index != UINT16_MAX && p->comb_index >= 0x8000) return false;
  if (cp >= 0xAC00 && cp <= 0xD7A3) return true;   // Hangul syllables: algorithmic, NFC-stable
  if (cp >= 0x1100 && cp <= 0x11FF) return false;  // conjoining jamo compose algorithmically (L+V, LV+T)
  return p->decomp_seqindex == UINT16_MAX || p->decomp_type != 0;  // canonical decompositions go slow
}

// Class and NFC-inertness of every BMP code point, built once (about a millisecond): the common path then
// costs one load instead of libutf8proc's two-level lookups.
struct BmpTable {
  static constexpr uint8_t kInertBit = 0x80;
  std::array<uint8_t, 0x10000> bits{};
  BmpTable() {
    for (char32_t cp = 0; cp < 0x10000; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;  // surrogates never come out of valid UTF-8
      bits[cp] = static_cast<uint8_t>(classify_uncached(cp)) | (nfc_inert_uncached(cp) ? kInertBit : 0);
    }
  }
};

const BmpTable& bmp_table() {
  static const auto* table = new BmpTable();  // never destroyed: safe to use during static destruction
  return *table;
}

// NFC of a short run through libutf8proc (explicit length: an embedded NUL is an ordinary character).
void append_nfc_slow(std::string& out, std::string_view run) {
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(run.data()),
                                          static_cast<utf8proc_ssize_t>(run.size()), &result,
                                          static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owner(result, &std::free);
  if (n < 0) throw Error(std::string("NFC normalization failed: ") + utf8proc_errmsg(n));
  out.append(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
}

}  // namespace

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t well_formed_length(std::string_view s, size_t i) {
  bool complete;
  const size_t n = valid_prefix(s, i, complete);
  return complete ? n : 0;
}

size_t first_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = well_formed_length(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

bool is_white_space(char32_t cp) { return white_space_uncached(cp); }

CharClass classify(char32_t cp) {
  if (cp < 0x10000) return static_cast<CharClass>(bmp_table().bits[cp] & 0x7F);
  return classify_uncached(cp);
}

bool nfc_inert(char32_t cp) {
  if (cp < 0x10000) return (bmp_table().bits[cp] & BmpTable::kInertBit) != 0;
  return nfc_inert_uncached(cp);
}

bool nfc_if_changed(std::string_view text, std::string& out) {
  const BmpTable& table = bmp_table();
  size_t copied = 0;      // text[0, copied) is already in `out` (or unchanged, while out is empty)
  size_t prev_start = 0;  // where the code point before i starts
  bool changed = false;
  size_t i = 0;
  while (i < text.size()) {
    const size_t start = i;
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      prev_start = start;
      ++i;
      continue;
    }
    const char32_t cp = next_code_point(text, i);
    const bool inert = cp < 0x10000 ? (table.bits[cp] & BmpTable::kInertBit) != 0 : nfc_inert_uncached(cp);
    if (inert) {
      prev_start = start;
      continue;
    }
    // A run of characters NFC may change, plus the inert starter before it (they may compose with it).
    // Inert characters cannot combine backwards, so the run ends at the next one and NFC of the pieces
    // equals NFC of the whole.
    const size_t run_begin = start == 0 ? 0 : std::max(prev_start, copied);
    size_t run_end = i;
    while (run_end < text.size()) {
      size_t j = run_end;
      const char32_t next = next_code_point(text, j);
      if (nfc_inert(next)) break;
      run_end = j;
    }
    if (!changed) {
      out.clear();
      out.reserve(text.size() + 16);
      changed = true;
    }
    out.append(text.data() + copied, run_begin - copied);
    append_nfc_slow(out, text.substr(run_begin, run_end - run_begin));
    copied = run_end;
    i = run_end;
    prev_start = run_end;  // not used before being set again: the next character is inert
  }
  if (!changed) return false;
  out.append(text.data() + copied, text.size() - copied);
  return true;
}

std::string lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {
      out.push_back(bytes[i++]);
      continue;
    }
    bool complete;
    const size_t n = valid_prefix(bytes, i, complete);
    if (complete) {
      out.append(bytes.data() + i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += n == 0 ? 1 : n;
    }
  }
  return out;
}

}  // namespace qwen3::unicode
