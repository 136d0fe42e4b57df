// `.dat` entries as libtorch tensors. NVFP4 codes (id 100) and E4M3 scales (id 101) are uint8 tensors here:
// the raw bytes, decoded by the nvfp4 module, so the same code runs on libtorch 1.13 and 2.x.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>
#include <string_view>

#include "qwen3/dat/dat.h"

namespace qwen3 {

at::ScalarType scalar_type_of(ElemType type);
// The element type a tensor of this dtype is written as; throws Error for dtypes the format lacks.
ElemType elem_type_of(at::ScalarType dtype);

// A CPU tensor holding the entry's payload, in the entry's dtype and shape.
at::Tensor read_tensor(const DatReader& reader, const DatEntry& entry);

// Writes a whole entry from a tensor (any device; copied to contiguous CPU memory if needed). `as` overrides
// the element id when the bytes are the same size (uint8 codes written as id 100, scales as id 101).
void write_tensor(DatWriter& writer, std::string_view key, const at::Tensor& tensor,
                  std::optional<ElemType> as = std::nullopt);

}  // namespace qwen3
