#include "qwen3/checkpoint/checkpoint.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (only here from fmt 11 on)
#include <unistd.h>
#include <cstring>
#include <cerrno>
#include <sys/file.h>
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <fstream>

#include "qwen3/base/file_io.h"
#include "qwen3/base/remove_tree.h"
#include "qwen3/dat/dat.h"
#include "qwen3/dat/durable_file.h"
#include "qwen3/base/json_limits.h"
#include "qwen3/dat/dat_tensor.h"

namespace qwen3 {
namespace fs = std::filesystem;
namespace {

bool is_step_dir(const fs::directory_entry& e) {
  const std::string name = e.path().filename().string();
  return e.is_directory() && name.rfind("step-", 0) == 0 && name.size() == 13 &&
         name.find_first_not_of("0123456789", 5) == std::string::npos;
}

std::vector<fs::path> complete_checkpoints(const std::string& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (is_step_dir(e) && fs::exists(e.path() / "checkpoint.json")) out.push_back(e.path());
  std::sort(out.begin(), out.end());  // zero-padded step numbers sort by step
  return out;
}

// A new hidden folder `.NAME.KIND-PID-N` in `dir` (KIND: tmp, a save being written; old, a replaced copy being
// removed; the lock holder removes both as stale), with the permissions the process's umask gives any folder it
// makes: mkdtemp's are 0700, and renamed into place they left every checkpoint unreadable to the run's group
// (a teammate's export, a job under another account) where the run's other files were not.
fs::path make_temporary_folder(const fs::path& dir, const std::string& name, const char* kind) {
  static std::atomic<uint64_t> made{0};
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const fs::path path = dir / fmt::format(".{}.{}-{}-{}", name, kind, ::getpid(), made.fetch_add(1));
    if (::mkdir(path.c_str(), 0777) == 0) return path;
    if (errno != EEXIST)
      throw Error(dir.string() + ": cannot create a temporary checkpoint directory: " + std::strerror(errno));
  }
  throw Error(dir.string() + ": cannot create a temporary checkpoint directory: every name tried exists");
}

}  // namespace

std::string stable_hash(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

std::string tensor_bytes_hash(const void* data, size_t bytes) {
  // Each lane: add the word times one odd constant, rotate, multiply by another (every input bit reaches every
  // lane bit within a few words); the lanes are independent so their multiplies overlap. Then the lanes, the tail
  // bytes and the length are folded in order. Little-endian words, as every machine this tool builds for.
  constexpr uint64_t kA = 0x9E3779B185EBCA87ull, kB = 0xC2B2AE3D27D4EB4Full, kC = 0x165667B19E3779F9ull;
  const auto rotl = [](uint64_t x, int r) { return (x << r) | (x >> (64 - r)); };
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t lane[4] = {kA + kB, kB, 0, kC};
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32)
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * static_cast<size_t>(k), 8);
      lane[k] = rotl(lane[k] + w * kB, 31) * kA;
    }
  uint64_t h = static_cast<uint64_t>(bytes) * kC;
  for (uint64_t l : lane) h = rotl(h ^ (rotl(l * kB, 31) * kA), 27) * kA + kC;
  for (; i < bytes; ++i) h = rotl(h ^ (p[i] * kC), 11) * kA;
  h ^= h >> 33;
  h *= kB;
  h ^= h >> 29;
  return fmt::format("{:016x}", h);
}

std::string file_content_hash(const std::string& path) {
  std::ifstream in = open_input_file(path, "data file", std::ios::binary);
  uint64_t h = 1469598103934665603ull;
  std::vector<char> buf(size_t{1} << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    for (std::streamsize i = 0; i < in.gcount(); ++i) {
      h ^= static_cast<unsigned char>(buf[static_cast<size_t>(i)]);
      h *= 1099511628211ull;
    }
  }
  if (in.bad()) throw Error(path + ": cannot read (for its content hash)");
  return fmt::format("{:016x}", h);
}

std::string weights_hash(const DatReader& reader) {
  std::string text;
  for (const auto& e : reader.entries())
    text += fmt::format("|{}:{}:{}", e.key, static_cast<uint32_t>(e.type), fmt::join(e.shape, "x"));
  return stable_hash(text);
}

std::string save_checkpoint(const std::string& dir, const CheckpointState& state, int keep) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(dir + ": cannot create checkpoint directory: " + ec.message());
  const std::string name = fmt::format("step-{:08d}", state.step);
  const fs::path final_path = fs::path(dir) / name;
  const fs::path tmp = make_temporary_folder(dir, name, "tmp");
  try {
    nlohmann::json hashes = nlohmann::json::object();
    {
      DatWriter w((tmp / "tensors.dat").string(), state.tensors.size());
      for (size_t i = 0; i < state.tensors.size(); ++i) {
        const auto& [key, t] = state.tensors[i];
        if (!t.defined() && !state.fetch) throw Error("checkpoint: '" + key + "' has no tensor and nothing fetches it");
        // The bytes as written, hashed from the same host copy (a fetched one is released when written).
        const at::Tensor cpu = (t.defined() ? t : state.fetch(i)).to(at::kCPU).contiguous();
        write_tensor(w, key, cpu);
        hashes[key] = tensor_bytes_hash(cpu.data_ptr(), cpu.numel() * cpu.element_size());
      }
      w.commit();  // fsyncs the file
    }
    nlohmann::json meta = {{"magic", kCheckpointMagic},
                           {"format_version", kCheckpointFormatVersion},
                           {"step", state.step},
                           {"optimizer_steps", state.optimizer_steps},
                           {"skipped_steps", state.skipped_steps},
                           {"model_hash", state.model_hash},
                           // Objects always (a state that set none writes {}): the reader refuses anything else.
                           {"flags", state.flags.is_null() ? nlohmann::json::object() : state.flags},
                           {"extra", state.extra.is_null() ? nlohmann::json::object() : state.extra},
                           // Checked on load (CheckpointDamaged); checkpoints from before 2026-11-28 lack it.
                           {"tensor_hashes", hashes}};
    {
      std::ofstream f(tmp / "checkpoint.json");
      f << meta.dump(2) << "\n";
      f.flush();
      if (!f) throw Error((tmp / "checkpoint.json").string() + ": write failed");
    }
    fsync_path((tmp / "checkpoint.json").string(), false);
    fsync_path(tmp.string(), true);
    if (fs::exists(final_path)) {
      // A checkpoint of this step exists: swap the new one in atomically, so that a complete step-N is there at
      // every instant (removing it first and renaming after left an empty step-N to a SIGKILL in between), then
      // remove the old one from the temporary name.
      if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) != 0) {
        // A filesystem without the exchange: the old copy steps aside first (older checkpoints stay complete).
        const fs::path aside = make_temporary_folder(dir, name, "old");  // a free name: the rename needs it absent
        fs::remove(aside);
        fs::rename(final_path, aside);
        fs::rename(tmp, final_path);
        remove_tree(aside, ec);
      } else {
        remove_tree(tmp, ec);  // the old checkpoint, now under the temporary name
      }
    } else {
      fs::rename(tmp, final_path);
    }
    fsync_path(dir, true);
  } catch (...) {
    remove_tree(tmp, ec);
    throw;
  }
  if (keep > 0) {
    auto all = complete_checkpoints(dir);
    for (size_t i = 0; i + keep < all.size(); ++i) remove_tree(all[i], ec);
  }
  return final_path.string();
}

CheckpointDirLock::CheckpointDirLock(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw Error(dir + ": not usable as a checkpoint directory" + (ec ? ": " + ec.message() : ": not a directory"));
  const std::string path = (fs::path(dir) / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(path + ": cannot open the checkpoint directory's lock: " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[32] = {0};
    const ssize_t n = ::pread(fd_, holder, sizeof(holder) - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      throw Error(dir + " is in use by another trainer (pid " + (n > 0 ? std::string(holder, strnlen(holder, n)) : "?") +
                  "); one trainer per --checkpoint-dir");
    throw Error(path + ": cannot lock: " + std::strerror(err));
  }
  // Holding the directory's lock, no other trainer can be writing here: temporaries of interrupted saves
  // (".step-N.tmp-*", ".step-N.old-*") are provably stale.
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".step-", 0) == 0 && (name.find(".tmp-") != std::string::npos || name.find(".old-") != std::string::npos))
      remove_tree(e.path(), ec);
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size()))
    throw Error(path + ": cannot write the lock holder's pid: " + std::strerror(errno));
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

std::vector<std::string> complete_checkpoint_paths(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& p : complete_checkpoints(dir)) out.push_back(p.string());
  return out;
}

std::optional<std::string> first_nonfinite_tensor(const CheckpointState& state) {
  for (const auto& [name, t] : state.tensors)
    if (t.defined() && t.is_floating_point() && !at::isfinite(t).all().item<bool>()) return name;
  return std::nullopt;
}

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  const auto all = complete_checkpoints(dir);
  if (all.empty()) return std::nullopt;
  return all.back().string();
}

nlohmann::json ExportInfo::to_json() const {
  nlohmann::json j = {{"weights_hash", weights_hash},
                      {"tied_head", tied_head},
                      {"scale_mode", nvfp4::scale_mode_name(scale_mode)}};
  if (weights_sample_hash) j["weights_sample_hash"] = *weights_sample_hash;
  if (!config.is_null()) j["config"] = config;
  return j;
}

std::optional<ExportInfo> ExportInfo::from_json(const nlohmann::json& extra, const std::string& origin) {
  if (!extra.is_object() || !extra.contains("weights_hash")) return std::nullopt;
  ExportInfo info;
  info.weights_hash = json_field<std::string>(extra, "weights_hash", origin, "a string");
  info.tied_head = json_field<bool>(extra, "tied_head", origin, "true or false");
  const std::string mode = json_field<std::string>(extra, "scale_mode", origin, "a string");
  if (mode != "rne" && mode != "search") throw Error(origin + ": unknown scale mode '" + mode + "'");
  info.scale_mode = nvfp4::scale_mode_from_name(mode);
  if (extra.contains("weights_sample_hash"))
    info.weights_sample_hash = json_field<std::string>(extra, "weights_sample_hash", origin, "a string");
  info.config = extra.value("config", nlohmann::json());
  return info;
}

CheckpointState load_checkpoint(const std::string& path, const std::string& tensor_prefix) {
  const fs::path p(path);
  std::ifstream f(p / "checkpoint.json");
  if (!f) throw Error(path + ": not a checkpoint (no checkpoint.json)");
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(f, depth_limited((p / "checkpoint.json").string()));
  } catch (const nlohmann::json::exception& e) {
    throw Error((p / "checkpoint.json").string() + ": invalid JSON: " + json_error_text(e));
  }
  if (meta.value("magic", "") != kCheckpointMagic) throw Error(path + ": not a qwen3-train checkpoint (wrong magic)");
  if (meta.value("format_version", -1) != kCheckpointFormatVersion)
    throw Error(path + ": checkpoint format version " + json_excerpt(meta.value("format_version", nlohmann::json())) +
                " is not supported (this build reads version " + std::to_string(kCheckpointFormatVersion) + ")");
  CheckpointState s;
  const std::string origin = (p / "checkpoint.json").string();
  s.step = json_field<int64_t>(meta, "step", origin, "an integer");
  s.optimizer_steps = json_field<int64_t>(meta, "optimizer_steps", origin, "an integer");
  s.skipped_steps = json_field<int64_t>(meta, "skipped_steps", origin, "an integer");
  s.model_hash = json_field<std::string>(meta, "model_hash", origin, "a string");
  s.flags = json_field<nlohmann::json>(meta, "flags", origin, "an object");
  if (!s.flags.is_object()) throw Error(origin + ": field \"flags\" must be an object, got " + json_excerpt(s.flags));
  s.extra = meta.value("extra", nlohmann::json::object());
  if (!s.extra.is_object()) throw Error(origin + ": field \"extra\" must be an object, got " + json_excerpt(s.extra));
  // Counters no run makes (train's --steps is at most 10^9) are a damaged or foreign file, not a position in the
  // data (a negative step was reported as a bad batch index).
  for (const auto& [name, value] : {std::pair{"step", s.step}, {"optimizer_steps", s.optimizer_steps},
                                    {"skipped_steps", s.skipped_steps}})
    if (value < 0 || value > kMaxCheckpointStep)
      throw Error(origin + ": field \"" + name + "\" is " + std::to_string(value) + ", not a step count (0 to " +
                  std::to_string(kMaxCheckpointStep) + "): not a checkpoint this tool wrote");
  if (s.skipped_steps > s.step)
    throw Error(origin + ": " + std::to_string(s.skipped_steps) + " skipped steps of " + std::to_string(s.step) +
                ": not a checkpoint this tool wrote");
  const nlohmann::json hashes = meta.value("tensor_hashes", nlohmann::json::object());
  if (!hashes.is_object())
    throw Error(origin + ": field \"tensor_hashes\" must be an object, got " + json_excerpt(hashes));
  DatReader r((p / "tensors.dat").string(), DatRules::container_only);
  for (const auto& e : r.entries()) {
    if (e.key.compare(0, tensor_prefix.size(), tensor_prefix) != 0) continue;
    at::Tensor t = read_tensor(r, e);
    if (!hashes.empty()) {  // a checkpoint that records them records every tensor's
      const auto saved = hashes.find(e.key);
      if (saved == hashes.end() || !saved->is_string())
        throw CheckpointDamaged(origin + ": no hash for '" + e.key +
                                "' (the checkpoint's files do not belong together)");
      const std::string found = tensor_bytes_hash(t.data_ptr(), e.nbytes);
      if (found != saved->get<std::string>())
        throw CheckpointDamaged(fmt::format("{}: '{}' is not the tensor saved there (hash {}, saved {}): the file "
                                            "changed after it was written",
                                            (p / "tensors.dat").string(), e.key, found, saved->get<std::string>()));
    }
    s.tensors.emplace_back(e.key, std::move(t));
  }
  return s;
}

}  // namespace qwen3
