// The manifest's own check at load, as mmtrt/bundle/schema.py does it, from the same manifest_schema.json (built
// in): every field the runtime reads has its type and range, the fields agree, and the bundle holds only files the
// manifest lists and hashes, none leading outside it. An edited manifest is one line naming the field.
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "manifest.hpp"
#include "mmtrt/bundle.hpp"

namespace mmtrt {

extern const char* const kManifestSchema;  // manifest_schema.json, written into the build by CMake

namespace {

namespace fs = std::filesystem;
const char* kFix = "recompile the recipe or restore the bundle";
const std::set<std::string> kUnlisted = {"manifest.json", "build_report.json", "model.sig"};

struct Target {
  std::string label;
  const json* value;
};

// Every place `path` names: (label, value or nullptr when absent); absent or null parents are skipped.
std::vector<Target> targets(const json& manifest, const std::string& path) {
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  std::vector<Target> nodes = {{"", &manifest}}, out;
  for (size_t depth = 0; depth < parts.size(); ++depth) {
    std::string key = parts[depth];
    const bool items = key.size() > 2 && key.compare(key.size() - 2, 2, "[]") == 0;
    if (items) key.resize(key.size() - 2);
    const bool last = depth + 1 == parts.size();
    std::vector<Target> found;
    for (const auto& [label, node] : nodes) {
      if (!node || !node->is_object()) continue;
      std::vector<std::string> keys;
      if (key == "*") {
        for (const auto& [k, v] : node->items()) keys.push_back(k);
      } else {
        keys.push_back(key);
      }
      for (const auto& k : keys) {
        const std::string child = label.empty() ? k : label + "." + k;
        const auto it = node->find(k);
        if (it == node->end()) {
          if (last) out.push_back({child, nullptr});
          continue;
        }
        if (!items) {
          found.push_back({child, &*it});
        } else if (it->is_array()) {
          for (size_t i = 0; i < it->size(); ++i) found.push_back({child + "[" + std::to_string(i) + "]", &(*it)[i]});
        }
      }
    }
    nodes = std::move(found);
  }
  out.insert(out.end(), nodes.begin(), nodes.end());
  return out;
}

std::string show(const json& value) {
  const std::string text = value.dump(-1, ' ', true, json::error_handler_t::replace);
  return text.size() <= 40 ? text : text.substr(0, 37) + "...";
}

bool is_int(const json& v, const json& spec) {
  if (!v.is_number_integer()) return false;
  const int64_t lo = spec.value("min", INT64_MIN), hi = spec.value("max", INT64_MAX);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return false;
  const int64_t x = v.get<int64_t>();
  return lo <= x && x <= hi;
}

bool is_name(const json& v) {
  if (!v.is_string()) return false;
  const std::string& s = v.get_ref<const std::string&>();
  if (s.empty() || !valid_utf8(s)) return false;
  for (unsigned char c : s)
    if (c < 0x20 || c == 0x7F) return false;
  return true;
}

bool is_path(const json& v) {
  if (!is_name(v)) return false;
  const std::string& s = v.get_ref<const std::string&>();
  if (s[0] == '/' || s.find('\\') != std::string::npos) return false;
  for (size_t start = 0;;) {
    const size_t slash = s.find('/', start);
    const std::string part = s.substr(start, slash - start);
    if (part.empty() || part == "." || part == "..") return false;
    if (slash == std::string::npos) return true;
    start = slash + 1;
  }
}

bool type_ok(const json& v, const json& spec) {
  const std::string type = spec.at("type");
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array() && static_cast<int64_t>(v.size()) >= spec.value("min", 0);
  if (type == "int") return is_int(v, spec);
  if (type == "string") return v.is_string() && valid_utf8(v.get_ref<const std::string&>());
  if (type == "name") return is_name(v);
  if (type == "path") return is_path(v);
  if (type == "sha256") {
    if (!v.is_string() || v.get_ref<const std::string&>().size() != 64) return false;
    for (char c : v.get_ref<const std::string&>())
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    return true;
  }
  if (type == "dim") return is_int(v, json{{"min", 0}}) || is_name(v);
  if (type == "enum") {
    if (!v.is_string()) return false;
    for (const auto& allowed : spec.at("values"))
      if (allowed == v) return true;
    return false;
  }
  return false;
}

std::string kind(const json& spec) {
  const std::string type = spec.at("type");
  if (type == "int")
    return "an integer from " + spec.at("min").dump() + " to " + spec.at("max").dump();
  if (type == "enum") {
    std::string out = "one of ";
    for (size_t i = 0; i < spec.at("values").size(); ++i)
      out += (i ? ", " : "") + spec.at("values")[i].get<std::string>();
    return out;
  }
  if (type == "array" && spec.value("min", 0) > 0) return "a list of at least " + spec.at("min").dump();
  static const std::map<std::string, std::string> words = {
      {"object", "an object"}, {"array", "a list"}, {"string", "a string"},
      {"name", "a non-empty name without control characters"}, {"path", "a relative path inside the bundle"},
      {"sha256", "a sha256 (64 lowercase hex digits)"}, {"dim", "a size or a dim name"}};
  return words.at(type);
}

std::string problem(const json& spec, const json* value) {
  if (!value) return spec.value("optional", false) ? "" : "is missing";
  if (value->is_null()) return spec.value("nullable", false) ? "" : "is null, it must be " + kind(spec);
  return type_ok(*value, spec) ? "" : "must be " + kind(spec) + ", not " + show(*value);
}

std::string replace_all(std::string text, const std::string& needle, const std::string& with) {
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + with.size()))
    text.replace(at, needle.size(), with);
  return text;
}

const json* tensor(const json& m, const std::string& comp, const std::string& side, const std::string& name) {
  const auto c = m.at("components").find(comp);
  if (c == m.at("components").end()) return nullptr;
  for (const auto& t : c->at(side))
    if (t.at("name") == name) return &t;
  return nullptr;
}

std::string cache_shape(const std::vector<const json*>& pasts, const json& llm) {
  for (const json* t : pasts) {
    const json& shape = t->at("shape");
    if (shape.size() < 3) continue;
    const std::pair<size_t, const char*> axes[] = {{shape.size() - 3, "num_kv_heads"}, {shape.size() - 1, "head_dim"}};
    for (const auto& [axis, key] : axes)
      if (shape[axis].is_number_integer() && shape[axis] != llm.at(key))
        return std::string("model.llm.") + key + " is " + llm.at(key).dump() + " but the LLM's " +
               t->at("name").get<std::string>() + " has " + shape[axis].dump();
  }
  return "";
}

std::string cache_relations(const json& m) {
  const json& llm = m.at("model").at("llm");
  const json& dims = m.at("dims");
  const auto kv_it = m.at("model").find("kv_cache");
  std::map<std::string, const json*> inputs;
  std::set<std::string> outputs;
  for (const auto& t : m.at("components").at("llm").at("inputs")) inputs[t.at("name")] = &t;
  for (const auto& t : m.at("components").at("llm").at("outputs")) outputs.insert(t.at("name").get<std::string>());
  const int64_t layers = llm.at("num_layers").get<int64_t>();
  if (kv_it == m.at("model").end() || kv_it->is_null()) {
    std::vector<const json*> pasts;
    for (const auto& [name, t] : inputs)
      if (name.rfind("past.", 0) == 0) pasts.push_back(t);
    if (static_cast<int64_t>(pasts.size()) != 2 * layers)
      return "model.llm.num_layers is " + std::to_string(layers) + " but the LLM takes " +
             std::to_string(pasts.size()) + " past tensors";
    return cache_shape(pasts, llm);
  }
  const json& kv = *kv_it;
  for (const char* key : {"past", "present"}) {
    const std::string pattern = kv.at(key);
    if (pattern.find("{layer}") == std::string::npos || pattern.find("{kind}") == std::string::npos)
      return std::string("model.kv_cache.") + key + " must name {layer} and {kind}, not " + show(kv.at(key));
  }
  const std::string past = kv.at("past"), present = kv.at("present");
  std::vector<std::string> names;
  bool all = true;
  for (int64_t i = 0; i < layers; ++i)
    for (const auto& k : kv.at("kinds")) {
      const std::string p = replace_all(replace_all(past, "{layer}", std::to_string(i)), "{kind}", k);
      const std::string q = replace_all(replace_all(present, "{layer}", std::to_string(i)), "{kind}", k);
      names.push_back(p);
      all = all && inputs.count(p) && outputs.count(q);
    }
  const std::string prefix = past.substr(0, past.find('{'));
  size_t bound = 0;
  for (const auto& [name, t] : inputs) bound += name.rfind(prefix, 0) == 0;
  if (!all || bound != names.size()) {
    std::string kinds;
    for (const auto& k : kv.at("kinds")) kinds += (kinds.empty() ? "" : ", ") + k.get<std::string>();
    return "model.kv_cache (" + std::to_string(layers) + " layers of " + kinds + ") does not match the LLM's " +
           std::to_string(bound) + " cache inputs";
  }
  const json& first = *inputs.at(names.front());
  if (first.contains("dtype") && first.at("dtype") != kv.at("dtype"))
    return "model.kv_cache.dtype is " + kv.at("dtype").get<std::string>() + " but the LLM's cache inputs are " +
           first.at("dtype").get<std::string>();
  if (!dims.contains("capacity")) return "dims.capacity is missing (a kv_cache bundle sizes its buffers by it)";
  if (kv.at("layout") == "paged") {
    if (!kv.contains("block_tokens") || !dims.contains("pool_blocks") || !dims.contains("num_slots"))
      return "a paged model.kv_cache needs block_tokens and dims pool_blocks and num_slots";
    const json& slots = dims.at("num_slots").at("max");
    const json& blocks = dims.at("pool_blocks").at("max");
    const int64_t product = (blocks.is_null() ? 0 : blocks.get<int64_t>()) * kv.at("block_tokens").get<int64_t>();
    if (slots.is_null() || slots.get<int64_t>() != product)
      return "dims.num_slots (" + slots.dump() + ") must be dims.pool_blocks (" + blocks.dump() +
             ") x model.kv_cache.block_tokens (" + kv.at("block_tokens").dump() + ")";
  }
  const json& capacity = dims.at("capacity").at("max");
  if (capacity.is_null() || capacity.get<int64_t>() > llm.at("max_position_embeddings").get<int64_t>())
    return "dims.capacity (" + (capacity.is_null() ? std::string("None") : capacity.dump()) +
           ") exceeds the LLM's positions (" + llm.at("max_position_embeddings").dump() +
           ", model.llm.max_position_embeddings)";
  return cache_shape({&first}, llm);
}

std::string file_relations(const json& m) {
  const json& listed = m.at("artifacts");
  for (const auto& [comp, c] : m.at("components").items()) {
    std::vector<std::string> files = {c.at("artifact").get<std::string>()};
    if (c.contains("files"))
      for (const auto& f : c.at("files")) files.push_back(f);
    for (const auto& f : files)
      if (!listed.contains(f)) return "components." + comp + " reads " + f + ", which artifacts does not list (nor hash)";
  }
  const auto trt = m.find("tensorrt");
  if (trt != m.end() && trt->is_object() && trt->contains("segments"))
    for (const auto& seg : trt->at("segments"))
      if (seg.contains("files"))
        for (const auto& f : seg.at("files"))
          if (!listed.contains(f.get<std::string>()))
            return "tensorrt segment " + seg.at("id").get<std::string>() + " reads " + f.get<std::string>() +
                   ", which artifacts does not list (nor hash)";
  const auto placement = m.find("placement");
  if (placement != m.end())
    for (const auto& [comp, place] : placement->items())
      if (place.contains("segments"))
        for (const auto& seg : place.at("segments"))
          if (seg.contains("onnx") && !listed.contains(seg.at("onnx").get<std::string>()))
            return "placement." + comp + " segment " + seg.at("id").get<std::string>() + " reads " +
                   seg.at("onnx").get<std::string>() + ", which artifacts does not list (nor hash)";
  return "";
}

// What the engine choice reads when a plan holds no engine: the reason it gives instead.
std::string plan_relations(const json& m) {
  const auto trt = m.find("tensorrt");
  if (trt != m.end() && trt->is_object() && trt->contains("segments"))
    for (const auto& seg : trt->at("segments"))
      if (seg.at("profiles").is_null() && !(seg.contains("unbuildable") && seg.at("unbuildable").is_string()))
        return "tensorrt segment " + seg.at("id").get<std::string>() + " has no profiles and no reason (unbuildable)";
  const auto llm = m.find("tensorrt_llm");
  if (llm != m.end() && llm->is_object() && !llm->empty() && llm->at("checkpoint").is_null() &&
      !(llm->contains("checkpoint_missing") && llm->at("checkpoint_missing").is_string()))
    return "tensorrt_llm has no checkpoint and no reason (checkpoint_missing)";
  return "";
}

std::string relations(const json& m) {
  const json& dims = m.at("dims");
  for (const auto& [name, r] : dims.items()) {
    const int64_t lo = r.at("min"), opt = r.at("opt");
    if (lo > opt || (!r.at("max").is_null() && opt > r.at("max").get<int64_t>()))
      return "dims." + name + " must have min <= opt <= max, not " + show(r);
  }
  for (const auto& [comp, c] : m.at("components").items())
    for (const auto& t : c.at("inputs"))
      for (const auto& d : t.at("shape"))
        if (d.is_string() && !dims.contains(d.get<std::string>()))
          return "components." + comp + " tensor " + t.at("name").get<std::string>() + " names dim '" +
                 d.get<std::string>() + "', which dims lacks";
  const json& model = m.at("model");
  const int64_t vocab = model.at("llm").at("vocab_size");
  if (model.at("image_token_id").get<int64_t>() >= vocab)
    return "model.image_token_id [" + model.at("image_token_id").dump() + "] lies outside the vocabulary of " +
           std::to_string(vocab) + " (model.llm.vocab_size)";
  for (const auto& id : model.at("eos_token_ids"))
    if (id.get<int64_t>() >= vocab)
      return "model.eos_token_ids " + show(model.at("eos_token_ids")) + " lies outside the vocabulary of " +
             std::to_string(vocab) + " (model.llm.vocab_size)";
  const json& pre = m.at("components").at("preprocess").at("outputs").at(0).at("shape");
  const json* vision = tensor(m, "vision", "inputs", "pixel_values");
  // [batch, 3, H, W]; a Qwen2-VL image's patches [patches, width]
  bool fits = pre.size() == (vision ? vision->at("shape").size() : 4);
  if (fits && vision)
    for (size_t i = 1; i < pre.size(); ++i)
      if (pre[i].is_number_integer() && vision->at("shape")[i].is_number_integer() && pre[i] != vision->at("shape")[i])
        fits = false;
  if (!fits)
    return "components.preprocess output " + show(pre) + " does not fit the vision input " +
           (vision ? show(vision->at("shape")) : std::string("null"));
  const json* features = tensor(m, "vision", "outputs", "image_features");
  const bool tiled = model.at("vision").contains("tile_tokens");  // any resolution: the output is per tile
  const json& tokens = model.at("vision").at(tiled ? "tile_tokens" : "image_tokens");
  if (features && features->at("shape").size() == 3 && features->at("shape")[1].is_number_integer() &&
      features->at("shape")[1] != tokens)
    return std::string("model.vision.") + (tiled ? "tile_tokens" : "image_tokens") + " is " + tokens.dump() +
           " but the vision output holds " + features->at("shape")[1].dump() + (tiled ? " per tile" : " per image");
  std::string why = cache_relations(m);
  if (why.empty()) why = plan_relations(m);
  return why.empty() ? file_relations(m) : why;
}

void check_files(const std::string& bundle, const json& manifest) {
  char resolved[PATH_MAX];
  if (!realpath(bundle.c_str(), resolved)) throw Error(ErrorKind::BadBundle, bundle + " cannot be resolved");
  const std::string root = resolved;
  for (const auto& [name, digest] : manifest.at("artifacts").items()) {
    const std::string path = bundle + "/" + name;
    if (!realpath(path.c_str(), resolved)) {
      if (errno == ENOENT) continue;  // missing: the artifact check names it
      throw Error(ErrorKind::BadBundle, path + " cannot be resolved (" + std::strerror(errno) + "); " + kFix);
    }
    const std::string real = resolved;
    if (real.compare(0, root.size() + 1, root + "/") != 0)
      throw Error(ErrorKind::BadBundle, path + " leads outside the bundle (to " + real + "); " + kFix);
  }
  std::vector<std::string> unlisted;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(bundle, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const std::string rel = fs::relative(it->path(), bundle).generic_string();
    if (rel == "engines" || rel.rfind("engines/", 0) == 0) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->symlink_status().type() == fs::file_type::directory) continue;
    if (!kUnlisted.count(rel) && !manifest.at("artifacts").contains(rel)) unlisted.push_back(rel);
  }
  if (unlisted.empty()) return;
  std::sort(unlisted.begin(), unlisted.end());
  std::string names;
  for (size_t i = 0; i < unlisted.size() && i < 3; ++i) names += (i ? ", " : "") + unlisted[i];
  throw Error(ErrorKind::BadBundle, bundle + " holds " + names + ", which manifest.json does not list (nor hash); "
                                        "remove it or " + kFix);
}

}  // namespace

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int extra = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    if (extra < 0 || (extra > 0 && i + extra >= s.size())) return false;
    uint32_t cp = extra == 0 ? c : c & (0x3F >> extra);
    for (int k = 1; k <= extra; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 2) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((extra == 1 && cp < 0x80) || (extra == 2 && cp < 0x800) || (extra == 3 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += extra + 1;
  }
  return true;
}

void check_manifest_schema(const std::string& bundle, const json& manifest) {
  static const json schema = json::parse(kManifestSchema);
  const std::string where = bundle + "/manifest.json";
  for (const auto& spec : schema.at("fields"))
    for (const auto& target : targets(manifest, spec.at("path"))) {
      const std::string why = problem(spec, target.value);
      if (!why.empty()) throw Error(ErrorKind::BadBundle, where + ": " + target.label + " " + why + "; " + kFix);
    }
  const std::string why = relations(manifest);
  if (!why.empty()) throw Error(ErrorKind::BadBundle, where + ": " + why + "; " + kFix);
  check_files(bundle, manifest);
}

}  // namespace mmtrt
