// The program as a function: what main runs, and what the tests' probe sweep runs in forked children (a
// process a probe would take 0.5 s, libtorch's start-up, where a fork takes a millisecond).
#pragma once

namespace qwen3::cli {

// Parses argv, runs the one command it names, and turns every failure into one `error: ...` line on stderr.
// Returns the exit code: 0 success, 1 runtime error, 2 bad flag or value (then 130/143 for a run that a signal
// stopped).
int run_command_line(int argc, char** argv);

}  // namespace qwen3::cli
