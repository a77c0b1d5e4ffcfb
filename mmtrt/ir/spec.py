"""A named tensor with named symbolic dimensions: the contract between components, read by the runtime too.

It lives apart from mmtrt.ir.graph so the runtime reads the manifest's specs without importing onnx.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LOGITS_FROM = "logits_from"  # the LLM input that says from which position on it returns logits (mmtrt.ir.logits)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int | str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "TensorSpec":
        return cls(d["name"], d["dtype"], tuple(d["shape"]))
