#include "tokenizer.hpp"

#include <cstdio>
#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <memory>
#include <unistd.h>

#include "mmtrt/bundle.hpp"
#include "special_tokens.hpp"

// The few functions of onnxruntime-genai's C API (ort_genai_c.h, 0.18) this file calls; no header ships.
extern "C" {
struct OgaResult;
struct OgaSequences;
OgaResult* OgaCreateTokenizerFromPath(const char* path, OgaTokenizer** out);
void OgaDestroyTokenizer(OgaTokenizer* tokenizer);
OgaResult* OgaUpdateTokenizerOptions(OgaTokenizer* tokenizer, const char* const* keys, const char* const* values,
                                     size_t count);
OgaResult* OgaTokenizerApplyChatTemplate(const OgaTokenizer* tokenizer, const char* template_str,
                                         const char* messages, const char* tools, bool add_generation_prompt,
                                         const char** out_string);
OgaResult* OgaTokenizerEncode(const OgaTokenizer* tokenizer, const char* str, OgaSequences* sequences);
OgaResult* OgaTokenizerDecode(const OgaTokenizer* tokenizer, const int32_t* tokens, size_t count,
                              const char** out_string);
OgaResult* OgaCreateSequences(OgaSequences** out);
void OgaDestroySequences(OgaSequences* sequences);
size_t OgaSequencesGetSequenceCount(const OgaSequences* sequences, size_t index);
const int32_t* OgaSequencesGetSequenceData(const OgaSequences* sequences, size_t index);
const char* OgaResultGetError(const OgaResult* result);
void OgaDestroyResult(OgaResult* result);
void OgaDestroyString(const char* str);
}

namespace mmtrt {
namespace {

void check(OgaResult* result, const std::string& what) {
  if (!result) return;
  const std::string message = OgaResultGetError(result);
  OgaDestroyResult(result);
  throw Error(ErrorKind::Runtime, what + ": " + message);
}

std::string take_string(const char* str) {
  std::string out(str ? str : "");
  OgaDestroyString(str);
  return out;
}

// onnxruntime-genai reads a tokenizer from a folder that also holds a genai_config.json. The bundle is never
// written to: the tokenizer files are linked into a private temporary folder beside a minimal config.
class ConfigFolder {
 public:
  // text_only: tokenizer.json and tokenizer_config.json written without their special tokens
  ConfigFolder(const std::string& tokenizer_dir, const json& model, bool text_only = false) : text_only_(text_only) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/mmtrt-tokenizer-XXXXXX";
    if (!mkdtemp(pattern.data())) throw Error(ErrorKind::Runtime, "cannot create a temporary folder in " + pattern);
    path_ = pattern;
    try {
      link_files(tokenizer_dir, model);
    } catch (...) {
      remove();
      throw;
    }
  }
  ~ConfigFolder() { remove(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::string> files_;
  bool text_only_;

  void link_files(const std::string& tokenizer_dir, const json& model) {
    std::unique_ptr<DIR, int (*)(DIR*)> dir(opendir(tokenizer_dir.c_str()), closedir);
    if (!dir) throw Error(ErrorKind::BadBundle, tokenizer_dir + " is missing; recompile the recipe");
    while (const dirent* entry = readdir(dir.get())) {
      const std::string name = entry->d_name;
      if (name == "." || name == "..") continue;
      files_.push_back(path_ + "/" + name);
      if (text_only_ && (name == "tokenizer.json" || name == "tokenizer_config.json")) {
        std::ofstream(files_.back()) << without_special_tokens(name, read_json_file(tokenizer_dir + "/" + name)).dump();
        continue;
      }
      if (symlink((tokenizer_dir + "/" + name).c_str(), files_.back().c_str()) != 0)
        throw Error(ErrorKind::Runtime, "cannot link " + name + " into " + path_);
    }
    const json& llm = model.at("llm");
    const json config = {{"model",
                          {{"type", "llama"},
                           {"context_length", llm.at("max_position_embeddings")},
                           {"vocab_size", llm.at("vocab_size")},
                           {"eos_token_id", model.at("eos_token_ids")},
                           {"bos_token_id", model.at("eos_token_ids").at(0)},
                           {"pad_token_id", model.at("eos_token_ids").at(0)},
                           {"decoder",
                            {{"filename", "unused.onnx"},
                             {"head_size", llm.at("head_dim")},
                             {"hidden_size", llm.at("hidden_size")},
                             {"num_attention_heads", llm.at("num_heads")},
                             {"num_hidden_layers", llm.at("num_layers")},
                             {"num_key_value_heads", llm.at("num_kv_heads")}}}}}};
    files_.push_back(path_ + "/genai_config.json");
    std::ofstream(files_.back()) << config.dump();
  }
  void remove() {
    for (const auto& file : files_) unlink(file.c_str());
    rmdir(path_.c_str());
  }
};

std::string read_bos_token(const std::string& folder) {
  std::ifstream in(folder + "/tokenizer_config.json");
  if (!in) return "";
  const json config = json::parse(in, nullptr, false);
  if (config.is_discarded() || !config.contains("bos_token")) return "";
  const json& bos = config["bos_token"];
  if (bos.is_string()) return bos.get<std::string>();
  if (bos.is_object() && bos.contains("content")) return bos["content"].get<std::string>();
  return "";
}

}  // namespace

Tokenizer::Tokenizer(const std::string& folder, const json& model)
    : bos_token_(read_bos_token(folder)),
      special_(SpecialTokens::from_file(folder + "/tokenizer.json")),
      byte_level_(ByteLevelDetokenizer::from_file(folder + "/tokenizer.json")) {
  const ConfigFolder config(folder, model);
  check(OgaCreateTokenizerFromPath(config.path().c_str(), &handle_), "cannot load the tokenizer in " + folder);
  const ConfigFolder text_config(folder, model, true);
  check(OgaCreateTokenizerFromPath(text_config.path().c_str(), &text_handle_),
        "cannot load the tokenizer in " + folder);
}

Tokenizer::~Tokenizer() {
  if (handle_) OgaDestroyTokenizer(handle_);
  if (text_handle_) OgaDestroyTokenizer(text_handle_);
}

std::string Tokenizer::format_prompt(const std::string& chat_template, const std::string& prompt) const {
  const json messages = json::array(
      {{{"role", "user"}, {"content", json::array({{{"type", "image"}}, {{"type", "text"}, {"text", prompt}}})}}});
  const char* out = nullptr;
  if (OgaResult* result =
          OgaTokenizerApplyChatTemplate(handle_, chat_template.c_str(), messages.dump().c_str(), nullptr, true, &out)) {
    const std::string message = OgaResultGetError(result);
    OgaDestroyResult(result);
    throw Error(ErrorKind::BadBundle, "the C++ runtime's template engine cannot render this bundle's chat template (" +
                                          message.substr(0, message.find('\n')) + "); run the bundle with the "
                                          "Python runtime (mmtrt run), or pass the prompt as the template renders it "
                                          "with --raw-prompt");
  }
  return take_string(out);
}

// The special tokens around the ids are the post-processor's (as HF `tokenizers` adds them), never
// onnxruntime-genai's own choice, which follows tokenizer_config.json's bos_token.
std::vector<int32_t> Tokenizer::encode(const std::string& text, bool add_special_tokens) const {
  std::vector<int32_t> ids = encode_with(handle_, text);
  if (!add_special_tokens) return ids;
  ids.insert(ids.begin(), special_.prefix.begin(), special_.prefix.end());
  ids.insert(ids.end(), special_.suffix.begin(), special_.suffix.end());
  return ids;
}

std::vector<int32_t> Tokenizer::encode_text(const std::string& text) const { return encode_with(text_handle_, text); }

std::vector<int32_t> Tokenizer::encode_with(OgaTokenizer* handle, const std::string& text) {
  const char* key = "add_special_tokens";
  const char* value = "false";
  check(OgaUpdateTokenizerOptions(handle, &key, &value, 1), "cannot set add_special_tokens");
  OgaSequences* sequences = nullptr;
  check(OgaCreateSequences(&sequences), "cannot allocate token sequences");
  std::unique_ptr<OgaSequences, void (*)(OgaSequences*)> owned(sequences, OgaDestroySequences);
  check(OgaTokenizerEncode(handle, text.c_str(), sequences), "cannot tokenize the prompt");
  const int32_t* data = OgaSequencesGetSequenceData(sequences, 0);
  return std::vector<int32_t>(data, data + OgaSequencesGetSequenceCount(sequences, 0));
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  if (byte_level_) return byte_level_->decode(ids);
  const char* out = nullptr;
  check(OgaTokenizerDecode(handle_, ids.data(), ids.size(), &out), "cannot decode tokens");
  return take_string(out);
}

}  // namespace mmtrt
