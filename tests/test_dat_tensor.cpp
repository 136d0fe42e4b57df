// Every element type through libtorch tensors: write_tensor -> DatWriter -> DatReader -> read_tensor.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "dat_test_util.h"
#include "qwen3/dat/dat_tensor.h"

namespace qwen3 {
namespace {

TEST(DatTensor, EveryElementTypeRoundTrips) {
  test::TempDir dir;
  const std::string path = dir.file("all.dat");
  at::manual_seed(7);
  const at::Tensor base = at::randn({3, 5}) * 100;
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"u8", base.abs().to(at::kByte)},    {"i8", base.clamp(-128, 127).to(at::kChar)},
      {"i16", base.to(at::kShort)},        {"i32", (base * 1e6).to(at::kInt)},
      {"i64", (base * 1e12).to(at::kLong)}, {"f16", base.to(at::kHalf)},
      {"f32", base},                        {"f64", base.to(at::kDouble) / 3},
      {"bool", base > 0},                   {"bf16", base.to(at::kBFloat16)},
      {"scalar", at::scalar_tensor(2.5)},  {"empty", at::zeros({0, 4})},
  };
  const at::Tensor codes = at::randint(0, 256, {3, 8}, at::kByte);
  const at::Tensor scales = at::randint(0, 126, {3, 1}, at::kByte);
  {
    DatWriter w(path, tensors.size() + 2);
    for (auto& [key, t] : tensors) write_tensor(w, key, t);
    write_tensor(w, "p.weight.qdata", codes, ElemType::Float4E2M1x2);
    write_tensor(w, "p.weight.scale", scales, ElemType::Float8E4M3);
    EXPECT_THROW(write_tensor(w, "x", base, ElemType::Float16), Error);  // 4-byte data as a 2-byte type
    w.commit();
  }
  DatReader r(path);
  for (auto& [key, t] : tensors) {
    const DatEntry& e = r.at(key);
    EXPECT_EQ(e.type, elem_type_of(t.scalar_type())) << key;
    const at::Tensor back = read_tensor(r, e);
    EXPECT_EQ(back.scalar_type(), t.scalar_type()) << key;
    EXPECT_TRUE(back.equal(t)) << key;
  }
  EXPECT_EQ(r.at("p.weight.qdata").type, ElemType::Float4E2M1x2);
  EXPECT_TRUE(read_tensor(r, r.at("p.weight.qdata")).equal(codes));
  EXPECT_TRUE(read_tensor(r, r.at("p.weight.scale")).equal(scales));
}

TEST(DatTensor, DtypesWithoutAnElementTypeAreErrors) {
  EXPECT_THROW(elem_type_of(at::kComplexFloat), Error);
}

TEST(DatTensor, DamagedBoolBytesReadAsTrue) {
  auto bytes = test::build_dat({{"flags", 11, {3}, {0, 1, 7}}});
  DatReader r(memory_source("mem", bytes.data(), bytes.size()));
  const at::Tensor t = read_tensor(r, r.at("flags"));
  EXPECT_EQ(t.sum().item<int64_t>(), 2);
}

}  // namespace
}  // namespace qwen3
