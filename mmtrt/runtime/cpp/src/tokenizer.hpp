// The bundle's HF tokenizer through onnxruntime-genai's tokenizer C API (its ort-extensions tokenizer and
// its Jinja engine), plus the prompt formatting of mmtrt.runtime.prompt.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <optional>

#include "detokenizer.hpp"
#include "manifest.hpp"

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
  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens) const;
  std::string decode(const std::vector<int32_t>& ids) const;  // skips special tokens, as HF's decode
  const std::string& bos_token() const { return bos_token_; }

 private:
  OgaTokenizer* handle_ = nullptr;
  std::string bos_token_;
  std::optional<ByteLevelDetokenizer> byte_level_;
};

}  // namespace mmtrt
