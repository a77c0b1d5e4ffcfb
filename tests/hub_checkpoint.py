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
