// `qwen3-train inspect`: the index of a `.dat` file, validated, as a table or JSON.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "qwen3/dat/dat.h"

namespace qwen3 {

struct DatSummary {
  uint64_t entry_count = 0;
  uint64_t payload_bytes = 0;
  uint64_t nvfp4_pairs = 0;
  uint64_t parameters = 0;  // weights the file represents: an NVFP4 pair counts its unpacked [out, in]
};

DatSummary summarize(const DatReader& reader);
nlohmann::json inspect_json(const DatReader& reader);
std::string inspect_table(const DatReader& reader);

// NVFP4 scale entries holding NaN E4M3 codes (0x7F, 0xFF: the whole block decodes to NaN; the model loader
// refuses them): one line per entry naming it, the count and the first bad block. Reads every scale payload.
std::vector<std::string> nan_scale_problems(const DatReader& reader);

}  // namespace qwen3
