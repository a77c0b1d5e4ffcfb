// The bundle manifest as the runtime reads it: artifacts and their sha256, dims, each component's tensors.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace mmtrt {

using json = nlohmann::json;

struct DimRange {
  int64_t min = 0, opt = 0, max = 0;
};
using Dims = std::map<std::string, DimRange>;

// A tensor of a component: each dimension is a number or the name of a symbolic dim in Dims.
struct TensorSpec {
  std::string name;
  std::vector<std::variant<int64_t, std::string>> shape;
};

struct Manifest {
  json raw;
  Dims dims;
  std::map<std::string, std::vector<TensorSpec>> inputs;   // component -> inputs
  std::map<std::string, std::vector<TensorSpec>> outputs;  // component -> outputs
};

// Refuses a folder without manifest.json or with another schema version (as mmtrt.bundle.manifest does), and a
// manifest that fails manifest_schema.json or lists less than the bundle holds (check_manifest_schema).
Manifest read_manifest(const std::string& bundle);
// One line naming the field (src/manifest_schema.cpp, the twin of mmtrt/bundle/schema.py).
void check_manifest_schema(const std::string& bundle, const json& manifest);
std::string sha256_file(const std::string& path);
// Artifacts whose content no longer matches the manifest (or that are missing).
std::vector<std::string> modified_artifacts(const std::string& bundle, const Manifest& manifest);
// A UserError-like message when a shape lies outside the planned profile (mmtrt.partition.shapes.check_shape).
void check_shape(const std::string& component, const TensorSpec& spec, const std::vector<int64_t>& shape,
                 const Dims& dims);
json read_json_file(const std::string& path);
// Well-formed UTF-8 (no overlong forms, no surrogates), as the manifest's text and a prompt must be.
bool valid_utf8(const std::string& text);

}  // namespace mmtrt
