// Helpers for the .dat tests: build files in memory byte by byte, and temporary directories.
#pragma once
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "qwen3/base/remove_tree.h"
#include "qwen3/dat/dat.h"
#include "qwen3/dat/leb128.h"

namespace qwen3::test {

inline void put_leb(std::vector<uint8_t>& out, uint64_t v) {
  uint8_t tmp[leb128::kMaxBytes];
  const size_t n = leb128::encode(v, tmp);
  out.insert(out.end(), tmp, tmp + n);
}

struct RawEntry {
  std::string key;
  uint64_t type;
  std::vector<int64_t> shape;
  std::vector<uint8_t> payload;  // must hold numel * elem_size bytes for a valid file
};

inline std::vector<uint8_t> build_dat(const std::vector<RawEntry>& entries) {
  std::vector<uint8_t> out;
  put_leb(out, entries.size());
  for (const auto& e : entries) {
    put_leb(out, e.key.size());
    out.insert(out.end(), e.key.begin(), e.key.end());
    put_leb(out, e.type);
    put_leb(out, e.shape.size());
    for (auto d : e.shape) put_leb(out, static_cast<uint64_t>(d));
    out.insert(out.end(), e.payload.begin(), e.payload.end());
  }
  return out;
}

inline std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

// A small valid model-like file: dense fp16 tensors and one NVFP4 pair.
inline std::vector<RawEntry> sample_entries() {
  return {
      {"model.embed_tokens.weight", 5, {8, 16}, random_bytes(8 * 16 * 2, 1)},
      {"model.layers.0.self_attn.q_proj.weight.qdata", 0, {4, 16}, random_bytes(4 * 16, 2)},
      {"model.layers.0.self_attn.q_proj.weight.scale", 101, {4, 2}, random_bytes(4 * 2, 3)},
      {"model.norm.weight", 5, {16}, random_bytes(32, 4)},
      {"counts", 4, {3}, random_bytes(24, 5)},
      {"scalar", 6, {}, random_bytes(4, 6)},
  };
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "qwen3-test-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    qwen3::remove_tree(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

}  // namespace qwen3::test
