// A model small enough to train in seconds on CPU, sized to the tiny test tokenizer (tests/data), shared by the
// trainer, export and convert tests.
#pragma once
#include <string>

#include "qwen3/config/config.h"
#include "build_paths.h"

namespace qwen3::test {

inline Qwen3Config trainable_tiny_config(bool tied = true) {
  Qwen3Config c = preset_config("tiny");
  c.vocab_size = 384;
  c.hidden_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.intermediate_size = 128;
  c.bos_token_id = -1;
  c.eos_token_ids = {272};  // the tiny tokenizer's <|im_end|>
  c.tie_word_embeddings = tied;
  return c;
}

}  // namespace qwen3::test
