// TensorBoard's event file, written directly: a TFRecord file (each record its length, the length's masked
// CRC32C, the bytes, their masked CRC32C) of tensorflow.Event protocol buffers, the first naming the file
// version, then one a step holding that step's scalars as Summary.Value{tag, simple_value}. That is what
// TensorBoard, tensorboardX and W&B's TensorBoard sync read; no Debian package writes it from C++ (TensorFlow's
// own writer needs TensorFlow), and the format is four fields and a checksum, so it is written by hand here
// (docs/trainer.md, "Watching a run").
#pragma once
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace qwen3 {

// CRC-32C (Castagnoli) of bytes, and TFRecord's masked form of a CRC.
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(uint32_t crc);

class TensorBoardWriter {
 public:
  // Creates DIR (with its parents) and a new events.out.tfevents.<seconds>.<host>.<pid> file in it; Error when
  // it cannot be written.
  explicit TensorBoardWriter(const std::string& dir);
  // One event: the step's scalars (tag, value), at wall-clock `wall_time` seconds since the epoch. Flushed, so a
  // TensorBoard watching the folder sees each step as it ends.
  void add_scalars(int64_t step, double wall_time, const std::vector<std::pair<std::string, double>>& scalars);
  // SessionLog START at `step`: TensorBoard drops the events it has read with a step at or past it (the ones a
  // stopped run wrote after the checkpoint a resume continues from), as PyTorch's SummaryWriter(purge_step=) does.
  void add_session_start(int64_t step, double wall_time);
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);
  std::string path_;
  std::ofstream out_;
};

}  // namespace qwen3
