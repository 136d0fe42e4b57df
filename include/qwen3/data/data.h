// Training data (docs/data.md): TSV `prompt<TAB>target` pairs, plain text lines, or JSON records (chat
// `messages`, alpaca, `{"text": ...}`) as JSON Lines or one JSON array → token samples of at most
// seq_len + 1 tokens → padded or packed batches in an order fixed by (seed, epoch). The whole file is read and
// tokenized once, at construction; every batch is then a pure function of (epoch, index), so resuming needs
// no data-loader state beyond the step counter.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "qwen3/tokenizer/chat_format.h"
#include "qwen3/tokenizer/tokenizer.h"

namespace qwen3 {

// --data-format auto|tsv|text|chat|alpaca|text-jsonl. chat, alpaca and text-jsonl are JSON records, one per
// line (JSON Lines) or the elements of one JSON array (the file's first data character is '[').
enum class DataFormat { auto_detect, tsv, text, chat, alpaca, text_jsonl };
enum class SampleMode { random, sequential };      // --sample-mode random|sequential
// --pack-strategy best-fit|stream: how --pack fills rows (docs/data.md). best-fit: whole samples, best-fit
// decreasing; stream: the samples concatenated and cut every seq_len tokens (a sample may span two rows; the only
// strategy before 2026-11-26).
enum class PackStrategy { best_fit, stream };

// Flag spellings (what --help lists): "auto", "tsv", "text", "chat", "alpaca", "text-jsonl"; "random",
// "sequential". parse_* throw UsageError.
DataFormat parse_data_format(const std::string& name);
SampleMode parse_sample_mode(const std::string& name);
PackStrategy parse_pack_strategy(const std::string& name);
const char* to_string(DataFormat format);
// Formats whose samples are rendered in the chat format (prompt/target pairs too): they need its marker tokens,
// and the template decides their ids.
bool renders_chat(DataFormat format);
const char* to_string(SampleMode mode);
const char* to_string(PackStrategy strategy);

// The line rule every reader of data files shares (docs/data.md): not blank after trimming ASCII spaces, and not
// a comment (its trimmed text starting with a non-empty `comment_prefix`).
bool is_data_line(std::string_view line, std::string_view comment_prefix);

struct DataOptions {
  std::string path;
  DataFormat format = DataFormat::auto_detect;
  std::optional<std::string> system;  // the system prompt of every pair / record that has none of its own
  int64_t seq_len = 256;              // input positions per row
  int64_t batch_size = 1;             // rows per batch
  bool pack = false;                  // rows filled with several samples instead of one sample and padding
  PackStrategy pack_strategy = PackStrategy::best_fit;
  SampleMode sample_mode = SampleMode::random;
  uint64_t seed = 0;
  bool strict = false;                // a bad line is a fatal Error instead of a skipped, counted one
  std::string comment_prefix = "#";   // a trimmed line starting with it is a comment; empty: no comments
  std::string role = "training data";  // what messages call the file ("eval data (--eval-data)", ...)
  int64_t max_bad_line_warnings = 20;  // one warning per bad line up to this many, then a summary
};

struct DataStats {
  int64_t lines = 0;        // physical lines in the file (records, for a JSON array)
  int64_t blank = 0;        // empty (after trimming) lines
  int64_t comments = 0;     // lines starting with the comment prefix (not bad; the summary counts them)
  int64_t samples = 0;      // token sequences that batches draw from (a long text line gives several)
  int64_t skipped = 0;      // bad lines left out (always 0 with strict)
  int64_t tokens = 0;       // tokens kept, each line's once (after truncation)
  int64_t loss_tokens = 0;  // targets that carry loss, summed over the samples (one padded epoch)
  int64_t truncated = 0;    // TSV pairs whose prompt lost tokens on the left to fit seq_len
  int64_t split_lines = 0;  // text lines (or conversations) cut into more than one window
  int64_t lossless_windows = 0;  // windows of a cut conversation without a loss target, left out
};

struct Batch {
  at::Tensor input_ids;   // int64 [B, T], T <= seq_len; padded with pad_id()
  at::Tensor target_ids;  // int64 [B, T]: the next token of each input position, -100 where no loss
  int64_t loss_tokens = 0;  // targets != -100
  int64_t tokens = 0;       // input positions that are not padding
  at::Tensor token_mask;    // bool [B, T]: the input positions that are not padding (transformers' attention_mask)
  std::vector<int64_t> lines;  // per row, the file line of its (padded) or its first (packed) sample
  // Packed batches only (undefined when padded), int64 [B, T]: each input position's offset in its sample (the
  // positions restart with every sample), and which sample of the row it belongs to (padding is a sample of its
  // own). The model masks attention to the position's own sample (docs/data.md "Batches").
  at::Tensor position_ids, document_ids;
};

class TrainingData {
 public:
  // Reads and tokenizes the whole file, logs a summary (and the warnings for bad or truncated lines).
  // Throws qwen3::Error for an unreadable file, a bad line with `strict`, or a file without a single sample;
  // qwen3::UsageError for seq_len < 1 or batch_size < 1.
  TrainingData(const Tokenizer& tok, DataOptions opt);
  ~TrainingData();
  TrainingData(TrainingData&&) noexcept;
  TrainingData& operator=(TrainingData&&) noexcept;

  const DataStats& stats() const;
  const DataOptions& options() const;
  DataFormat format() const;  // the format used: auto_detect resolved
  TokenId pad_id() const;     // <|endoftext|> when the tokenizer has it, else 0
  // Rows per epoch: samples (padded) or ceil((stream tokens - 1) / seq_len) (packed).
  int64_t rows_per_epoch() const;
  // ceil(rows_per_epoch / batch_size): the last batch of an epoch may have fewer rows.
  int64_t batches_per_epoch() const;
  // Deterministic from (seed, epoch, index); safe to call from several threads. Throws qwen3::Error when
  // epoch < 0 or index is outside [0, batches_per_epoch()).
  Batch batch(int64_t epoch, int64_t index) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The conversations of a chat or alpaca file (JSON Lines, or one JSON array) rendered as training renders them,
// one per record (`tokenize --chat`). Error naming FILE:LINE (or FILE: record N) for a malformed record.
std::vector<ChatTokens> render_chat_file(const Tokenizer& tokenizer, const std::string& path,
                                         const std::optional<std::string>& system);

}  // namespace qwen3
