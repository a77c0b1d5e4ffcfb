"""A compile's memory follows the checkpoint: a lossless compile's peak RSS, above what compiling a model of no
size takes, stays within 1.5x the checkpoint's bytes, with or without the passes that only rewrite the graph
(kv_layout, fuse_skip_norm, an early-exit draft, fuse_projections, pack_qkv_rotary), and awq_int4 adds to it one
decoder layer's working set; each bundle still gives transformers' greedy tokens (awq_int4's: those of
transformers holding the bundle's dequantized weights, as tests/passes/test_awq_int4.py compares its logits).

The checkpoint is bfloat16 and written tensor by tensor (the test itself never holds the model), with an LLM
deep enough (12 layers, 92M parameters, 184 MB) that the export's float32 graphs, held together, would take 2x
its bytes on their own: the compile keeps the large weights in the source model and widens one at a time as it
writes, and awq_int4 folds and rounds one layer at a time from them (holding the LLM's float32 weights, 12
layers' worth, fails the awq budget of 6). Each compile runs in its own interpreter, whose exact peak (`wait4`'s
ru_maxrss) is read when it exits; the baseline is the same compile of the same architecture at hidden size 128.
"""

import os
import subprocess
import sys

import onnx
import pytest
import torch
from transformers import LlavaForConditionalGeneration

from builders import decided_steps, fake_quantized, hf_greedy, random_image
from conftest import ROOT, module_folder
from mmtrt.runtime import load
from mmtrt.zoo.tiny_llava import describe_tiny_llava

sys.path.insert(0, str(ROOT / "scripts"))
from random_checkpoint import write_checkpoint  # noqa: E402

BUDGET = 1.5  # peak RSS above the baseline, per checkpoint byte
# awq_int4's working set of one decoder layer, in that layer's float32 weight bytes: the weights it folds and
# rounds and their scaled copies, the Gram matrix of the widest input (the down projection's, in float64: 1.4
# layers' bytes at these shapes) and the Cholesky factor it searches through
LAYER_BUDGET = 6
AWQ = ("passes:\n  - awq_int4: {lowering: matmulnbits, accuracy_level: 0, "
       "calibration: {samples: 1, text_windows: 1, search_tokens: 64}}\n")
# the serving recipes' lossless passes, which rewrite the LLM's graph around its weights
STRUCTURE = ("passes:\n  - speculative: {draft: early_exit, layers: 6, k: 4}\n  - fuse_skip_norm: {}\n"
             "  - kv_layout: {layout: static}\n  - fuse_projections: {}\n  - pack_qkv_rotary: {}\n")
HIDDEN, LAYERS = 768, 12
PROMPT = "Describe the image."


def checkpoint(folder, hidden: int) -> int:
    config, generation, processor = describe_tiny_llava(hidden=hidden, layers=LAYERS, heads=8, kv_heads=8)
    return write_checkpoint(folder, LlavaForConditionalGeneration, config, processor, generation, torch.bfloat16)


def compile_peak(folder, out, passes: str = "") -> int:
    """Compile `folder` in a new interpreter, with `passes` (recipe lines); its peak resident bytes."""
    recipe = out.parent / f"{out.name}.yaml"
    recipe.write_text(f"model: {{source: hf, path: {folder}}}\n{passes}")
    log = out.parent / f"{out.name}.log"
    with open(log, "wb") as err:
        child = subprocess.Popen([sys.executable, "-m", "mmtrt.cli", "compile", str(recipe), "-o", str(out)],
                                 stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, "MMTRT_NO_PROGRESS": "1"})
        _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    assert child.returncode == 0, log.read_text()[-2000:]
    return usage.ru_maxrss * 1024


@pytest.fixture(scope="module")
def checkpoints(request, tmp_path_factory):
    with module_folder(request, tmp_path_factory, "memory") as tmp:  # 1 GB of checkpoints and bundles
        checkpoint(tmp / "small", hidden=128)
        yield tmp, checkpoint(tmp / "large", hidden=HIDDEN)


@pytest.fixture(scope="module")
def compiled(checkpoints):
    tmp, weights = checkpoints
    baseline = compile_peak(tmp / "small", tmp / "small.bundle")
    peak = compile_peak(tmp / "large", tmp / "large.bundle")
    return tmp, weights, baseline, peak


@pytest.fixture(scope="module")
def quantized(checkpoints):
    tmp, _ = checkpoints
    return tmp, compile_peak(tmp / "small", tmp / "small.awq", AWQ), compile_peak(tmp / "large", tmp / "large.awq", AWQ)


@pytest.fixture(scope="module")
def restructured(compiled):
    tmp, weights, baseline, _ = compiled
    return tmp, weights, baseline, compile_peak(tmp / "large", tmp / "large.static", STRUCTURE)


def assert_within_budget(peak: int, baseline: int, weights: int) -> None:
    assert peak - baseline <= BUDGET * weights, (
        f"peak {peak / 1e9:.2f} GB, baseline {baseline / 1e9:.2f} GB: {(peak - baseline) / weights:.2f}x the "
        f"checkpoint's {weights / 1e9:.2f} GB")


def test_peak_memory_above_the_baseline_is_within_the_budget(compiled):
    _, weights, baseline, peak = compiled
    assert weights > 150e6
    assert_within_budget(peak, baseline, weights)


def test_passes_that_rewrite_the_graph_keep_the_weights_in_the_source(restructured, rng):
    """kv_layout, fuse_skip_norm, an early-exit draft, fuse_projections and pack_qkv_rotary hold no float32 copy of
    the LLM: the same budget above the bare compile's baseline, and speculative decoding on the static cache gives
    transformers' greedy tokens."""
    tmp, weights, baseline, peak = restructured
    assert_within_budget(peak, baseline, weights)
    model = LlavaForConditionalGeneration.from_pretrained(tmp / "large", dtype=torch.float32).eval()
    pipe = load(tmp / "large.static", threads=2)
    assert pipe.speculative["draft"] == "early_exit"
    assert_greedy_tokens(pipe, model, rng)


def test_awq_int4_adds_one_layers_working_set_to_the_lossless_peak(compiled, quantized):
    """awq_int4's peak over the lossless compile's, less what it adds at hidden size 128 (its calibration data,
    sessions and code), is within LAYER_BUDGET of one layer's float32 weights."""
    _, _, small, large = compiled
    _, small_awq, large_awq = quantized
    layer = 4 * (4 * HIDDEN**2 + 3 * HIDDEN * 3 * HIDDEN)  # q, k, v, o; gate, up, down (intermediate 3x)
    added = (large_awq - large) - (small_awq - small)
    assert added <= LAYER_BUDGET * layer, (
        f"awq_int4 peaks {(large_awq - large) / 1e6:.0f} MB above the lossless compile, {(small_awq - small) / 1e6:.0f}"
        f" MB at no size: {added / layer:.1f}x a layer's {layer / 1e6:.0f} MB, over {LAYER_BUDGET}x")


def test_the_bundle_gives_transformers_greedy_tokens(compiled, rng):
    tmp, *_ = compiled
    model = LlavaForConditionalGeneration.from_pretrained(tmp / "large", dtype=torch.float32).eval()
    assert_greedy_tokens(load(tmp / "large.bundle", threads=2), model, rng)


def test_the_awq_int4_bundle_gives_the_greedy_tokens_of_its_weights(quantized, rng):
    tmp, *_ = quantized
    model = LlavaForConditionalGeneration.from_pretrained(tmp / "large", dtype=torch.float32).eval()
    reference = fake_quantized(model, onnx.load(tmp / "large.awq" / "llm.onnx"), 7 * LAYERS + 1)
    assert_greedy_tokens(load(tmp / "large.awq", threads=2), reference, rng)


def assert_greedy_tokens(pipe, model, rng):
    _, _, processor = describe_tiny_llava(hidden=HIDDEN, layers=LAYERS, heads=8, kv_heads=8)
    for _ in range(5):  # a random image whose first steps are near ties cannot tell right from wrong: draw again
        image = random_image(rng, 64, 64)
        _, want, margins = hf_greedy(model, processor, image, PROMPT, 8)
        decided = decided_steps(margins)
        if decided >= 3:
            break
    assert decided >= 3, f"five random images all had early near ties: {margins}"
    assert pipe.generate(image, PROMPT, max_new_tokens=8).token_ids[:decided] == want[:decided]
