// Byte-level BPE on ids: the GPT-2 byte alphabet, the merge table, the merge loop and a cache of words
// already merged. Everything here works on raw bytes; the byte-level spelling only matters when reading
// tokenizer.json.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "qwen3/tokenizer/tokenizer.h"

namespace qwen3::tok {

// GPT-2's byte-to-unicode map: printable Latin-1 bytes stand for themselves, the other 68 bytes for
// U+0100.. in byte order (so space is U+0120 'Ġ', newline U+010A 'Ċ').
char32_t byte_to_char(uint8_t byte);
// The byte a character stands for, or -1 for characters outside the alphabet.
int char_to_byte(char32_t c);
// A token's byte-level spelling (UTF-8) back to raw bytes; false when a character is outside the alphabet.
bool byte_level_to_bytes(std::string_view spelled, std::string& bytes);
std::string bytes_to_byte_level(std::string_view bytes);

// (left, right) id pairs to their rank and merged id: open addressing, sized for a load below one half.
class MergeTable {
 public:
  static constexpr uint32_t kNoRank = UINT32_MAX;
  struct Entry {
    uint64_t key = kEmpty;
    uint32_t rank = kNoRank;
    TokenId merged = -1;
  };
  void reserve(size_t merges);
  // A pair given twice keeps the later rank, as the JS reference's map does.
  void insert(TokenId left, TokenId right, uint32_t rank, TokenId merged);
  const Entry* find(TokenId left, TokenId right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = pack(left, right);
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      const Entry& e = slots_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return count_; }

 private:
  static constexpr uint64_t kEmpty = UINT64_MAX;  // ids are non-negative, so no pair packs to this
  static uint64_t pack(TokenId l, TokenId r) { return (uint64_t(uint32_t(l)) << 32) | uint32_t(r); }
  size_t slot_of(uint64_t key) const { return size_t((key * 0x9E3779B97F4A7C15ull) >> shift_) & mask_; }
  std::vector<Entry> slots_;
  size_t mask_ = 0, count_ = 0;
  int shift_ = 64;
};

// Merges one pre-tokenized word (raw bytes) into ids: repeatedly the lowest-rank adjacent pair, the
// leftmost of equal ranks. Short words scan an array (cache-friendly, no allocation); long ones (CJK runs,
// long symbol runs) use a heap so the work stays O(n log n).
void merge_word(std::string_view word, const std::array<TokenId, 256>& byte_ids, const MergeTable& merges,
                std::vector<TokenId>& out);
// The two strategies, exposed so the tests can check that they agree.
void merge_word_by_scan(std::string_view word, const std::array<TokenId, 256>& byte_ids,
                        const MergeTable& merges, std::vector<TokenId>& out);
void merge_word_by_heap(std::string_view word, const std::array<TokenId, 256>& byte_ids,
                        const MergeTable& merges, std::vector<TokenId>& out);

// Words already merged, keyed by their bytes. Bounded: when full it starts over, which keeps memory flat
// on endless distinct input and costs little, since frequent words come back at once.
class WordCache {
 public:
  explicit WordCache(size_t max_words = size_t(1) << 16);
  static uint64_t hash(std::string_view word);
  // Appends the cached ids of `word` to `out`; false when it is not cached.
  bool find(std::string_view word, uint64_t hash, std::vector<TokenId>& out) const;
  void insert(std::string_view word, uint64_t hash, const TokenId* ids, size_t count);
  void clear();

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_offset = 0, key_length = 0, ids_offset = 0, ids_count = 0;
    bool used = false;
  };
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<TokenId> ids_;
  size_t max_words_, words_ = 0;
};

}  // namespace qwen3::tok
