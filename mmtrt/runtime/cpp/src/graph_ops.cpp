#include "graph_ops.hpp"

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string_view>
#include <vector>

namespace mmtrt {
namespace {

constexpr uint32_t kModelGraph = 7, kGraphNode = 1, kNodeOpType = 4;  // onnx.proto's field numbers
constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

// The fields of one message, each a (field number, wire type, payload) where the payload of a length-delimited
// field is its bytes; false on bytes that are no message.
class Fields {
 public:
  explicit Fields(std::string_view bytes) : rest_(bytes) {}

  bool next(uint32_t& field, uint32_t& wire, std::string_view& payload) {
    uint64_t key = 0, length = 0;
    if (rest_.empty() || !varint(key)) return false;
    field = static_cast<uint32_t>(key >> 3);
    wire = static_cast<uint32_t>(key & 7);
    switch (wire) {
      case kVarint: return varint(length);
      case kFixed64: return skip(8, payload);
      case kFixed32: return skip(4, payload);
      case kLengthDelimited: return varint(length) && skip(length, payload);
      default: return false;
    }
  }

 private:
  bool varint(uint64_t& value) {
    value = 0;
    for (int shift = 0; shift < 64 && !rest_.empty(); shift += 7) {
      const auto byte = static_cast<uint8_t>(rest_.front());
      rest_.remove_prefix(1);
      value |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if (!(byte & 0x80)) return true;
    }
    return false;
  }

  bool skip(uint64_t size, std::string_view& payload) {
    if (size > rest_.size()) return false;
    payload = rest_.substr(0, size);
    rest_.remove_prefix(size);
    return true;
  }

  std::string_view rest_;
};

// The payloads of `message`'s length-delimited fields numbered `wanted`.
std::vector<std::string_view> submessages(std::string_view message, uint32_t wanted) {
  std::vector<std::string_view> found;
  Fields fields(message);
  uint32_t field = 0, wire = 0;
  std::string_view payload;
  while (fields.next(field, wire, payload))
    if (field == wanted && wire == kLengthDelimited) found.push_back(payload);
  return found;
}

}  // namespace

std::set<std::string> graph_op_types(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::set<std::string> ops;
  for (auto graph : submessages(bytes, kModelGraph))
    for (auto node : submessages(graph, kGraphNode))
      for (auto op : submessages(node, kNodeOpType)) ops.emplace(op);
  return ops;
}

}  // namespace mmtrt
