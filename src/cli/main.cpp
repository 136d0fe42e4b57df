// qwen3-train: the command line is a function of the cli library (command_line.h).
#include "command_line.h"

int main(int argc, char** argv) { return qwen3::cli::run_command_line(argc, argv); }
