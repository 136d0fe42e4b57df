// JSON record data (docs/data.md "JSON records"): HF chat `messages`, alpaca and `{"text"}` records, as JSON Lines
// or one JSON array; detection, rendering through the chat template, loss masks, malformed records.
#include <gtest/gtest.h>

#include "data_test_util.h"
#include "qwen3/base/error.h"
#include "qwen3/tokenizer/chat_format.h"

namespace qwen3 {
namespace {

using test::data_options;
using test::DataFile;
using test::Ids;
using test::LogCapture;
using test::tiny_tokenizer;

// The sample's tokens and, per token, whether it is a loss target, from a padded batch of one row.
struct Row {
  Ids inputs, targets;
};
Row row_of(const TrainingData& data, int64_t index) {
  const Batch b = data.batch(0, index);
  return {test::row(b.input_ids, 0), test::row(b.target_ids, 0)};
}

// The ids the data must hold for `messages`: the conversation as the chat template renders it, its loss
// targets the assistant replies and their <|im_end|>.
void expect_conversation(const TrainingData& data, int64_t index, const std::vector<ChatMessage>& messages) {
  const ChatTokens want = render_conversation(tiny_tokenizer(), messages);
  const Row r = row_of(data, index);
  const Ids all = test::to_ids(want.ids);
  ASSERT_GE(all.size(), 2u);
  EXPECT_EQ(Ids(r.inputs.begin(), r.inputs.begin() + static_cast<std::ptrdiff_t>(all.size() - 1)),
            Ids(all.begin(), all.end() - 1));
  Ids want_targets;
  for (size_t i = 1; i < all.size(); ++i)
    if (want.loss_mask[i]) want_targets.push_back(all[i]);
  Ids got_targets;
  for (int64_t t : r.targets)
    if (t != -100) got_targets.push_back(t);
  EXPECT_EQ(got_targets, want_targets);
}

TEST(DataRecords, ChatJsonlIsDetectedAndMultiTurnLossCoversEachAssistantTurn) {
  const DataFile file(
      R"({"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "ab"}, )"
      R"({"role": "assistant", "content": "xyz"}, {"role": "user", "content": "and"}, {"role": "assistant", "content": "q"}]})"
      "\n\n"
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], "id": 7})"
      "\n",
      "chat.jsonl");
  const TrainingData data(tiny_tokenizer(), data_options(file.path(), DataFormat::auto_detect));
  EXPECT_EQ(data.format(), DataFormat::chat);
  EXPECT_EQ(data.stats().samples, 2);
  EXPECT_EQ(data.stats().blank, 1);
  expect_conversation(data, 0,
                      {{ChatRole::system, "sys", {}}, {ChatRole::user, "ab", {}}, {ChatRole::assistant, "xyz", {}},
                       {ChatRole::user, "and", {}}, {ChatRole::assistant, "q", {}}});
  expect_conversation(data, 1, {{ChatRole::user, "hi", {}}, {ChatRole::assistant, "hello", {}}});
  EXPECT_EQ(data.batch(0, 1).lines, std::vector<int64_t>({3}));
  // Loss tokens: each reply and its <|im_end|>, nothing of system or user.
  const auto replies = tiny_tokenizer().encode("xyz").size() + tiny_tokenizer().encode("q").size() +
                       tiny_tokenizer().encode("hello").size() + 3;
  EXPECT_EQ(data.stats().loss_tokens, static_cast<int64_t>(replies));
}

TEST(DataRecords, AlpacaAsJsonArrayAndAsJsonlAndSystemDefaults) {
  const char* records[] = {R"({"instruction": "ab", "input": "cd", "output": "xyz"})",
                           R"({"instruction": "ab", "input": "", "output": "q", "system": "own"})"};
  const DataFile array(std::string("[\n  ") + records[0] + ",\n  " + records[1] + "\n]\n", "a.json");
  const DataFile lines(std::string(records[0]) + "\n" + records[1] + "\n", "a.jsonl");
  for (const DataFile* file : {&array, &lines}) {
    DataOptions opt = data_options(file->path(), DataFormat::auto_detect);
    opt.system = "default system";
    const TrainingData data(tiny_tokenizer(), opt);
    EXPECT_EQ(data.format(), DataFormat::alpaca);
    ASSERT_EQ(data.stats().samples, 2);
    // The input on the line after the instruction; --system where the record has none.
    expect_conversation(data, 0, {{ChatRole::system, "default system", {}}, {ChatRole::user, "ab\ncd", {}},
                                  {ChatRole::assistant, "xyz", {}}});
    expect_conversation(data, 1, {{ChatRole::system, "own", {}}, {ChatRole::user, "ab", {}}, {ChatRole::assistant, "q", {}}});
  }
  EXPECT_EQ(TrainingData(tiny_tokenizer(), data_options(array.path(), DataFormat::alpaca)).stats().lines, 2);
}

TEST(DataRecords, TextJsonlTrainsEveryTokenButTheFirst) {
  const DataFile file(R"({"text": "hello world"})" "\n" R"({"text": "  spaced\n"})" "\n", "t.jsonl");
  const TrainingData data(tiny_tokenizer(), data_options(file.path(), DataFormat::auto_detect));
  EXPECT_EQ(data.format(), DataFormat::text_jsonl);
  const Ids ids = test::to_ids(tiny_tokenizer().encode("hello world"));
  const Row r = row_of(data, 0);
  EXPECT_EQ(Ids(r.inputs.begin(), r.inputs.begin() + static_cast<std::ptrdiff_t>(ids.size() - 1)), Ids(ids.begin(), ids.end() - 1));
  EXPECT_EQ(test::counted_targets(data.batch(0, 0).target_ids, 0), Ids(ids.begin() + 1, ids.end()));
  // The text as written, not trimmed: JSON says where it starts and ends.
  EXPECT_EQ(data.stats().tokens, static_cast<int64_t>(ids.size() + tiny_tokenizer().encode("  spaced\n").size()));
}

// Malformed records are skipped with FILE:LINE (FILE: record N in an array) and what is wrong; fatal with strict.
// The shapes other tools' data comes in, detected as chat records: ShareGPT's conversations (human/gpt/system),
// content as a list of text parts, TRL's prompt/completion — plain strings as the pair [user, assistant], lists of
// messages with the loss on the completion only (the prompt's earlier assistant turn carries none).
TEST(DataRecords, ShareGptTrlAndContentPartsReadAsConversations) {
  const std::string lines =
      R"({"conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "ab"}, {"from": "gpt", "value": "xyz"}]})"
      "\n"
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, {"role": "assistant", "content": "xyz"}]})"
      "\n"
      R"({"prompt": "ab", "completion": "xyz"})"
      "\n"
      R"({"prompt": [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "cd"}, {"role": "user", "content": "ef"}], "completion": [{"role": "assistant", "content": "xyz"}]})"
      "\n";
  const DataFile file(lines, "other.jsonl");
  DataOptions o = data_options(file.path(), DataFormat::auto_detect);
  o.sample_mode = SampleMode::sequential;
  o.batch_size = 1;
  const TrainingData data(tiny_tokenizer(), o);
  ASSERT_EQ(data.stats().samples, 4);
  ASSERT_EQ(data.stats().skipped, 0);
  expect_conversation(data, 0, {{ChatRole::system, "be brief", {}}, {ChatRole::user, "ab", {}}, {ChatRole::assistant, "xyz", {}}});
  expect_conversation(data, 1, {{ChatRole::user, "ab", {}}, {ChatRole::assistant, "xyz", {}}});
  expect_conversation(data, 2, {{ChatRole::user, "ab", {}}, {ChatRole::assistant, "xyz", {}}});
  ChatMessage earlier{ChatRole::assistant, "cd", {}};
  earlier.trained = false;
  expect_conversation(data, 3, {{ChatRole::user, "ab", {}}, earlier, {ChatRole::user, "ef", {}}, {ChatRole::assistant, "xyz", {}}});
  // The earlier turn is really out of the loss: fewer targets than the same conversation as plain messages.
  const ChatTokens trained_all = render_conversation(
      tiny_tokenizer(), {{ChatRole::user, "ab", {}}, {ChatRole::assistant, "cd", {}}, {ChatRole::user, "ef", {}}, {ChatRole::assistant, "xyz", {}}});
  int64_t targets = 0;
  for (int64_t t : row_of(data, 3).targets) targets += t != -100;
  int64_t all_targets = 0;
  for (size_t i = 1; i < trained_all.loss_mask.size(); ++i) all_targets += trained_all.loss_mask[i];
  EXPECT_LT(targets, all_targets);
}

TEST(DataRecords, MalformedRecordsAreNamedAndSkippedOrFatalWhenStrict) {
  const std::string good = R"({"messages": [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "xyz"}]})";
  const std::pair<std::string, std::string> bad[] = {
      {R"({"messages": [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "x"})", "not a JSON value"},
      {R"({"messages": [{"role": "user", "content": "ab"}]})", "no assistant message"},
      {R"({"messages": [{"role": "tool", "content": "r"}, {"role": "assistant", "content": "x"}]})",
       "messages[0]: role 'tool' (a tool turn) is not rendered by qwen3-train's templates"},
      {R"({"messages": [{"role": "user"}, {"role": "assistant", "content": "x"}]})", "messages[0]: no \"content\""},
      {R"({"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "x"}]})",
       "messages[0]: content is number, not a string or a list of text parts"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image", "url": "x"}]}, {"role": "assistant", "content": "x"}]})",
       "messages[0]: content part 0 is of type 'image', not text"},
      {R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x", "tool_calls": [{}]}]})",
       "messages[1]: tool calls are not rendered"},
      {R"({"conversations": [{"from": "human", "value": "a"}, {"from": "observation", "value": "x"}]})",
       "conversations[1]: role 'observation' (a tool turn)"},
      {R"({"prompt": "a", "completion": [{"role": "assistant", "content": "x"}]})",
       "\"prompt\" is string and \"completion\" is array"},
      {R"({"prompt": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "completion": []})",
       "no assistant message"},
      {R"({"messages": "hi"})", "\"messages\" is string, not an array"},
      {R"({"instruction": "a", "output": "b"})", "no \"messages\""},
      {R"([1])", "the record is array, not an object"},
  };
  std::string content = good + "\n";
  for (const auto& [record, reason] : bad) content += record + "\n";
  const DataFile file(content, "c.jsonl");
  {
    LogCapture log;
    const TrainingData data(tiny_tokenizer(), data_options(file.path(), DataFormat::auto_detect));
    EXPECT_EQ(data.stats().samples, 1);
    EXPECT_EQ(data.stats().skipped, static_cast<int64_t>(std::size(bad)));
    int line = 2;
    for (const auto& [record, reason] : bad)
      EXPECT_NE(log.text().find(file.path() + ":" + std::to_string(line++) + ": skipped: " + reason), std::string::npos)
          << reason << "\n" << log.text();
  }
  DataOptions strict = data_options(file.path(), DataFormat::chat);
  strict.strict = true;
  try {
    const TrainingData data(tiny_tokenizer(), strict);
    ADD_FAILURE() << "strict data accepted a malformed record";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(file.path() + ":2: not a JSON value"), std::string::npos) << e.what();
  }
  // In an array the records are numbered.
  const DataFile array("[" + good + ", " + bad[1].first + "]", "c.json");
  LogCapture log;
  const TrainingData data(tiny_tokenizer(), data_options(array.path(), DataFormat::auto_detect));
  EXPECT_NE(log.text().find(array.path() + ": record 2: skipped: no assistant message"), std::string::npos) << log.text();
  const DataFile broken("[" + good + ",\n", "broken.json");
  EXPECT_THROW(TrainingData(tiny_tokenizer(), data_options(broken.path(), DataFormat::auto_detect)), Error);
}

// A conversation longer than a row is cut into windows like a long text line; a window with no loss target (a
// long user turn) is left out rather than trained on nothing.
TEST(DataRecords, LongConversationsAreWindowedAndLosslessWindowsLeftOut) {
  std::string user;
  for (int i = 0; i < 30; ++i) user += "ab ";
  const DataFile file(R"({"messages": [{"role": "user", "content": ")" + user +
                          R"("}, {"role": "assistant", "content": "xyz"}]})" "\n",
                      "long.jsonl");
  const TrainingData data(tiny_tokenizer(), data_options(file.path(), DataFormat::auto_detect, /*seq_len=*/16));
  EXPECT_GE(data.stats().lossless_windows, 1);
  EXPECT_EQ(data.stats().split_lines, 1);
  for (int64_t b = 0; b < data.batches_per_epoch(); ++b)
    EXPECT_FALSE(test::counted_targets(data.batch(0, b).target_ids, 0).empty()) << "batch " << b;
  EXPECT_EQ(data.stats().loss_tokens, static_cast<int64_t>(tiny_tokenizer().encode("xyz").size() + 1));
}

}  // namespace
}  // namespace qwen3
