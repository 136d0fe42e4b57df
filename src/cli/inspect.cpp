#include "inspect.h"

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (only here from fmt 11 on)

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>

#include "cli_common.h"
#include "qwen3/base/error.h"
#include "qwen3/export/checkpoint_export.h"
#include "qwen3/base/message_text.h"
#include "qwen3/nvfp4/nvfp4.h"

namespace qwen3 {
namespace {

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) { v /= 1024.0; ++u; }
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.2f} {}", v, units[u]);
}

}  // namespace

DatSummary summarize(const DatReader& reader) {
  DatSummary s;
  s.entry_count = reader.entries().size();
  for (const auto& e : reader.entries()) {
    s.payload_bytes += e.nbytes;
    if (ends_with(e.key, kQdataSuffix)) {
      ++s.nvfp4_pairs;
      s.parameters += e.numel() * 2;  // two codes a byte
    } else if (!ends_with(e.key, kScaleSuffix)) {
      s.parameters += e.numel();
    }
  }
  return s;
}

nlohmann::json inspect_json(const DatReader& reader) {
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& e : reader.entries()) {
    entries.push_back({{"key", e.key},
                       {"elem_type", static_cast<uint32_t>(e.type)},
                       {"elem_type_name", elem_type_name(e.type)},
                       {"shape", e.shape},
                       {"offset", e.payload_offset},
                       {"nbytes", e.nbytes}});
  }
  const DatSummary s = summarize(reader);
  return {{"entry_count", s.entry_count},
          {"entries", std::move(entries)},
          {"file_bytes", reader.file_size()},
          {"payload_bytes", s.payload_bytes},
          {"nvfp4_pairs", s.nvfp4_pairs},
          {"parameters", s.parameters}};
}

std::string inspect_table(const DatReader& reader) {
  size_t key_w = 3;
  for (const auto& e : reader.entries()) key_w = std::max(key_w, e.key.size());
  std::string out = fmt::format("{:>5}  {:<{}}  {:<16}  {:<16}  {:>12}  {:>12}\n", "#", "key", key_w, "type", "shape",
                                "offset", "bytes");
  size_t i = 0;
  for (const auto& e : reader.entries()) {
    out += fmt::format("{:>5}  {:<{}}  {:<16}  {:<16}  {:>12}  {:>12}\n", i++, e.key, key_w, elem_type_name(e.type),
                       shape_text(e.shape), e.payload_offset, e.nbytes);
  }
  const DatSummary s = summarize(reader);
  out += fmt::format("entries: {}  payload: {} ({})  file: {} bytes  nvfp4 pairs: {}  parameters: {} ({:.3f} B)\n",
                     s.entry_count, s.payload_bytes, human_bytes(s.payload_bytes), reader.file_size(), s.nvfp4_pairs,
                     s.parameters, static_cast<double>(s.parameters) / 1e9);
  return out;
}

std::vector<std::string> nan_scale_problems(const DatReader& reader) {
  std::vector<std::string> problems;
  std::vector<uint8_t> buffer(size_t{1} << 20);
  for (const auto& e : reader.entries()) {
    if (!ends_with(e.key, kScaleSuffix) || elem_size(e.type) != 1) continue;
    nvfp4::NanScaleCodes bad_scales;
    for (uint64_t at = 0; at < e.nbytes; at += buffer.size()) {
      const uint64_t n = std::min<uint64_t>(buffer.size(), e.nbytes - at);
      reader.read_range(e, at, buffer.data(), n);
      bad_scales.add(buffer.data(), n, at);
    }
    if (bad_scales.count == 0) continue;
    const uint64_t per_row = e.shape.size() >= 2 ? static_cast<uint64_t>(e.shape.back()) : e.nbytes;
    problems.push_back(fmt::format("entry '{}' holds {}", e.key, bad_scales.describe(per_row)));
  }
  return problems;
}

namespace cli {

Command add_inspect_command(CLI::App& app) {
  struct Options {
    std::string file;
    bool json = false;
  };
  auto opts = std::make_shared<Options>();
  auto* sub = app.add_subcommand("inspect", "List and validate the entries of a .dat file");
  sub->add_option("FILE", opts->file,
                  "the .dat file, or a checkpoint folder (a step-N folder, or the folder of them: the newest), whose "
                  "tensors.dat it lists")
      ->required();
  sub->add_flag("--json", opts->json, "print JSON instead of a table");
  return {sub, [opts]() {
            // A checkpoint stands for its tensors.dat, found as export --checkpoint finds it; said on stderr, so that
            // --json stays one document.
            std::error_code ec;
            if (std::filesystem::is_directory(opts->file, ec)) {
              const std::filesystem::path folder(opts->file);
              // A model's folder, or a run's --output-dir (its export beside checkpoints/): the file is named.
              if (std::filesystem::exists(folder / "model.dat", ec) &&
                  !std::filesystem::exists(folder / "checkpoint.json", ec))
                throw Error(fmt::format("inspect: {} is a folder holding model.dat, not a checkpoint: give the file "
                                        "({}) or a checkpoint folder",
                                        opts->file, (folder / "model.dat").string()));
              opts->file = (std::filesystem::path(resolve_checkpoint(opts->file)) / "tensors.dat").string();
              spdlog::info("inspect: {}", opts->file);
            }
            DatReader reader(opts->file);
            if (opts->json)
              fmt::print("{}\n", inspect_json(reader).dump(1));
            else
              fmt::print("{}", inspect_table(reader));
            // The index printed, the payloads' one rule a model cannot load without: no NaN block scales.
            const std::vector<std::string> problems = nan_scale_problems(reader);
            if (problems.empty()) return 0;
            throw Error(fmt::format("{}: {}{}", opts->file, problems.front(),
                                    problems.size() > 1 ? fmt::format(" (and {} more entries)", problems.size() - 1)
                                                        : std::string()));
          }};
}

}  // namespace cli
}  // namespace qwen3
