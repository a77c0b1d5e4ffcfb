"""Calibrating and budgeting on the user's own data: the recipe's images, prompts and text reach the passes, the
qa suite scores known answers, the label-free agreement budget works on a saved checkpoint, and a blown budget
stops the compile naming the pass."""

import copy
import json

import numpy as np
import pytest
import torch
from PIL import Image

from builders import random_image
from mmtrt.cli import main
from mmtrt.eval import userdata
from mmtrt.eval.agreement import agreement_suite
from mmtrt.ir.frontend import lower
from mmtrt.quant.calibration import calibration_batches, load_recipe_data, recipe_data
from mmtrt.recipe import CalibrationData
from mmtrt.runtime import load
from passes.prune.channel_prune import ChannelPrune

PROMPTS = ["What is in the picture?", "Describe the colours please."]


def write_images(folder, rng, sizes):
    folder.mkdir(parents=True, exist_ok=True)
    for i, (h, w) in enumerate(sizes):
        random_image(rng, h, w).save(folder / f"{i}.png")
    return sorted(folder.glob("*.png"))


def compile_recipe_text(tmp_path, text):
    (tmp_path / "r.yaml").write_text(text)
    return main(["compile", str(tmp_path / "r.yaml"), "-o", str(tmp_path / "out.bundle")])


def test_recipe_images_prompts_and_text_are_what_calibration_runs(tiny, tmp_path, rng):
    """Against transformers: each LLM sequence is the processor's tokens of that image's own prompt, embedded by
    the model's table, with the model's image features in the image rows; the text is the tokenizer's."""
    model, processor = tiny
    images = write_images(tmp_path / "imgs", rng, [(64, 64), (64, 64)])
    (tmp_path / "cal.jsonl").write_text(json.dumps({"image": "imgs/1.png", "prompt": PROMPTS[1]}) + "\n")
    (tmp_path / "notes.txt").write_text("A short note about the pictures, for the language model.")
    config = CalibrationData(images="imgs", prompt=PROMPTS[0], jsonl="cal.jsonl", text=["notes.txt"])
    data = load_recipe_data(config, tmp_path)
    assert [s.image for s in data.samples] == images + [images[1]] and data.samples[2].prompt == PROMPTS[1]
    ir = lower(model, processor)
    with recipe_data(data):
        batches = calibration_batches(ir, "recipe", 3, 1, "recipe")
    sequences = [seq for feeds in batches.llm for seq in feeds["inputs_embeds"]]
    table = model.get_input_embeddings().weight.detach().numpy()
    expected = []
    for sample in data.samples:
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": sample.prompt}]}]
        inputs = processor(images=Image.open(sample.image).convert("RGB"),
                           text=processor.apply_chat_template(messages, add_generation_prompt=True), return_tensors="pt")
        ids = inputs["input_ids"][0].numpy()
        with torch.no_grad():
            features = model.get_image_features(pixel_values=inputs["pixel_values"])
        features = (features.pooler_output if hasattr(features, "pooler_output") else features)
        features = torch.cat(list(features)) if isinstance(features, (list, tuple)) else features
        want = table[ids].copy()
        want[ids == model.config.image_token_id] = features.reshape(-1, want.shape[-1]).numpy()
        expected.append(want)
    text_ids = processor.tokenizer(data.text, add_special_tokens=False)["input_ids"]
    expected.append(table[text_ids])
    assert len(sequences) == len(expected) and len(batches.vision) >= 1
    for want in expected:  # batches group sequences by length, so match each expected one by shape and value
        match = [s for s in sequences if s.shape == want.shape and np.allclose(s, want, atol=1e-4)]
        assert match, f"no calibration sequence equals the reference of shape {want.shape}"
    prune = ChannelPrune(ChannelPrune.Config(vision={"mlp": 0.5}, llm={"mlp": 0.5},
                                             calibration={"images": "recipe", "samples": 3, "text": "recipe"}))
    with recipe_data(data):
        report = prune.run(ir)
    assert report["vision"]["params_removed"] > 0 and report["llm"]["params_removed"] > 0


@pytest.fixture
def qa_files(tmp_path, rng, tiny_bundle):
    """Three questions whose labels are the unmodified bundle's own greedy answers for two, a wrong one for one."""
    images = write_images(tmp_path / "imgs", rng, [(64, 64), (80, 60), (50, 90)])
    pipe = load(tiny_bundle)
    answers = [pipe.generate(img, PROMPTS[i % 2], max_new_tokens=3).text for i, img in enumerate(images)]
    rows = [{"image": f"imgs/{p.name}", "prompt": PROMPTS[i % 2], "answer": a} for i, (p, a) in enumerate(zip(images, answers))]
    rows[2]["answer"] = answers[2] + " certainly not this"
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"prompt": "Say something."}, {"image": "imgs/0.png", "prompt": PROMPTS[0]}]))
    (tmp_path / "notes.txt").write_text("Plain English words for the calibration of the language model. " * 12)
    return tmp_path


def test_own_data_recipe_records_baseline_final_and_per_pass_cost(qa_files, capsys):
    recipe = """model: {source: zoo, name: tiny-llava}
calibration: {images: imgs, prompt: "What is in the picture?", text: [notes.txt]}
passes:
  - dead_layer_elimination: {}
  - awq_int4: {group_size: 16, calibration: {images: recipe, samples: 3, text: recipe, text_windows: 1}}
evaluate:
  suites: [qa]
  qa: {data: qa.jsonl, scorer: exact, max_new_tokens: 3}
  agreement: {data: prompts.jsonl, max_new_tokens: 6}
budgets: {qa_accuracy_drop: 100, agreement_top1_drop: 100, agreement_kl_increase: 100}
"""
    assert compile_recipe_text(qa_files, recipe) == 0, capsys.readouterr().err
    capsys.readouterr()
    manifest = json.loads((qa_files / "out.bundle" / "manifest.json").read_text())
    ev = manifest["evaluation"]
    assert ev["baseline"]["qa.accuracy_pct"] == pytest.approx(200 / 3, abs=0.01)  # 2 of 3 labels are its answers
    assert ev["baseline"]["agreement.top1_agreement_pct"] == 100.0 and ev["baseline"]["agreement.mean_kl"] < 1e-6
    assert ev["suites"]["agreement"]["samples"]["prompts"] == 2
    assert [p["pass"] for p in ev["lossy_passes"]] == ["awq_int4"] and ev["lossy_passes"][0]["index"] == 1
    final, base = ev["final"], ev["baseline"]
    assert ev["total_cost"] == {
        "qa_accuracy_drop": round(base["qa.accuracy_pct"] - final["qa.accuracy_pct"], 2),
        "agreement_top1_drop": round(base["agreement.top1_agreement_pct"] - final["agreement.top1_agreement_pct"], 3),
        "agreement_kl_increase": float(f"{final['agreement.mean_kl'] - base['agreement.mean_kl']:.4g}")}
    assert ev["total_cost"]["agreement_kl_increase"] > 0  # 4-bit weights move the distribution
    assert manifest["calibration_data"]["images"] == 3
    assert manifest["passes"][1]["changes"]["llm"]["linears_quantized"] > 0
    # the same suites from the command line, on the written bundle, give the final numbers
    assert main(["eval", str(qa_files / "out.bundle"), "--suite", "qa", "--data", str(qa_files / "qa.jsonl"),
                 "--scorer", "exact", "--max-new-tokens", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["metrics"]["accuracy_pct"] == final["qa.accuracy_pct"]


def test_agreement_budget_on_a_saved_checkpoint_with_only_a_prompts_file(siglip_checkpoint, tmp_path, capsys):
    (tmp_path / "prompts.txt").write_text("Tell me a story.\n\nWhat is two and two?\nName a colour.\n")
    recipe = f"""model: {{source: hf, path: {siglip_checkpoint}}}
passes:
  - awq_int4: {{method: rtn, group_size: 16, calibration: {{images: none, text_windows: 1}}}}
evaluate: {{agreement: {{data: prompts.txt, max_new_tokens: 8}}}}
budgets: {{agreement_top1_drop: 100, agreement_kl_increase: 100}}
"""
    assert compile_recipe_text(tmp_path, recipe) == 0, capsys.readouterr().err
    ev = json.loads((tmp_path / "out.bundle" / "manifest.json").read_text())["evaluation"]
    assert ev["suites"] == {"agreement": {"samples": {"prompts": 3, "positions": ev["suites"]["agreement"]["samples"]["positions"]}}}
    assert ev["baseline"]["agreement.top1_agreement_pct"] == 100.0
    assert ev["lossy_passes"][0]["pass"] == "awq_int4" and ev["total_cost"]["agreement_kl_increase"] > 0


def test_an_exceeded_agreement_budget_fails_naming_the_pass(tmp_path, capsys):
    (tmp_path / "prompts.txt").write_text("Tell me a story.\nWhat is two and two?\n")
    recipe = """model: {source: zoo, name: tiny-llava}
passes:
  - graph_cleanup: {}
  - awq_int4: {method: rtn, group_size: 16, calibration: {images: none, text_windows: 1}}
evaluate: {agreement: {data: prompts.txt, max_new_tokens: 8}}
budgets: {agreement_kl_increase: 0.000001}
"""
    assert compile_recipe_text(tmp_path, recipe) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mmtrt: error: accuracy budget exceeded: agreement_kl_increase ")
    assert "(passes[1] awq_int4 cost agreement_top1_drop " in err and len(err.splitlines()) == 1
    assert not list(tmp_path.glob("out.bundle*"))


def test_agreement_equals_transformers_between_two_models(tiny_bundle, rng):
    """The bundle of tiny-llava against a source with perturbed weights: the suite's top-1 agreement and KL equal
    those of the two PyTorch models compared directly (the bundle matches its own model to about 1e-5)."""
    from mmtrt.zoo.tiny_llava import build_tiny_llava

    ours, processor = build_tiny_llava()
    other = copy.deepcopy(ours)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.from_numpy(rng.normal(0, 0.02, p.shape).astype(np.float32)))
    samples = [userdata.Sample(None, "Tell me about the sea.", None, "a:1"),
               userdata.Sample(None, "Count to five.", None, "a:2")]
    got = agreement_suite(load(tiny_bundle), None, samples, (other, processor), max_new_tokens=8)
    agree = positions = 0
    kl = 0.0
    for s in samples:
        text = processor.apply_chat_template([{"role": "user", "content": [{"type": "text", "text": s.prompt}]}],
                                             add_generation_prompt=True)
        inputs = processor(text=text, return_tensors="pt")
        n = inputs["input_ids"].shape[1]
        with torch.no_grad():
            out = other.generate(**inputs, max_new_tokens=8, do_sample=False)
            ref = other(input_ids=out[:, :-1]).logits[0, n - 1:].double().log_softmax(-1)
            mine = ours(input_ids=out[:, :-1]).logits[0, n - 1:].double().log_softmax(-1)
        agree += int((ref.argmax(-1) == mine.argmax(-1)).sum())
        kl += float((ref.exp() * (ref - mine)).sum())
        positions += out.shape[1] - n
    assert got["samples"] == {"prompts": 2, "positions": positions}
    assert got["metrics"]["top1_agreement_pct"] == pytest.approx(100 * agree / positions, abs=100 / positions + 1e-9)
    assert got["metrics"]["mean_kl"] == pytest.approx(kl / positions, rel=1e-3)
    assert kl > 0


def test_eval_agreement_on_a_lossless_bundle_agrees_with_its_source(tiny_bundle, tmp_path, capsys):
    """`mmtrt eval --suite agreement`: the source in its own dtype, computing in float32 (ir/source_float32.py),
    agrees with its lossless bundle on every position."""
    (tmp_path / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    assert main(["eval", str(tiny_bundle), "--suite", "agreement", "--data", str(tmp_path / "prompts.txt"),
                 "--max-new-tokens", "6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["samples"]["prompts"] == 2 and out["metrics"]["top1_agreement_pct"] == 100.0
    assert out["metrics"]["mean_kl"] < 1e-6
