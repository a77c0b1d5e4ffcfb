"""Weight quantization: group-wise INT4 math and the layouts ONNX Runtime, TensorRT and TensorRT-LLM read."""

# The groups TensorRT-LLM's fine-grained INT4 kernels take (cutlass_kernels/fpA_intB_gemm: "Only group size 64 and 128
# supported for fine grained kernels"); here so that recipe validation reads it without numpy.
TRTLLM_GROUPS = (64, 128)
