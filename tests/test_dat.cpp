// The .dat container: LEB128, element types, round trips, byte-exact rewriting, every malformed input of
// dat-format.md, and the writer's atomicity.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <csignal>
#include <cstring>
#include <limits>

#include "qwen3/dat/durable_file.h"
#include "cli_test_util.h"
#include "dat_test_util.h"
#include "qwen3/dat/dat.h"
#include "qwen3/dat/leb128.h"

namespace qwen3 {
namespace {

using test::build_dat;
using test::put_leb;
using test::RawEntry;

TEST(Leb128, MinimalEncodingAndRoundTrip) {
  const std::pair<uint64_t, size_t> cases[] = {{0, 1},         {1, 1},          {127, 1},          {128, 2},
                                               {16383, 2},     {16384, 3},      {uint64_t{1} << 35, 6},
                                               {uint64_t{1} << 63, 10}, {std::numeric_limits<uint64_t>::max(), 10}};
  for (auto [value, len] : cases) {
    uint8_t buf[leb128::kMaxBytes];
    EXPECT_EQ(leb128::encode(value, buf), len) << value;
    const auto d = leb128::decode(buf, len);
    ASSERT_EQ(d.status, leb128::DecodeStatus::ok) << value;
    EXPECT_EQ(d.value, value);
    EXPECT_EQ(d.length, len);
  }
  const uint8_t two_fifty_five[] = {0xFF, 0x01};
  EXPECT_EQ(leb128::decode(two_fifty_five, 2).value, 255u);
}

TEST(Leb128, RejectsTruncatedTooLongAndOverflow) {
  const uint8_t truncated[] = {0x80, 0x80};
  EXPECT_EQ(leb128::decode(truncated, 2).status, leb128::DecodeStatus::truncated);
  std::vector<uint8_t> eleven(10, 0x80);
  eleven.push_back(0x00);
  EXPECT_EQ(leb128::decode(eleven.data(), eleven.size()).status, leb128::DecodeStatus::too_long);
  std::vector<uint8_t> overflow(9, 0xFF);
  overflow.push_back(0x02);  // bit 64
  EXPECT_EQ(leb128::decode(overflow.data(), overflow.size()).status, leb128::DecodeStatus::overflow);
  // A non-minimal but in-range encoding is still a valid number for a reader.
  const uint8_t padded[] = {0x81, 0x80, 0x00};
  EXPECT_EQ(leb128::decode(padded, 3).value, 1u);
}

TEST(ElemTypes, SizesNamesAndUnknownIds) {
  EXPECT_EQ(elem_size(ElemType::BFloat16), 2u);
  EXPECT_EQ(elem_size(ElemType::Int64), 8u);
  EXPECT_EQ(elem_size(ElemType::Float4E2M1x2), 1u);
  EXPECT_STREQ(elem_type_name(ElemType::Float8E4M3), "float8_e4m3fn");
  EXPECT_EQ(elem_type_from_name("float4_e2m1fn_x2"), ElemType::Float4E2M1x2);
  EXPECT_THROW(elem_type_from_name("float5"), UsageError);
  for (uint64_t id : {0, 1, 2, 3, 4, 5, 6, 7, 11, 15, 100, 101}) EXPECT_TRUE(is_known_elem_type(id)) << id;
  for (uint64_t id : {8, 9, 10, 12, 13, 14, 16, 99, 102, 255}) EXPECT_FALSE(is_known_elem_type(id)) << id;
}

TEST(Utf8, ValidatesStrictly) {
  EXPECT_TRUE(is_valid_utf8("model.norm.weight"));
  EXPECT_TRUE(is_valid_utf8("權重\xF0\x9F\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\xC0\xAF"));          // overlong '/'
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(is_valid_utf8("abc\xE6\xAC"));       // truncated sequence
  EXPECT_FALSE(is_valid_utf8("\x80"));
}

TEST(DatReader, IndexesEntriesAndReadsPayloads) {
  const auto entries = test::sample_entries();
  const auto bytes = build_dat(entries);
  DatReader r(memory_source("mem", bytes.data(), bytes.size()));
  ASSERT_EQ(r.entries().size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const DatEntry& e = r.entries()[i];
    EXPECT_EQ(e.key, entries[i].key);
    EXPECT_EQ(static_cast<uint64_t>(e.type), entries[i].type);
    EXPECT_EQ(e.shape, entries[i].shape);
    std::vector<uint8_t> payload(e.nbytes);
    r.read(e, payload.data(), payload.size());
    EXPECT_EQ(payload, entries[i].payload) << e.key;
  }
  EXPECT_EQ(r.at("scalar").numel(), 1u);
  EXPECT_EQ(r.find("missing"), nullptr);
  EXPECT_THROW(r.at("missing"), DatError);
  // Any order, any piece.
  const DatEntry& emb = r.at("model.embed_tokens.weight");
  std::vector<uint8_t> piece(10);
  r.read_range(emb, 100, piece.data(), piece.size());
  EXPECT_TRUE(std::equal(piece.begin(), piece.end(), entries[0].payload.begin() + 100));
  EXPECT_THROW(r.read_range(emb, emb.nbytes - 5, piece.data(), 10), Error);
  EXPECT_THROW(r.read(emb, piece.data(), piece.size()), Error);  // wrong destination size
}

TEST(DatReader, TrailingBytesAreIgnored) {
  auto bytes = build_dat(test::sample_entries());
  bytes.insert(bytes.end(), {1, 2, 3});
  DatReader r(memory_source("mem", bytes.data(), bytes.size()));
  EXPECT_EQ(r.entries().size(), 6u);
}

// Parses `bytes` and expects a DatError whose message contains every fragment.
void expect_dat_error(const std::vector<uint8_t>& bytes, std::initializer_list<const char*> fragments) {
  try {
    DatReader r(memory_source("bad.dat", bytes.data(), bytes.size()));
    ADD_FAILURE() << "no error for a malformed file";
  } catch (const DatError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("bad.dat"), std::string::npos) << msg;
    for (const char* f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  }
}

TEST(DatReaderMalformed, EmptyAndTruncatedFiles) {
  expect_dat_error({}, {"empty file"});
  const auto good = build_dat(test::sample_entries());
  // Cut inside the first key: the entry index and its header offset are named.
  const auto one = build_dat({test::sample_entries()[0]});
  expect_dat_error(std::vector<uint8_t>(one.begin(), one.begin() + 12), {"entry 0", "byte 1", "key length 25"});
  // A count that the remaining bytes cannot hold is rejected before anything is reserved.
  expect_dat_error(std::vector<uint8_t>(good.begin(), good.begin() + 5), {"entry count 6 cannot fit"});
  // Cut inside the last payload.
  expect_dat_error(std::vector<uint8_t>(good.begin(), good.end() - 1), {"'scalar'", "runs past the end"});
  // Count promises one more entry than present.
  auto more = good;
  more[0] = 7;
  expect_dat_error(more, {"entry 6", "file ends before this entry"});
}

// A JSON file given for a .dat (a config.json as --weights) says so beside what the parse found; a malformed file
// that does not start with '{' does not.
TEST(DatReaderMalformed, AJsonFileIsNamedAsOne) {
  const std::string json = "{\n  \"architectures\": [\"Qwen3ForCausalLM\"],\n  \"hidden_size\": 64\n}\n";
  expect_dat_error(std::vector<uint8_t>(json.begin(), json.end()), {"a JSON file, such as a config.json"});
  try {
    const std::vector<uint8_t> other = {5, 1, 2};
    DatReader r(memory_source("bad.dat", other.data(), other.size()));
    ADD_FAILURE() << "no error";
  } catch (const DatError& e) {
    EXPECT_EQ(std::string(e.what()).find("JSON"), std::string::npos) << e.what();
  }
}

TEST(DatReaderMalformed, BadLeb128) {
  std::vector<uint8_t> too_long(10, 0x80);
  too_long.push_back(0x01);
  expect_dat_error(too_long, {"entry count", "longer than 10 bytes"});
  std::vector<uint8_t> overflow{1};  // one entry whose key length overflows
  overflow.insert(overflow.end(), 9, 0xFF);
  overflow.push_back(0x7F);
  expect_dat_error(overflow, {"entry 0", "overflows 64 bits"});
  std::vector<uint8_t> huge_count;
  put_leb(huge_count, uint64_t{1} << 40);
  expect_dat_error(huge_count, {"entry count", "cannot fit"});
}

TEST(DatReaderMalformed, ShapesThatOverflowOrExceedTheFile) {
  // 2^47 * 2^47 * 8 bytes overflows 64 bits.
  expect_dat_error(build_dat({{"w", 7, {int64_t{1} << 47, int64_t{1} << 47}, {}}}), {"'w'", "overflows"});
  expect_dat_error(build_dat({{"w", 7, {int64_t{1} << 50}, {}}}), {"'w'", "exceeds 2^48"});
  expect_dat_error(build_dat({{"w", 6, {1000, 1000}, std::vector<uint8_t>(100)}}),
                   {"'w'", "4000000 bytes", "runs past the end"});
  expect_dat_error(build_dat({{"w", 6, std::vector<int64_t>(17, 1), {}}}), {"'w'", "rank 17"});
}

TEST(DatReaderMalformed, UnknownTypeDuplicateKeyAndBadKeys) {
  expect_dat_error(build_dat({{"a", 6, {1}, {0, 0, 0, 0}}, {"w", 42, {1}, {0}}}),
                   {"entry 1", "'w'", "header at byte 10", "unknown element type 42"});
  expect_dat_error(build_dat({{"w", 0, {1}, {0}}, {"w", 0, {1}, {0}}}), {"entry 1", "'w'", "duplicate key"});
  expect_dat_error(build_dat({{"bad\xFFkey", 0, {1}, {0}}}), {"entry 0", "not valid UTF-8"});
  expect_dat_error(build_dat({{"", 0, {1}, {0}}}), {"empty key"});
}

TEST(DatReaderMalformed, Nvfp4PairsMustBeCompleteAndAgree) {
  const auto codes = [](int64_t r, int64_t c) { return std::vector<uint8_t>(r * c); };
  expect_dat_error(build_dat({{"p.weight.qdata", 0, {4, 8}, codes(4, 8)}}), {"'p.weight.qdata'", "without their scale"});
  expect_dat_error(build_dat({{"p.weight.scale", 101, {4, 1}, codes(4, 1)}}), {"'p.weight.scale'", "without its codes"});
  expect_dat_error(build_dat({{"p.weight.qdata", 0, {4, 8}, codes(4, 8)}, {"p.weight.scale", 101, {4, 2}, codes(4, 2)}}),
                   {"'p.weight.scale'", "does not match", "expected [4, 1]"});
  expect_dat_error(build_dat({{"p.weight.qdata", 6, {4, 8}, std::vector<uint8_t>(128)},
                              {"p.weight.scale", 101, {4, 1}, codes(4, 1)}}),
                   {"'p.weight.qdata'", "uint8 or float4"});
  expect_dat_error(build_dat({{"p.weight.qdata", 0, {4, 4}, codes(4, 4)}, {"p.weight.scale", 101, {4, 0}, {}}}),
                   {"not a multiple of 16"});
  // Old files with float16 scales and id-100 codes are fine.
  const auto ok = build_dat({{"p.weight.qdata", 100, {4, 8}, codes(4, 8)}, {"p.weight.scale", 5, {4, 1}, codes(4, 2)}});
  EXPECT_NO_THROW(DatReader(memory_source("ok", ok.data(), ok.size())));
}

TEST(DatWriter, RoundTripsAndRewritesByteForByte) {
  test::TempDir dir;
  const auto original = build_dat(test::sample_entries());
  test::write_file(dir.file("in.dat"), original);
  DatReader in(dir.file("in.dat"));
  {
    DatWriter out(dir.file("out.dat"), in.entries().size());
    for (const auto& e : in.entries()) {
      // Stream each payload in odd-sized pieces to exercise the buffering.
      out.begin_entry(e.key, e.type, e.shape);
      std::vector<uint8_t> piece(7);
      for (uint64_t off = 0; off < e.nbytes; off += piece.size()) {
        const uint64_t n = std::min<uint64_t>(piece.size(), e.nbytes - off);
        in.read_range(e, off, piece.data(), n);
        out.write_payload(piece.data(), n);
      }
    }
    out.commit();
  }
  EXPECT_EQ(test::read_file(dir.file("out.dat")), original);
}

TEST(DatWriter, IncompleteFilesNeverAppearUnderTheTargetName) {
  test::TempDir dir;
  const std::string target = dir.file("model.dat");
  {
    DatWriter w(target, 2);
    w.write_entry("a", ElemType::Float32, {1}, "\0\0\0\0", 4);
    EXPECT_THROW(w.commit(), Error);  // one entry missing
  }
  EXPECT_FALSE(std::filesystem::exists(target));
  {
    DatWriter w(target, 1);
    w.begin_entry("a", ElemType::Float32, {2});
    w.write_payload("\0\0\0\0", 4);
    EXPECT_THROW(w.commit(), Error);  // payload incomplete
    EXPECT_THROW(w.write_payload("\0\0\0\0\0\0\0\0", 8), Error);  // overrun
  }
  {
    DatWriter w(target, 1);
    w.write_entry("a", ElemType::Float32, {1}, "\0\0\0\0", 4);
    EXPECT_THROW(w.begin_entry("b", ElemType::Float32, {1}), Error);  // more than announced
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "temporary files left behind";
  EXPECT_THROW(DatWriter(dir.file("no/such/dir/x.dat"), 1), Error);
}

TEST(DatWriter, CommitReplacesAnExistingTargetAtomically) {
  test::TempDir dir;
  const std::string target = dir.file("model.dat");
  test::write_file(target, {9, 9, 9});
  {
    DatWriter w(target, 1);
    w.write_entry("a", ElemType::UInt8, {2}, "\1\2", 2);
    EXPECT_EQ(test::read_file(target), (std::vector<uint8_t>{9, 9, 9}));  // untouched until commit
    w.commit();
  }
  DatReader r(target);
  EXPECT_EQ(r.entries().at(0).key, "a");
}

// A written file has the permissions the umask gives any new file (0644 under 022, 0600 under 077): it was 0644
// whatever the umask, so a user who keeps files private (077) got world-readable weights.
TEST(DatWriter, AFileHasTheUmasksPermissions) {
  test::TempDir dir;
  for (const mode_t mask : {mode_t{022}, mode_t{077}, mode_t{027}}) {
    const mode_t before = ::umask(mask);
    const std::string target = dir.file("m" + std::to_string(mask) + ".dat");
    {
      DatWriter w(target, 1);
      w.write_entry("a", ElemType::UInt8, {1}, "\1", 1);
      w.commit();
    }
    ::umask(before);
    struct stat info {};
    ASSERT_EQ(::stat(target.c_str(), &info), 0);
    EXPECT_EQ(info.st_mode & 0777, 0666 & ~mask) << std::oct << mask;
  }
}

// A real write failure: the file size limit makes write(2) fail with EFBIG part-way through, as a full disk
// would with ENOSPC. Runs in a child so the limit does not leak into other tests.
TEST(DatWriter, WriteFailureLeavesNothingBehind) {
  test::TempDir dir;
  const std::string target = dir.file("big.dat");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim {1 << 20, 1 << 20};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    std::vector<uint8_t> payload(8 << 20, 0x5A);
    int code = 3;
    try {
      DatWriter w(target, 1);
      w.write_entry("big", ElemType::UInt8, {static_cast<int64_t>(payload.size())}, payload.data(), payload.size());
      w.commit();
      code = 4;  // the limit did not bite
    } catch (const Error& e) {
      code = std::strstr(e.what(), "write failed") ? 0 : 5;
    }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "a partial or temporary file survived";
}


// A writer removes the temporaries of its target that a dead writer left, and only those: a live writer holds a
// lock on its own.
TEST(DatWriter, RemovesStaleTemporariesOfItsTargetOnly) {
  test::TempDir dir;
  const std::string target = dir.file("out.dat");
  const std::string stale = dir.file(".out.dat.tmp-AbC123"), other = dir.file(".other.dat.tmp-AbC123");
  std::ofstream(stale) << "left by a killed export";
  std::ofstream(other) << "another target's";
  DatWriter live(target, 1);  // removes the stale one, keeps its own
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(std::filesystem::exists(other));
  EXPECT_TRUE(std::filesystem::exists(live.temp_path()));
  {
    DatWriter second(target, 0);  // the first writer is alive: its temporary stays
    EXPECT_TRUE(std::filesystem::exists(live.temp_path()));
    second.commit();
  }
  const uint8_t byte = 7;
  live.write_entry("k", ElemType::UInt8, {1}, &byte, 1);
  live.commit();
  EXPECT_EQ(DatReader(target).entries().size(), 1u);
}

}  // namespace
namespace {

// The one durable-write path: the whole content under the name, no temporary left, and on failure nothing under
// the name and no temporary either.
TEST(DurableFile, WritesWholeOrNothing) {
  test::TempDir dir;
  const std::string target = dir.file("report.json");
  write_file_durably(target, "{\"a\": 1}\n");
  EXPECT_EQ(test::slurp(target), "{\"a\": 1}\n");
  write_file_durably(target, "second");
  EXPECT_EQ(test::slurp(target), "second");
  std::filesystem::create_directories(dir.file("busy/inside"));  // a non-empty folder cannot be renamed over
  EXPECT_THROW(write_file_durably(dir.file("busy"), "x"), Error);
  EXPECT_THROW(write_file_durably(dir.file("missing/x.json"), "x"), Error);
  size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    ++entries;
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  }
  EXPECT_EQ(entries, 2u);  // report.json and busy/
  EXPECT_EQ(parent_folder("a/b/c.dat"), "a/b");
  EXPECT_EQ(parent_folder("c.dat"), ".");
  EXPECT_EQ(parent_folder("/c.dat"), "/");
}

}  // namespace
}  // namespace qwen3
