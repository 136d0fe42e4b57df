// .dat reader speed. Index: a 652-entry Qwen3-4B-shaped file (~3 GB, written sparse so it costs no disk) must
// index by reading headers only. Payloads: reading every payload of a >1 GB file from the page cache, against
// a plain read() loop and `cat FILE > /dev/null` over the same file. Results: docs/performance.md.
// Files go to $BENCH_DIR (default /tmp).
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "qwen3/checkpoint/checkpoint.h"
#include "qwen3/dat/dat.h"
#include "qwen3/model/layout.h"
#include "qwen3/dat/leb128.h"

namespace {

using namespace qwen3;

std::string bench_dir() {
  const char* d = std::getenv("BENCH_DIR");
  return d ? d : "/tmp";
}

// Headers written for real, payloads left as holes: the index sees a genuine 3 GB file.
std::string make_sparse_4b_file() {
  const std::string path = bench_dir() + "/qwen3-bench-4b-sparse.dat";
  const auto entries = qwen3_dat_entries(qwen3_4b_shape(), true, ElemType::Float16);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  uint8_t count[10];
  const size_t n = leb128::encode(entries.size(), count);
  off_t pos = ::write(fd, count, n);
  for (const auto& e : entries) {
    const auto h = encode_entry_header(e.key, e.type, e.shape);
    pos += ::pwrite(fd, h.data(), h.size(), pos);
    pos += static_cast<off_t>(payload_bytes(e.type, e.shape));
  }
  ::ftruncate(fd, pos);
  ::close(fd);
  return path;
}

// A real >1 GB file: 10 blocks of the 4B shape in NVFP4 plus its fp16 embedding and lm_head pair (~1.6 GB).
std::string make_large_file() {
  const std::string path = bench_dir() + "/qwen3-bench-large.dat";
  if (::access(path.c_str(), R_OK) == 0) return path;
  ModelShape shape = qwen3_4b_shape();
  shape.layers = 10;
  const auto entries = qwen3_dat_entries(shape, true, ElemType::Float16);
  DatWriter w(path, entries.size());
  std::vector<uint8_t> chunk(8 << 20);
  for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<uint8_t>(i * 2654435761u >> 24);
  for (const auto& e : entries) {
    w.begin_entry(e.key, e.type, e.shape);
    for (uint64_t left = payload_bytes(e.type, e.shape); left > 0;) {
      const uint64_t n = std::min<uint64_t>(left, chunk.size());
      w.write_payload(chunk.data(), n);
      left -= n;
    }
  }
  w.commit();
  return path;
}

uint64_t file_bytes(const std::string& path) { return DatReader(path).file_size(); }

void BM_Index4BHeadersOnly(benchmark::State& state) {
  const std::string path = make_sparse_4b_file();
  size_t entries = 0;
  for (auto _ : state) {
    DatReader r(path);
    entries = r.entries().size();
    benchmark::DoNotOptimize(entries);
  }
  state.counters["entries"] = static_cast<double>(entries);
  state.counters["file_GB"] = static_cast<double>(file_bytes(path)) / 1e9;
}
BENCHMARK(BM_Index4BHeadersOnly)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_ReadAllPayloads(benchmark::State& state) {
  const std::string path = make_large_file();
  const DatReader r(path);
  std::vector<uint8_t> buf(static_cast<size_t>(state.range(0)));
  uint64_t total = 0;
  for (auto _ : state) {
    total = 0;
    for (const auto& e : r.entries()) {
      for (uint64_t off = 0; off < e.nbytes; off += buf.size()) {
        const uint64_t n = std::min<uint64_t>(buf.size(), e.nbytes - off);
        r.read_range(e, off, buf.data(), n);
        total += n;
      }
    }
    benchmark::DoNotOptimize(buf.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(total * state.iterations()));
}
BENCHMARK(BM_ReadAllPayloads)->Arg(128 << 10)->Arg(16 << 20)->UseRealTime()->Unit(benchmark::kMillisecond);

// What `cat` does: read() into a 128 KiB buffer until EOF.
void BM_ReadLoopBaseline(benchmark::State& state) {
  const std::string path = make_large_file();
  std::vector<uint8_t> buf(128 << 10);
  uint64_t total = 0;
  for (auto _ : state) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    total = 0;
    for (ssize_t got; (got = ::read(fd, buf.data(), buf.size())) > 0;) total += static_cast<uint64_t>(got);
    ::close(fd);
    benchmark::DoNotOptimize(buf.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(total * state.iterations()));
}
BENCHMARK(BM_ReadLoopBaseline)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_CatToDevNull(benchmark::State& state) {
  const std::string path = make_large_file();
  const std::string cmd = "cat '" + path + "' > /dev/null";
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    if (std::system(cmd.c_str()) != 0) state.SkipWithError("cat failed");
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  state.SetBytesProcessed(static_cast<int64_t>(file_bytes(path) * state.iterations()));
}
BENCHMARK(BM_CatToDevNull)->UseManualTime()->Unit(benchmark::kMillisecond);

// A checkpoint's tensor hashes (tensor_bytes_hash, checked on resume) beside a copy of the same bytes, in one run:
// what hashing adds to a save of a 4B model's master and moments (about 48 GB in the fast configuration).
std::vector<uint8_t>& hash_input() {
  static std::vector<uint8_t> bytes = [] {
    std::vector<uint8_t> b(size_t{256} << 20);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
    return b;
  }();
  return bytes;
}

void BM_TensorBytesHash(benchmark::State& state) {
  const auto& bytes = hash_input();
  for (auto _ : state) benchmark::DoNotOptimize(tensor_bytes_hash(bytes.data(), bytes.size()));
  state.SetBytesProcessed(static_cast<int64_t>(bytes.size() * state.iterations()));
}
BENCHMARK(BM_TensorBytesHash)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_CopyOfTheHashedBytes(benchmark::State& state) {
  const auto& bytes = hash_input();
  std::vector<uint8_t> copy(bytes.size());
  for (auto _ : state) {
    std::memcpy(copy.data(), bytes.data(), bytes.size());
    benchmark::DoNotOptimize(copy.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes.size() * state.iterations()));
}
BENCHMARK(BM_CopyOfTheHashedBytes)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
