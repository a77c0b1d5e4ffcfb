"""Built-in models, buildable offline."""

from mmtrt.errors import UserError
from mmtrt.recipe import ZOO_MODELS


def build_zoo_model(name: str):
    """The PyTorch model and processor of a zoo entry."""
    if name == "tiny-llava":
        from mmtrt.zoo.tiny_llava import build_tiny_llava

        return build_tiny_llava()
    if name == "dino-smollm":
        from mmtrt.zoo.dino_smollm import build_dino_smollm

        return build_dino_smollm()
    if name == "dino-smollm-tokendrop":
        from mmtrt.zoo.dino_smollm import TOKEN_DROP_PROJECTOR, build_dino_smollm

        return build_dino_smollm(TOKEN_DROP_PROJECTOR)
    if name == "dino-smollm-page":
        from mmtrt.zoo.dino_smollm import PAGE_PROJECTOR, PAGE_SIZE, build_dino_smollm

        return build_dino_smollm(PAGE_PROJECTOR, PAGE_SIZE)
    raise UserError(f"unknown zoo model {name!r}; known: {', '.join(ZOO_MODELS)}")
