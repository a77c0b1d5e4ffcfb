# find_package(mmtrt) after `cmake --install build/cpp --prefix PREFIX`: gives the target mmtrt::mmtrt_runtime
# (alias it as you like); its rpath points at the ONNX Runtime and onnxruntime-genai libraries it was built with.
include("${CMAKE_CURRENT_LIST_DIR}/mmtrtTargets.cmake")
if(NOT TARGET mmtrt::runtime)
  add_library(mmtrt::runtime INTERFACE IMPORTED)
  set_target_properties(mmtrt::runtime PROPERTIES INTERFACE_LINK_LIBRARIES mmtrt::mmtrt_runtime)
endif()
