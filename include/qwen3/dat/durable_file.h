// Files that are complete under their name or absent: written beside the target under a temporary name,
// fsynced, renamed into place, and the folder fsynced, so that a crash, a kill or a full disk never leaves a
// half-written file under the name a user reads. One implementation for the `.dat` writer, checkpoints, the
// converter's config.json and the memory report (they had four, with different fsync behaviour).
#pragma once
#include <string>
#include <string_view>

namespace qwen3 {

// fsync of a file or a folder; Error naming the path and the OS reason.
void fsync_path(const std::string& path, bool directory);

// The folder a path lies in ("." for a bare name).
std::string parent_folder(const std::string& path);

// The permissions a new file gets from the process's umask (0666 & ~umask), for files made by mkstemp (0600):
// read from /proc/self/status, since umask() can only be read by setting it; 0644 where that is missing.
unsigned new_file_mode();

// fsync `temp`, rename it over `target`, fsync the folder. On failure `temp` is removed and an Error names
// `target` and the reason; nothing under `target` changed.
void move_into_place(const std::string& temp, const std::string& target);

// `content` as the whole of `target`, durably: a temporary ".NAME.tmp-PID" beside it, then move_into_place.
void write_file_durably(const std::string& target, std::string_view content);

}  // namespace qwen3
