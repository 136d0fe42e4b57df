// What a TrainingData holds: every sample's tokens in one flat int32 buffer (plus a parallel loss mask), the
// samples as spans of it, and the order of the last epoch asked for (a shuffle costs O(samples); a trainer
// asks for the same epoch many times in a row).
#pragma once
#include <memory>
#include <mutex>
#include <vector>

#include "qwen3/data/data.h"

namespace qwen3 {

struct SampleSpan {
  int64_t begin = 0;   // index of the first token in Impl::tokens
  int64_t length = 0;  // 2 ..= seq_len + 1 tokens
  int64_t line = 0;    // the file line it came from (1-based)
};

// One epoch's sample order and, for packing, where each row's samples are.
struct EpochOrder {
  int64_t epoch = -1;
  std::vector<int64_t> order;         // sample indices (best-fit packing: grouped by row, rows in their order)
  std::vector<int64_t> stream_begin;  // stream packing: order.size() + 1 prefix sums of the lengths
  std::vector<int64_t> row_begin;     // best-fit packing: rows + 1 offsets into `order`
};

struct TrainingData::Impl {
  DataOptions options;
  DataFormat format = DataFormat::text;
  DataStats stats;
  TokenId pad_id = 0;
  std::vector<TokenId> tokens;     // every kept line's tokens, once (text windows overlap by a token)
  std::vector<uint8_t> loss_mask;  // per token: 1 when it carries loss as a target
  std::vector<SampleSpan> samples;
  int64_t stream_tokens = 0;       // sum of the sample lengths: the packed stream of one epoch
  int64_t rows_per_epoch = 0;

  std::shared_ptr<const EpochOrder> epoch_order(int64_t epoch) const;
  Batch padded_batch(const EpochOrder& epoch, int64_t index) const;
  Batch packed_batch(const EpochOrder& epoch, int64_t index) const;      // stream packing
  Batch best_fit_batch(const EpochOrder& epoch, int64_t index) const;    // best-fit packing

 private:
  mutable std::mutex cache_mutex_;
  mutable std::shared_ptr<const EpochOrder> cached_order_;
};

// Reads opt.path into `data` (everything but the epoch cache); defined in data_loader.cpp.
void load_training_data(const Tokenizer& tokenizer, TrainingData::Impl& data);

}  // namespace qwen3
