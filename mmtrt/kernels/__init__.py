"""mmtrt's custom TensorRT plugins: CUDA kernels (csrc/*.cu) whose per-thread math lives in headers that the CPU
twins (csrc/cpu_twin.cpp, `mmtrt.kernels.cpu`) share, the build of both (`build`), the plugin catalog
(`catalog`) and their TensorRT registration (`registration`, tensorrt.plugin, imported only on a TensorRT host)."""
