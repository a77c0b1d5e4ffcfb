"""TensorRT 11.4's `tensorrt.plugin` Python sources, loaded at test time against TensorRT-RTX's bindings.

The sources ship as plain files in the `tensorrt-cu13-bindings==11.4.0.106` wheel, whose native libraries cannot be
installed here; they are downloaded once with pip into build/wheels (never committed) and executed as shipped, with
`tensorrt` resolving to `tensorrt_rtx` (the same pybind enums and classes: DataType, DimensionOperation, Dims, ...).
Two things differ from a TensorRT 11 process, and only these:
- `_export.IS_AOT_ENABLED` is set to True, the value TensorRT 11's bindings give it (they have
  QuickPluginCreationRequest; TensorRT-RTX 1.7's do not), so KernelLaunchParams and the aot_impl checks exist;
- `_tensor.py`'s SymExprImpl is left out: it subclasses `tensorrt.ISymExpr`, which TensorRT-RTX lacks, and only the
  hand-over of launch arguments to a TensorRT 11 builder uses it.
`_lib.py` and `_plugin_class.py` (the creators and the quick-plugin classes TensorRT calls) need TensorRT 11's AOT
plugin interface and are not loaded: `facade()` gives `register`, `autotune` and `aot_impl` decorators that run
the same validators `_lib.py` runs on a decorated function, and keep what they validated for the tests.
"""

import ast
import contextlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import types
import warnings
import zipfile
from pathlib import Path

import pytest

WHEEL = "tensorrt-cu13-bindings==11.4.0.106"
CACHE = Path(__file__).resolve().parents[1] / "build" / "wheels" / "tensorrt-cu13-bindings-11.4.0.106"
MODULES = ("_export", "_utils", "_autotune", "_tensor", "_top_level", "_validate")
PACKAGE = "trt11_plugin_sources"


def sources() -> Path:
    """The folder holding tensorrt_bindings/plugin/*.py of the 11.4 wheel, downloaded on first use."""
    folder = CACHE / "plugin"
    if (folder / "_validate.py").is_file():
        return folder
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE.parent) as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, WHEEL],
                              capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode or not wheels:
            pytest.skip(f"cannot download {WHEEL} for TensorRT 11's tensorrt.plugin sources: "
                        f"{(done.stderr or 'no wheel').strip().splitlines()[-1]}")
        staged = Path(tmp) / "plugin"
        staged.mkdir()
        with zipfile.ZipFile(wheels[0]) as wheel:
            for name in wheel.namelist():
                if name.startswith("tensorrt_bindings/plugin/") and name.endswith(".py"):
                    (staged / Path(name).name).write_bytes(wheel.read(name))
        CACHE.mkdir(exist_ok=True)
        try:
            os.rename(staged, folder)
        except OSError:  # another test process published it first
            pass
    return folder


def _exec(package: types.ModuleType, name: str, folder: Path, drop: set[str] = frozenset()) -> types.ModuleType:
    path = folder / f"{name}.py"
    module = types.ModuleType(f"{PACKAGE}.{name}")
    module.__file__, module.__package__ = str(path), PACKAGE
    sys.modules[module.__name__] = module
    with warnings.catch_warnings():  # the shipped docstrings hold invalid escape sequences
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        tree = ast.parse(path.read_text(), str(path))
        tree.body = [n for n in tree.body if not (isinstance(n, ast.ClassDef) and n.name in drop)]
        code = compile(tree, str(path), "exec")
    exec(code, module.__dict__)
    setattr(package, name, module)
    return module


def load() -> types.ModuleType:
    """The package with the 11.4 sources' public API (TensorDesc, ShapeExprs, KernelLaunchParams, ...) and the
    validator module as `_validate`."""
    if PACKAGE in sys.modules:
        return sys.modules[PACKAGE]
    trt = pytest.importorskip("tensorrt_rtx")
    folder = sources()
    package = types.ModuleType(PACKAGE)
    package.__path__, package.__all__ = [str(folder)], []
    sys.modules[PACKAGE] = package
    saved = sys.modules.get("tensorrt")
    sys.modules["tensorrt"] = trt
    try:
        for name in MODULES:
            module = _exec(package, name, folder, {"SymExprImpl"} if name == "_tensor" else set())
            if name == "_export":
                module.IS_AOT_ENABLED = True
    finally:
        if saved is None:
            sys.modules.pop("tensorrt")
        else:
            sys.modules["tensorrt"] = saved
    return package


def facade(package: types.ModuleType) -> tuple[types.ModuleType, dict[str, types.SimpleNamespace]]:
    """A `tensorrt.plugin` for registration.py: the loaded public API plus decorators that validate as `_lib.py`'s
    register / autotune / aot_impl do. Returns the module and the registry of what was decorated."""
    validate = package._validate
    registry: dict[str, types.SimpleNamespace] = {}
    trtp = types.ModuleType("tensorrt.plugin")
    trtp.__dict__.update({name: getattr(package, name) for name in package.__all__})

    def register(plugin_id: str, lazy_register: bool = False):
        def decorator(fn):
            namespace, name = plugin_id.split("::")
            validate._validate_name_and_namespace(namespace, name)
            if plugin_id in registry:  # as _lib.py's register: one definition per plugin and process
                raise ValueError(f"'OpRegistry' already has a defintion for '{name}'")
            tensors, attrs, _, _ = validate._parse_register_inputs(fn, lazy_register)
            registry[plugin_id] = types.SimpleNamespace(desc=fn, input_tensor_names=tensors, input_attrs=attrs,
                                                        num_outputs=validate._parse_register_return(fn))
            return fn
        return decorator

    def step(kind: str, check):
        def named(plugin_id: str):
            def decorator(fn):
                plugin = registry[plugin_id]
                check(fn, plugin)
                setattr(plugin, kind, fn)
                return fn
            return decorator
        return named

    trtp.register = register
    trtp.autotune = step("autotune", validate._validate_autotune)
    trtp.aot_impl = step("aot_impl", validate._validate_aot_impl)
    return trtp, registry


def import_registration(path: Path, trtp: types.ModuleType) -> types.ModuleType:
    """Execute a registration module under as_tensorrt(trtp)."""
    with as_tensorrt(trtp):
        spec = importlib.util.spec_from_file_location(f"registration_{abs(hash(str(path)))}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


@contextlib.contextmanager
def as_tensorrt(trtp: types.ModuleType):
    """`import tensorrt` gives tensorrt_rtx (a module that forwards every name to it) and `import tensorrt.plugin`
    gives `trtp`, until the block ends."""
    trt = importlib.import_module("tensorrt_rtx")
    alias = types.ModuleType("tensorrt")
    alias.__dict__.update(__getattr__=lambda name: getattr(trt, name), plugin=trtp)
    saved = {k: sys.modules.get(k) for k in ("tensorrt", "tensorrt.plugin")}
    sys.modules.update({"tensorrt": alias, "tensorrt.plugin": trtp})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value


def copy_beside(folder: Path, registration: Path | None, launch: Path, ptx: Path | None) -> Path:
    """A folder laid out as a bundle's plugins/: registration.py beside launch.py and (where built) kernels.ptx."""
    for src, name in ((registration, "registration.py"), (launch, "launch.py"), (ptx, "kernels.ptx")):
        if src is not None:
            shutil.copyfile(src, folder / name)
    return folder / "registration.py"
