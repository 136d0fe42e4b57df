#include "qwen3/dat/dat_tensor.h"

#include <ATen/ATen.h>

#include <string>

namespace qwen3 {

at::ScalarType scalar_type_of(ElemType type) {
  switch (type) {
    case ElemType::UInt8: return at::kByte;
    case ElemType::Int8: return at::kChar;
    case ElemType::Int16: return at::kShort;
    case ElemType::Int32: return at::kInt;
    case ElemType::Int64: return at::kLong;
    case ElemType::Float16: return at::kHalf;
    case ElemType::Float32: return at::kFloat;
    case ElemType::Float64: return at::kDouble;
    case ElemType::Bool: return at::kBool;
    case ElemType::BFloat16: return at::kBFloat16;
    case ElemType::Float4E2M1x2: return at::kByte;
    case ElemType::Float8E4M3: return at::kByte;
  }
  throw Error("unknown element type id " + std::to_string(static_cast<uint32_t>(type)));
}

ElemType elem_type_of(at::ScalarType dtype) {
  switch (dtype) {
    case at::kByte: return ElemType::UInt8;
    case at::kChar: return ElemType::Int8;
    case at::kShort: return ElemType::Int16;
    case at::kInt: return ElemType::Int32;
    case at::kLong: return ElemType::Int64;
    case at::kHalf: return ElemType::Float16;
    case at::kFloat: return ElemType::Float32;
    case at::kDouble: return ElemType::Float64;
    case at::kBool: return ElemType::Bool;
    case at::kBFloat16: return ElemType::BFloat16;
    default: throw Error(std::string("the .dat format has no element type for dtype ") + at::toString(dtype));
  }
}

at::Tensor read_tensor(const DatReader& reader, const DatEntry& entry) {
  at::Tensor t = at::empty(entry.shape, at::TensorOptions().dtype(scalar_type_of(entry.type)));
  reader.read(entry, t.data_ptr(), entry.nbytes);
  if (entry.type == ElemType::Bool) {
    // A torch bool holding anything but 0/1 is undefined behaviour; normalize what a damaged file holds.
    auto bytes = t.view(at::kByte);
    bytes.clamp_max_(1);
  }
  return t;
}

void write_tensor(DatWriter& writer, std::string_view key, const at::Tensor& tensor, std::optional<ElemType> as) {
  const at::Tensor cpu = tensor.to(at::kCPU).contiguous();
  const ElemType natural = elem_type_of(cpu.scalar_type());
  const ElemType type = as.value_or(natural);
  if (elem_size(type) != elem_size(natural))
    throw Error("cannot write a " + std::string(elem_type_name(natural)) + " tensor as " + elem_type_name(type) +
                " (entry '" + std::string(key) + "')");
  const std::vector<int64_t> shape(cpu.sizes().begin(), cpu.sizes().end());
  writer.write_entry(key, type, shape, cpu.data_ptr(), cpu.numel() * cpu.element_size());
}

}  // namespace qwen3
