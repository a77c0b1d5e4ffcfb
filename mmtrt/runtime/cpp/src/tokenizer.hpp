// The bundle's HF tokenizer through onnxruntime-genai's tokenizer C API (its ort-extensions tokenizer and
// its Jinja engine), plus the prompt formatting of mmtrt.runtime.prompt.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <optional>

#include "detokenizer.hpp"
#include "manifest.hpp"
#include "special_tokens.hpp"

struct OgaTokenizer;

namespace mmtrt {

class Tokenizer {
 public:
  // folder: BUNDLE/tokenizer; model: the manifest's "model" section.
  Tokenizer(const std::string& folder, const json& model);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // One user message holding the image then the text, with the generation prompt (format_prompt).
  std::string format_prompt(const std::string& chat_template, const std::string& prompt) const;
  // add_special_tokens: the post-processor's tokens around the ids (HF `tokenizers`' encode)
  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens) const;
  // Special tokens in `text` as text (transformers' split_special_tokens); nothing added around it.
  std::vector<int32_t> encode_text(const std::string& text) const;
  bool holds_special_tokens(const std::string& text) const { return special_.found_in(text); }
  const SpecialTokens& special_tokens() const { return special_; }
  std::string decode(const std::vector<int32_t>& ids) const;  // skips special tokens, as HF's decode
  const std::string& bos_token() const { return bos_token_; }

 private:
  static std::vector<int32_t> encode_with(OgaTokenizer* handle, const std::string& text);
  OgaTokenizer* handle_ = nullptr;
  OgaTokenizer* text_handle_ = nullptr;  // the same tokenizer without its special tokens
  std::string bos_token_;
  SpecialTokens special_;
  std::optional<ByteLevelDetokenizer> byte_level_;
};

}  // namespace mmtrt
