"""The two TensorRTs mmtrt builds engines with: TensorRT 11 (`tensorrt`) and TensorRT for RTX (`tensorrt_rtx`).

Both ship the same Python API under two module names (Builder, OnnxParser with onnx-tensorrt inside, optimization
profiles, build_serialized_network, strong typing always on), so one build path (`build.py`) drives both and an
engine TensorRT-RTX builds here, on the CPU, proves that code path for TensorRT too. Where they differ, it is
written down here and nowhere else:

- Where an engine runs: TensorRT's on the GPU model (compute capability) and TensorRT version that built it, so
  building needs that GPU; TensorRT-RTX builds ahead of time on the CPU ("CPU-only AOT", its default) for a list
  of compute capabilities set on the builder config (`num_compute_capabilities`, `set_compute_capability`, an API
  TensorRT lacks) and specialises the engine just in time on the device.
- Timing cache: TensorRT times tactics on the GPU and keeps them per GPU and version; TensorRT-RTX times nothing
  ahead of time (its timing cache calls are deprecated no-ops since 1.2), so it gets none.
- Plugins: TensorRT registers mmtrt's plugins as AOT plugins through `tensorrt.plugin` (the kernel goes into the
  engine); TensorRT-RTX has no AOT plugin interface (`tensorrt_rtx.plugin` does not import), so they register as
  Python IPluginV3 plugins (`mmtrt/kernels/rtx.py`, through `kernels/bundle.register_plugins`) whose kernel the
  Python runtime launches from the bundle's PTX: such an engine needs them registered again where it runs.
- The command-line builder: `trtexec` for TensorRT, `tensorrt_rtx` for TensorRT-RTX (same flags for what mmtrt
  uses; it ships with the TensorRT-RTX archive, not with the wheel).
- Polygraphy runs either, one per process (`polygraphy.config.USE_TENSORRT_RTX`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Flavor:
    name: str               # the `--target` name
    module: str             # the Python module
    tool: str               # the command-line builder
    install: str            # what installs it
    builds_on_cpu: bool     # True: no GPU needed to build

    def load(self):
        """The module, or an ImportError-like exception naming what installs it."""
        return importlib.import_module(self.module)


TENSORRT = Flavor(
    name="tensorrt", module="tensorrt", tool="trtexec",
    install="TensorRT 11 on a GPU host: pip install tensorrt-cu13 (its libraries download from NVIDIA's package "
            "index)",
    builds_on_cpu=False)
RTX = Flavor(
    name="rtx", module="tensorrt_rtx", tool="tensorrt_rtx",
    install="pip install tensorrt-rtx-cu13==1.7.1.116",
    builds_on_cpu=True)
FLAVORS = {f.name: f for f in (TENSORRT, RTX)}

# TensorRT-RTX's default targets when none is set (its documentation: "CPU-Only AOT and TensorRT-RTX Engines"),
# set explicitly so the engine key names what the engine runs on. TensorRT-RTX 1.7 can target these and 7.5 and
# 12.1 too (`tensorrt_rtx.ComputeCapability`: SM75, SM80, SM86, SM89, SM120, SM121), never 9.0 or 10.x: no
# TensorRT-RTX engine runs on a Hopper (H100, H200) or data-centre Blackwell (B200) GPU.
RTX_COMPUTE_CAPABILITIES = ("8.0", "8.6", "8.9", "12.0")
RTX_SUPPORTED = ("7.5", "8.0", "8.6", "8.9", "12.0", "12.1")
GPUS = {"7.5": "Turing: RTX 20, T4", "8.0": "Ampere: A100, A30", "8.6": "Ampere: RTX 30, A10, A40, RTX A6000",
        "8.7": "Jetson Orin", "8.9": "Ada: RTX 40, L4, L40S", "9.0": "Hopper: H100, H200",
        "10.0": "Blackwell: B200, GB200", "12.0": "Blackwell: RTX 50, RTX PRO 6000", "12.1": "Blackwell: GB10"}


def gpus_of(capabilities: str) -> str:
    """'8.0 (Ampere: A100, A30), 8.6 (...)' for '8.0,8.6'."""
    return ", ".join(f"{cc} ({GPUS[cc]})" if cc in GPUS else cc for cc in capabilities.split(","))


def rtx_host_note(capability: str | None) -> str | None:
    """What to tell the builder of TensorRT-RTX engines whose host GPU (capability, None without one) they skip."""
    if capability is None or capability in RTX_COMPUTE_CAPABILITIES:
        return None
    return (f"this host's GPU (compute capability {capability}: {GPUS.get(capability, 'unknown')}) is not among the "
            f"TensorRT-RTX engines' targets ({', '.join(RTX_COMPUTE_CAPABILITIES)}): they will not run here; "
            f"ONNX Runtime runs these segments on this host")


def flavor(name: str) -> Flavor:
    return FLAVORS[name]


def set_rtx_targets(trt, config) -> None:
    """The builder config of a TensorRT-RTX build: the compute capabilities the engine will run on."""
    config.num_compute_capabilities = len(RTX_COMPUTE_CAPABILITIES)
    for index, cc in enumerate(RTX_COMPUTE_CAPABILITIES):
        config.set_compute_capability(getattr(trt.ComputeCapability, f"SM{cc.replace('.', '')}"), index)
