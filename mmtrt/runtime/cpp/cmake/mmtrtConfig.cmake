# find_package(mmtrt) after `cmake --install build/cpp --prefix PREFIX`: the target mmtrt::runtime, whose rpath
# points at the ONNX Runtime and onnxruntime-genai libraries it was built against (build/cpp/deps).
include("${CMAKE_CURRENT_LIST_DIR}/mmtrtTargets.cmake")
