"""TensorRT backend, for TensorRT 11 and TensorRT-RTX alike (`flavors.py`): what their ONNX parser accepts, the form
it reads, engine build plans, the build, the engine cache and the engine runner.

TensorRT and TensorRT-RTX are imported only inside functions: everything else runs on any host.
"""
