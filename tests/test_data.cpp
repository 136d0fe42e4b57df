// The data module's reading side on the tiny tokenizer (ids 0..255 are the bytes themselves; 270
// <|endoftext|>, 271 <|im_start|>, 272 <|im_end|>; see test_tokenizer.cpp): chat rendering and its loss span,
// text lines, format detection, comments, bad lines, truncation of long pairs, windows of long lines.
#include <gtest/gtest.h>

#include "data_test_util.h"
#include "qwen3/tokenizer/chat_format.h"
#include "qwen3/base/error.h"

namespace qwen3 {
namespace {

using test::counted_targets;
using test::DataFile;
using test::data_options;
using RowIds = test::Ids;
using test::LogCapture;
using test::row;
using test::tiny_tokenizer;
using test::to_ids;

constexpr int64_t kImEnd = 272;

TEST(DataTsv, RendersChatFormatWithLossOnTargetAndImEndOnly) {
  const DataFile file("ab\txyz\n");
  const TrainingData data(tiny_tokenizer(), data_options(file.path(), DataFormat::tsv));
  const RowIds full = to_ids(render_chat(tiny_tokenizer(), ChatTurn{std::nullopt, "ab", "xyz"}).ids);
  const auto n = static_cast<int64_t>(full.size());
  ASSERT_EQ(full.front(), 271);
  ASSERT_EQ(RowIds(full.end() - 5, full.end()), RowIds({'x', 'y', 'z', kImEnd, '\n'}));

  const Batch b = data.batch(0, 0);
  ASSERT_EQ(b.input_ids.sizes(), at::IntArrayRef({1, n - 1}));
  EXPECT_EQ(row(b.input_ids, 0), RowIds(full.begin(), full.end() - 1));
  RowIds expected_targets(static_cast<size_t>(n - 1), -100);  // the prompt and the final "\n": no loss
  for (int64_t j = n - 6; j <= n - 3; ++j) expected_targets[static_cast<size_t>(j)] = full[static_cast<size_t>(j + 1)];
  EXPECT_EQ(row(b.target_ids, 0), expected_targets);
  EXPECT_EQ(b.loss_tokens, 4);
  EXPECT_EQ(b.tokens, n - 1);
  EXPECT_EQ(data.stats().samples, 1);
  EXPECT_EQ(data.stats().loss_tokens, 4);
  EXPECT_EQ(data.stats().tokens, n);
}

TEST(DataTsv, SystemPromptComesFirstAndCarriesNoLoss) {
  const DataFile file("ab\txyz\n");
  DataOptions opt = data_options(file.path(), DataFormat::tsv);
  opt.system = "be brief";
  const TrainingData data(tiny_tokenizer(), opt);
  const Batch b = data.batch(0, 0);
  const RowIds full = to_ids(render_chat(tiny_tokenizer(), ChatTurn{opt.system, "ab", "xyz"}).ids);
  EXPECT_EQ(row(b.input_ids, 0), RowIds(full.begin(), full.end() - 1));
  const std::vector<TokenId> input(full.begin(), full.end());
  EXPECT_EQ(tiny_tokenizer().decode(input).rfind("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nab", 0),
            0u);
  EXPECT_EQ(counted_targets(b.target_ids, 0), RowIds({'x', 'y', 'z', kImEnd}));
}

TEST(DataTsv, SplitsAtTheFirstTabAndTrimsEachField) {
  const DataFile file("  ab \t xyz\tq  \r\n");
  const TrainingData data(tiny_tokenizer(), data_options(file.path(), DataFormat::tsv));
  const RowIds full = to_ids(render_chat(tiny_tokenizer(), ChatTurn{std::nullopt, "ab", "xyz\tq"}).ids);
  EXPECT_EQ(row(data.batch(0, 0).input_ids, 0), RowIds(full.begin(), full.end() - 1));
}

TEST(DataText, EveryTokenAfterTheFirstIsATarget) {
  const DataFile file("  xyz abc \n", "train.txt");
  const TrainingData data(tiny_tokenizer(), data_options(file.path(), DataFormat::text));
  const RowIds ids = to_ids(tiny_tokenizer().encode("xyz abc"));
  const Batch b = data.batch(0, 0);
  EXPECT_EQ(row(b.input_ids, 0), RowIds(ids.begin(), ids.end() - 1));
  EXPECT_EQ(row(b.target_ids, 0), RowIds(ids.begin() + 1, ids.end()));
  EXPECT_EQ(b.loss_tokens, static_cast<int64_t>(ids.size()) - 1);
  EXPECT_EQ(data.stats().loss_tokens, static_cast<int64_t>(ids.size()) - 1);
}

TEST(DataFormatDetection, FirstDataLineDecides) {
  const DataFile tsv("# a comment\twith a tab\n\nab\txyz\nno tab here\n");
  const TrainingData as_tsv(tiny_tokenizer(), data_options(tsv.path(), DataFormat::auto_detect));
  EXPECT_EQ(as_tsv.format(), DataFormat::tsv);
  EXPECT_EQ(as_tsv.stats().skipped, 1);  // the line without a TAB is bad in TSV

  const DataFile text("# comment\nplain line\nab\txyz\n");
  const TrainingData as_text(tiny_tokenizer(), data_options(text.path(), DataFormat::auto_detect));
  EXPECT_EQ(as_text.format(), DataFormat::text);
  EXPECT_EQ(as_text.stats().samples, 2);  // a TAB inside a text line is just text
  EXPECT_EQ(as_text.stats().skipped, 0);

  EXPECT_EQ(parse_data_format("auto"), DataFormat::auto_detect);
  EXPECT_EQ(parse_sample_mode("sequential"), SampleMode::sequential);
  EXPECT_THROW(parse_data_format("csv"), UsageError);
  EXPECT_THROW(parse_sample_mode("shuffle"), UsageError);
}

TEST(DataLines, BlankLinesAndCommentsAreIgnoredNotBad) {
  const DataFile file("\xEF\xBB\xBF# comment\n\n   \r\n  # indented comment\nab\txyz\n\n");
  const TrainingData data(tiny_tokenizer(), data_options(file.path(), DataFormat::tsv));
  EXPECT_EQ(data.stats().lines, 6);
  EXPECT_EQ(data.stats().blank, 3);
  EXPECT_EQ(data.stats().comments, 2);
  EXPECT_EQ(data.stats().samples, 1);
  EXPECT_EQ(data.stats().skipped, 0);
}

// The summary counts comments, and an empty prefix turns them off: `#include <stdio.h>` is a real prompt.
TEST(DataLines, CommentsAreCountedAndAnEmptyPrefixTurnsThemOff) {
  const DataFile file("# format: prompt<TAB>target\n#include <stdio.h>\tC\nab\txyz\n");
  {
    LogCapture log;
    const TrainingData data(tiny_tokenizer(), data_options(file.path(), DataFormat::auto_detect));
    EXPECT_EQ(data.stats().comments, 2);
    EXPECT_EQ(data.stats().samples, 1);
    EXPECT_NE(log.text().find("2 comments starting '#'"), std::string::npos) << log.text();
  }
  DataOptions opt = data_options(file.path(), DataFormat::tsv);
  opt.comment_prefix = "";
  const TrainingData data(tiny_tokenizer(), opt);
  EXPECT_EQ(data.stats().comments, 0);
  EXPECT_EQ(data.stats().samples, 2);   // "#include <stdio.h>" -> "C" and "ab" -> "xyz"
  EXPECT_EQ(data.stats().skipped, 1);   // the header has no TAB: a bad line now, not a silent comment
  EXPECT_EQ(data.batch(0, 0).lines, std::vector<int64_t>({2}));  // batches name their rows' lines
}

// JSON that is no record qwen3-train reads is refused under auto (naming the line) instead of being trained as
// raw text; forcing text reads it as text. Text that merely starts with a bracket is text.
TEST(DataLines, JsonThatIsNoRecordIsRefusedUnderAuto) {
  for (const char* content : {"# config\n{\"learning_rate\": 0.1}\n", "[\n  1, 2, 3\n]\n", "[1, 2]\n",
                              "{\"prompt\": \"a\tb\"}\n"}) {
    const DataFile file(content);
    try {
      const TrainingData data(tiny_tokenizer(), data_options(file.path(), DataFormat::auto_detect));
      ADD_FAILURE() << "accepted: " << content;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_TRUE(what.find("looks like JSON") != std::string::npos || what.find("is not a chat record") != std::string::npos)
          << what;
      EXPECT_NE(what.find(file.path()), std::string::npos) << what;
    }
    EXPECT_NO_THROW(TrainingData(tiny_tokenizer(), data_options(file.path(), DataFormat::text))) << content;
  }
  for (const char* content : {"[INST] hello there\n", "{braces} are fine\n", "[1, 2\n"}) {
    const DataFile file(content);
    EXPECT_EQ(TrainingData(tiny_tokenizer(), data_options(file.path(), DataFormat::auto_detect)).format(), DataFormat::text)
        << content;
  }
}

const char* const kBadTsv =
    "ab\txyz\n"       // 1 good
    "no tab here\n"   // 2
    "\txyz\n"         // 3 empty prompt
    "ab\t  \n"        // 4 empty target
    "a\xff\tb\n"      // 5 invalid UTF-8
    "cd\tuvw\n";      // 6 good

TEST(DataLines, BadLinesAreSkippedCountedAndReportedWithFileAndLine) {
  const DataFile file(kBadTsv);
  LogCapture log;
  const TrainingData data(tiny_tokenizer(), data_options(file.path(), DataFormat::tsv));
  EXPECT_EQ(data.stats().samples, 2);
  EXPECT_EQ(data.stats().skipped, 4);
  EXPECT_EQ(data.stats().lines, 6);
  EXPECT_EQ(log.count(file.path() + ":2: skipped: no TAB"), 1) << log.text();
  EXPECT_EQ(log.count(file.path() + ":3: skipped: empty prompt"), 1);
  EXPECT_EQ(log.count(file.path() + ":4: skipped: empty target"), 1);
  EXPECT_EQ(log.count(file.path() + ":5: skipped: invalid UTF-8 at byte 2"), 1);
}

TEST(DataLines, WarningsStopAtTheLimitThenASummary) {
  const DataFile file("a\nb\nc\nd\nab\txyz\n");
  DataOptions opt = data_options(file.path(), DataFormat::tsv);
  opt.max_bad_line_warnings = 2;
  LogCapture log;
  const TrainingData data(tiny_tokenizer(), opt);
  EXPECT_EQ(data.stats().skipped, 4);
  EXPECT_EQ(log.count("skipped: no TAB"), 2);
  EXPECT_EQ(log.count("4 bad lines skipped in all"), 1);
}

TEST(DataLines, StrictMakesTheFirstBadLineFatalNamingFileAndLine) {
  const DataFile file(kBadTsv);
  DataOptions opt = data_options(file.path(), DataFormat::tsv);
  opt.strict = true;
  try {
    TrainingData data(tiny_tokenizer(), opt);
    FAIL() << "a bad line with strict must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(file.path() + ":2: no TAB"), std::string::npos) << e.what();
  }
}

TEST(DataLines, BadLineNumbersAreRightPastTheFirstChunk) {
  std::string content;
  for (int i = 1; i <= 20000; ++i) content += i == 17001 ? "broken\n" : "ab\txyz\n";
  const DataFile file(content);
  DataOptions opt = data_options(file.path(), DataFormat::tsv);
  const TrainingData data(tiny_tokenizer(), opt);
  EXPECT_EQ(data.stats().samples, 19999);
  opt.strict = true;
  EXPECT_THROW(
      try { TrainingData strict(tiny_tokenizer(), opt); } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(":17001: "), std::string::npos) << e.what();
        throw;
      },
      Error);
}

TEST(DataText, ASingleTokenLineIsBad) {
  const DataFile file("x\nxyz\n", "t.txt");
  const TrainingData data(tiny_tokenizer(), data_options(file.path(), DataFormat::text));
  EXPECT_EQ(data.stats().skipped, 1);
  EXPECT_EQ(data.stats().samples, 1);
}

// Pairs of the tiny tokenizer: "ab\txyz" renders to 25 tokens, fitting seq_len 32 untouched.
TEST(DataTsv, LongPairKeepsItsTargetAndLosesPromptTokensOnTheLeft) {
  const std::string prompt(60, 'q');  // 60 tokens: no merge joins q's
  ASSERT_EQ(render_chat(tiny_tokenizer(), ChatTurn{std::nullopt, "ab", "xyz"}).ids.size(), 25u);
  const DataFile file(prompt + "\txyz\nab\txyz\n");
  LogCapture log;
  const TrainingData data(tiny_tokenizer(), data_options(file.path(), DataFormat::tsv, /*seq_len=*/32));
  EXPECT_EQ(data.stats().truncated, 1);
  EXPECT_EQ(data.stats().samples, 2);
  EXPECT_EQ(log.count("lost prompt tokens"), 1) << log.text();
  EXPECT_EQ(log.count("(the first at line 1)"), 1);

  const Batch b = data.batch(0, 0);
  ASSERT_EQ(b.input_ids.sizes(), at::IntArrayRef({1, 32}));
  const RowIds full = to_ids(render_chat(tiny_tokenizer(), ChatTurn{std::nullopt, prompt, "xyz"}).ids);
  // 33 tokens ending at the closing <|im_end|>: the trailing "\n" and the prompt's start are gone.
  const RowIds kept(full.end() - 34, full.end() - 1);
  EXPECT_EQ(row(b.input_ids, 0), RowIds(kept.begin(), kept.end() - 1));
  EXPECT_EQ(counted_targets(b.target_ids, 0), RowIds({'x', 'y', 'z', kImEnd}));
}

TEST(DataTsv, TargetLongerThanSeqLenIsABadLine) {
  const DataFile file("ab\t" + std::string(32, 'q') + "\nab\txyz\n");
  const TrainingData data(tiny_tokenizer(), data_options(file.path(), DataFormat::tsv, /*seq_len=*/32));
  EXPECT_EQ(data.stats().skipped, 1);  // 32 q's + <|im_end|> = 33 loss tokens > 32 targets
  EXPECT_EQ(data.stats().samples, 1);
  DataOptions opt = data_options(file.path(), DataFormat::tsv, 32);
  opt.strict = true;
  EXPECT_THROW(TrainingData(tiny_tokenizer(), opt), Error);
  opt.seq_len = 33;  // now it fits with exactly one prompt token before it
  const TrainingData fits(tiny_tokenizer(), opt);
  EXPECT_EQ(fits.stats().truncated, 1);
  EXPECT_EQ(fits.batch(0, 0).loss_tokens, 33);
  EXPECT_EQ(fits.batch(0, 0).input_ids.size(1), 33);
}

TEST(DataText, LongLineIsCutIntoWindowsThatCoverEveryTargetOnce) {
  const std::string line = "abcdefghijklmnopqrstuvwxyz";
  const RowIds ids = to_ids(tiny_tokenizer().encode(line));
  ASSERT_EQ(ids.size(), 26u);
  const DataFile file(line + "\n", "t.txt");
  const TrainingData data(tiny_tokenizer(), data_options(file.path(), DataFormat::text, /*seq_len=*/10, 3));
  EXPECT_EQ(data.stats().samples, 3);  // targets 1..10, 11..20, 21..25
  EXPECT_EQ(data.stats().split_lines, 1);
  EXPECT_EQ(data.stats().tokens, 26);
  EXPECT_EQ(data.stats().loss_tokens, 25);
  const Batch b = data.batch(0, 0);
  ASSERT_EQ(b.input_ids.sizes(), at::IntArrayRef({3, 10}));
  RowIds all_targets;
  for (int64_t r = 0; r < 3; ++r) {
    const RowIds t = counted_targets(b.target_ids, r);
    all_targets.insert(all_targets.end(), t.begin(), t.end());
  }
  EXPECT_EQ(all_targets, RowIds(ids.begin() + 1, ids.end()));
  EXPECT_EQ(row(b.input_ids, 2), RowIds({'u', 'v', 'w', 'x', 'y', 270, 270, 270, 270, 270}));
  EXPECT_EQ(b.tokens, 25);
}

TEST(DataFile, NoSamplesIsAnErrorNamingTheFile) {
  for (const std::string content : {"", "# only a comment\n\n", "no tab\n"}) {
    const DataFile file(content);
    try {
      TrainingData data(tiny_tokenizer(), data_options(file.path(), DataFormat::tsv));
      FAIL() << "no samples must throw for '" << content << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(file.path()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("no samples"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(TrainingData(tiny_tokenizer(), data_options("/nonexistent/train.tsv", DataFormat::tsv)), Error);
  const DataFile file("ab\txyz\n");
  EXPECT_THROW(TrainingData(tiny_tokenizer(), data_options(file.path(), DataFormat::tsv, 0)), UsageError);
}

}  // namespace
}  // namespace qwen3
