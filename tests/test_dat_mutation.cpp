// Mutation testing of the reader: thousands of byte flips, insertions and truncations of a valid file must
// each give a clean DatError or a consistent index whose payloads read back. Never a crash, hang or huge
// allocation (run under ASan by scripts/fuzz.sh as well).
#include <gtest/gtest.h>

#include <random>

#include "dat_test_util.h"
#include "qwen3/dat/dat.h"

namespace qwen3 {
namespace {

// Returns true if the bytes parsed; checks the result is internally consistent.
bool parse_and_check(const std::vector<uint8_t>& bytes) {
  try {
    DatReader r(memory_source("mut", bytes.data(), bytes.size()));
    uint64_t prev_end = 0;
    for (const auto& e : r.entries()) {
      EXPECT_GE(e.header_offset, prev_end);
      EXPECT_LE(e.payload_offset + e.nbytes, bytes.size());
      EXPECT_EQ(e.nbytes, payload_bytes(e.type, e.shape));
      std::vector<uint8_t> payload(e.nbytes);
      r.read(e, payload.data(), payload.size());
      prev_end = e.payload_offset + e.nbytes;
    }
    return true;
  } catch (const DatError&) {
    return false;
  }
}

TEST(DatMutation, FlipsInsertionsAndTruncationsGiveCleanResults) {
  const auto good = test::build_dat(test::sample_entries());
  ASSERT_TRUE(parse_and_check(good));
  std::mt19937 rng(12345);
  int parsed = 0, rejected = 0;
  for (int iter = 0; iter < 6000; ++iter) {
    auto bytes = good;
    switch (iter % 4) {
      case 0:  // flip one bit
        bytes[rng() % bytes.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
        break;
      case 1:  // overwrite a few bytes, often in the header region where it matters most
        for (int k = 0; k < 3; ++k) bytes[rng() % std::min<size_t>(bytes.size(), 80)] = static_cast<uint8_t>(rng());
        break;
      case 2:  // truncate
        bytes.resize(rng() % bytes.size());
        break;
      default:  // insert or delete a byte
        if (rng() % 2)
          bytes.insert(bytes.begin() + rng() % bytes.size(), static_cast<uint8_t>(rng()));
        else
          bytes.erase(bytes.begin() + rng() % bytes.size());
    }
    (parse_and_check(bytes) ? parsed : rejected)++;
  }
  // Both outcomes must occur, or the mutations are not reaching the parser.
  EXPECT_GT(parsed, 100);
  EXPECT_GT(rejected, 100);
}

TEST(DatMutation, EveryTruncationOfAFileOnDiskIsAnError) {
  test::TempDir dir;
  const auto good = test::build_dat(test::sample_entries());
  for (size_t len = 0; len < good.size(); ++len) {
    const std::string path = dir.file("t.dat");
    test::write_file(path, std::vector<uint8_t>(good.begin(), good.begin() + len));
    EXPECT_THROW(DatReader{path}, DatError) << "length " << len;
  }
}

}  // namespace
}  // namespace qwen3
