"""Built-in models, buildable offline."""

from mmtrt.errors import UserError


def build_zoo_model(name: str):
    """The PyTorch model and processor of a zoo entry."""
    if name == "tiny-llava":
        from mmtrt.zoo.tiny_llava import build_tiny_llava

        return build_tiny_llava()
    raise UserError(f"unknown zoo model {name!r}; known: tiny-llava")
