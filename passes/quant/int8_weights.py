"""int8_weights: the linears of the vision component (the vision tower, and the projector unless excluded), or of
the LLM, as INT8 with one scale per output channel: weight-only (DequantizeLinear in front of each MatMul) or with
the activations quantized at run time (`activations: dynamic`, DynamicQuantizeMatMul).

awq_int4 leaves the vision tower in float by default; the tower is the bundle's largest float part after the LLM
is in INT4 and the embedding in int8. Per-channel INT8 of the weights needs no calibration and is the weight-only
form TensorRT and ONNX Runtime both run; the dynamic form is what makes a CPU's prefill and vision encoder faster
(mmtrt/quant/int8_weights.py). Place it after `recover`, which refits the float projector (or exclude the
projector: `exclude: [vision.linear.*]`, the names the report lists), and after the passes that read float
linears (awq_int4, channel_prune, fuse_projections' float MatMuls).
"""

from __future__ import annotations

import fnmatch
from typing import Any

from mmtrt.ir.graph import ModelIR
from mmtrt.pipeline.pass_base import Pass
from mmtrt.quant.int8_weights import int8_weight_linears
from passes.quant.int8_weights_config import Int8WeightsConfig


class Int8Weights(Pass):
    name = "int8_weights"
    Config = Int8WeightsConfig
    components = ("vision", "llm")
    lossy = True
    reads_source_weights = True  # widens one selected weight at a time; the others stay in the source model

    def run(self, ir: ModelIR) -> dict[str, Any]:
        cfg = self.config

        def select(name: str) -> bool:
            return (any(fnmatch.fnmatchcase(name, p) for p in cfg.include)
                    and not any(fnmatch.fnmatchcase(name, p) for p in cfg.exclude))

        return {name: int8_weight_linears(ir.components[name].onnx, name, select, cfg.activations)
                for name in cfg.components}
