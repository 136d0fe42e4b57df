// The one check every command that writes a user-visible file makes before it starts: nothing a user saved is
// replaced by accident. docs/export.md ("Output targets").
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace qwen3 {

// `out` (named `flag` in messages) must not exist unless `overwrite`, must not be a directory, and must never
// be one of `input_files` (the same file by path or by identity: a link counts) or lie inside one of
// `input_dirs` (a checkpoint being read), overwrite or not: UsageError (exit 2) naming the flag, the path and
// the way out. Then its folder is made if missing and must be writable (Error, exit 1, with the OS reason), so
// a run fails before it starts rather than after hours of training.
void prepare_output_target(std::string_view flag, const std::string& out, bool overwrite,
                         const std::vector<std::string>& input_files, const std::vector<std::string>& input_dirs = {});

// Its first check alone, for a file written whether or not it exists (--metrics-jsonl appends): `out` is none of
// `input_files` and lies in none of `input_dirs` (UsageError naming the flag and both paths).
void refuse_input_as_output(std::string_view flag, const std::string& out, const std::vector<std::string>& input_files,
                            const std::vector<std::string>& input_dirs = {});

// For a file that is appended to (--metrics-jsonl): not a directory (UsageError), its folder made if missing
// and writable (Error with the OS reason).
void prepare_output_folder(std::string_view flag, const std::string& out);

}  // namespace qwen3
