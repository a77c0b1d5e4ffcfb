"""mmtrt's custom TensorRT plugins: CUDA kernels (csrc/*.cu) whose per-thread math lives in headers that the CPU
twins (csrc/cpu_twin.cpp, `mmtrt.kernels.cpu`) share, the build of both (`build`), the plugin catalog
(`catalog`), how each kernel is launched (`launch`) and their registration: TensorRT 11's AOT plugins
(`registration`, tensorrt.plugin, imported only on a TensorRT host) and TensorRT-RTX's Python plugins (`rtx`)."""
