"""The options of `graph_cleanup`, apart from the pass so that a recipe is validated without torch or onnx."""

from __future__ import annotations

from pydantic import Field

from mmtrt.pipeline.pass_config import PassConfig


class GraphCleanupConfig(PassConfig):
    fold_constants: bool = Field(True, description="Evaluate subgraphs whose inputs are all constants and store the results.")
