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

// Refuses a folder without manifest.json or with another schema version (as mmtrt.bundle.manifest does).
Manifest read_manifest(const std::string& bundle);
std::string sha256_file(const std::string& path);
// Artifacts whose content no longer matches the manifest (or that are missing).
std::vector<std::string> modified_artifacts(const std::string& bundle, const Manifest& manifest);
// A UserError-like message when a shape lies outside the planned profile (mmtrt.partition.shapes.check_shape).
void check_shape(const std::string& component, const TensorSpec& spec, const std::vector<int64_t>& shape,
                 const Dims& dims);
json read_json_file(const std::string& path);

}  // namespace mmtrt
