"""The options of `awq_int4`, apart from the pass so that a recipe is validated without torch or onnx."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from mmtrt.pipeline.pass_config import PassConfig, int_choice
from mmtrt.quant import TRTLLM_GROUPS

AccuracyLevel = int_choice(0, 1, 2, 3, 4)


class CalibrationData(PassConfig):
    images: Literal["digits", "recipe", "none"] = Field("digits", description="Calibration images: `digits` (scikit-learn digits, train split, with the digits prompt), `recipe` (the recipe's `calibration.images` folder and `calibration.jsonl`, each with its prompt) or `none` (text only).")
    samples: int = Field(16, ge=0, description="Calibration images (the first ones of the chosen set).")
    text: Literal["reference", "recipe"] = Field("reference", description="Calibration text: `reference` (Python's documentation, taken from its end: the perplexity suite reads from the start) or `recipe` (the recipe's `calibration.text` files, from their start).")
    text_windows: int = Field(8, ge=0, description="512-token windows of calibration text (a recipe text shorter than one window is used whole).")


class Calibration(CalibrationData):
    search_tokens: int = Field(1024, ge=1, description="Tokens the module-output error of the scale search runs on (the first calibration batches that fit; statistics and own-output errors use every token).")


class AwqInt4Config(PassConfig):
    method: Literal["awq", "rtn", "gptq", "awq_gptq"] = Field("awq", description="`awq` (scale and clip search), `rtn` (round to nearest, the baseline), `gptq` (GPTQ's error compensation with the Hessian of each linear's calibration inputs) or `awq_gptq` (AWQ's scale search, then GPTQ on the scaled weights instead of the clip search).")
    group_size: int = Field(128, description="Weights per scale along the input dimension: a power of two from 16 to 256 (TensorRT takes 64 and 128).")
    symmetric: bool = Field(True, description="Signed [-8, 7] grid without zero points (TensorRT and TensorRT-LLM need it); false: unsigned grid with a zero point per group (ONNX Runtime only).")
    zero_point: Literal["int4", "float"] = Field("int4", description="Asymmetric only: `int4` zero points (ONNX Runtime's own RTN format, the range stretched to hold 0) or `float` ones (the grid spans each group's min to max exactly, as GGUF's Q4_1 and HQQ do; 4 bytes per group).")
    components: list[Literal["llm", "vision"]] = Field(["llm"], min_length=1, description="Components whose linears are quantized (`vision` includes the projector).")
    include: list[str] = Field(["*"], description="Glob patterns of linear names to quantize, e.g. `llm.layers.*.down_proj`; names look like `llm.layers.3.q_proj`, `llm.lm_head`, `vision.layers.0.fc1`, `vision.linear.18` (the pass report lists them).")
    exclude: list[str] = Field([], description="Glob patterns of linear names to keep in float, e.g. `llm.lm_head`.")
    calibration: Calibration = Field(Calibration(), description="Calibration data: `images` (`digits`, `recipe` or `none`), `samples` (images), `text` (`reference` or `recipe`), `text_windows` (512-token windows), `search_tokens` (tokens the module-output error is measured on).")
    clip: bool = Field(True, description="AWQ's clipping-range search after the scale search (`awq` only).")
    float_budget_mib: float = Field(0.0, ge=0, description="Mixed precision: MiB the most sensitive linears (largest measured relative output error after quantization on the calibration data) may add to the bundle by staying in the graph's float type; 0 quantizes every selected linear. The pass report lists them (`kept_float`).")
    sensitivity: Literal["output_error", "fisher"] = Field("output_error", description="What ranks the linears `float_budget_mib` keeps: `output_error` (each linear's relative error at its own outputs, largest first) or `fisher` (the error's effect on the source model's answer at the calibration images' answer position, second order through the Fisher information, largest per byte first; needs the source model, as `mmtrt compile` holds it, and linears of the source's shapes). The report lists the scores (`task_sensitivity`).")
    float_dtype: Literal["graph", "float16"] = Field("graph", description="How the linears `float_budget_mib` keeps are stored: `graph` (the graph's float type) or `float16` (an fp16 initializer cast to the graph's type in front of the MatMul, folded when the graph loads: half the bytes in an fp32 graph, so the same budget keeps about twice the linears).")
    act_order: bool = Field(False, description="GPTQ methods: round the input columns in order of decreasing Hessian diagonal, with each group's scale taken up front (static groups), so the stored groups stay contiguous as TensorRT and MatMulNBits need.")
    embedding: Literal["float", "int8"] = Field("float", description="The token embedding table: `float` as exported, or `int8` with one scale per row (max|row| / 127), gathered and dequantized in the embed graph (4x smaller in fp32).")
    lowering: Literal["auto", "matmulnbits", "dequantize_linear"] = Field("auto", description="ONNX form: `matmulnbits` (ONNX Runtime), `dequantize_linear` (TensorRT's INT4 DequantizeLinear + MatMul, symmetric only), `auto` (TensorRT's when the component's partition offers TensorRT, the grid is symmetric and the group 64 or 128).")
    accuracy_level: AccuracyLevel = Field(4, description="MatMulNBits accuracy level: 4 computes with int8 activations (fastest on the CPU), 0 keeps them in float.")
    trtllm_checkpoint: Literal["auto", "always", "never"] = Field("auto", description="Write a TensorRT-LLM W4A16_AWQ checkpoint of the LLM into the bundle: `auto` when partition.llm lists tensorrt-llm and the model allows it, `always` (an error when it cannot), `never`.")
    trtllm_dtype: Literal["float16", "bfloat16"] = Field("float16", description="Type of the checkpoint's float tensors (scales, norms, embeddings); TensorRT-LLM's W4A16 kernels take fp16 or bf16 activations, not fp32.")

    @field_validator("trtllm_dtype", mode="before")
    @classmethod
    def _w4a16_dtype(cls, value):
        if value == "float32":
            raise ValueError("trtllm_dtype float32 is refused: TensorRT-LLM's W4A16 kernels take float16 or "
                             "bfloat16 activations; set trtllm_dtype: float16 or bfloat16")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "AwqInt4Config":
        if self.group_size & (self.group_size - 1) or not 16 <= self.group_size <= 256:
            raise ValueError(f"group_size must be a power of two from 16 to 256, got {self.group_size}")
        if self.symmetric and self.zero_point == "float":
            raise ValueError("zero_point: float applies to the asymmetric grid; set symmetric: false or drop zero_point")
        if self.act_order and self.method not in ("gptq", "awq_gptq"):
            raise ValueError("act_order applies to GPTQ's rounding; set method: gptq or awq_gptq, or drop act_order")
        if self.trtllm_checkpoint == "always" and self.group_size not in TRTLLM_GROUPS:
            raise ValueError(f"trtllm_checkpoint: always needs group_size 64 or 128, the groups TensorRT-LLM's INT4 "
                             f"kernels take, not {self.group_size}")
        if not self.symmetric and (self.lowering == "dequantize_linear" or self.trtllm_checkpoint == "always"):
            raise ValueError("TensorRT's DequantizeLinear and TensorRT-LLM's W4A16_AWQ take symmetric INT4 only; "
                             "set symmetric: true or lowering: matmulnbits and trtllm_checkpoint: never")
        cal = self.calibration
        if self.sensitivity == "fisher" and not (self.float_budget_mib and cal.images != "none" and cal.samples):
            raise ValueError("sensitivity: fisher ranks the linears float_budget_mib keeps on the calibration images; "
                             "set float_budget_mib > 0 and calibration images (calibration.images: digits or recipe)")
        if "vision" in self.components and (cal.images == "none" or not cal.samples):
            raise ValueError("quantizing the vision component needs calibration images (calibration.images: digits or recipe)")
        if (cal.images == "none" or not cal.samples) and not cal.text_windows:
            raise ValueError("calibration has no data: give calibration.samples images or calibration.text_windows")
        return self
