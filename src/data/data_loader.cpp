// Reading a training file: lines in chunks, each chunk tokenized in parallel (the tokenizer is thread-safe),
// then merged in file order so that stats, warnings, the first fatal line and the sample order never depend on
// the thread count.
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "data/data_lines.h"
#include "data/training_data_impl.h"
#include "qwen3/base/error.h"
#include "qwen3/base/file_io.h"

namespace qwen3 {
namespace {

// Bounded so a 100 MB file is never held as text, nor as per-line token vectors, all at once.
constexpr size_t kChunkLines = 8192;
constexpr size_t kChunkBytes = size_t{8} << 20;
constexpr int64_t kLinesPerTask = 64;

struct NumberedLine {
  int64_t number = 0;  // 1-based, as editors count
  std::string text;    // without its "\n"
};

// `auto`: TSV when the first data line (neither blank nor a comment) has a TAB, else text. A first data line
// that looks like JSON is refused: trained as text it would teach the model JSON syntax without a word.
std::optional<DataFormat> detect_format(const std::vector<NumberedLine>& chunk, const DataOptions& opt) {
  for (const NumberedLine& line : chunk) {
    if (data::classify_line(line.text, opt.comment_prefix) != data::LineKind::sample) continue;
    if (data::looks_like_json(line.text))
      throw Error(fmt::format("{}:{}: the data looks like JSON (a JSONL record or a JSON array); qwen3-train reads "
                              "prompt<TAB>target pairs and plain text lines (docs/data.md): convert it, or pass "
                              "--data-format text to train on the raw lines",
                              opt.path, line.number));
    return line.text.find('\t') != std::string::npos ? DataFormat::tsv : DataFormat::text;
  }
  return std::nullopt;
}

data::LineSample line_sample(const Tokenizer& tokenizer, const std::string& line, DataFormat format,
                             const DataOptions& opt) {
  if (const data::LineKind kind = data::classify_line(line, opt.comment_prefix); kind != data::LineKind::sample) {
    data::LineSample s;
    s.kind = kind;
    return s;
  }
  try {
    return format == DataFormat::tsv ? data::tsv_line_sample(tokenizer, line, opt.system, opt.seq_len)
                                     : data::text_line_sample(tokenizer, line);
  } catch (const Error& e) {  // what the tokenizer refuses is this line's problem, not the run's
    data::LineSample s;
    s.kind = data::LineKind::bad;
    s.reason = e.what();
    return s;
  }
}

class BadLineReport {
 public:
  explicit BadLineReport(const DataOptions& opt) : opt_(opt) {}
  void add(int64_t line, const std::string& reason) {
    if (opt_.strict) throw Error(fmt::format("{}:{}: {} (strict data: bad lines are fatal)", opt_.path, line, reason));
    if (++count_ <= opt_.max_bad_line_warnings) spdlog::warn("{}:{}: skipped: {}", opt_.path, line, reason);
  }
  void summarize() const {
    if (count_ > opt_.max_bad_line_warnings)
      spdlog::warn("{}: {} bad lines skipped in all ({} listed above)", opt_.path, count_, opt_.max_bad_line_warnings);
  }
  int64_t count() const { return count_; }

 private:
  const DataOptions& opt_;
  int64_t count_ = 0;
};

// The line's tokens go into the flat buffer once; its samples are windows of at most seq_len + 1 tokens that
// overlap by one token, so every next-token target of the line is in exactly one window.
void append_line(TrainingData::Impl& d, const data::LineSample& line, int64_t line_number) {
  const auto base = static_cast<int64_t>(d.tokens.size());
  const auto length = static_cast<int64_t>(line.ids.size());
  const int64_t seq_len = d.options.seq_len;
  d.tokens.insert(d.tokens.end(), line.ids.begin(), line.ids.end());
  d.loss_mask.insert(d.loss_mask.end(), line.loss_mask.begin(), line.loss_mask.end());
  int64_t windows = 0;
  for (int64_t start = 0; start + 1 < length; start += seq_len, ++windows)
    d.samples.push_back(SampleSpan{base + start, std::min(seq_len + 1, length - start), line_number});
  d.stats.tokens += length;
  for (int64_t i = 1; i < length; ++i) d.stats.loss_tokens += line.loss_mask[static_cast<size_t>(i)];
  d.stats.split_lines += windows > 1;
  d.stats.truncated += line.prompt_truncated;
}

}  // namespace

void load_training_data(const Tokenizer& tokenizer, TrainingData::Impl& d) {
  const DataOptions& opt = d.options;
  std::ifstream in = open_input_file(opt.path, opt.role, std::ios::binary);

  std::optional<DataFormat> format;
  if (opt.format != DataFormat::auto_detect) format = opt.format;
  BadLineReport bad_lines(opt);
  int64_t first_truncated_line = 0;
  int64_t line_number = 0;
  std::vector<NumberedLine> chunk;
  std::vector<data::LineSample> results;
  std::string text;
  for (;;) {
    chunk.clear();
    size_t chunk_bytes = 0;
    while (chunk.size() < kChunkLines && chunk_bytes < kChunkBytes && std::getline(in, text)) {
      if (++line_number == 1 && text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);  // a UTF-8 BOM
      chunk_bytes += text.size();
      chunk.push_back(NumberedLine{line_number, std::move(text)});
    }
    if (in.bad()) throw Error(fmt::format("error reading {} '{}' after line {}", opt.role, opt.path, line_number));
    if (chunk.empty()) break;
    if (!format) format = detect_format(chunk, opt);
    // Until a data line decides the format every line is blank or a comment, so the fallback is never used.
    const DataFormat chunk_format = format.value_or(DataFormat::text);

    results.assign(chunk.size(), data::LineSample{});
    at::parallel_for(0, static_cast<int64_t>(chunk.size()), kLinesPerTask, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) results[i] = line_sample(tokenizer, chunk[i].text, chunk_format, opt);
    });
    for (size_t i = 0; i < chunk.size(); ++i) {
      const data::LineSample& r = results[i];
      if (r.kind == data::LineKind::blank) {
        ++d.stats.blank;
      } else if (r.kind == data::LineKind::comment) {
        ++d.stats.comments;
      } else if (r.kind == data::LineKind::bad) {
        bad_lines.add(chunk[i].number, r.reason);
      } else {
        if (r.prompt_truncated && first_truncated_line == 0) first_truncated_line = chunk[i].number;
        append_line(d, r, chunk[i].number);
      }
    }
  }
  d.stats.lines = line_number;
  d.stats.skipped = bad_lines.count();
  d.stats.samples = static_cast<int64_t>(d.samples.size());
  d.format = format.value_or(DataFormat::text);
  bad_lines.summarize();
  if (d.stats.truncated > 0)
    spdlog::warn("{}: {} pairs longer than seq_len + 1 = {} tokens kept their target and lost prompt tokens on "
                 "the left (the first at line {})",
                 opt.path, d.stats.truncated, opt.seq_len + 1, first_truncated_line);
  if (d.samples.empty())
    throw Error(fmt::format("{} '{}' has no samples ({} lines: {} blank, {} comments, {} bad)", opt.role, opt.path,
                            d.stats.lines, d.stats.blank, d.stats.comments, d.stats.skipped));
  d.tokens.shrink_to_fit();
  d.loss_mask.shrink_to_fit();
  d.samples.shrink_to_fit();
}

}  // namespace qwen3
