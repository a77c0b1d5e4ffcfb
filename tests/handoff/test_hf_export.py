"""`mmtrt export hf`: tiny LLaVA 1.5, LLaVA-OneVision and Qwen2-VL bundles exported, loaded with transformers'
from_pretrained from the folder alone, give the bundle's greedy tokens on fresh random images; the keys are the
Hub's whichever layout the source checkpoint was saved in."""

import json

import numpy as np
import onnx
import pytest
import torch
from builders import decided_steps, dequantized_linears, hf_greedy, random_image
from conftest import ROOT, compile_to
from folder_reference import awq_weight, float_twin, read_tensors
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from mmtrt.cli import main
from mmtrt.handoff.hf_export import export_hf
from mmtrt.runtime import load

PROMPT = "What is in the picture?"
NEW_TOKENS = 8


def _keys(folder):
    with safe_open(folder / "model.safetensors", "np") as f:
        return set(f.keys())


def _model_class(folder):
    import transformers

    return getattr(transformers, json.loads((folder / "config.json").read_text())["architectures"][0])


def _greedy_equal(bundle, folder, rng, size):
    """The exported folder, through transformers alone, decides what the bundle decides."""
    from transformers import AutoProcessor

    model = _model_class(folder).from_pretrained(folder).eval()
    processor = AutoProcessor.from_pretrained(folder)
    pipe = load(bundle, threads=1)
    for _ in range(5):  # a random image whose first steps are near ties cannot tell right from wrong: draw again
        image = random_image(rng, *size)
        ids, want, margins = hf_greedy(model, processor, image, PROMPT, NEW_TOKENS)
        decided = decided_steps(margins)
        if decided >= min(len(margins), 3):
            break
    assert decided >= min(len(margins), 3), f"five random images all had early near ties: {margins}"
    got = pipe.generate(image, PROMPT, max_new_tokens=NEW_TOKENS)
    assert got.prompt_tokens == len(ids)
    assert got.token_ids[:decided] == want[:decided]


@pytest.fixture(scope="module")
def pruned_llava(tmp_path_factory):
    """The tiny LLaVA with its LLM's MLP channel-pruned: the export's config takes the graph's widths."""
    recipe = (ROOT / "recipes" / "tiny-llava.yaml").read_text().replace(
        "  - graph_cleanup: {}\n", "  - channel_prune: {llm: {mlp: 0.25, heads: 0.5}, importance: l2, bias_compensation: false}\n"
        "  - graph_cleanup: {}\n")
    return compile_to(tmp_path_factory.mktemp("pruned"), recipe, "pruned.bundle")


def test_tiny_llava_exports_to_the_hub_layout_and_gives_the_bundles_tokens(tiny_bundle, tmp_path, rng, capsys):
    out = tmp_path / "hf"
    assert main(["export", "hf", str(tiny_bundle), str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    for name in ("config.json", "preprocessor_config.json", "processor_config.json", "tokenizer.json",
                 "chat_template.jinja", "generation_config.json", "model.safetensors", "README.md"):
        assert (out / name).is_file(), name
    keys = _keys(out)
    assert "vision_tower.vision_model.embeddings.patch_embedding.weight" in keys
    assert {"language_model.model.embed_tokens.weight", "language_model.lm_head.weight"} <= keys
    assert not any(k.startswith(("model.", "vision_tower.embeddings", "lm_head")) for k in keys)
    _greedy_equal(tiny_bundle, out, rng, (40, 56))


def test_a_channel_pruned_llm_exports_with_the_graphs_sizes(pruned_llava, tiny, tmp_path, rng):
    out = tmp_path / "hf"
    export_hf(pruned_llava, out)
    config = json.loads((out / "config.json").read_text())["text_config"]
    source = tiny[0].config.text_config
    assert config["intermediate_size"] < source.intermediate_size
    assert config["num_attention_heads"] < source.num_attention_heads
    assert load_file(out / "model.safetensors")["language_model.model.layers.0.mlp.up_proj.weight"].shape[0] == \
        config["intermediate_size"]
    _greedy_equal(pruned_llava, out, rng, (48, 40))


def test_llava_onevision_exports_and_gives_the_bundles_tokens(onevision_bundle, tmp_path, rng):
    out = tmp_path / "hf"
    report = export_hf(onevision_bundle, out)
    assert report["family"] == "llava_onevision" and report["not_expressed"] == []
    keys = _keys(out)
    assert "image_newline" in keys and "vision_tower.vision_model.head.mlp.fc1.weight" in keys
    assert "language_model.lm_head.weight" not in keys  # tied to the embedding, as the config says
    _greedy_equal(onevision_bundle, out, rng, (50, 70))


def test_qwen2_vl_exports_and_gives_the_bundles_tokens(qwen_bundle, tmp_path, rng):
    bundle = qwen_bundle("qwen2_vl")
    out = tmp_path / "hf"
    export_hf(bundle, out)
    keys = _keys(out)
    assert "visual.patch_embed.proj.weight" in keys and "model.embed_tokens.weight" in keys
    assert not any(k.startswith(("model.visual", "model.language_model")) for k in keys)
    _greedy_equal(bundle, out, rng, (56, 84))


def test_new_and_hub_layout_sources_export_the_same_hub_folder(tiny, tiny_bundle, tmp_path):
    """transformers 5 saves the tower without its `vision_model` level; the Hub's checkpoints have it. Both load,
    and both export to the same keys and tensors."""
    model, processor = tiny
    new, hub = tmp_path / "new", tmp_path / "hub"
    model.save_pretrained(new)
    processor.save_pretrained(new)
    saved = load_file(new / "model.safetensors")
    assert any(k.startswith("vision_tower.embeddings.") for k in saved)
    model.save_pretrained(hub)
    processor.save_pretrained(hub)
    save_file({k.replace("vision_tower.", "vision_tower.vision_model.", 1): v for k, v in saved.items()},
              hub / "model.safetensors", metadata={"format": "pt"})
    outs = [export_hf(tiny_bundle, tmp_path / f"out-{s.name}", source=s)["out"] for s in (new, hub)]
    first, second = (load_file(f"{o}/model.safetensors") for o in outs)
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    assert "vision_tower.vision_model.embeddings.patch_embedding.weight" in first


def test_a_token_pruned_bundle_says_in_one_line_what_the_folder_does_not_hold(tmp_path, capsys):
    recipe = (ROOT / "recipes" / "tiny-llava.yaml").read_text().replace(
        "  - graph_cleanup: {}\n", "  - graph_cleanup: {}\n  - token_prune: {keep: 16, method: norm}\n")
    bundle = compile_to(tmp_path, recipe)
    assert main(["export", "hf", str(bundle), str(tmp_path / "hf")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("not expressed: token_prune: the folder's vision tower gives every image token, not "
                               "the bundle's 16 per image") and len(lines) == 2
    assert "token_prune" in (tmp_path / "hf" / "README.md").read_text()


def test_bad_input_is_one_line_and_writes_nothing(tiny_bundle, tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    assert main(["export", "hf", str(tiny_bundle), str(out)]) == 2
    assert capsys.readouterr().err.strip().endswith(f"{out} exists; name a new folder for the export (or remove that one)")
    assert list(out.iterdir()) == []
    assert main(["export", "hf", str(tmp_path / "missing"), str(tmp_path / "hf")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1 and not (tmp_path / "hf").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]


AWQ = ("  - awq_int4: {group_size: 32, lowering: matmulnbits, accuracy_level: 0, "
       "calibration: {samples: 2, text_windows: 1}}\n")


@pytest.fixture(scope="module")
def awq_llava(tmp_path_factory):
    recipe = (ROOT / "recipes" / "tiny-llava.yaml").read_text().replace("  - graph_cleanup: {}\n", AWQ)
    return compile_to(tmp_path_factory.mktemp("awq"), recipe, "awq.bundle")


def test_an_awq_int4_llm_exports_as_autoawq_gemm_holding_the_bundles_int4_weights(awq_llava, tmp_path, rng):
    """transformers' AWQ loader needs gptqmodel, which does not install here: the packing is checked against the
    format, the weights against the bundle's graph, and the tokens with the folder dequantized into a float one."""
    out = tmp_path / "hf"
    assert export_hf(awq_llava, out)["quantization"] == "awq"
    config = json.loads((out / "config.json").read_text())
    quant = config["quantization_config"]
    assert {k: quant[k] for k in ("quant_method", "version", "bits", "group_size", "zero_point")} == \
        {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": 32, "zero_point": True}
    tensors = read_tensors(out)
    graph = dequantized_linears(onnx.load(awq_llava / "llm.onnx"))
    prefix = "language_model.model."
    dense = {}
    for name, (weight, _) in graph.items():
        layer, role = name.removeprefix("llm.layers.").split(".") if name != "llm.lm_head" else (None, "lm_head")
        module = "language_model.lm_head" if layer is None else \
            f"{prefix}layers.{layer}.{'self_attn' if role[0] in 'qkvo' else 'mlp'}.{role}"
        if f"{module}.qweight" in tensors:
            assert tensors[f"{module}.qweight"].dtype == np.int32 and module not in quant["modules_to_not_convert"]
            dense[module] = awq_weight(tensors, module, 32)
        else:  # o_proj's input is scaled first (GQA: no v_proj to fold into); lm_head stays float in AWQ
            assert module == "language_model.lm_head" or module in quant["modules_to_not_convert"]
            dense[module] = tensors[f"{module}.weight"]
        np.testing.assert_array_equal(dense[module], weight.astype(np.float32))
    assert sum(f"{m}.qweight" in tensors for m in dense) >= 4 * 6
    _greedy_equal(awq_llava, float_twin(out, tmp_path / "dense", dense), rng, (44, 60))
