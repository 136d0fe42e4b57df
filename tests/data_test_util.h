// Shared by the data tests: a training file written to a temporary directory, TrainingData built on the tiny
// tokenizer, the rows of a batch as plain vectors, and the log lines a load printed.
#pragma once
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dat_test_util.h"
#include "qwen3/data/data.h"
#include "tokenizer_test_util.h"

namespace qwen3::test {

using Ids = std::vector<int64_t>;

// A file in its own temporary directory, removed with the object.
class DataFile {
 public:
  explicit DataFile(const std::string& content, const std::string& name = "train.tsv") : path_(dir_.file(name)) {
    std::ofstream(path_, std::ios::binary) << content;
  }
  const std::string& path() const { return path_; }

 private:
  TempDir dir_;
  std::string path_;
};

inline DataOptions data_options(const std::string& path, DataFormat format, int64_t seq_len = 64,
                                int64_t batch_size = 1) {
  DataOptions opt;
  opt.path = path;
  opt.format = format;
  opt.seq_len = seq_len;
  opt.batch_size = batch_size;
  opt.sample_mode = SampleMode::sequential;
  return opt;
}

inline Ids row(const at::Tensor& t, int64_t r) {
  const at::Tensor x = t[r].contiguous();
  return Ids(x.data_ptr<int64_t>(), x.data_ptr<int64_t>() + x.numel());
}

inline Ids to_ids(const std::vector<TokenId>& ids) { return Ids(ids.begin(), ids.end()); }

// The targets of a row that carry loss, in order.
inline Ids counted_targets(const at::Tensor& targets, int64_t r) {
  Ids out;
  for (int64_t id : row(targets, r))
    if (id != -100) out.push_back(id);
  return out;
}

// Everything logged while it lives (the default logger is swapped for one writing to a string).
class LogCapture {
 public:
  LogCapture() : previous_(spdlog::default_logger()) {
    auto logger = std::make_shared<spdlog::logger>("capture",
                                                   std::make_shared<spdlog::sinks::ostream_sink_mt>(stream_));
    logger->set_level(spdlog::level::info);
    spdlog::set_default_logger(logger);
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  std::string text() const { return stream_.str(); }
  int count(const std::string& needle) const {
    int n = 0;
    const std::string all = text();
    for (size_t at = all.find(needle); at != std::string::npos; at = all.find(needle, at + 1)) ++n;
    return n;
  }

 private:
  std::ostringstream stream_;
  std::shared_ptr<spdlog::logger> previous_;
};

}  // namespace qwen3::test
