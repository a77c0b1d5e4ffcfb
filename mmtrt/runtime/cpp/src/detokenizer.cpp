#include "detokenizer.hpp"

#include <fstream>

#include <nlohmann/json.hpp>

namespace mmtrt {
namespace {

// GPT-2's bytes_to_unicode, inverted: the printable bytes stand for themselves, the rest for 256 + n.
std::map<uint32_t, uint8_t> byte_level_chars() {
  std::map<uint32_t, uint8_t> chars;
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    chars[printable ? b : next++] = static_cast<uint8_t>(b);
  }
  return chars;
}

// Code points of a valid UTF-8 string (token strings in tokenizer.json are valid).
std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int length = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t cp = length == 1 ? c : c & (0x7F >> length);
    for (int k = 1; k < length && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += length;
  }
  return out;
}

void append_replacement(std::string& out) { out += "\xEF\xBF\xBD"; }

}  // namespace

std::string utf8_lossy(const std::string& bytes) {
  std::string out;
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const auto b0 = static_cast<unsigned char>(bytes[i]);
    if (b0 < 0x80) {
      out += static_cast<char>(b0);
      ++i;
      continue;
    }
    int need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the first continuation byte
    if (b0 >= 0xC2 && b0 <= 0xDF) need = 1;
    else if (b0 >= 0xE0 && b0 <= 0xEF) {
      need = 2;
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      need = 3;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
    }
    if (need == 0) {
      append_replacement(out);
      ++i;
      continue;
    }
    size_t j = i + 1;
    bool valid = true;
    for (int k = 0; k < need; ++k, ++j) {
      const unsigned char lower = k == 0 ? lo : 0x80, upper = k == 0 ? hi : 0xBF;
      if (j >= n || static_cast<unsigned char>(bytes[j]) < lower || static_cast<unsigned char>(bytes[j]) > upper) {
        valid = false;
        break;
      }
    }
    if (valid) out.append(bytes, i, j - i);
    else append_replacement(out);  // one U+FFFD for the maximal invalid prefix, then resume at the bad byte
    i = j;
  }
  return out;
}

std::optional<ByteLevelDetokenizer> ByteLevelDetokenizer::from_file(const std::string& tokenizer_json) {
  std::ifstream in(tokenizer_json);
  const nlohmann::json t = nlohmann::json::parse(in, nullptr, false);
  if (t.is_discarded() || !t.contains("decoder") || !t["decoder"].is_object() ||
      t["decoder"].value("type", "") != "ByteLevel" || !t["model"].contains("vocab") || !t["model"]["vocab"].is_object())
    return std::nullopt;
  ByteLevelDetokenizer d;
  for (const auto& [token, id] : t["model"]["vocab"].items()) d.tokens_[id.get<int32_t>()] = token;
  for (const auto& added : t.value("added_tokens", nlohmann::json::array())) {
    const auto id = added.at("id").get<int32_t>();
    d.tokens_[id] = added.at("content").get<std::string>();
    if (added.value("special", false)) d.special_.insert(id);
  }
  d.char_bytes_ = byte_level_chars();
  return d;
}

std::string ByteLevelDetokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string bytes;
  for (const int32_t id : ids) {
    const auto found = tokens_.find(id);
    if (found == tokens_.end() || special_.count(id)) continue;
    std::string mapped;
    bool all_mapped = true;
    for (const uint32_t cp : code_points(found->second)) {
      const auto byte = char_bytes_.find(cp);
      if (byte == char_bytes_.end()) {
        all_mapped = false;
        break;
      }
      mapped += static_cast<char>(byte->second);
    }
    bytes += all_mapped ? mapped : found->second;
  }
  return utf8_lossy(bytes);
}

}  // namespace mmtrt
