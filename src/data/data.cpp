#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "data/data_lines.h"
#include "data/packing.h"
#include "data/sample_order.h"
#include "data/training_data_impl.h"
#include "qwen3/data/data.h"
#include "qwen3/base/enum_names.h"
#include "qwen3/base/error.h"
#include "qwen3/base/file_io.h"

#include <sstream>

namespace qwen3 {

DataFormat parse_data_format(const std::string& name) {
  const DataFormat all[] = {DataFormat::auto_detect, DataFormat::tsv,    DataFormat::text,
                            DataFormat::chat,        DataFormat::alpaca, DataFormat::text_jsonl};
  return enum_from_name(name, all, "data format");
}

SampleMode parse_sample_mode(const std::string& name) {
  const SampleMode all[] = {SampleMode::random, SampleMode::sequential};
  return enum_from_name(name, all, "sample mode");
}

const char* to_string(DataFormat format) {
  switch (format) {
    case DataFormat::auto_detect: return "auto";
    case DataFormat::tsv: return "tsv";
    case DataFormat::text: return "text";
    case DataFormat::chat: return "chat";
    case DataFormat::alpaca: return "alpaca";
    case DataFormat::text_jsonl: return "text-jsonl";
  }
  return "?";
}

bool renders_chat(DataFormat format) {
  return format == DataFormat::tsv || format == DataFormat::chat || format == DataFormat::alpaca;
}

const char* to_string(SampleMode mode) { return mode == SampleMode::random ? "random" : "sequential"; }

PackStrategy parse_pack_strategy(const std::string& name) {
  const PackStrategy all[] = {PackStrategy::best_fit, PackStrategy::stream};
  return enum_from_name(name, all, "pack strategy");
}

const char* to_string(PackStrategy strategy) { return strategy == PackStrategy::best_fit ? "best-fit" : "stream"; }

std::vector<ChatTokens> render_chat_file(const Tokenizer& tokenizer, const std::string& path,
                                         const std::optional<std::string>& system) {
  tokenizer.check_chat_format();
  std::ifstream in = open_input_file(path, "chat data", std::ios::binary);
  std::ostringstream all;
  all << in.rdbuf();
  const std::string text = all.str();
  std::vector<std::pair<std::string, nlohmann::json>> records;  // (where, record)
  const std::string_view trimmed = data::trim_ascii_space(text);
  if (!trimmed.empty() && trimmed.front() == '[') {
    const nlohmann::json array = nlohmann::json::parse(trimmed.begin(), trimmed.end(), nullptr, false);
    if (array.is_discarded() || !array.is_array()) throw Error(path + ": not a valid JSON array of records");
    for (size_t i = 0; i < array.size(); ++i) records.emplace_back(fmt::format("{}: record {}", path, i + 1), array[i]);
  } else {
    std::istringstream lines(text);
    std::string line;
    for (int64_t n = 1; std::getline(lines, line); ++n) {
      if (data::trim_ascii_space(line).empty()) continue;
      const std::string where = fmt::format("{}:{}", path, n);
      nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
      if (record.is_discarded()) throw Error(where + ": not a JSON value (one record per line)");
      records.emplace_back(where, std::move(record));
    }
  }
  std::vector<ChatTokens> out;
  for (const auto& [where, record] : records) {
    const auto kind = data::record_kind_of(record);
    if (!kind || *kind == data::RecordKind::text)
      throw Error(where + ": not a chat {\"messages\": [...]} (or {\"conversations\"}, or {\"prompt\", \"completion\"}) or alpaca {\"instruction\", \"output\"} record");
    data::RecordMessages m = data::record_messages(record, *kind, system);
    if (!m.problem.empty()) throw Error(where + ": " + m.problem);
    try {
      out.push_back(render_conversation(tokenizer, m.messages));
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
  }
  return out;
}

bool is_data_line(std::string_view line, std::string_view comment_prefix) {
  return data::classify_line(line, comment_prefix) == data::LineKind::sample;
}

TrainingData::TrainingData(const Tokenizer& tok, DataOptions opt) : impl_(std::make_unique<Impl>()) {
  if (opt.seq_len < 1) throw UsageError(fmt::format("seq_len must be at least 1, not {}", opt.seq_len));
  if (opt.batch_size < 1) throw UsageError(fmt::format("batch_size must be at least 1, not {}", opt.batch_size));
  Impl& d = *impl_;
  d.options = std::move(opt);
  // Qwen3's pad token; padding never carries loss and, at the end of a causal row, is never attended to.
  d.pad_id = tok.token_to_id("<|endoftext|>").value_or(0);
  load_training_data(tok, d);

  for (const SampleSpan& s : d.samples) d.stream_tokens += s.length;
  const int64_t seq_len = d.options.seq_len;
  if (!d.options.pack) {
    d.rows_per_epoch = d.stats.samples;
  } else if (d.options.pack_strategy == PackStrategy::stream) {
    // Stream rows overlap by one token (a row's last target is the next row's first input); the tail is a row too.
    d.rows_per_epoch = (d.stream_tokens - 1 + seq_len - 1) / seq_len;
  } else {
    // Best-fit rows (epoch_order): their count depends on the lengths alone, so epoch 0's (computed now, and kept
    // for the first batches) is every epoch's.
    d.rows_per_epoch = static_cast<int64_t>(d.epoch_order(0)->row_begin.size()) - 1;
  }

  const DataStats& s = d.stats;
  spdlog::info("data: {} ({}): {} lines ({} blank, {} comments{}), {} samples, {} tokens, {} loss tokens, {} skipped, "
               "{} truncated, {} split",
               d.options.path, to_string(d.format), s.lines, s.blank, s.comments,
               d.options.comment_prefix.empty() ? ": comments off" : fmt::format(" starting '{}'", d.options.comment_prefix),
               s.samples, s.tokens, s.loss_tokens, s.skipped, s.truncated, s.split_lines);
  spdlog::info("data: {} {} rows of <= {} tokens -> {} batches of <= {} per epoch, {} order", rows_per_epoch(),
               !d.options.pack ? "padded" : fmt::format("packed ({})", to_string(d.options.pack_strategy)), seq_len,
               batches_per_epoch(), d.options.batch_size,
               to_string(d.options.sample_mode));
}

TrainingData::~TrainingData() = default;
TrainingData::TrainingData(TrainingData&&) noexcept = default;
TrainingData& TrainingData::operator=(TrainingData&&) noexcept = default;

const DataStats& TrainingData::stats() const { return impl_->stats; }
const DataOptions& TrainingData::options() const { return impl_->options; }
DataFormat TrainingData::format() const { return impl_->format; }
TokenId TrainingData::pad_id() const { return impl_->pad_id; }
int64_t TrainingData::rows_per_epoch() const { return impl_->rows_per_epoch; }

int64_t TrainingData::batches_per_epoch() const {
  return (impl_->rows_per_epoch + impl_->options.batch_size - 1) / impl_->options.batch_size;
}

Batch TrainingData::batch(int64_t epoch, int64_t index) const {
  if (epoch < 0) throw Error(fmt::format("data: epoch {} is negative", epoch));
  if (index < 0 || index >= batches_per_epoch())
    throw Error(fmt::format("data: batch {} is outside [0, {}) of '{}'", index, batches_per_epoch(),
                            impl_->options.path));
  const std::shared_ptr<const EpochOrder> order = impl_->epoch_order(epoch);
  if (!impl_->options.pack) return impl_->padded_batch(*order, index);
  return impl_->options.pack_strategy == PackStrategy::stream ? impl_->packed_batch(*order, index)
                                                              : impl_->best_fit_batch(*order, index);
}

std::shared_ptr<const EpochOrder> TrainingData::Impl::epoch_order(int64_t epoch) const {
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cached_order_ && cached_order_->epoch == epoch) return cached_order_;
  }
  // Computed outside the lock: two threads may both compute the same order, which is only wasted work.
  auto fresh = std::make_shared<EpochOrder>();
  fresh->epoch = epoch;
  fresh->order = data::sample_order(stats.samples, options.sample_mode, options.seed, epoch);
  if (options.pack && options.pack_strategy == PackStrategy::best_fit) {
    // Rows of seq_len + 1 tokens of whole samples (seq_len inputs and the last one's target). The epoch's order
    // decides which of equally long samples share a row; the rows are then put in an order of their own
    // (shuffled, or as opened: longest first), from a stream unrelated to the samples' shuffle.
    std::vector<int64_t> lengths(fresh->order.size());
    for (size_t k = 0; k < lengths.size(); ++k) lengths[k] = samples[static_cast<size_t>(fresh->order[k])].length;
    const data::PackedRowPlan plan = data::best_fit_decreasing(lengths, options.seq_len + 1);
    const std::vector<int64_t> row_order =
        data::sample_order(plan.rows(), options.sample_mode, options.seed ^ 0x6A09E667F3BCC908ULL, epoch);
    std::vector<int64_t> grouped;
    grouped.reserve(fresh->order.size());
    fresh->row_begin.push_back(0);
    for (const int64_t r : row_order) {
      for (int64_t i = plan.row_begin[static_cast<size_t>(r)]; i < plan.row_begin[static_cast<size_t>(r) + 1]; ++i)
        grouped.push_back(fresh->order[static_cast<size_t>(plan.row_samples[static_cast<size_t>(i)])]);
      fresh->row_begin.push_back(static_cast<int64_t>(grouped.size()));
    }
    fresh->order = std::move(grouped);
  } else if (options.pack) {
    fresh->stream_begin.resize(fresh->order.size() + 1, 0);
    for (size_t k = 0; k < fresh->order.size(); ++k)
      fresh->stream_begin[k + 1] = fresh->stream_begin[k] + samples[static_cast<size_t>(fresh->order[k])].length;
  }
  std::lock_guard<std::mutex> lock(cache_mutex_);
  cached_order_ = fresh;
  return fresh;
}

}  // namespace qwen3
