// The tokenizer against independent references: ids from @huggingface/tokenizers on the real Qwen3 file
// (tests/data/tokenizer_fixture.json), the hand-written pre-tokenizer against PCRE2 running the pattern
// itself, the NFC fast path against libutf8proc on every code point, and the two merge loops against each other.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <utf8proc.h>

#include <random>

#include "cli_test_util.h"
#include "qwen3/tokenizer/chat_format.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode_text.h"
#include "tokenizer_test_util.h"

namespace qwen3 {
namespace {

using Ids = std::vector<TokenId>;

nlohmann::json load_fixture() { return nlohmann::json::parse(test::slurp(test::tokenizer_fixture_path())); }

std::string show(const Ids& ids) {
  std::string s;
  for (TokenId id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

TEST(TokenizerReference, ExamplesFromTheSpec) {
  QWEN3_REQUIRE_REAL_TOKENIZER(t);
  EXPECT_EQ(t->encode("Hello World"), Ids({9707, 4337}));
  EXPECT_EQ(t->encode("<|im_start|>user\n你是誰<|im_end|>\n"), Ids({151644, 872, 198, 105043, 108908, 151645, 198}));
  EXPECT_EQ(t->merge_count(), 151387u);
  EXPECT_EQ(t->added_tokens().size(), 26u);
  EXPECT_EQ(t->vocab_size(), 151643u + 26u);
  EXPECT_EQ(t->added_token_id("<|endoftext|>"), 151643);
}

TEST(TokenizerReference, FixtureIdsEqualTheReference) {
  QWEN3_REQUIRE_REAL_TOKENIZER(t);
  const nlohmann::json fixture = load_fixture();
  ASSERT_GE(fixture["cases"].size(), 300u);
  size_t mismatches = 0;
  for (const auto& c : fixture["cases"]) {
    const std::string text = c["text"];
    const Ids expect = c["ids"].get<Ids>();
    const Ids got = t->encode(text);
    if (got != expect && ++mismatches <= 10)
      ADD_FAILURE() << "text " << nlohmann::json(text).dump() << "\n  reference " << show(expect) << "\n  ours      "
                    << show(got);
    const std::string nfc = nfc_normalize(text);
    if (c.contains("nfc")) {
      EXPECT_EQ(nfc, c["nfc"].get<std::string>()) << "NFC differs from the reference's";
    }
    EXPECT_EQ(t->decode(got), nfc) << nlohmann::json(text).dump();
  }
  EXPECT_EQ(mismatches, 0u) << "of " << fixture["cases"].size() << " strings";
}

TEST(TokenizerReference, FixtureDecodingEqualsTheReference) {
  QWEN3_REQUIRE_REAL_TOKENIZER(t);
  for (const auto& c : load_fixture()["decode_cases"])
    EXPECT_EQ(t->decode(c["ids"].get<Ids>()), c["text"].get<std::string>()) << c.dump();
}

// The package's tokenizer_config.json holds the hybrid Qwen3 template, which the tokenizer picks up from beside
// tokenizer.json: the last assistant turn carries an empty think block, which stays out of the loss and ends
// the generation prompt.
TEST(TokenizerReference, TheHybridTemplateBesideTheTokenizerIsUsed) {
  QWEN3_REQUIRE_REAL_TOKENIZER(t);
  ASSERT_EQ(t->chat_template(), ChatTemplate::qwen3_thinking) << t->chat_template_origin();
  const ChatTokens c = render_chat(*t, {std::nullopt, "Hi", "Hello!"});
  EXPECT_EQ(c.ids, t->encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
                             "Hello!<|im_end|>\n"));
  const Ids prompt = chat_generation_prompt(*t, std::nullopt, "Hi");
  EXPECT_EQ(prompt, Ids(c.ids.begin(), c.ids.begin() + static_cast<std::ptrdiff_t>(prompt.size())));
  for (size_t i = 0; i < c.ids.size(); ++i)
    EXPECT_EQ(c.loss_mask[i], i >= prompt.size() && i + 1 < c.ids.size()) << "position " << i;
}

TEST(TokenizerReference, ChatTargetIsEncodedOnItsOwn) {
  QWEN3_REQUIRE_REAL_TOKENIZER(hybrid);
  const Tokenizer chatml = hybrid->with_chat_template(ChatTemplate::chatml, "test");
  const Tokenizer* t = &chatml;
  const ChatTokens plain = render_chat(*t, {std::nullopt, "Hi", "Hello!"});
  EXPECT_EQ(plain.ids, t->encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"));
  // A target starting with a newline: the prompt ends in "\n" (198) as at generation time, never "\n\n" (271).
  const ChatTokens c = render_chat(*t, {std::string("Be brief."), "Hi", "\nHello!"});
  const Ids prompt = chat_generation_prompt(*t, std::string("Be brief."), "Hi");
  ASSERT_EQ(prompt.back(), 198);
  Ids expect = prompt;
  for (TokenId id : t->encode("\nHello!")) expect.push_back(id);
  expect.push_back(151645);
  expect.push_back(198);
  EXPECT_EQ(c.ids, expect);
  for (size_t i = 0; i < c.ids.size(); ++i)
    EXPECT_EQ(c.loss_mask[i], i >= prompt.size() && i + 1 < c.ids.size()) << "position " << i;
}

// The pieces as strings, for readable failures.
std::vector<std::string> pieces_of(std::string_view text, const std::vector<tok::Piece>& pieces) {
  std::vector<std::string> out;
  for (const auto& p : pieces) out.emplace_back(text.substr(p.begin, p.end - p.begin));
  return out;
}

std::vector<std::string> scanner_split(std::string_view text) {
  std::vector<tok::Piece> pieces;
  tok::split_qwen2(text, pieces);
  return pieces_of(text, pieces);
}

TEST(PreTokenizer, ScannerSplitsLikeThePattern) {
  EXPECT_EQ(scanner_split("Hello World"), (std::vector<std::string>{"Hello", " World"}));
  EXPECT_EQ(scanner_split("  \n\n  \t x"), (std::vector<std::string>{"  \n\n", "  \t", " x"}));
  EXPECT_EQ(scanner_split("don't 'S"), (std::vector<std::string>{"don", "'t", " '", "S"}));
  EXPECT_EQ(scanner_split("a  b "), (std::vector<std::string>{"a", " ", " b", " "}));
  EXPECT_EQ(scanner_split("x.\n\ny"), (std::vector<std::string>{"x", ".\n\n", "y"}));
  EXPECT_EQ(scanner_split("12ab"), (std::vector<std::string>{"1", "2", "ab"}));
  EXPECT_EQ(scanner_split(" .hi"), (std::vector<std::string>{" .", "hi"}));
  EXPECT_EQ(tok::onig_to_pcre2("(?i:'s|x)\\s[^\\s]"),
            "(?:'[sS]|[xX])[\\t-\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}"
            "\\x{3000}][^\\t-\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}"
            "\\x{3000}]");
}

TEST(PreTokenizer, ScannerEqualsPcre2OnFixtureAndRandomText) {
  const tok::RegexSplitter regex(tok::kQwen2Pattern);
  auto check = [&](const std::string& text) {
    std::vector<tok::Piece> pieces;
    regex.split(text, pieces);
    ASSERT_EQ(scanner_split(text), pieces_of(text, pieces)) << nlohmann::json(text).dump();
  };
  for (const auto& c : load_fixture()["cases"]) check(nfc_normalize(c["text"].get<std::string>()));
  // Every class of the pattern and the characters where engines disagree (U+180E, U+FEFF, U+0085, ſ).
  const std::vector<std::string> pool = {"a", "Z", "s", "S", "t", "r", "e", "E", "v", "m", "l", "L", "d", "'", "1",
                                         " ", " ", "\t", "\n", "\r", ".", "!", "_", "中", "é", "²", "Ⅻ", "٣",
                                         "\xC2\xA0", "\xE3\x80\x80", "\xC2\x85", "\xE2\x80\xA8", "\xE1\xA0\x8E",
                                         "\xEF\xBB\xBF", "\xC5\xBF", "\xCC\x81", "\xF0\x9F\x98\x80", "<|", "\x0B"};
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::string s;
    const int n = 1 + int(rng() % 12);
    for (int k = 0; k < n; ++k) s += pool[rng() % pool.size()];
    check(s);
  }
}

TEST(Unicode, NfcFastPathIsExactForEveryCodePoint) {
  // Whatever the fast path copies must be what NFC leaves alone: an inert character has combining class 0
  // and no canonical decomposition (Hangul syllables aside), and no character that NFC composes onto a
  // starter is inert. The composed pairs are exactly those inside the canonical decompositions of the
  // characters NFC keeps (the others are composition exclusions, never recomposed).
  for (utf8proc_int32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    utf8proc_int32_t d[8];
    int last_class = 0;
    const utf8proc_ssize_t n = utf8proc_decompose_char(cp, d, 8, UTF8PROC_DECOMPOSE, &last_class);
    ASSERT_GT(n, 0);
    const bool inert = unicode::nfc_inert(char32_t(cp));
    if (inert) {
      ASSERT_EQ(utf8proc_get_property(cp)->combining_class, 0) << std::hex << cp;
      if (!(cp >= 0xAC00 && cp <= 0xD7A3)) {
        ASSERT_TRUE(n == 1 && d[0] == cp) << std::hex << cp;
      }
    }
    if (n < 2) continue;
    std::string one;
    unicode::append_utf8(one, char32_t(cp));
    if (nfc_normalize(one) != one) continue;  // a composition exclusion
    for (utf8proc_ssize_t k = 1; k < n; ++k) ASSERT_FALSE(unicode::nfc_inert(char32_t(d[k]))) << std::hex << cp;
  }
}

TEST(Unicode, NfcEqualsLibutf8procOnRandomText) {
  const std::vector<char32_t> pool = {'a', 'e', 'A', ' ', 0xE9, 0x301, 0x308, 0x323, 0x302, 0x1100, 0x1161, 0x11A8,
                                      0xAC00, 0xD55C, 0x212B, 0x2126, 0x0F71, 0x0F72, 0x0F73, 0x0CBF, 0x0CD5,
                                      0x4E2D, 0x3099, 0x304B, 0xFB01, 0x1F600, 0x0344, 0x0958, 0x1E0A, 0x0307};
  std::mt19937 rng(11);
  for (int i = 0; i < 20000; ++i) {
    std::string s;
    const int n = 1 + int(rng() % 10);
    for (int k = 0; k < n; ++k) unicode::append_utf8(s, pool[rng() % pool.size()]);
    utf8proc_uint8_t* ref = nullptr;
    const auto len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()),
                                  &ref, utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    ASSERT_GE(len, 0);
    const std::string expect(reinterpret_cast<char*>(ref), size_t(len));
    std::free(ref);
    ASSERT_EQ(nfc_normalize(s), expect) << nlohmann::json(s).dump();
  }
}

TEST(Bpe, ScanAndHeapMergeLoopsAgree) {
  // A random merge table over the bytes 'a', 'b', 'c' (ids 0, 1, 2), each merge joining existing tokens.
  std::mt19937 rng(3);
  std::array<TokenId, 256> byte_ids{};
  byte_ids['a'] = 0, byte_ids['b'] = 1, byte_ids['c'] = 2;
  tok::MergeTable merges;
  merges.reserve(400);
  TokenId next_id = 3;
  for (uint32_t rank = 0; rank < 400; ++rank) {
    const TokenId l = TokenId(rng() % next_id), r = TokenId(rng() % next_id);
    if (!merges.find(l, r)) merges.insert(l, r, rank, next_id++);
  }
  for (int i = 0; i < 20000; ++i) {
    std::string word;
    const size_t n = 2 + rng() % 47;
    for (size_t k = 0; k < n; ++k) word += char('a' + rng() % 3);
    Ids scan, heap;
    tok::merge_word_by_scan(word, byte_ids, merges, scan);
    tok::merge_word_by_heap(word, byte_ids, merges, heap);
    ASSERT_EQ(scan, heap) << word;
  }
}

TEST(Bpe, WordCacheStartsOverWhenFull) {
  tok::WordCache cache(4);
  const TokenId ids[] = {1, 2};
  for (int i = 0; i < 10; ++i) {
    const std::string w = "w" + std::to_string(i);
    cache.insert(w, tok::WordCache::hash(w), ids, 2);
  }
  Ids out;
  EXPECT_TRUE(cache.find("w9", tok::WordCache::hash("w9"), out));
  EXPECT_EQ(out, Ids({1, 2}));
  EXPECT_FALSE(cache.find("w0", tok::WordCache::hash("w0"), out));
}

}  // namespace
}  // namespace qwen3
