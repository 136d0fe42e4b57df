// Reading a training file: lines in chunks, each chunk tokenized in parallel (the tokenizer is thread-safe),
// then merged in file order so that stats, warnings, the first fatal line and the sample order never depend on
// the thread count.
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "data/data_lines.h"
#include "data/training_data_impl.h"
#include "qwen3/base/error.h"
#include "qwen3/base/file_io.h"
#include "qwen3/base/json_limits.h"

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

bool is_json_format(DataFormat f) {
  return f == DataFormat::chat || f == DataFormat::alpaca || f == DataFormat::text_jsonl;
}

data::RecordKind record_kind(DataFormat f) {
  return f == DataFormat::chat ? data::RecordKind::chat
                               : (f == DataFormat::alpaca ? data::RecordKind::alpaca : data::RecordKind::text);
}

DataFormat format_of_record(data::RecordKind kind) {
  return kind == data::RecordKind::chat ? DataFormat::chat
                                        : (kind == data::RecordKind::alpaca ? DataFormat::alpaca : DataFormat::text_jsonl);
}

constexpr const char* kRecordKeys =
    "a chat record {\"messages\": [...]} (or ShareGPT's {\"conversations\": [...]}, or TRL's {\"prompt\", "
    "\"completion\"}), an alpaca record {\"instruction\", \"input\", \"output\"} or a text record {\"text\": ...} "
    "(docs/data.md)";

// How the file is read: its format, and whether it is one JSON array of records (else lines).
struct Layout {
  DataFormat format = DataFormat::text;
  bool json_array = false;
};

// The first data line (neither blank nor a comment) decides what `auto` does not fix: a '[' starts a JSON
// array; a JSON object is a record whose keys name the format; otherwise TSV when it has a TAB, else text. A
// line that looks like JSON but is no record qwen3-train reads is refused: trained as text it would teach the
// model JSON syntax without a word.
std::optional<Layout> detect_layout(const std::vector<NumberedLine>& chunk, const DataOptions& opt) {
  for (const NumberedLine& line : chunk) {
    if (data::classify_line(line.text, opt.comment_prefix) != data::LineKind::sample) continue;
    const std::string_view trimmed = data::trim_ascii_space(line.text);
    if (opt.format == DataFormat::tsv || opt.format == DataFormat::text) return Layout{opt.format, false};
    // The array's first record decides `auto` ("[INST] hi" is text: only "[", "[{" or a whole array start one).
    if (trimmed.front() == '[' && (is_json_format(opt.format) || data::looks_like_json(trimmed)))
      return Layout{opt.format, true};
    if (is_json_format(opt.format)) return Layout{opt.format, false};
    if (trimmed.front() == '{') {
      const nlohmann::json record = nlohmann::json::parse(trimmed.begin(), trimmed.end(), nullptr, false);
      if (!record.is_discarded())
        if (const auto kind = data::record_kind_of(record)) return Layout{format_of_record(*kind), false};
    }
    if (const auto problem = data::utf8_problem(line.text))  // before JSON's verdict: the reason is the encoding
      throw Error(fmt::format("{}:{}: {}; data files are UTF-8", opt.path, line.number, *problem));
    if (data::looks_like_json(line.text))
      throw Error(fmt::format("{}:{}: the data looks like JSON but is not {}; or pass --data-format text to train on "
                              "the raw lines",
                              opt.path, line.number, kRecordKeys));
    return Layout{line.text.find('\t') != std::string::npos ? DataFormat::tsv : DataFormat::text, false};
  }
  return std::nullopt;
}

data::LineSample bad_sample(std::string reason) {
  data::LineSample s;
  s.kind = data::LineKind::bad;
  s.reason = std::move(reason);
  return s;
}

data::LineSample record_or_bad(const Tokenizer& tokenizer, const nlohmann::json& record, DataFormat format,
                               const DataOptions& opt) {
  try {
    return data::record_sample(tokenizer, record, record_kind(format), opt.system);
  } catch (const Error& e) {  // what the tokenizer (or its chat template) refuses is this record's problem
    return bad_sample(e.what());
  }
}

data::LineSample line_sample(const Tokenizer& tokenizer, const std::string& line, DataFormat format,
                             const DataOptions& opt) {
  if (const data::LineKind kind = data::classify_line(line, opt.comment_prefix); kind != data::LineKind::sample) {
    data::LineSample s;
    s.kind = kind;
    return s;
  }
  if (is_json_format(format)) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    if (record.is_discarded())
      return bad_sample(data::utf8_problem(line).value_or("not a JSON value (one record per line)"));
    return record_or_bad(tokenizer, record, format, opt);
  }
  try {
    return format == DataFormat::tsv ? data::tsv_line_sample(tokenizer, line, opt.system, opt.seq_len)
                                     : data::text_line_sample(tokenizer, line);
  } catch (const Error& e) {  // what the tokenizer refuses is this line's problem, not the run's
    return bad_sample(e.what());
  }
}

// Where a line or record is: "FILE:LINE" for lines, "FILE: record N" for the elements of a JSON array.
std::string location(const DataOptions& opt, bool json_array, int64_t number) {
  return json_array ? fmt::format("{}: record {}", opt.path, number) : fmt::format("{}:{}", opt.path, number);
}

class BadLineReport {
 public:
  explicit BadLineReport(const DataOptions& opt) : opt_(opt) {}
  void add(const std::string& where, const std::string& reason) {
    if (opt_.strict) throw Error(fmt::format("{}: {} (strict data: bad lines are fatal)", where, reason));
    if (++count_ <= opt_.max_bad_line_warnings) spdlog::warn("{}: skipped: {}", where, reason);
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
// overlap by one token, so every next-token target of the line is in exactly one window. A window none of whose
// targets carries loss (a long user turn of a cut conversation) is left out: it would train nothing.
void append_line(TrainingData::Impl& d, const data::LineSample& line, int64_t line_number) {
  const auto base = static_cast<int64_t>(d.tokens.size());
  const auto length = static_cast<int64_t>(line.ids.size());
  const int64_t seq_len = d.options.seq_len;
  d.tokens.insert(d.tokens.end(), line.ids.begin(), line.ids.end());
  d.loss_mask.insert(d.loss_mask.end(), line.loss_mask.begin(), line.loss_mask.end());
  int64_t windows = 0;
  for (int64_t start = 0; start + 1 < length; start += seq_len, ++windows) {
    const int64_t size = std::min(seq_len + 1, length - start);
    const auto first_target = line.loss_mask.begin() + start + 1, end = line.loss_mask.begin() + start + size;
    if (std::find(first_target, end, uint8_t{1}) == end) {
      ++d.stats.lossless_windows;
      continue;
    }
    d.samples.push_back(SampleSpan{base + start, size, line_number});
  }
  d.stats.tokens += length;
  for (int64_t i = 1; i < length; ++i) d.stats.loss_tokens += line.loss_mask[static_cast<size_t>(i)];
  d.stats.split_lines += windows > 1;
  d.stats.truncated += line.prompt_truncated;
}

// The results of one chunk of lines or records, merged in file order.
struct ChunkMerge {
  TrainingData::Impl& d;
  BadLineReport& bad;
  bool json_array;
  int64_t first_truncated = 0;
  void add(int64_t number, const data::LineSample& r) {
    if (r.kind == data::LineKind::blank) {
      ++d.stats.blank;
    } else if (r.kind == data::LineKind::comment) {
      ++d.stats.comments;
    } else if (r.kind == data::LineKind::bad) {
      bad.add(location(d.options, json_array, number), r.reason);
    } else {
      if (r.prompt_truncated && first_truncated == 0) first_truncated = number;
      append_line(d, r, number);
    }
  }
};

std::string read_whole_file(const DataOptions& opt) {
  std::ifstream in = open_input_file(opt.path, opt.role, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error(fmt::format("error reading {} '{}'", opt.role, opt.path));
  return text.str();
}

// A JSON array of records: parsed whole (a JSON array has no lines to stream by), then tokenized in parallel.
// Returns the number of records.
int64_t load_json_array(const Tokenizer& tokenizer, TrainingData::Impl& d, DataFormat format, ChunkMerge& merge) {
  const DataOptions& opt = d.options;
  nlohmann::json records;
  const std::string text = read_whole_file(opt);
  try {
    records = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // Not UTF-8 is said as such, with its line (nlohmann's text would quote the invalid byte itself).
    if (const size_t at = first_invalid_utf8_byte(text); at != std::string::npos) {
      const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n');
      throw Error(fmt::format("{} '{}':{}: invalid UTF-8 at byte {} of the file; data files are UTF-8", opt.role,
                              opt.path, line, at + 1));
    }
    throw Error(fmt::format("{} '{}': not a valid JSON array of records ({})", opt.role, opt.path, json_error_text(e)));
  }
  if (!records.is_array()) throw Error(fmt::format("{} '{}': a JSON file must be an array of records", opt.role, opt.path));
  if (format == DataFormat::auto_detect) {
    const auto kind = records.empty() ? std::nullopt : data::record_kind_of(records.front());
    if (!kind) throw Error(fmt::format("{}: record 1 is not {}", opt.path, kRecordKeys));
    format = format_of_record(*kind);
  }
  d.format = format;
  if (renders_chat(format)) tokenizer.check_chat_format();
  const auto n = static_cast<int64_t>(records.size());
  std::vector<data::LineSample> results;
  for (int64_t first = 0; first < n; first += static_cast<int64_t>(kChunkLines)) {
    const int64_t last = std::min(n, first + static_cast<int64_t>(kChunkLines));
    results.assign(static_cast<size_t>(last - first), data::LineSample{});
    at::parallel_for(first, last, kLinesPerTask, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) results[i - first] = record_or_bad(tokenizer, records[i], format, opt);
    });
    for (int64_t i = first; i < last; ++i) merge.add(i + 1, results[i - first]);
  }
  return n;
}

}  // namespace

void load_training_data(const Tokenizer& tokenizer, TrainingData::Impl& d) {
  const DataOptions& opt = d.options;
  std::ifstream in = open_input_file(opt.path, opt.role, std::ios::binary);

  std::optional<Layout> layout;
  BadLineReport bad_lines(opt);
  ChunkMerge merge{d, bad_lines, false};
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
    if (!layout) {
      layout = detect_layout(chunk, opt);
      if (layout && renders_chat(layout->format)) tokenizer.check_chat_format();  // once, not per line skipped
      // Plain text has no prompt to put a system prompt before: given, it was ignored, silently (train and eval,
      // whatever --data-format said, auto included; a JSON array's records decide their kinds one by one).
      if (layout && opt.system && layout->format != DataFormat::auto_detect && !renders_chat(layout->format))
        throw UsageError(fmt::format("--system applies to pairs and chat records; {} '{}' is {}: plain text",
                                     opt.role, opt.path, to_string(layout->format)));
    }
    if (layout && layout->json_array) break;
    // Until a data line decides the format every line is blank or a comment, so the fallback is never used.
    const DataFormat chunk_format = layout ? layout->format : DataFormat::text;

    results.assign(chunk.size(), data::LineSample{});
    at::parallel_for(0, static_cast<int64_t>(chunk.size()), kLinesPerTask, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) results[i] = line_sample(tokenizer, chunk[i].text, chunk_format, opt);
    });
    for (size_t i = 0; i < chunk.size(); ++i) merge.add(chunk[i].number, results[i]);
  }
  if (layout && layout->json_array) {
    in.close();
    merge.json_array = true;
    d.stats = DataStats{};
    line_number = load_json_array(tokenizer, d, layout->format, merge);
  } else {
    d.format = layout ? layout->format : (opt.format == DataFormat::auto_detect ? DataFormat::text : opt.format);
  }
  d.stats.lines = line_number;
  d.stats.skipped = bad_lines.count();
  d.stats.samples = static_cast<int64_t>(d.samples.size());
  bad_lines.summarize();
  if (d.stats.truncated > 0)
    spdlog::warn("{}: {} pairs longer than seq_len + 1 = {} tokens kept their target and lost prompt tokens on "
                 "the left (the first at line {})",
                 opt.path, d.stats.truncated, opt.seq_len + 1, merge.first_truncated);
  if (d.samples.empty())
    throw Error(fmt::format("{} '{}' has no samples ({} {}: {} blank, {} comments, {} bad)", opt.role, opt.path,
                            d.stats.lines, merge.json_array ? "records" : "lines", d.stats.blank, d.stats.comments,
                            d.stats.skipped));
  d.tokens.shrink_to_fit();
  d.loss_mask.shrink_to_fit();
  d.samples.shrink_to_fit();
}

}  // namespace qwen3
