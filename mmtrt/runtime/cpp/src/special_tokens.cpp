#include "special_tokens.hpp"

#include "mmtrt/bundle.hpp"

namespace mmtrt {
namespace {

void add_processor(const json& processor, SpecialTokens& out) {
  if (processor.is_null()) return;
  const std::string type = processor.at("type");
  if (type == "Sequence") {
    for (const auto& inner : processor.at("processors")) add_processor(inner, out);
  } else if (type == "TemplateProcessing") {
    bool after = false;
    for (const auto& piece : processor.at("single")) {
      if (piece.contains("Sequence")) {
        after = true;
        continue;
      }
      const json& ids = processor.at("special_tokens").at(piece.at("SpecialToken").at("id").get<std::string>()).at("ids");
      auto& side = after ? out.suffix : out.prefix;
      for (const auto& id : ids) side.push_back(id.get<int32_t>());
    }
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    out.prefix.push_back(processor.at("cls").at(1).get<int32_t>());
    out.suffix.push_back(processor.at("sep").at(1).get<int32_t>());
  } else if (type != "ByteLevel") {
    throw Error(ErrorKind::BadBundle, "the tokenizer's post-processor is " + type + ", which the C++ runtime does "
                                      "not run; use the Python runtime");
  }
}

}  // namespace

SpecialTokens SpecialTokens::from_file(const std::string& tokenizer_json) {
  const json tokenizer = read_json_file(tokenizer_json);
  SpecialTokens out;
  try {
    add_processor(tokenizer.value("post_processor", json()), out);
    for (const auto& token : tokenizer.value("added_tokens", json::array()))
      if (token.value("special", false)) out.contents.push_back(token.at("content").get<std::string>());
  } catch (const json::exception& exc) {
    throw Error(ErrorKind::BadBundle, tokenizer_json + " has a post-processor the runtime cannot read (" +
                                          exc.what() + "); recompile the recipe");
  }
  return out;
}

bool SpecialTokens::found_in(const std::string& text) const {
  for (const auto& content : contents)
    if (!content.empty() && text.find(content) != std::string::npos) return true;
  return false;
}

json without_special_tokens(const std::string& file_name, json content) {
  if (file_name == "tokenizer.json" && content.contains("added_tokens")) {
    json kept = json::array();
    for (const auto& token : content.at("added_tokens"))
      if (!token.value("special", false)) kept.push_back(token);
    content["added_tokens"] = kept;
  } else if (file_name == "tokenizer_config.json") {
    for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
                            "additional_special_tokens", "extra_special_tokens"})
      content.erase(key);
    if (content.contains("added_tokens_decoder")) {
      json kept = json::object();
      for (const auto& [id, token] : content.at("added_tokens_decoder").items())
        if (!token.value("special", false)) kept[id] = token;
      content["added_tokens_decoder"] = kept;
    }
  }
  return content;
}

}  // namespace mmtrt
