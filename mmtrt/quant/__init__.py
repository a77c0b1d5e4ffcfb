"""Weight quantization: group-wise INT4 math and the layouts ONNX Runtime, TensorRT and TensorRT-LLM read."""
