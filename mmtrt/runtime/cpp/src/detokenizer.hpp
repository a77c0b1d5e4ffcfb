// Token ids back to text as HF `tokenizers` does for a ByteLevel decoder: token strings -> GPT-2 byte map ->
// bytes -> UTF-8 with each invalid sequence replaced by one U+FFFD (Rust's String::from_utf8_lossy).
// onnxruntime-genai's decode differs there: it drops invalid bytes, and small models generate many.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace mmtrt {

class ByteLevelDetokenizer {
 public:
  // None when tokenizer.json's decoder is not ByteLevel (then onnxruntime-genai decodes).
  static std::optional<ByteLevelDetokenizer> from_file(const std::string& tokenizer_json);
  std::string decode(const std::vector<int32_t>& ids) const;  // skips special tokens

 private:
  std::map<int32_t, std::string> tokens_;
  std::set<int32_t> special_;
  std::map<uint32_t, uint8_t> char_bytes_;
};

std::string utf8_lossy(const std::string& bytes);

}  // namespace mmtrt
