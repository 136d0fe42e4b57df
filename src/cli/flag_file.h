// A TOML file of flags (train --config-file, and the run.toml a run writes): keys are the long flag names
// (seq-len, or seq_len: snake_case is the same flag), values TOML strings, integers, floats, booleans or arrays.
// Read with toml++ (a real TOML parser: a '#' inside a quoted value is part of the value). Paths are taken
// relative to the file's folder. docs/trainer.md "Runs as files".
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace qwen3::cli {

struct FlagFileEntry {
  std::string flag;                  // the long name, dashes: seq-len
  std::vector<std::string> values;   // as the flag would be given on the command line (one, or an array's)
  int64_t line = 0;                  // where the key is, for messages
};

// The file's flags in the file's order. `is_path_flag` names the flags whose relative values are resolved against
// the file's folder. UsageError (naming the file, and the line where there is one) for a file that is not TOML, a
// [section], a date or a nested array; Error when the file cannot be read.
std::vector<FlagFileEntry> read_flag_file(const std::string& path,
                                          const std::function<bool(const std::string&)>& is_path_flag);

}  // namespace qwen3::cli
