"""mmtrt's plugins for TensorRT-RTX: IPluginV3 plugins with the V3One capabilities, written in Python, registered
with IPluginCreatorV3One creators, so TensorRT-RTX's ONNX parser imports fuse_plugins' nodes and its builder builds
them into engines, on the CPU too.

Why not registration.py (TensorRT 11's tensorrt.plugin AOT plugins)? TensorRT-RTX 1.7 has no AOT plugin interface:
its bindings lack QuickPluginCreationRequest, KernelLaunchParams, ISymExpr, IPluginV3QuickAOTBuild and the `plugin`
module (tensorrt_rtx.plugin imports a tensorrt_rtx_bindings.plugin the wheel does not ship), its library knows no
PLUGIN_V3QUICKAOT_BUILD capability, its ONNX parser imports plugins of V3One creators only, and its Python
network has no add_plugin. So the kernel cannot be baked into a TensorRT-RTX engine: the engine records the plugin
(name, namespace, version, attributes) and the runtime registers these creators again, whose `enqueue` launches the
kernel from the bundle's PTX through CuPy; an RTX engine with plugins runs in the Python runtime only.

The builds need one more thing: on every plugin node, TensorRT-RTX 1.7's parser dlopens `libtensorrt_rtx.so`
(unversioned) and aborts the process (std::terminate, uncatchable) when it cannot, while the wheel ships only
`libtensorrt_rtx.so.1`. `provide_parser_library` loads a stub library of that SONAME, linked to the wheel's
library, before any parse, so the parser finds the library already loaded.

At run time `runtime_reason` says why such an engine cannot load on a host (no CuPy, a driver older than the PTX
needs, a registration that fails), and the runtime runs its segment on ONNX Runtime with that reason instead.

NOT RUN: `enqueue` (no GPU here; TensorRT-RTX engines run on compute capability 7.5, 8.0, 8.6, 8.9, 12.0 and 12.1
only, mmtrt's are built for 8.0, 8.6, 8.9 and 12.0: never on a Hopper GPU such as the H200).
"""

import ctypes
import hashlib
import importlib.util
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np

from mmtrt.errors import UserError
from mmtrt.kernels import build, driver, launch
from mmtrt.kernels.catalog import BY_NAME, NAMESPACE, PluginSpec

FLOAT_ATTRIBUTES = {"scale", "mass"}
FEATURES = {"TokenSelect": 2, "TokenSelectMerge": 2, "TokenSelectScored": 1, "TokenSelectDynamic": 1}
TYPE_NAMES = {"FP32": "FLOAT", "FP16": "HALF"}  # tensorrt.plugin's type strings that are not DataType names
SUFFIX = {"FLOAT": "f32", "HALF": "f16", "BF16": "bf16"}
_CREATORS: dict[str, object] = {}  # the registry keeps pointers only: the Python creators must stay alive


def provide_parser_library(trt) -> None:
    """Make `libtensorrt_rtx.so` resolvable for TensorRT-RTX's ONNX parser (see the module's docstring)."""
    libs = Path(trt.__file__).resolve().parents[1] / "tensorrt_rtx_libs"
    if (libs / "libtensorrt_rtx.so").exists():
        return
    ctypes.CDLL(str(_stub(str(libs / "libtensorrt_rtx.so.1"))), mode=ctypes.RTLD_GLOBAL)


@lru_cache(maxsize=None)
def _stub(library: str) -> Path:
    """An empty shared library with SONAME libtensorrt_rtx.so that needs `library`, built once per library file."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise UserError("TensorRT-RTX's parser needs libtensorrt_rtx.so to import plugin nodes, and building its link "
                        "library needs a C++ compiler: install g++, or link libtensorrt_rtx.so to libtensorrt_rtx.so.1 "
                        "in tensorrt_rtx_libs")
    key = hashlib.sha256(f"{library}\n{Path(library).stat().st_size}\n{cxx}".encode()).hexdigest()[:16]
    folder = build.BUILD_ROOT / f"rtx-link-{key}"
    if not (folder / "libtensorrt_rtx.so").is_file():
        build.BUILD_ROOT.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=build.BUILD_ROOT, prefix=".rtx-"))
        subprocess.run([cxx, "-shared", "-fPIC", "-x", "c++", "/dev/null", "-x", "none", "-Wl,-soname,libtensorrt_rtx.so",
                        "-Wl,--no-as-needed", library, "-o", str(tmp / "libtensorrt_rtx.so")], check=True,
                       capture_output=True, timeout=120)
        build._publish(tmp, folder)
    return folder / "libtensorrt_rtx.so"


def register(trt, ptx: Path | None = None, parsing: bool = True) -> list[str]:
    """Register every catalog plugin's creator with TensorRT-RTX (`trt` is the tensorrt_rtx module) and, for a
    build (`parsing`), make the parser's library resolvable; `ptx` is the bundle's kernels.ptx, which enqueue
    loads. Returns the plugin ids."""
    if parsing:
        provide_parser_library(trt)
    registry = trt.get_plugin_registry()
    for spec in BY_NAME.values():
        creator = _CREATORS.get(spec.plugin_id)
        if creator is None:
            creator = _CREATORS[spec.plugin_id] = _classes(trt)[1](spec)
            if not registry.register_creator(creator, NAMESPACE):
                raise UserError(f"TensorRT-RTX refused to register {spec.plugin_id}: another creator of that name is "
                                "registered in this process")
        creator.ptx = ptx
    return sorted(_CREATORS)


def runtime_reason(bundle: Path, plugins: dict) -> str | None:
    """None when the TensorRT-RTX engines of this bundle that call its plugins can load and run here: CuPy imports,
    the driver loads the PTX, the creators register (no ONNX parsing, so no parser library); else why not."""
    if importlib.util.find_spec("cupy") is None:
        return ("their kernels launch through CuPy, which is not installed (pip install 'mmtrt[rtx-plugins]', "
                "CuPy for CUDA 13)")
    entry = next(iter(plugins.values()))
    why = driver.reason(entry["ptx_isa"], driver_cuda=driver.cuda_driver_version()) if "ptx_isa" in entry else None
    if why:
        return why
    try:
        import tensorrt_rtx

        from mmtrt.kernels.bundle import register_plugins

        register_plugins(bundle, plugins, tensorrt_rtx, parsing=False)
    except Exception as exc:  # an install or a registration that fails here is the reason, not the load's end
        return f"registering them with TensorRT-RTX failed ({type(exc).__name__}: {exc})"
    return None


def io_types(name: str) -> set[tuple[str, ...]]:
    """The allowed input-then-output types as TensorRT DataType names."""
    return {tuple(TYPE_NAMES.get(t, t) for t in combo) for combo in launch.io_combinations(name)}


def launch_for(name: str, dims: list[tuple[int, ...]], types: list[str], values: dict) -> launch.Launch:
    """The launch of plugin `name` on inputs of these dims and DataType names, with these attribute values."""
    if name == "Int4GroupGemm":
        return launch.int4_gemm(dims[0], dims[2], values["group_size"], SUFFIX[types[0]], SUFFIX[types[2]])
    suffix = SUFFIX[types[FEATURES[name]]]
    if name in ("TokenSelect", "TokenSelectMerge"):
        return launch.token_select(dims[0], dims[1], dims[2], values["keep"], values["cls"], values["scale"], suffix,
                                   values.get("contextual"))
    if name == "TokenSelectScored":
        return launch.token_select_scored(dims[1], values["keep"], suffix)
    return launch.token_select_dynamic(dims[1], values["most"], values["least"], values["mass"], suffix)


@lru_cache(maxsize=None)
def _classes(trt):
    """The plugin and creator classes, derived from this module's TensorRT classes."""

    class Plugin(trt.IPluginV3, trt.IPluginV3OneCore, trt.IPluginV3OneBuild, trt.IPluginV3OneRuntime):
        def __init__(self, spec: PluginSpec, values: dict, creator):
            trt.IPluginV3.__init__(self)
            trt.IPluginV3OneCore.__init__(self)
            trt.IPluginV3OneBuild.__init__(self)
            trt.IPluginV3OneRuntime.__init__(self)
            self.spec, self.values, self.creator = spec, values, creator
            self.plugin_name, self.plugin_namespace, self.plugin_version = spec.name, NAMESPACE, spec.version
            self.num_outputs = 2 if spec.name == "TokenSelectDynamic" else 1
            self.timing_cache_id = ""

        def get_capability_interface(self, kind):
            return self

        def clone(self):
            return Plugin(self.spec, self.values, self.creator)

        def get_output_data_types(self, input_types):
            if self.spec.name == "Int4GroupGemm":
                return [input_types[0]]
            features = input_types[FEATURES[self.spec.name]]
            return [features, trt.int32] if self.spec.name == "TokenSelectDynamic" else [features]

        def get_output_shapes(self, inputs, shape_inputs, builder):
            if self.spec.name == "Int4GroupGemm":
                out = trt.DimsExprs(inputs[0])
                out[len(out) - 1] = inputs[2][1]
                return [out]
            features = inputs[FEATURES[self.spec.name]]
            out = trt.DimsExprs(features)
            out[1] = builder.constant(self.values.get("most", self.values.get("keep")))
            return [out, trt.DimsExprs([features[0]])] if self.spec.name == "TokenSelectDynamic" else [out]

        def supports_format_combination(self, pos, in_out, num_inputs):
            chosen = tuple(d.desc.type.name for d in in_out[: pos + 1])
            return in_out[pos].desc.format == trt.TensorFormat.LINEAR and any(
                combo[: pos + 1] == chosen for combo in io_types(self.spec.name))

        def configure_plugin(self, inputs, outputs):
            pass

        def get_workspace_size(self, inputs, outputs):
            return 0

        def get_valid_tactics(self):
            return []

        def set_tactic(self, tactic):
            pass

        def on_shape_change(self, inputs, outputs):
            self.found = launch_for(self.spec.name, [tuple(d.dims) for d in inputs], [d.type.name for d in inputs],
                                    self.values)

        def get_fields_to_serialize(self):
            return trt.PluginFieldCollection([_field(trt, a, self.values[a]) for a in self.spec.attributes])

        def attach_to_context(self, context):
            return self.clone()

        def enqueue(self, input_desc, output_desc, inputs, outputs, workspace, stream):
            import cupy as cp

            found = self.found
            kernel = _kernel(str(self.creator.ptx), found.kernel)
            args = (*[np.uint64(p) for p in inputs], *[np.int32(a) for a in found.args],
                    *[np.uint64(p) for p in outputs])
            with cp.cuda.ExternalStream(stream):
                kernel((*found.grid, 1), (*found.block, 1), args, shared_mem=found.shared_mem)

    class Creator(trt.IPluginCreatorV3One):
        def __init__(self, spec: PluginSpec):
            trt.IPluginCreatorV3One.__init__(self)
            self.spec, self.ptx = spec, None
            self.name, self.plugin_namespace, self.plugin_version = spec.name, NAMESPACE, spec.version
            self.field_names = trt.PluginFieldCollection(
                [trt.PluginField(a, np.array([]), _field_type(trt, a)) for a in spec.attributes])

        def create_plugin(self, name, fields, phase):
            values = {f.name: (float if f.name in FLOAT_ATTRIBUTES else int)(np.asarray(f.data).reshape(-1)[0])
                      for f in fields}
            missing = sorted(set(self.spec.attributes) - set(values))
            if missing:
                raise ValueError(f"{self.spec.plugin_id} node {name} lacks attributes {missing}")
            return Plugin(self.spec, values, self)

    return Plugin, Creator


def _field_type(trt, name: str):
    return trt.PluginFieldType.FLOAT32 if name in FLOAT_ATTRIBUTES else trt.PluginFieldType.INT32


def _field(trt, name: str, value):
    return trt.PluginField(name, np.array([value], np.float32 if name in FLOAT_ATTRIBUTES else np.int32),
                           _field_type(trt, name))


@lru_cache(maxsize=None)
def _kernel(ptx: str, name: str):
    import cupy as cp

    return cp.RawModule(path=ptx).get_function(name)
