"""A tiny LLaVA checkpoint in the Hugging Face Hub's key layout, which vLLM reads (`vision_tower.vision_model.*`;
transformers saves `vision_tower.*`), for the vLLM hand-off tests: one folder that both `mmtrt compile` and vLLM load."""

from pathlib import Path

from safetensors.torch import load_file, save_file

from mmtrt.zoo.tiny_llava import build_tiny_llava

HUB_VISION = "vision_tower.vision_model."


def save_hub_llava(folder: Path, **sizes) -> Path:
    model, processor = build_tiny_llava(**sizes)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    weights = folder / "model.safetensors"
    tensors = load_file(weights)
    renamed = {HUB_VISION + k.removeprefix("vision_tower.") if k.startswith("vision_tower.")
               and not k.startswith(HUB_VISION) else k: v for k, v in tensors.items()}
    save_file(renamed, weights, metadata={"format": "pt"})
    return folder


ENVELOPE = ("envelope:\n  batch: {min: 1, opt: 1, max: 4}\n  prompt_tokens: {min: 1, opt: 48, max: 256}\n"
            "  max_new_tokens: 24\n")
PRUNED_TOKENS = 32  # token_prune keep 0.5 of the tiny LLaVA's 64 patches


def compile_plain_and_pruned(folder: Path) -> dict[str, Path]:
    """The checkpoint compiled twice: lossless passes only, and with token_prune (keep 0.5)."""
    from conftest import compile_to

    head = f"model: {{source: hf, path: {folder}}}\npasses:\n  - dead_layer_elimination: {{}}\n"
    return {"plain": compile_to(folder.parent, head + ENVELOPE, "plain.bundle"),
            "pruned": compile_to(folder.parent, head + "  - token_prune: {keep: 0.5}\n" + ENVELOPE, "pruned.bundle")}
