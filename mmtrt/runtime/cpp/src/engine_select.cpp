// Which engine runs a TensorRT segment on a host (mmtrt.backends.tensorrt.engines.select): the one engines/index.json
// records under the segment's key for that host, or one trtexec wrote under the planned name.
#include <algorithm>
#include <sstream>
#include <sys/stat.h>

#include <openssl/evp.h>

#include "engines.hpp"

namespace mmtrt {
namespace {

// Python's json.dumps with its default separators, for the integers, lists and dicts of a profile.
void py_dumps(const json& value, std::ostringstream& out) {
  if (value.is_object()) {
    out << '{';
    bool first = true;
    for (const auto& [key, item] : value.items()) {  // nlohmann's json keeps object keys sorted
      out << (first ? "" : ", ") << json(key).dump() << ": ";
      py_dumps(item, out);
      first = false;
    }
    out << '}';
  } else if (value.is_array()) {
    out << '[';
    for (size_t i = 0; i < value.size(); ++i) {
      out << (i ? ", " : "");
      py_dumps(value[i], out);
    }
    out << ']';
  } else if (value.is_null()) {
    out << "null";
  } else {
    out << value.dump();
  }
}

std::string sha256_hex(const std::string& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(data.data(), data.size(), digest, &length, EVP_sha256(), nullptr);
  std::ostringstream hex;
  for (unsigned int i = 0; i < length; ++i) hex << "0123456789abcdef"[digest[i] >> 4] << "0123456789abcdef"[digest[i] & 15];
  return hex.str();
}

bool is_file(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

const char* const kIndex = "engines/index.json";

}  // namespace

std::string Target::tag() const {
  std::string cc = compute_capability;
  cc.erase(std::remove(cc.begin(), cc.end(), '.'), cc.end());
  return "sm" + cc + "-trt" + tensorrt;
}

std::string profile_digest(const json& profile) {
  std::ostringstream text;
  py_dumps(profile, text);
  return sha256_hex(text.str()).substr(0, 12);
}

EngineChoice select_engine(const std::string& bundle, const json& entry, const Target& target, const json& index) {
  const std::string id = entry.at("id").get<std::string>();
  if (entry.at("profiles").is_null())
    return {"", id + " has no TensorRT profile (" + entry.value("unbuildable", json()).dump() + ")"};
  if (!target.error.empty()) return {"", target.error};
  const std::string key =
      entry.at("sha256").get<std::string>().substr(0, 16) + "-" + profile_digest(entry.at("profiles")) + "-" + target.tag();
  if (!index.contains(key)) {
    // trtexec writes no index record: an engine under the planned name (the plan's --saveEngine) is taken
    const std::string planned = "engines/" + id + "-" + key + ".engine";
    if (is_file(bundle + "/" + planned))
      return {bundle + "/" + planned, "engine " + planned + " (not in " + kIndex + ": built outside build-engines)"};
    std::vector<std::string> built;
    for (const auto& [k, record] : index.items())
      if (record.at("segment") == id) built.push_back(record.at("target").get<std::string>());
    std::sort(built.begin(), built.end());
    std::string others;
    for (const auto& b : built) others += (others.empty() ? " (built for: " : ", ") + b;
    if (!others.empty()) others += ")";
    return {"", "no engine for " + id + " matches " + target.tag() + others +
                    "; run `mmtrt build-engines BUNDLE` on this host"};
  }
  const json& record = index.at(key);
  const std::string file = record.at("file").get<std::string>();
  const std::string path = bundle + "/" + file;
  if (!is_file(path) || sha256_file(path) != record.at("sha256").get<std::string>())
    return {"", "engine " + file + " is missing or modified; run `mmtrt build-engines BUNDLE --force`"};
  return {path, "engine " + file};
}

}  // namespace mmtrt
