"""Built-in models, buildable offline; each can also be described (config, generation config, processor)
without building its weights, for planning."""

from mmtrt.errors import UserError
from mmtrt.recipe import ZOO_MODELS


def _dino(kind: str, weights: bool):
    from mmtrt.zoo import dino_smollm as d

    projector, size = {"dino-smollm": (d.PROJECTOR, d.IMAGE_SIZE),
                       "dino-smollm-tokendrop": (d.TOKEN_DROP_PROJECTOR, d.IMAGE_SIZE),
                       "dino-smollm-page": (d.PAGE_PROJECTOR, d.PAGE_SIZE)}[kind]
    return (d.build_dino_smollm if weights else d.describe_dino_smollm)(projector, size)


def _tiny(weights: bool):
    from mmtrt.zoo.tiny_llava import build_tiny_llava, describe_tiny_llava

    return build_tiny_llava() if weights else describe_tiny_llava()


def _entry(name: str, weights: bool):
    if name == "tiny-llava":
        return _tiny(weights)
    if name in ZOO_MODELS:
        return _dino(name, weights)
    raise UserError(f"unknown zoo model {name!r}; known: {', '.join(ZOO_MODELS)}")


def build_zoo_model(name: str):
    """The PyTorch model and processor of a zoo entry."""
    return _entry(name, weights=True)


def describe_zoo_model(name: str):
    """The config, generation config and processor of a zoo entry, without building its weights."""
    return _entry(name, weights=False)
