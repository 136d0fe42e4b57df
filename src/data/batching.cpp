// Rows → a Batch: padded (one sample a row), stream-packed (cut from the concatenated samples) or best-fit
// packed (whole samples, data/packing.h). A row is a run of tokens; input position j holds token j and targets
// token j + 1, which counts (is not -100) only when it carries loss and is not the first token of its sample:
// nothing is learned across the border of two packed samples, nor from padding.
#include <algorithm>

#include "data/training_data_impl.h"

namespace qwen3 {
namespace {

constexpr int64_t kNoLoss = -100;  // at::cross_entropy's default ignore_index

struct Row {
  int64_t line = 0;  // the file line of the row's (first) sample
  std::vector<TokenId> ids;
  std::vector<uint8_t> is_target;  // per token: may token i be the target of position i - 1
  std::vector<int64_t> position;   // per token: its offset in its sample
  std::vector<int64_t> document;   // per token: which sample of the row (0, 1, ...)
};

void append_tokens(const TrainingData::Impl& d, const SampleSpan& sample, int64_t from, int64_t to, Row& row) {
  const int64_t document = row.document.empty() ? 0 : row.document.back() + 1;
  for (int64_t i = from; i < to; ++i) {
    const auto at = static_cast<size_t>(sample.begin + i);
    row.ids.push_back(d.tokens[at]);
    row.is_target.push_back(i > 0 && d.loss_mask[at]);
    row.position.push_back(i);
    row.document.push_back(document);
  }
}

Batch to_batch(const std::vector<Row>& rows, TokenId pad_id, bool packed) {
  int64_t width = 0;  // padded to the longest row of this batch, not to seq_len
  for (const Row& r : rows) width = std::max<int64_t>(width, static_cast<int64_t>(r.ids.size()) - 1);
  const auto count = static_cast<int64_t>(rows.size());
  Batch b;
  b.input_ids = at::full({count, width}, static_cast<int64_t>(pad_id), at::kLong);
  b.target_ids = at::full({count, width}, kNoLoss, at::kLong);
  b.token_mask = at::zeros({count, width}, at::kBool);
  auto input = b.input_ids.accessor<int64_t, 2>();
  auto target = b.target_ids.accessor<int64_t, 2>();
  auto real = b.token_mask.accessor<bool, 2>();
  if (packed) {
    b.position_ids = at::arange(width, at::kLong).unsqueeze(0).repeat({count, 1});
    b.document_ids = at::full({count, width}, int64_t{-1}, at::kLong);  // padding: a document of its own
  } else {  // accessors need tensors; these are dropped below
    b.position_ids = b.document_ids = at::zeros({0, 0}, at::kLong);
  }
  auto position = b.position_ids.accessor<int64_t, 2>();
  auto document = b.document_ids.accessor<int64_t, 2>();
  for (int64_t r = 0; r < count; ++r) {
    const Row& row = rows[static_cast<size_t>(r)];
    const auto positions = static_cast<int64_t>(row.ids.size()) - 1;
    for (int64_t j = 0; j < positions; ++j) {
      input[r][j] = row.ids[static_cast<size_t>(j)];
      real[r][j] = true;
      if (packed) {
        position[r][j] = row.position[static_cast<size_t>(j)];
        document[r][j] = row.document[static_cast<size_t>(j)];
      }
      if (row.is_target[static_cast<size_t>(j + 1)]) {
        target[r][j] = row.ids[static_cast<size_t>(j + 1)];
        ++b.loss_tokens;
      }
    }
    b.tokens += positions;
    b.lines.push_back(row.line);
  }
  if (!packed) b.position_ids = b.document_ids = at::Tensor();
  return b;
}

}  // namespace

Batch TrainingData::Impl::padded_batch(const EpochOrder& epoch, int64_t index) const {
  const int64_t first = index * options.batch_size;
  const int64_t last = std::min(first + options.batch_size, rows_per_epoch);
  std::vector<Row> rows(static_cast<size_t>(last - first));
  for (int64_t r = first; r < last; ++r) {
    const SampleSpan& sample = samples[static_cast<size_t>(epoch.order[static_cast<size_t>(r)])];
    rows[static_cast<size_t>(r - first)].line = sample.line;
    append_tokens(*this, sample, 0, sample.length, rows[static_cast<size_t>(r - first)]);
  }
  return to_batch(rows, pad_id, /*packed=*/false);
}

Batch TrainingData::Impl::packed_batch(const EpochOrder& epoch, int64_t index) const {
  const int64_t seq_len = options.seq_len;
  const int64_t first = index * options.batch_size;
  const int64_t last = std::min(first + options.batch_size, rows_per_epoch);
  std::vector<Row> rows(static_cast<size_t>(last - first));
  for (int64_t r = first; r < last; ++r) {
    // Row r is stream tokens [r * seq_len, r * seq_len + seq_len + 1): seq_len inputs and their targets.
    int64_t pos = r * seq_len;
    const int64_t end = std::min(pos + seq_len + 1, stream_tokens);
    auto k = static_cast<size_t>(
        std::upper_bound(epoch.stream_begin.begin(), epoch.stream_begin.end(), pos) - epoch.stream_begin.begin() - 1);
    Row& row = rows[static_cast<size_t>(r - first)];
    row.line = samples[static_cast<size_t>(epoch.order[k])].line;
    while (pos < end) {
      const SampleSpan& sample = samples[static_cast<size_t>(epoch.order[k])];
      const int64_t offset = pos - epoch.stream_begin[k];
      const int64_t take = std::min(end, epoch.stream_begin[k + 1]) - pos;
      append_tokens(*this, sample, offset, offset + take, row);
      pos += take;
      ++k;
    }
  }
  return to_batch(rows, pad_id, /*packed=*/true);
}

Batch TrainingData::Impl::best_fit_batch(const EpochOrder& epoch, int64_t index) const {
  const int64_t first = index * options.batch_size;
  const int64_t last = std::min(first + options.batch_size, rows_per_epoch);
  std::vector<Row> rows(static_cast<size_t>(last - first));
  for (int64_t r = first; r < last; ++r) {
    Row& row = rows[static_cast<size_t>(r - first)];
    const auto begin = static_cast<size_t>(epoch.row_begin[static_cast<size_t>(r)]);
    const auto end = static_cast<size_t>(epoch.row_begin[static_cast<size_t>(r) + 1]);
    row.line = samples[static_cast<size_t>(epoch.order[begin])].line;
    for (size_t k = begin; k < end; ++k) {  // whole samples: at most seq_len + 1 tokens in all
      const SampleSpan& sample = samples[static_cast<size_t>(epoch.order[k])];
      append_tokens(*this, sample, 0, sample.length, row);
    }
  }
  return to_batch(rows, pad_id, /*packed=*/true);
}

}  // namespace qwen3
