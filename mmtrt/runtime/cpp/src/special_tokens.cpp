#include "special_tokens.hpp"

#include <algorithm>

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
      if (token.value("special", false)) {
        out.contents.push_back(token.at("content").get<std::string>());
        out.ids.push_back(token.at("id").get<int32_t>());
      }
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

void check_token_ids(const std::string& bundle, const json& model, const SpecialTokens& special) {
  const std::string where = bundle + "/manifest.json: ";
  const std::string fix = "; recompile the recipe or restore the bundle";
  const std::string image_token = model.at("image_token");
  const int64_t image_token_id = model.at("image_token_id");
  std::string given = "None";
  bool same = false;
  for (size_t i = 0; i < special.contents.size(); ++i)
    if (special.contents[i] == image_token) {
      given = std::to_string(special.ids[i]);
      same = special.ids[i] == image_token_id;
    }
  if (!same)
    throw Error(ErrorKind::BadBundle, where + "model.image_token_id is " + std::to_string(image_token_id) +
                                          " but the tokenizer gives " + image_token + " the id " + given + fix);
  for (const auto& eos : model.at("eos_token_ids"))
    if (std::find(special.ids.begin(), special.ids.end(), eos.get<int64_t>()) == special.ids.end())
      throw Error(ErrorKind::BadBundle, where + "model.eos_token_ids holds " + eos.dump() +
                                            ", which is not a special token of the tokenizer" + fix);
}

}  // namespace mmtrt
