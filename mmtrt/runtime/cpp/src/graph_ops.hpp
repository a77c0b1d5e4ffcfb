#pragma once
// The op types of an ONNX file's graph, read from the protobuf wire format (ModelProto.graph, GraphProto.node,
// NodeProto.op_type) without a protobuf library: the runner sets session entries by what a graph computes.
#include <set>
#include <string>

namespace mmtrt {

// Empty for a file that cannot be read or is not a ModelProto (ONNX Runtime then says why when it loads it).
std::set<std::string> graph_op_types(const std::string& path);

}  // namespace mmtrt
