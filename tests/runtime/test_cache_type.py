"""kv_layout after cast_precision stores the cache in the LLM's fp16 without being told: half the memory of the fp32
bundle's buffers, no Casts at the cache I/O, and the tokens of the same fp16 bundle's growing (hf) cache."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from builders import FP16_NEAR_TIE, assert_same_up_to_near_ties, random_image
from conftest import ROOT, compile_to
from mmtrt.cli import main
from mmtrt.compiler import compile_recipe
from mmtrt.runtime import load

FP16 = (ROOT / "recipes" / "tiny-llava-fp16.yaml").read_text()
PROMPTS = ["What is in the picture?", "Describe it", "red cat under the blue table near a window " * 3]


def with_layout(text: str) -> str:
    return FP16.replace("envelope:", text + "envelope:")


@pytest.fixture(scope="module")
def fp16_hf(tmp_path_factory):
    return load(compile_recipe(ROOT / "recipes" / "tiny-llava-fp16.yaml", tmp_path_factory.mktemp("hf16") / "b"))


@pytest.fixture(scope="module", params=["static", "paged"])
def layouts(request, tmp_path_factory):
    """(fp16 bundle with the layout, the fp32 bundle with the same layout)."""
    half = compile_to(tmp_path_factory.mktemp(f"{request.param}16"),
                      with_layout(f"  - kv_layout: {{layout: {request.param}}}\n"), "b")
    return half, request.getfixturevalue(f"tiny_{request.param}_bundle")


def cache_bytes(pipe) -> int:
    return sum(a.nbytes for a in pipe.stepper.cache.host.values())


def test_the_cache_takes_the_llm_type_and_half_the_memory(layouts):
    half_bundle, full_bundle = layouts
    half, full = load(half_bundle), load(full_bundle)
    assert half.kv["dtype"] == "float16" and full.kv["dtype"] == "float32"
    assert all(a.dtype == np.float16 for a in half.stepper.cache.host.values())
    assert cache_bytes(half) * 2 == cache_bytes(full) > 0
    graph = onnx.load(half_bundle / "llm.onnx", load_external_data=False).graph
    cache_io = {v.name for v in [*graph.input, *graph.output] if v.name.startswith(("past.", "present."))}
    assert not [n.name for n in graph.node if n.op_type == "Cast" and set(n.input) & cache_io], "casts at cache I/O"
    assert not [n.name for n in graph.node if n.op_type == "Cast" and set(n.output) & cache_io]


def test_tokens_equal_the_fp16_bundle_growing_cache(layouts, fp16_hf, rng):
    pipe = load(layouts[0])
    for prompt in PROMPTS:
        image = random_image(rng, int(rng.integers(30, 100)), int(rng.integers(30, 100)))
        ours, ref = pipe.generate(image, prompt, 16), fp16_hf.generate(image, prompt, 16)
        assert_same_up_to_near_ties(ours, ref, FP16_NEAR_TIE)


def test_an_fp32_cache_after_cast_precision_is_refused_at_plan_time(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(with_layout("  - kv_layout: {layout: static, cache_dtype: fp32}\n"))
    assert main(["compile", str(recipe), "--plan"]) == 2
    err = capsys.readouterr().err
    assert "cache_dtype fp32 on an LLM that cast_precision lowered to float16; drop cache_dtype" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "r.bundle").exists()


@pytest.mark.parametrize("recipe_text", [
    FP16.replace("dtype: fp16", "dtype: bf16").replace("envelope:", "  - kv_layout: {layout: static}\nenvelope:"),
    (ROOT / "recipes" / "tiny-llava.yaml").read_text().replace(
        "envelope:", "  - kv_layout: {layout: paged, cache_dtype: bf16}\nenvelope:")])
def test_a_bf16_cache_is_refused_at_plan_time(recipe_text, tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(recipe_text)
    assert main(["compile", str(recipe), "--plan"]) == 2
    err = capsys.readouterr().err
    assert "a bfloat16 KV cache does not run: ONNX Runtime's CPU GroupQueryAttention has no bfloat16 kernel" in err
    assert len(err.strip().splitlines()) == 1


def test_onnx_runtime_still_has_no_cpu_bf16_group_query_attention():
    """Why bf16 is refused; when this fails, ONNX Runtime gained the kernel and the refusal can go."""
    heads, kv_heads, dim, capacity = 4, 2, 8, 16
    bf16, i32 = onnx.TensorProto.BFLOAT16, onnx.TensorProto.INT32
    shapes = {"q": [1, 3, heads * dim], "k": [1, 3, kv_heads * dim], "v": [1, 3, kv_heads * dim],
              "past_k": [1, kv_heads, capacity, dim], "past_v": [1, kv_heads, capacity, dim]}
    inputs = [onnx.helper.make_tensor_value_info(n, bf16, s) for n, s in shapes.items()]
    inputs += [onnx.helper.make_tensor_value_info("seqlens", i32, [1]),
               onnx.helper.make_tensor_value_info("total", i32, [])]
    node = onnx.helper.make_node("GroupQueryAttention", [i.name for i in inputs], ["o", "pk", "pv"],
                                 domain="com.microsoft", num_heads=heads, kv_num_heads=kv_heads)
    graph = onnx.helper.make_graph([node], "g", inputs, [onnx.helper.make_tensor_value_info(n, bf16, None)
                                                         for n in ("o", "pk", "pv")])
    model = onnx.helper.make_model(graph, ir_version=10, opset_imports=[
        onnx.helper.make_opsetid("", 23), onnx.helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(Exception, match="NOT_IMPLEMENTED|Could not find an implementation"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
