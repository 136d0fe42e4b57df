// `qwen3-train tokenize` as scripts call it (the tiny tokenizer of test_tokenizer.cpp: "hello" is 259,
// " world" 264, <|im_end|> 272).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "cli_test_util.h"
#include "qwen3/tokenizer/chat_format.h"
#include "tokenizer_test_util.h"

namespace qwen3 {
namespace {

using test::run_cli;
using test::tiny_tokenizer;

std::string tokenize(const std::string& args) { return "tokenize --tokenizer " + test::tiny_tokenizer_path() + " " + args; }

TEST(TokenizeCli, TextIsOneInputWithItsNewlines) {
  auto r = run_cli(tokenize("--text 'hello world'"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "259 264\n");
  r = run_cli(tokenize("--text 'hello\nhello<|im_end|>'"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "259 10 259 272\n");
  r = run_cli(tokenize("--text 'hello world' --json"));
  EXPECT_EQ(r.out, "[[259,264]]\n");
  r = run_cli(tokenize("--text ''"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "\n");
}

TEST(TokenizeCli, FileIsOneInputPerLine) {
  test::TempDir dir;
  const std::string path = dir.file("in.txt");
  std::ofstream(path) << "hello world\n\n<|im_end|>hello\r\nlast";
  auto r = run_cli(tokenize("--file " + path));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "259 264\n\n272 259\n108 97 115 116\n");
  r = run_cli(tokenize("--file " + path + " --json"));
  EXPECT_EQ(nlohmann::json::parse(r.out), nlohmann::json::parse("[[259,264],[],[272,259],[108,97,115,116]]"));
}

TEST(TokenizeCli, DecodeTurnsLinesOfIdsIntoText) {
  auto r = run_cli(tokenize("--decode --text '259 264\n272  259'"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "hello world\n<|im_end|>hello\n");
  // A list pasted from Python, or a row of --json's output: commas and brackets separate ids too.
  r = run_cli(tokenize("--decode --text '[259, 264]\n272,259'"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "hello world\n<|im_end|>hello\n");
  r = run_cli(tokenize("--decode --json --text '259 10 264\n228 189'"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out), nlohmann::json::parse(R"(["hello\n world", "\ufffd"])"));
  test::TempDir dir;
  const std::string path = dir.file("ids.txt");
  std::ofstream(path) << "259\n264 x\n";
  r = run_cli(tokenize("--decode --file " + path));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(path + ":2: 'x' is not a token id"), std::string::npos) << r.err;
}

// --chat: one {"ids", "loss_mask"} per record, as training renders it; the template by name or from a config.
TEST(TokenizeCli, ChatRecordsGiveIdsAndLossMasks) {
  test::TempDir dir;
  const std::string path = dir.file("c.jsonl");
  std::ofstream(path) << R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})"
                      << "\n\n" << R"({"instruction": "ab", "output": "xyz"})" << "\n";
  auto r = run_cli(tokenize("--json --chat " + path));
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json all = nlohmann::json::parse(r.out);
  ASSERT_EQ(all.size(), 2u);
  const ChatTokens want = render_chat(tiny_tokenizer(), {std::nullopt, "hi", "hello"});
  EXPECT_EQ(all[0]["ids"].get<std::vector<TokenId>>(), want.ids);
  EXPECT_EQ(all[0]["loss_mask"].get<std::vector<uint8_t>>(), want.loss_mask);
  // The hybrid template by name: the empty think block is in the ids and out of the mask.
  r = run_cli(tokenize("--json --chat-template qwen3-thinking --chat " + path));
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json thinking = nlohmann::json::parse(r.out);
  EXPECT_GT(thinking[0]["ids"].size(), all[0]["ids"].size());
  EXPECT_EQ(std::count(thinking[0]["loss_mask"].begin(), thinking[0]["loss_mask"].end(), 1),
            std::count(all[0]["loss_mask"].begin(), all[0]["loss_mask"].end(), 1));
  std::ofstream(dir.file("bad.jsonl")) << R"({"messages": [{"role": "user", "content": "hi"}]})" << "\n";
  r = run_cli(tokenize("--chat " + dir.file("bad.jsonl")));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(dir.file("bad.jsonl") + ":1: no assistant message"), std::string::npos) << r.err;
  r = run_cli(tokenize("--chat-template llama --chat " + path));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("chatml or qwen3-thinking"), std::string::npos) << r.err;
}

TEST(TokenizeCli, ErrorsAreOneLineWithTheRightExitCode) {
  auto r = run_cli(tokenize(""));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--text, --file or --chat"), std::string::npos) << r.err;
  r = run_cli(tokenize("--text a --file b"));
  EXPECT_EQ(r.code, 2) << r.err;
  r = run_cli("tokenize --text a");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--tokenizer"), std::string::npos) << r.err;
  r = run_cli(tokenize("--decode --text '12 -3'"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--text: '-3' is not a token id"), std::string::npos) << r.err;
  r = run_cli(tokenize("--decode --text '99999'"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("token id 99999"), std::string::npos) << r.err;
  r = run_cli("tokenize --tokenizer /nonexistent/t.json --text a");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err.rfind("error: tokenizer /nonexistent/t.json: cannot open", 0), 0u) << r.err;
  r = run_cli(tokenize("--file /nonexistent/in.txt"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("/nonexistent/in.txt"), std::string::npos) << r.err;
  r = run_cli(tokenize("--text \"$(printf 'ok\\377')\""));  // invalid UTF-8 in the input
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("not valid UTF-8"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  // A template renders --chat's records only: given beside text or ids it was ignored, silently.
  for (const char* flags : {"--text hi --chat-template chatml", "--decode --text '1 2' --tokenizer-config x.json"}) {
    r = run_cli(tokenize(flags));
    EXPECT_EQ(r.code, 2) << flags;
    EXPECT_NE(r.err.find("tokenize: --tokenizer-config and --chat-template apply to --chat"), std::string::npos)
        << r.err;
  }
}

TEST(TokenizeCli, RealTokenizerExample) {
  QWEN3_REQUIRE_REAL_TOKENIZER(t);
  (void)t;
  const auto r = run_cli("tokenize --tokenizer " + test::real_tokenizer_path() +
                         " --text '<|im_start|>user\n你是誰<|im_end|>\n'");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "151644 872 198 105043 108908 151645 198\n");
}

}  // namespace
}  // namespace qwen3
