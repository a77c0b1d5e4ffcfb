"""The tensorrt.plugin registration, read as source (TensorRT is not installed here, so it cannot be imported):
every catalog plugin is registered with shapes, autotune and an AOT implementation; the attributes it declares
are the ones fuse_plugins writes on the node; every kernel it can name is in the PTX."""

import ast
import itertools
import re

import pytest

from mmtrt.kernels import build
from mmtrt.kernels.bundle import REGISTRATION
from mmtrt.kernels.catalog import PLUGINS

TREE = ast.parse(REGISTRATION.read_text())


def decorated(kind: str) -> dict[str, ast.FunctionDef]:
    found = {}
    for node in TREE.body:
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == kind:
                    found[d.args[0].value] = node
    return found


def test_every_plugin_has_register_autotune_and_aot_impl():
    ids = {spec.plugin_id for spec in PLUGINS.values()}
    for kind in ("register", "autotune", "aot_impl"):
        assert set(decorated(kind)) == ids, kind


@pytest.mark.parametrize("key", sorted(PLUGINS))
def test_registered_attributes_are_the_node_attributes(key):
    spec = PLUGINS[key]
    for kind in ("register", "aot_impl"):
        fn = decorated(kind)[spec.plugin_id]
        names = [a.arg for a in fn.args.args if ast.unparse(a.annotation or ast.Constant("")) != "trtp.TensorDesc"]
        attributes = [n for n in names if n not in ("outputs", "tactic")]
        assert attributes == list(spec.attributes), kind


def test_shared_memory_formula_matches_the_header():
    """The AOT launch's shared memory is token_select_smem_floats (token_select.h) in bytes."""
    header = (build.SOURCE_DIR / "token_select.h").read_text()
    assert "return s.kv_len + 2 * s.tokens + s.keep + kTokenSelectThreads + s.tokens + s.contextual * (s.head_dim + 2);" in header
    body = ast.unparse(next(n for n in TREE.body if isinstance(n, ast.FunctionDef) and n.name == "_token_select_smem"))
    assert "4 * (kv_len + 3 * tokens + keep + TOKEN_SELECT_THREADS + contextual * (head_dim + 2))" in body


def test_scored_shared_memory_matches_the_header():
    """TokenSelectScored / TokenSelectDynamic launch with scored_smem_words (token_budget.h) in bytes."""
    header = (build.SOURCE_DIR / "token_budget.h").read_text()
    assert "return 4 * s.tokens + s.keep + 1;" in header
    body = ast.unparse(next(n for n in TREE.body if isinstance(n, ast.FunctionDef) and n.name == "_scored_launch"))
    assert "params.shared_mem = 4 * (4 * tokens + rows + 1)" in body


def test_every_kernel_the_registration_can_name_is_in_the_ptx():
    if build.nvcc() is None:
        pytest.skip("nvcc is not installed: no PTX to read")
    entries = set(re.findall(r"\.visible \.entry (\w+)\(", build.device_code().ptx.read_text()))
    suffixes = ("f32", "f16", "bf16")
    assert {f"mmtrt_token_select{m}_{s}" for m in ("", "_merge", "_scored", "_dynamic") for s in suffixes} <= entries
    # Int4GroupGemm's autotune: x, pre and y share a type; the scales are that type or fp32
    pairs = {(s, s) for s in suffixes} | {(s, "f32") for s in ("f16", "bf16")}
    assert {f"mmtrt_int4_gemm_{x}_{s}" for x, s in pairs} <= entries
    assert not {e for e in entries if e.startswith("mmtrt_int4_gemm_")} - {f"mmtrt_int4_gemm_{x}_{s}" for x, s in itertools.product(suffixes, suffixes)}
