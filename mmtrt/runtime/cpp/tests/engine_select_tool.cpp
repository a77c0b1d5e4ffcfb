// Prints the engine the C++ runtime would run each TensorRT segment of BUNDLE with on a host of compute capability
// CC and TensorRT TRT, so the tests compare it with the Python runtime's choice on hosts they are not.
//   mmtrt-engine-select BUNDLE CC TRT  ->  {"segment": {"engine": "engines/..." or null, "why": "..."}, ...}
#include <cstdio>
#include <iostream>

#include "../src/engines.hpp"
#include "mmtrt/bundle.hpp"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: mmtrt-engine-select BUNDLE CC TRT\n");
    return 2;
  }
  const std::string bundle = argv[1];
  try {
    const mmtrt::json manifest = mmtrt::read_json_file(bundle + "/manifest.json");
    const std::string index_path = bundle + "/engines/index.json";
    std::FILE* found = std::fopen(index_path.c_str(), "r");
    const mmtrt::json index = found ? mmtrt::read_json_file(index_path) : mmtrt::json::object();
    if (found) std::fclose(found);
    mmtrt::json out = mmtrt::json::object();
    for (const auto& entry : manifest.at("tensorrt").at("segments")) {
      const auto choice = mmtrt::select_engine(bundle, entry, {argv[2], argv[3], ""}, index);
      out[entry.at("id").get<std::string>()] = {
          {"engine", choice.engine.empty() ? mmtrt::json() : mmtrt::json(choice.engine.substr(bundle.size() + 1))},
          {"why", choice.why}};
    }
    std::cout << out.dump() << "\n";
  } catch (const std::exception& exc) {
    std::fprintf(stderr, "%s\n", exc.what());
    return 2;
  }
  return 0;
}
