// libFuzzer target for the .dat reader: any byte string must give a DatError or a consistent index whose
// payloads read back, without crashes, leaks, out-of-bounds accesses or oversized allocations.
// Build and run: scripts/fuzz.sh [seconds].
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "qwen3/dat/dat.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    qwen3::DatReader reader(qwen3::memory_source("fuzz", data, size));
    std::vector<uint8_t> payload;
    for (const auto& e : reader.entries()) {
      if (e.payload_offset + e.nbytes > size) std::abort();  // the index must stay inside the input
      payload.resize(e.nbytes);
      reader.read(e, payload.data(), payload.size());
    }
  } catch (const qwen3::DatError&) {
  }
  return 0;
}
