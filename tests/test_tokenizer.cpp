// The tokenizer on the hand-made tests/data/tiny_tokenizer.json (no download needed): merges by rank,
// bytes without merges, added tokens and their flags, decoding, bad files, and the chat format.
// Its vocabulary: ids 0..255 are the bytes themselves (id == byte value); merges, in rank order:
//   256 he, 257 ll, 258 hell, 259 hello, 260 Ġw, 261 or, 262 Ġwor, 263 ld, 264 Ġworld, 265 aa, 266 aaaa,
//   267 er, 268 "ä½", 269 "ä½ł" (= 你);
// added: 270 <|endoftext|>, 271 <|im_start|>, 272 <|im_end|> (special), 273 <tool>, 274 [LS] (lstrip,
//   rstrip), 275 café (normalized), 276 hi (single_word).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <thread>

#include "cli_test_util.h"
#include "qwen3/tokenizer/chat_format.h"
#include "qwen3/base/error.h"
#include "tokenizer_test_util.h"

namespace qwen3 {
namespace {

using Ids = std::vector<TokenId>;
using test::tiny_tokenizer;

TEST(Tokenizer, MergesApplyByRankLeftmostFirst) {
  const Tokenizer& t = tiny_tokenizer();
  EXPECT_EQ(t.encode("hello"), Ids({259}));
  EXPECT_EQ(t.encode(" world"), Ids({264}));
  EXPECT_EQ(t.encode("hello world"), Ids({259, 264}));
  EXPECT_EQ(t.encode("her"), Ids({256, 'r'}));  // "h e" (rank 0) before "e r" (rank 11)
  EXPECT_EQ(t.encode("aaa"), Ids({265, 'a'}));  // equal ranks: the leftmost pair merges first
  EXPECT_EQ(t.encode("aaaa"), Ids({266}));
  EXPECT_EQ(t.encode("aaaaa"), Ids({266, 'a'}));
  EXPECT_EQ(t.encode("worlds"), Ids({'w', 261, 263, 's'}));  // Ġwor needs the space: pieces never cross words
  EXPECT_EQ(t.encode(""), Ids{});
}

// Ids the model's embedding lacks are refused up front, naming the config (not "index out of range in self").
TEST(Tokenizer, MustFitTheModelsVocabulary) {
  const Tokenizer& t = tiny_tokenizer();
  ASSERT_EQ(t.vocab_size(), 277u);
  EXPECT_NO_THROW(t.check_fits_model(277, "config.json"));
  try {
    t.check_fits_model(276, "m/config.json");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ids up to 276 but the model's vocab_size is 276 (m/config.json)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Tokenizer, BytesWithoutMergesStayBytes) {
  const Tokenizer& t = tiny_tokenizer();
  EXPECT_EQ(t.encode("xyz"), Ids({'x', 'y', 'z'}));
  EXPECT_EQ(t.encode("你"), Ids({269}));
  EXPECT_EQ(t.encode("好"), Ids({0xE5, 0xA5, 0xBD}));
  EXPECT_EQ(t.encode("你好"), Ids({269, 0xE5, 0xA5, 0xBD}));
  EXPECT_EQ(t.encode("\xF0\x9F\x98\x80"), Ids({0xF0, 0x9F, 0x98, 0x80}));
  EXPECT_EQ(t.encode(std::string("a\0b", 3)), Ids({'a', 0, 'b'}));
}

TEST(Tokenizer, AddedTokensAreSplitOutAndNeverMerged) {
  const Tokenizer& t = tiny_tokenizer();
  EXPECT_EQ(t.encode("<|im_start|>hello<|im_end|>"), Ids({271, 259, 272}));
  EXPECT_EQ(t.encode("<|im_start|><|im_start|>"), Ids({271, 271}));
  EXPECT_EQ(t.encode(" <|endoftext|> "), Ids({' ', 270, ' '}));
  EXPECT_EQ(t.encode("<tool>x"), Ids({273, 'x'}));
  const std::string partial = "<|im_start|";  // not the token: plain bytes, as no merge applies to them
  EXPECT_EQ(t.encode(partial), Ids(partial.begin(), partial.end()));
  EXPECT_EQ(t.added_token_id("<|im_end|>"), 272);
  EXPECT_EQ(t.token_to_id("Ġworld"), 264);
  EXPECT_EQ(t.token_to_id("<|im_end|>"), 272);
  EXPECT_FALSE(t.token_to_id("nope").has_value());
  EXPECT_THROW(t.added_token_id("<|nope|>"), Error);
  EXPECT_EQ(t.vocab_size(), 277u);
  EXPECT_EQ(t.merge_count(), 14u);
}

TEST(Tokenizer, AddedTokenFlags) {
  const Tokenizer& t = tiny_tokenizer();
  // lstrip/rstrip swallow the whitespace beside the token, Unicode whitespace included.
  EXPECT_EQ(t.encode("a [LS] b"), Ids({'a', 274, 'b'}));
  EXPECT_EQ(t.encode("a\xE3\x80\x80[LS]\n b"), Ids({'a', 274, 'b'}));
  // normalized: matched after NFC, so the decomposed spelling finds it too.
  EXPECT_EQ(t.encode("caf\xC3\xA9"), Ids({275}));
  EXPECT_EQ(t.encode("cafe\xCC\x81"), Ids({275}));
  // single_word: only where no letter, digit or '_' touches it.
  EXPECT_EQ(t.encode("hi"), Ids({276}));
  EXPECT_EQ(t.encode("hi!"), Ids({276, '!'}));
  EXPECT_EQ(t.encode("this"), Ids({'t', 'h', 'i', 's'}));
  EXPECT_EQ(t.encode("hi_"), Ids({'h', 'i', '_'}));
}

TEST(Tokenizer, DecodeReversesEncode) {
  const Tokenizer& t = tiny_tokenizer();
  for (const std::string s : {"hello world", "你好 <|im_start|>x\n\n  \t", "a [LS] b", "", "\xF0\x9F\x98\x80!"}) {
    const std::string expect = s == "a [LS] b" ? "a[LS]b" : s;  // lstrip/rstrip removed the spaces
    EXPECT_EQ(t.decode(t.encode(s)), expect) << s;
  }
  EXPECT_EQ(t.decode(Ids{271, 259, 272}), "<|im_start|>hello<|im_end|>");
  EXPECT_EQ(t.decode(Ids{271, 259, 272}, /*skip_special=*/true), "hello");
  EXPECT_EQ(t.decode(Ids{273}, true), "<tool>");  // not special: kept
  EXPECT_EQ(t.decode(t.encode("cafe\xCC\x81")), "caf\xC3\xA9");  // NFC form
}

TEST(Tokenizer, DecodeReplacesInvalidUtf8) {
  const Tokenizer& t = tiny_tokenizer();
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(t.decode(Ids{0xE4, 0xBD}), fffd);                    // a truncated sequence: one U+FFFD
  EXPECT_EQ(t.decode(Ids{0xE4, 0xBD, 0xA0}), "你");
  EXPECT_EQ(t.decode(Ids{0xFF, 'a'}), fffd + "a");
  EXPECT_EQ(t.decode(Ids{0xC0, 0xAF}), fffd + fffd);              // overlong: each byte
  EXPECT_EQ(t.decode(Ids{0xED, 0xA0, 0x80}), fffd + fffd + fffd);  // a surrogate: each byte
  EXPECT_EQ(t.decode(Ids{0xF0, 0x9F, 0x98, 'A'}), fffd + "A");
  EXPECT_EQ(t.decode(Ids{0xC3, 272, 0xA9}), fffd + "<|im_end|>" + fffd);  // bytes never join across a token
  EXPECT_EQ(utf8_lossy("\xF4\x90\x80\x80"), fffd + fffd + fffd + fffd);
  EXPECT_EQ(utf8_lossy("\xE0\x80\x41"), fffd + fffd + "A");
  EXPECT_EQ(utf8_lossy("ok \xF0\x9F\x98\x80"), "ok \xF0\x9F\x98\x80");
  EXPECT_THROW(t.decode(Ids{277}), Error);
  EXPECT_THROW(t.decode(Ids{-1}), Error);
}

TEST(Tokenizer, EncodeRejectsInvalidUtf8) {
  try {
    tiny_tokenizer().encode("ok\xC3(");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("byte 2"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, SafeFromSeveralThreads) {
  const Tokenizer& t = tiny_tokenizer();
  const std::string text = "hello world <|im_end|> 你好 aaaa her\n\n";
  const Ids expect = t.encode(text);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (int i = 0; i < 2000; ++i) ok[k] += t.encode(text + std::to_string(i % 7)).size() == expect.size() + 1;
    });
  for (auto& th : threads) th.join();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(ok[k], 2000);
}

// A variant of the tiny file with one change, written to a temporary file.
struct BadFile {
  test::TempDir dir;
  std::string path;
  explicit BadFile(const std::function<void(nlohmann::json&)>& change) : path(dir.file("tokenizer.json")) {
    nlohmann::json j = nlohmann::json::parse(test::slurp(test::tiny_tokenizer_path()));
    change(j);
    std::ofstream(path) << j.dump();
  }
};

void expect_load_error(const std::function<void(nlohmann::json&)>& change, const std::string& expected) {
  BadFile f(change);
  try {
    Tokenizer::from_file(f.path);
    ADD_FAILURE() << "loaded; expected an error with: " << expected;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(f.path), std::string::npos) << what;
    EXPECT_NE(what.find(expected), std::string::npos) << what;
  }
}

TEST(Tokenizer, BadFilesAreOneClearError) {
  using nlohmann::json;
  expect_load_error([](json& j) { j["model"]["vocab"].erase("Ġ"); }, "no token for byte 0x20");
  expect_load_error([](json& j) { j["model"]["merges"].push_back({"zz", "q"}); }, "\"zz\" is not in model.vocab");
  expect_load_error([](json& j) { j["model"]["merges"].push_back({"x", "q"}); }, "merged token \"xq\"");
  expect_load_error([](json& j) { j["model"]["merges"][0] = "h e x"; }, "model.merges[0]");
  expect_load_error([](json& j) { j["model"]["merges"][1] = 7; }, "model.merges[1]");
  expect_load_error([](json& j) { j["model"]["vocab"]["Ġ"] = -3; }, "token id");
  expect_load_error([](json& j) { j["model"]["vocab"]["Ġ"] = 33; }, "gives id 33 to two tokens");
  expect_load_error([](json& j) { j["model"]["type"] = "WordPiece"; }, "only BPE");
  expect_load_error([](json& j) { j["model"]["byte_fallback"] = true; }, "byte_fallback");
  expect_load_error([](json& j) { j.erase("model"); }, "has no \"model\"");
  expect_load_error([](json& j) { j["added_tokens"][0].erase("content"); }, "added_tokens[0] has no \"content\"");
  expect_load_error([](json& j) { j["added_tokens"][1]["special"] = "yes"; }, "added_tokens[1].special");
  expect_load_error([](json& j) { j["normalizer"] = {{"type", "NFKC"}}; }, "normalizer NFKC");
  expect_load_error([](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, "Whitespace");
  expect_load_error([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(a"; },
                    "pattern");
  expect_load_error([](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; },
                    "add_prefix_space");
  expect_load_error([](json& j) { j["post_processor"] = {{"type", "TemplateProcessing"}}; }, "post_processor");
  expect_load_error([](json& j) { j = json::array(); }, "top level");

  test::TempDir dir;
  const std::string not_json = dir.file("t.json");
  std::ofstream(not_json) << "{\"model\": ";
  EXPECT_THROW(Tokenizer::from_file(not_json), Error);
  try {
    Tokenizer::from_file(dir.file("missing.json"));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.json: cannot open"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, MergesInTheOlderStringForm) {
  BadFile f([](nlohmann::json& j) {
    for (auto& m : j["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  });
  const Tokenizer t = Tokenizer::from_file(f.path);
  EXPECT_EQ(t.encode("hello world aaa her 你"), tiny_tokenizer().encode("hello world aaa her 你"));
}

TEST(ChatFormat, MaskCoversTheTargetAndTheClosingImEnd) {
  const Tokenizer& t = tiny_tokenizer();
  const ChatTokens c = render_chat(t, {std::string("sys"), "hi there", "hello"});
  const Ids expect_prefix = chat_generation_prompt(t, std::string("sys"), "hi there");
  ASSERT_EQ(c.ids.size(), c.loss_mask.size());
  ASSERT_GT(c.ids.size(), expect_prefix.size() + 2);
  EXPECT_TRUE(std::equal(expect_prefix.begin(), expect_prefix.end(), c.ids.begin()));
  // The whole example as text, tokenized at once, gives the same ids.
  EXPECT_EQ(c.ids, t.encode("<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi there<|im_end|>\n"
                            "<|im_start|>assistant\nhello<|im_end|>\n"));
  const size_t p = expect_prefix.size();
  EXPECT_EQ(Ids(c.ids.begin() + p, c.ids.end()), Ids({259, 272, '\n'}));
  std::vector<uint8_t> mask(p, 0);
  mask.insert(mask.end(), {1, 1, 0});  // "hello", <|im_end|>, not the "\n" after it
  EXPECT_EQ(c.loss_mask, mask);
}

TEST(ChatFormat, WithoutSystemPromptAndGenerationPrompt) {
  const Tokenizer& t = tiny_tokenizer();
  const Ids prompt = chat_generation_prompt(t, std::nullopt, "hi");
  EXPECT_EQ(prompt, t.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"));
  EXPECT_EQ(prompt.back(), '\n');
  const ChatTokens c = render_chat(t, {std::nullopt, "hi", "aaaa aaaa"});
  size_t masked = 0;
  for (size_t i = 0; i < c.ids.size(); ++i) masked += c.loss_mask[i];
  EXPECT_EQ(masked, t.encode("aaaa aaaa").size() + 1);
  EXPECT_EQ(c.ids[c.ids.size() - 2], 272);
  EXPECT_EQ(c.loss_mask[c.ids.size() - 2], 1);
  EXPECT_EQ(c.loss_mask.back(), 0);
}

}  // namespace
}  // namespace qwen3
