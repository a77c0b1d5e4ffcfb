"""The TensorRT 11 registration (registration.py) under TensorRT 11.4's own tensorrt.plugin validators and symbolic
size classes (tests/kernels/trt11_plugin.py loads them), and the launch geometry (launch.py) it shares with
TensorRT-RTX's plugin: shared memory against the kernel headers' own functions, type combinations against
tensorrt.plugin's expansion and the kernels in the PTX."""

import re

import numpy as np
import pytest

import trt11_plugin
from mmtrt.kernels import build, cpu, launch
from mmtrt.kernels.bundle import REGISTRATION
from mmtrt.kernels.catalog import BY_NAME, PLUGINS

LAUNCH = REGISTRATION.with_name("launch.py")
ARGS = {"TokenSelect": 9, "TokenSelectMerge": 10, "TokenSelectScored": 3, "TokenSelectDynamic": 5, "Int4GroupGemm": 4}
RANKS = {"TokenSelect": (4, 4, 3), "TokenSelectMerge": (4, 4, 3, 1, 1), "TokenSelectScored": (2, 3),
         "TokenSelectDynamic": (2, 3), "Int4GroupGemm": (3, 2, 2, 1)}
ATTRIBUTES = {"keep": 16, "cls": 1, "scale": 0.125, "contextual": 4, "most": 16, "least": 2, "mass": 0.9,
              "group_size": 64}


@pytest.fixture(scope="module")
def sources():
    return trt11_plugin.load()


@pytest.fixture(scope="module")
def registered(sources, tmp_path_factory):
    """registration.py imported from a folder laid out as a bundle's plugins/ (with the PTX where nvcc exists)."""
    folder = tmp_path_factory.mktemp("plugins")
    ptx = build.device_code().ptx if build.nvcc() else None
    path = trt11_plugin.copy_beside(folder, REGISTRATION, LAUNCH, ptx)
    trtp, registry = trt11_plugin.facade(sources)
    trt11_plugin.import_registration(path, trtp)
    return registry


def test_every_plugin_passes_tensorrt_plugins_validation(registered):
    """register, autotune and aot_impl of every catalog plugin, with the attributes fuse_plugins writes."""
    assert set(registered) == {spec.plugin_id for spec in PLUGINS.values()}
    for plugin_id, plugin in registered.items():
        spec = BY_NAME[plugin_id.split("::")[1]]
        assert list(plugin.input_attrs) == list(spec.attributes), plugin_id
        assert plugin.autotune and plugin.aot_impl
        assert plugin.num_outputs == (2 if spec.name == "TokenSelectDynamic" else 1)


def test_string_annotations_fail_tensorrt_plugins_validation(sources, tmp_path):
    """What `from __future__ import annotations` does to registration.py: tensorrt.plugin's validator refuses it."""
    text = "from __future__ import annotations\n" + REGISTRATION.read_text()
    (tmp_path / "registration.py").write_text(text)
    trt11_plugin.copy_beside(tmp_path, None, LAUNCH, None)
    with pytest.raises(ValueError, match="TensorDescs args should come first"):
        trt11_plugin.import_registration(tmp_path / "registration.py", trt11_plugin.facade(sources)[0])


@pytest.mark.skipif(build.nvcc() is None, reason="nvcc is not installed: no PTX for aot_impl to hand over")
@pytest.mark.parametrize("name", sorted(ARGS))
def test_aot_impl_runs_on_symbolic_sizes(sources, registered, name):
    """Every aot_impl, and the shapes of every register, on tensorrt.plugin's symbolic sizes (which have no
    reflected operators) for every type combination the autotune offers; the kernel it names is in the PTX."""
    import tensorrt_rtx as trt

    plugin = registered[f"mmtrt::{name}"]
    entries = set(re.findall(r"\.visible \.entry (\w+)\(", build.device_code().ptx.read_text()))
    attrs = [ATTRIBUTES[a] for a in plugin.input_attrs]
    for types in launch.io_combinations(name):
        descs = [sources.TensorDesc(sources.ShapeExprs(rank, _is_dummy=True), getattr(trt.DataType, _dtype(t)))
                 for rank, t in zip(RANKS[name], types)]
        outputs = plugin.desc(*descs, *attrs)
        assert len(outputs if isinstance(outputs, tuple) else (outputs,)) == plugin.num_outputs
        kernel, ptx, params, args = plugin.aot_impl(*descs, *attrs, outputs, 0)
        assert kernel.decode() in entries and ptx == build.device_code().ptx.read_bytes()
        assert isinstance(params, sources.KernelLaunchParams) and isinstance(args, sources.SymIntExprs)
        assert len(args) == ARGS[name]


def _dtype(name: str) -> str:
    return {"FP32": "FLOAT", "FP16": "HALF"}.get(name, name)


@pytest.mark.parametrize("name", sorted(ARGS))
def test_type_combinations_expand_as_tensorrt_plugin_expands_them(sources, name):
    ours = {tuple(_dtype(t) for t in combo) for combo in launch.io_combinations(name)}
    theirs = set()
    for text in launch.IO_TYPES[name]:
        combination = sources.AutoTuneCombination(text, "LINEAR")
        combination._generate_combinations()
        theirs |= {tuple(t.name for t in c.types) for c in combination._get_combinations()}
    assert ours == theirs


def test_shared_memory_matches_the_headers():
    """launch.py's bytes are the headers' token_select_smem_floats / scored_smem_words (through the CPU twin) on
    random sizes; the launch keeps the attributes' order of kernels.cu."""
    rng = np.random.default_rng()
    for _ in range(50):
        tokens, head_dim = int(rng.integers(1, 3000)), int(rng.integers(1, 256))
        kv_len, keep, contextual = tokens + int(rng.integers(0, 3)), int(rng.integers(1, tokens + 1)), int(rng.integers(0, 16))
        assert launch.token_select_bytes(kv_len, tokens, keep, head_dim, contextual) == cpu.smem_bytes(
            "token_select", kv_len=kv_len, tokens=tokens, keep=keep, head_dim=head_dim, contextual=contextual)
        assert launch.scored_bytes(tokens, keep) == cpu.smem_bytes("scored", tokens=tokens, rows=keep)
    found = launch.token_select((2, 6, 1, 64), (2, 6, 257, 64), (2, 256, 384), 64, 1, 0.125, "f16", contextual=10)
    assert found.kernel == "mmtrt_token_select_merge_f16" and found.grid == (2, 8) and found.block == (256, 1)
    assert found.args == [6, 1, 257, 64, 1, 256, 384, 64, launch.float_bits(0.125), 10]
    gemm = launch.int4_gemm((2, 3, 576), (9, 1536), 64, "f16", "f32")
    assert gemm.grid == (24, 1) and gemm.args == [6, 576, 1536, 64] and gemm.kernel == "mmtrt_int4_gemm_f16_f32"


@pytest.fixture
def plugin_bundle(tmp_path, monkeypatch):
    """A folder holding a bundle's plugins/ files and their manifest entries; no TensorRT 11 registration yet."""
    from mmtrt.kernels import bundle

    if build.nvcc() is None:
        pytest.skip("the plugin files need nvcc")
    monkeypatch.setattr(bundle, "_REGISTERED", {})
    return tmp_path, bundle.write_plugins(tmp_path, ["mmtrt::TokenSelect", "mmtrt::Int4GroupGemm"])


def test_registering_a_bundles_plugins_twice_in_a_process_registers_them_once(sources, plugin_bundle):
    """tensorrt.plugin refuses a second definition of a plugin (ValueError 'already has a defintion', as _lib.py
    raises it): build-engines registers before every build, so the second must find them registered."""
    from mmtrt.kernels.bundle import register_plugins

    folder, plugins = plugin_bundle
    trtp, registry = trt11_plugin.facade(sources)
    with trt11_plugin.as_tensorrt(trtp):
        register_plugins(folder, plugins)
        register_plugins(folder, plugins)
    assert set(registry) == {spec.plugin_id for spec in BY_NAME.values()}


def test_plugins_of_another_build_are_refused_in_one_line(sources, plugin_bundle, tmp_path_factory):
    from mmtrt.errors import UserError
    from mmtrt.kernels.bundle import register_plugins

    folder, plugins = plugin_bundle
    other = tmp_path_factory.mktemp("other")
    (other / "plugins").mkdir()
    for name in {n for e in plugins.values() for n in e["sha256"]}:
        (other / name).write_bytes((folder / name).read_bytes())
    with open(other / "plugins" / "launch.py", "a") as f:
        f.write("\n# another build\n")
    changed = {pid: {**e, "sha256": {**e["sha256"], "plugins/launch.py": build_digest(other / "plugins/launch.py")}}
               for pid, e in plugins.items()}
    trtp, _ = trt11_plugin.facade(sources)
    with trt11_plugin.as_tensorrt(trtp):
        register_plugins(folder, plugins)
        with pytest.raises(UserError, match="another build .* process of its own"):
            register_plugins(other, changed)


def build_digest(path):
    from mmtrt.bundle.manifest import sha256_file

    return sha256_file(path)
