#include "manifest.hpp"

#include <cstdint>
#include <fstream>
#include <sys/stat.h>

#include <openssl/evp.h>

#include "mmtrt/bundle.hpp"

namespace mmtrt {
namespace {

constexpr int kSchemaVersion = 2;
// The recipe key that widens each dimension, for error messages (mmtrt.partition.shapes.DIM_SOURCES).
const std::map<std::string, std::string> kDimSources = {
    {"height", "envelope.image"}, {"width", "envelope.image"}, {"num_images", "envelope.batch"},
    {"batch", "envelope.batch"}, {"seq", "envelope.prompt_tokens"},
    {"past", "envelope.prompt_tokens and envelope.max_new_tokens"},
    {"total", "envelope.prompt_tokens and envelope.max_new_tokens"}};

bool is_file(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::vector<TensorSpec> specs(const json& tensors) {
  std::vector<TensorSpec> out;
  for (const auto& t : tensors) {
    TensorSpec spec{t.at("name").get<std::string>(), {}};
    for (const auto& d : t.at("shape")) {
      if (d.is_number_integer()) spec.shape.emplace_back(d.get<int64_t>());
      else spec.shape.emplace_back(d.get<std::string>());
    }
    out.push_back(std::move(spec));
  }
  return out;
}

}  // namespace

json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorKind::BadBundle, "cannot read " + path);
  try {
    return json::parse(in);
  } catch (const json::exception& exc) {
    throw Error(ErrorKind::BadBundle, path + " is not valid JSON (" + exc.what() + "); recompile the recipe");
  }
}

Manifest read_manifest(const std::string& bundle) {
  const std::string path = bundle + "/manifest.json";
  if (!is_file(path))
    throw Error(ErrorKind::BadBundle, bundle + " is not an mmtrt bundle (no manifest.json); pass the folder "
                                               "`mmtrt compile` wrote");
  Manifest m;
  m.raw = read_json_file(path);
  const json version = m.raw.value("schema_version", json());
  if (version != kSchemaVersion)
    throw Error(ErrorKind::BadBundle, bundle + " has manifest schema " + (version.is_null() ? "None" : version.dump()) +
                                          ", this mmtrt reads " + std::to_string(kSchemaVersion) +
                                          "; recompile the recipe with this mmtrt");
  check_manifest_schema(bundle, m.raw);
  try {
    for (const auto& [name, range] : m.raw.at("dims").items())
      m.dims[name] = {range.at("min").get<int64_t>(), range.at("opt").get<int64_t>(),
                      range.at("max").is_null() ? INT64_MAX : range.at("max").get<int64_t>()};  // null: unbounded
    for (const auto& [name, comp] : m.raw.at("components").items()) {
      m.inputs[name] = specs(comp.at("inputs"));
      m.outputs[name] = specs(comp.at("outputs"));
    }
  } catch (const json::exception& exc) {
    throw Error(ErrorKind::BadBundle, path + " lacks what the runtime needs (" + exc.what() + "); recompile the recipe");
  }
  return m;
}

std::string sha256_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::BadBundle, "cannot read " + path);
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  std::vector<char> block(1 << 20);
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    EVP_DigestUpdate(ctx, block.data(), static_cast<size_t>(in.gcount()));
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx, digest, &length);
  EVP_MD_CTX_free(ctx);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < length; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 15];
  }
  return out;
}

std::vector<std::string> modified_artifacts(const std::string& bundle, const Manifest& manifest) {
  std::vector<std::string> bad;
  for (const auto& [name, digest] : manifest.raw.at("artifacts").items()) {
    const std::string path = bundle + "/" + name;
    if (!is_file(path) || sha256_file(path) != digest.get<std::string>()) bad.push_back(name);
  }
  return bad;
}

void check_shape(const std::string& component, const TensorSpec& spec, const std::vector<int64_t>& shape,
                 const Dims& dims) {
  for (size_t i = 0; i < spec.shape.size() && i < shape.size(); ++i) {
    const int64_t actual = shape[i];
    if (const auto* fixed = std::get_if<int64_t>(&spec.shape[i])) {
      if (*fixed != actual)
        throw Error(ErrorKind::BadInput, component + "." + spec.name + " has size " + std::to_string(actual) +
                                             " where the bundle expects " + std::to_string(*fixed));
      continue;
    }
    const std::string& dim = std::get<std::string>(spec.shape[i]);
    const DimRange& range = dims.at(dim);
    if (actual < range.min || actual > range.max) {
      const auto source = kDimSources.find(dim);
      throw Error(ErrorKind::BadInput,
                  component + "." + spec.name + ": " + dim + " = " + std::to_string(actual) +
                      " is outside the bundle's profile [" + std::to_string(range.min) + ", " +
                      std::to_string(range.max) + "]; recompile with a wider " +
                      (source == kDimSources.end() ? std::string("envelope") : source->second));
    }
  }
}

}  // namespace mmtrt
