// What an unknown flag most likely meant: the Hugging Face / TRL / torchtune name of a flag this tool spells
// otherwise (--learning-rate is --lr), else the nearest long flag of the command by edit distance.
#pragma once
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace qwen3::cli {

// "--lr" for "--learning-rate" given train's options; empty when nothing is close.
std::string suggest_flag(const CLI::App& command, const std::string& unknown);

// The command line's words that start with "--" and name no flag of `command` or of the program (`app`), each
// as given (a "=value" tail cut off).
std::vector<std::string> unknown_flags(const CLI::App& app, const CLI::App& command, const std::vector<std::string>& args);

}  // namespace qwen3::cli
