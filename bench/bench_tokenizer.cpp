// Tokenizer speed on the corpus of scripts/bench-tokenizer-reference.mjs (which times the JS reference on the
// same documents): encode throughput in MB/s and tokens/s, decode, and loading tokenizer.json. Run from the
// repository root after scripts/fetch-tokenizer.sh and the node script (which writes the corpus):
//   build/bench/bench_tokenizer
// $QWEN3_TOKENIZER_JSON and $QWEN3_TOKENIZER_CORPUS override the two paths. Results: docs/tokenizer.md.
#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "qwen3/tokenizer/tokenizer.h"

namespace {

using namespace qwen3;

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

std::string tokenizer_path() { return env_or("QWEN3_TOKENIZER_JSON", ".deps/tokenizer-qwen3/models/tokenizer.json"); }
std::string corpus_path() { return env_or("QWEN3_TOKENIZER_CORPUS", ".deps/bench/tokenizer-corpus.json"); }

struct Setup {
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<std::string> documents;
  size_t bytes = 0;
  std::string error;
};

const Setup& setup() {
  static const Setup s = [] {
    Setup s;
    try {
      s.tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_file(tokenizer_path()));
      std::ifstream in(corpus_path());
      if (!in) throw std::runtime_error(corpus_path() + " is missing: run node scripts/bench-tokenizer-reference.mjs");
      std::stringstream text;
      text << in.rdbuf();
      s.documents = nlohmann::json::parse(text.str()).get<std::vector<std::string>>();
      for (const auto& d : s.documents) s.bytes += d.size();
    } catch (const std::exception& e) {
      s.error = e.what();
    }
    return s;
  }();
  return s;
}

// The same checksum as the node script prints: equal values mean equal ids over the whole corpus.
uint64_t checksum(uint64_t sum, const std::vector<TokenId>& ids) {
  for (TokenId id : ids) sum = (sum * 31 + uint64_t(id)) % 1000000007ull;
  return sum;
}

void BM_EncodeCorpus(benchmark::State& state) {
  const Setup& s = setup();
  if (!s.error.empty()) return state.SkipWithError(s.error.c_str());
  size_t tokens = 0;
  uint64_t sum = 0;
  for (auto _ : state) {
    tokens = 0;
    sum = 0;
    for (const auto& doc : s.documents) {
      const auto ids = s.tokenizer->encode(doc);
      tokens += ids.size();
      sum = checksum(sum, ids);
    }
  }
  state.SetBytesProcessed(int64_t(state.iterations() * s.bytes));
  state.counters["tokens_per_s"] = benchmark::Counter(double(tokens) * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["tokens"] = double(tokens);
  state.counters["checksum"] = double(sum);
  state.counters["MB"] = double(s.bytes) / 1e6;
}

void BM_DecodeCorpus(benchmark::State& state) {
  const Setup& s = setup();
  if (!s.error.empty()) return state.SkipWithError(s.error.c_str());
  std::vector<std::vector<TokenId>> encoded;
  size_t tokens = 0;
  for (const auto& doc : s.documents) {
    encoded.push_back(s.tokenizer->encode(doc));
    tokens += encoded.back().size();
  }
  size_t out_bytes = 0;
  for (auto _ : state) {
    out_bytes = 0;
    for (const auto& ids : encoded) out_bytes += s.tokenizer->decode(ids).size();
  }
  state.SetBytesProcessed(int64_t(state.iterations() * out_bytes));
  state.counters["tokens_per_s"] = benchmark::Counter(double(tokens) * state.iterations(), benchmark::Counter::kIsRate);
}

void BM_LoadTokenizerJson(benchmark::State& state) {
  if (!setup().error.empty()) return state.SkipWithError(setup().error.c_str());
  for (auto _ : state) benchmark::DoNotOptimize(Tokenizer::from_file(tokenizer_path()));
}

BENCHMARK(BM_EncodeCorpus)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_DecodeCorpus)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LoadTokenizerJson)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
