"""awq_int4: 4-bit weights for the LLM's linear layers (and the vision encoder's, when asked) with AWQ.

AWQ as published (Lin et al., MLSys 2024), run on the IR itself: the component's graph runs in ONNX Runtime on
calibration data (digit images with the digits prompt through the real vision path, plus English text, or the
recipe's own images, prompts and text: `calibration: {images: recipe, text: recipe}`) with the
inputs of its linears exposed; per group of linears sharing an input, the per-channel scale mean|x|^alpha is
searched over 20 alphas with the error measured at the module the group feeds (the attention block for q/k/v,
the MLP for gate/up, both run from the graph's own nodes; o_proj, down_proj and lm_head at their own outputs);
1/s folds into the normalisation before q/k/v, gate/up and lm_head and into up_proj's rows before down_proj, and
stays a pre-quant Mul before o_proj; then each weight group's clipping range is searched (not for q and k).
`method: rtn` quantizes the same weights to nearest (the baseline). Deviation from the reference code: the error
is measured on a token budget (`calibration.search_tokens`) rather than on every calibration token.
`method: gptq` / `awq_gptq` round with GPTQ's error compensation instead (mmtrt/quant/gptq.py, optionally in
act-order); `float_budget_mib` keeps the most sensitive linears in float or fp16 (mixed.py; by own output error, or by
the source model's Fisher sensitivity, fisher.py), the TensorRT-compatible INT4 of docs/results/int4-tensorrt.md.

Lowering: `com.microsoft.MatMulNBits` for ONNX Runtime; INT4 initializer -> DequantizeLinear (blocked, symmetric)
-> MatMul for TensorRT, which ONNX Runtime also runs by fusing the pair into MatMulNBits itself. With `auto` the
LLM gets the TensorRT form when its partition offers TensorRT (a MatMulNBits would cut every TensorRT segment at
each linear), MatMulNBits otherwise. When the LLM's partition lists tensorrt-llm, a W4A16_AWQ checkpoint goes into
the bundle at trtllm/checkpoint; the manifest's `tensorrt_llm.command` builds it.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from mmtrt.errors import UserError
from mmtrt.ir.graph import ModelIR
from mmtrt.pipeline.pass_base import Pass
from mmtrt.pipeline.source import current_source
from mmtrt.quant.calibration import calibration_batches, image_embeds
from mmtrt.quant.embedding import int8_embedding
from mmtrt.quant.fisher import fisher_scores, source_deltas, source_linears
from mmtrt.quant.int4 import Grid
from mmtrt.quant.linears import find_linears
from mmtrt.quant.quantize import QuantizedLinear, Settings, quantize_component
from mmtrt.handoff.trtllm_export import NotExportable, checkpoint_assets
from passes.quant.awq_int4_config import AwqInt4Config

TENSORRT_BLOCKS = (64, 128)


class AwqInt4(Pass):
    name = "awq_int4"
    Config = AwqInt4Config
    components = ("vision", "embed", "llm")
    lossy = True
    reads_source_weights = True  # one layer's float weights at a time (mmtrt/quant/layer_rewrite.py)

    def plan_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        if self.config.sensitivity == "fisher" and facts["llm"].get("rope") == "mrope":
            raise UserError("awq_int4 sensitivity: fisher runs the source model on the calibration embeddings with "
                            "one row of positions; this LLM's M-RoPE takes three rows from each image's grid; use "
                            "sensitivity: output_error")
        if self.config.trtllm_checkpoint == "always" and facts["llm"].get("trtllm_refused"):
            raise UserError(f"trtllm_checkpoint: always: {facts['llm']['trtllm_refused']}; use trtllm_checkpoint: "
                            "auto or never (the LLM runs on ONNX Runtime or TensorRT)")
        return facts

    def run(self, ir: ModelIR) -> dict:
        cfg = self.config
        cal = cfg.calibration
        batches = calibration_batches(ir, cal.images, cal.samples, cal.text_windows, cal.text)
        changes, llm_quantized = {}, None
        # every decoder linear's output before quantization: a mixed TensorRT-LLM checkpoint finds its float ones
        outputs = {(lin.layer, lin.role): lin.output for lin in find_linears(ir.components["llm"].onnx, "llm")[1]}
        for name in ("vision", "llm"):
            if name in cfg.components:
                lowering, why = self._lowering(ir.components[name])
                settings = self._settings(lowering, self._task_sensitivity(ir) if name == "llm" else None,
                                          keep_arrays=name == "llm" and self._writes_checkpoint(ir))
                quantized, report = quantize_component(
                    ir.components[name].onnx, name, batches.vision if name == "vision" else batches.llm, settings)
                changes[name] = _summary(quantized, report, lowering, why, cfg.group_size)
                llm_quantized = quantized if name == "llm" else llm_quantized
        if cfg.embedding == "int8":
            changes["embed"] = int8_embedding(ir.components["embed"].onnx)
        if llm_quantized is not None:  # after the embedding: the checkpoint holds the rows the embed graph gives
            changes["trtllm_checkpoint"] = self._checkpoint(ir, llm_quantized, outputs)
        return changes

    def _settings(self, lowering: str, sensitivity=None, keep_arrays: bool = False) -> Settings:
        cfg = self.config

        def select(name: str) -> bool:
            return (any(fnmatch.fnmatchcase(name, p) for p in cfg.include)
                    and not any(fnmatch.fnmatchcase(name, p) for p in cfg.exclude))

        grid = Grid(cfg.group_size, cfg.symmetric, cfg.zero_point == "float")
        return Settings(cfg.method, grid, cfg.clip, lowering, cfg.accuracy_level, cfg.calibration.search_tokens, select,
                        int(cfg.float_budget_mib * 2**20), cfg.float_dtype, cfg.act_order, sensitivity, keep_arrays)

    def _task_sensitivity(self, ir: ModelIR):
        """The Fisher scorer of the LLM's linears on the calibration images, None unless the recipe asks for it."""
        cfg = self.config
        if cfg.sensitivity != "fisher":
            return None
        source = current_source()
        if source is None:
            raise UserError("awq_int4 sensitivity: fisher needs the source model, which only `mmtrt compile` holds; "
                            "run it from a recipe")
        llava, embeds = source[0], image_embeds(ir, cfg.calibration.images, cfg.calibration.samples)
        linears = source_linears(llava)
        return lambda lowered: fisher_scores(llava, embeds, source_deltas(linears, lowered))

    def _lowering(self, comp) -> tuple[str, str]:
        cfg = self.config
        if cfg.lowering != "auto":
            return cfg.lowering, "set in the recipe"
        if not comp.metadata.get("placement", {}).get("targeted", False):
            return "matmulnbits", f"partition.{comp.name} does not offer tensorrt"
        if not cfg.symmetric or cfg.group_size not in TENSORRT_BLOCKS:
            return "matmulnbits", (f"partition.{comp.name} offers tensorrt, but TensorRT's INT4 needs a symmetric "
                                   f"grid with group 64 or 128")
        return "dequantize_linear", f"partition.{comp.name} offers tensorrt (ONNX Runtime fuses it into MatMulNBits)"

    def _wanted(self, ir: ModelIR) -> bool:
        cfg = self.config
        listed = "tensorrt-llm" in ir.components["llm"].metadata.get("placement", {}).get("backends", [])
        return cfg.trtllm_checkpoint == "always" or (cfg.trtllm_checkpoint == "auto" and listed)

    def _writes_checkpoint(self, ir: ModelIR) -> bool:
        """Whether `_checkpoint` may write one, so the LLM's quantized linears keep their integers for it."""
        return self._wanted(ir) and not ir.config["llm"].get("trtllm_refused") and self.config.symmetric

    def _checkpoint(self, ir: ModelIR, quantized: list[QuantizedLinear], outputs: dict) -> dict:
        cfg = self.config
        if not self._wanted(ir):
            return {"written": False, "reason": "not requested (partition.llm does not list tensorrt-llm)"
                    if cfg.trtllm_checkpoint == "auto" else "trtllm_checkpoint: never"}
        if ir.config["llm"].get("trtllm_refused"):  # a model whose LLM the checkpoint cannot express
            return {"written": False, "reason": ir.config["llm"]["trtllm_refused"]}
        try:
            if not cfg.symmetric:
                raise NotExportable("W4A16_AWQ is symmetric; this recipe quantizes asymmetrically")
            assets, excluded = checkpoint_assets(ir, quantized, cfg.group_size, cfg.trtllm_dtype, outputs)
        except NotExportable as exc:
            if cfg.trtllm_checkpoint == "always":
                raise UserError(f"awq_int4 cannot write the TensorRT-LLM checkpoint: {exc}") from None
            return {"written": False, "reason": str(exc)}
        ir.assets.update(assets)
        return {"written": True, "files": sorted(assets), "dtype": cfg.trtllm_dtype,
                "build": "manifest tensorrt_llm.command (trtllm-build, limits from the shape plan)",
                **({"float_modules": excluded} if excluded else {})}


def _summary(quantized: list[QuantizedLinear], report: dict, lowering: str, why: str, group: int) -> dict:
    if not quantized:
        return {"linears_quantized": 0, "lowering": lowering}
    groups = report["groups"]
    before = sum(ql.linear.k * ql.linear.n * 4 for ql in quantized)
    after = sum(ql.stored_bytes for ql in quantized)
    rtn = [g["rtn_rel_mse"] for g in groups]
    final = [g["final_rel_mse"] for g in groups]
    return {
        "linears_quantized": len(quantized),
        "lowering": lowering,
        "lowering_reason": why,
        "group_size": group,
        "weight_bytes_fp32": before,
        "weight_bytes_int4": after,
        "bits_per_weight": round(8 * after / (before / 4), 3),
        "rtn_rel_mse_mean": float(f"{sum(rtn) / len(rtn):.4g}"),
        "final_rel_mse_mean": float(f"{sum(final) / len(final):.4g}"),
        "groups_below_rtn": sum(f < r for f, r in zip(final, rtn)),
        **_own_outputs({k: v for k, v in report.get("own_output_rel_mse", {}).items()
                        if k not in set(report.get("kept_float", []))}),
        **report,
    }


def _own_outputs(errors: dict[str, dict[str, float]]) -> dict:
    """Means over the quantized linears of the relative error at their own outputs, RTN's and the method's (with GPTQ
    or mixed precision, where the pass keeps every input's Hessian)."""
    if not errors:
        return {}
    rtn, final = [e["rtn"] for e in errors.values()], [e["final"] for e in errors.values()]
    return {"own_rtn_rel_mse_mean": float(f"{sum(rtn) / len(rtn):.4g}"),
            "own_final_rel_mse_mean": float(f"{sum(final) / len(final):.4g}"),
            "linears_below_rtn_at_own_outputs": sum(f < r for f, r in zip(final, rtn))}
