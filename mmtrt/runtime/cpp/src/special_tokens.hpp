// What HF `tokenizers` adds around a single sequence (the post-processor of tokenizer.json), and which added
// tokens are special, so the C++ runtime encodes as transformers does whatever onnxruntime-genai's tokenizer
// makes of tokenizer_config.json (its bos_token or add_bos_token, which transformers 5 does not read there).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "manifest.hpp"

namespace mmtrt {

struct SpecialTokens {
  std::vector<int32_t> prefix, suffix;  // the post-processor's tokens before and after a single sequence
  std::vector<std::string> contents;    // the text of every special added token
  std::vector<int32_t> ids;             // and its id
  static SpecialTokens from_file(const std::string& tokenizer_json);
  bool found_in(const std::string& text) const;
};

// tokenizer.json or tokenizer_config.json without the special added tokens: text that holds one is then
// tokenized as text (transformers' split_special_tokens).
json without_special_tokens(const std::string& file_name, json content);

// The manifest's token ids are the tokenizer's (mmtrt.bundle.schema.check_token_ids): the image placeholder's id,
// and end-of-sequence ids that are special tokens.
void check_token_ids(const std::string& bundle, const json& model, const SpecialTokens& special);

}  // namespace mmtrt
