"""TensorRT backend: what its ONNX parser accepts, engine build plans, the engine cache and the engine runner.

Only `build` and `runner` import tensorrt, and only inside functions: everything else runs on any host.
"""
