"""The recipe: a strict schema, so that a misspelled key fails loudly instead of being ignored."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mmtrt.errors import UserError
from mmtrt.pipeline.registry import registered_configs, unknown_pass
from mmtrt.schema_errors import validation_problems

Backend = Literal["torchvision", "onnxruntime", "tensorrt", "tensorrt-llm"]
ZOO_MODELS = ("tiny-llava", "dino-smollm", "dino-smollm-tokendrop", "dino-smollm-page")


class Strict(BaseModel):
    """Unknown keys are errors, and types are strict: `true` is not 1, nor the text "16" a number."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ModelSource(Strict):
    source: Literal["hf", "zoo"] = Field(description="Where the model comes from: `hf` (a saved checkpoint folder) or `zoo` (built in).")
    path: str | None = Field(None, description="`hf` only: the folder `save_pretrained` wrote (relative paths are relative to the recipe file), or a Hugging Face Hub id such as `llava-hf/llava-1.5-7b-hf`, read from the local Hugging Face cache (mmtrt never downloads).")
    name: str | None = Field(None, description=f"`zoo` only: one of {', '.join(ZOO_MODELS)}.")

    @model_validator(mode="after")
    def _one_location(self) -> "ModelSource":
        if self.source == "hf" and not self.path:
            raise ValueError("model.source hf needs model.path (the checkpoint folder)")
        if self.source == "zoo" and self.name not in ZOO_MODELS:
            raise ValueError(f"model.name must be one of {', '.join(ZOO_MODELS)} for source zoo, got {self.name!r}")
        return self


class Range(Strict):
    min: int = Field(ge=0, description="Smallest value the bundle accepts.")
    opt: int = Field(ge=0, description="The value the engines are tuned for.")
    max: int = Field(ge=1, description="Largest value the bundle accepts.")

    @model_validator(mode="after")
    def _ordered(self) -> "Range":
        if not self.min <= self.opt <= self.max:
            raise ValueError(f"needs min <= opt <= max, got {self.min}, {self.opt}, {self.max}")
        return self


class ImageEnvelope(Strict):
    min_side: int | None = Field(None, ge=1, description="Optional bound on the user's image file: its smallest side, in pixels. Unset, any image is taken (preprocessing resizes it to the model's input; PIL's decompression-bomb limit still applies).")
    max_side: int | None = Field(None, ge=1, description="Optional bound on the user's image file: its largest side, in pixels (e.g. to cap decoding time). Unset, any size up to PIL's decompression-bomb limit.")
    max_tiles: int | None = Field(None, ge=1, description="Any-resolution models (LLaVA-NeXT, LLaVA-OneVision) only: the most tiles an image may be cut into (its grid, the base image not counted). It bounds the image tokens, the sequence and the KV cache; an image whose best grid has more tiles is refused. Unset: the model's largest grid.")


class Envelope(Strict):
    batch: Range = Field(Range(min=1, opt=1, max=4), description="Requests run together (images and prompts).")
    image: ImageEnvelope = Field(ImageEnvelope(), description="Bounds on the user's image file, if any; the envelope itself bounds the preprocessed tensor.")
    prompt_tokens: Range = Field(Range(min=1, opt=32, max=256), description="Prompt length in tokens after the chat template, image tokens not counted.")
    max_new_tokens: int = Field(64, ge=1, description="Most tokens one request may generate; sizes the KV cache.")


class PartitionPolicy(Strict):
    preprocess: list[Backend] = Field(["torchvision"], description="Backends for image preprocessing, most preferred first.")
    vision: list[Backend] = Field(["tensorrt", "onnxruntime"], description="Backends for the vision encoder and projector, most preferred first.")
    embed: list[Backend] = Field(["onnxruntime"], description="Backends for the token embedding, most preferred first.")
    llm: list[Backend] = Field(["tensorrt", "onnxruntime"], description="Backends for the LLM decoder, most preferred first. `tensorrt-llm` opts in to a TensorRT-LLM checkpoint of the LLM in the bundle and its `trtllm-build` command (TensorRT-LLM 1.2 at most: its engine flow is gone from later releases); to hand the LLM to vLLM or TensorRT-LLM's LLM API, `mmtrt export hf`.")
    min_segment_size: int = Field(5, ge=1, description="A TensorRT segment with fewer nodes (Constant nodes not counted) runs on ONNX Runtime instead: a tiny island is not worth the transfers around it.")


class Output(Strict):
    external_data_threshold: int = Field(1024, ge=0, description="Initializers of at least this many bytes go to each ONNX file's external data file.")
    engines: list[Literal["rtx"]] = Field([], description="Engines the compile builds into the bundle's `engines/` folder, so it ships with them. `rtx`: every TensorRT segment built with TensorRT for RTX, on the compiling host with no GPU needed, for GPUs of compute capability 8.0, 8.6, 8.9 and 12.0 (needs `pip install tensorrt-rtx-cu13==1.7.1.116`); as `mmtrt build-engines BUNDLE --target rtx` builds them later. A segment the parser or builder refuses fails the compile, nothing written; one that cannot be built at all (no profile could be planned, or its plugins could not be registered) is listed with the reason in `build_report.json`. Engines are not in the bundle's hash: the portable bundle is its ONNX.")


class CalibrationData(Strict):
    images: str | None = Field(None, description="A folder of images (PNG, JPEG, ...; sorted by name, not recursive), each shown with `prompt`; relative to the recipe file. Passes read it with `calibration: {images: recipe}`.")
    prompt: str = Field("Describe the image.", min_length=1, description="The prompt shown with every image of the `images` folder.")
    jsonl: str | None = Field(None, description="A JSONL file, one `{\"image\": PATH, \"prompt\": TEXT}` per line, image paths relative to the JSONL; its samples follow the folder's.")
    text: list[str] = Field([], description="UTF-8 text files for the LLM, read in order; passes read them with `calibration: {text: recipe}`.")


class QaSuite(Strict):
    data: str | None = Field(None, description="A JSONL file, one `{\"image\": PATH, \"prompt\": TEXT, \"answer\": TEXT or NUMBER}` per line, image paths relative to the JSONL; relative to the recipe file. Required when the `qa` suite runs.")
    scorer: Literal["exact", "contains", "numeric"] = Field("contains", description="How a greedy answer is scored against `answer` (both case folded, whitespace collapsed, punctuation at the ends removed; number words are not read): `exact` equality (\"7.\" matches 7, \"seven\" does not); `contains`: the answer holds the label as whole words (\"It is 7.\" matches 7; \"17\" and \"seven\" do not); `numeric`: the answer's first number is within `tolerance` of the label (\"7.\" matches 7, \"seven\" does not).")
    tolerance: float = Field(0.0, ge=0, description="`numeric` only: the largest absolute difference that still counts as right.")
    limit: int | None = Field(None, ge=1, description="Use only the first this many questions (default: all).")
    max_new_tokens: int = Field(16, ge=1, description="Tokens generated per answer.")


class AgreementSuite(Strict):
    data: str | None = Field(None, description="Prompts, no labels: a text file with one prompt per line (text only), or a JSONL of `{\"prompt\": TEXT}` with an optional `\"image\": PATH` (relative to the JSONL); relative to the recipe file. Required when the `agreement` suite runs.")
    limit: int | None = Field(None, ge=1, description="Use only the first this many prompts (default: all).")
    max_new_tokens: int = Field(16, ge=1, description="Tokens of the source model's greedy answer scored per prompt: agreement is measured at the positions that predict them.")


class Evaluation(Strict):
    suites: list[Literal["digits", "perplexity", "qa", "agreement"]] = Field([], description="Suites compile measures on the unmodified model and after every lossy pass; results go into the manifest. `qa` scores answers on `evaluate.qa.data`; `agreement` compares with the source model on `evaluate.agreement.data` (top-1 agreement and KL divergence, no labels needed).")
    digits_limit: int = Field(100, ge=1, description="Held-out digit images the digits suite uses during compile.")
    perplexity_windows: int = Field(4, ge=1, description="512-token windows the perplexity suite uses during compile.")
    qa: QaSuite = Field(QaSuite(), description="The qa suite: your questions with answers.")
    agreement: AgreementSuite = Field(AgreementSuite(), description="The agreement suite: your prompts, answered by the source model.")


BUDGET_SUITES = {"digits_accuracy_drop": "digits", "perplexity_increase_pct": "perplexity",
                 "qa_accuracy_drop": "qa", "agreement_top1_drop": "agreement", "agreement_kl_increase": "agreement"}


class Budgets(Strict):
    digits_accuracy_drop: float | None = Field(None, ge=0, description="Most digits accuracy, in points, the lossy passes together may cost.")
    perplexity_increase_pct: float | None = Field(None, ge=0, description="Most perplexity increase, in percent, the lossy passes together may cost.")
    qa_accuracy_drop: float | None = Field(None, ge=0, description="Most qa accuracy, in points, the lossy passes together may cost (needs `evaluate.qa.data`).")
    agreement_top1_drop: float | None = Field(None, ge=0, description="Most top-1 agreement with the source model, in points, the lossy passes together may cost (needs `evaluate.agreement.data`; no labels).")
    agreement_kl_increase: float | None = Field(None, ge=0, description="Most increase of the mean KL divergence from the source model's next-token distribution (nats per position) the lossy passes together may cause.")

    def suites(self) -> list[str]:
        return sorted({BUDGET_SUITES[k] for k, v in self.model_dump().items() if v is not None})


class Recipe(Strict):
    model: ModelSource = Field(description="The model to compile.")
    passes: list[dict[str, dict[str, Any]]] = Field([], description="Graph passes in order, each a one-key mapping from pass name to its config.")
    envelope: Envelope = Field(Envelope(), description="The inputs the bundle must accept; every profile derives from it.")
    partition: PartitionPolicy = Field(PartitionPolicy(), description="Preferred backend per component, with fallbacks.")
    output: Output = Field(Output(), description="How the bundle is written.")
    evaluate: Evaluation = Field(Evaluation(), description="Accuracy measured during compile, against the unmodified model.")
    budgets: Budgets = Field(Budgets(), description="Accuracy the lossy passes may spend; compile fails with exit code 2 when exceeded.")
    calibration: CalibrationData = Field(CalibrationData(), description="Your own calibration data, for passes that set `calibration: {images: recipe}` or `{text: recipe}`.")

    @field_validator("passes")
    @classmethod
    def _one_key_passes(cls, passes: list[dict[str, dict[str, Any]]]) -> list[dict[str, dict[str, Any]]]:
        for i, entry in enumerate(passes):
            if len(entry) != 1:
                raise ValueError(f"entry {i} must be a one-key mapping like `- graph_cleanup: {{}}`, got keys {sorted(entry)}")
        return passes

    @model_validator(mode="after")
    def _suite_data(self) -> "Recipe":
        for suite in ("qa", "agreement"):
            if suite in self.eval_suites() and getattr(self.evaluate, suite).data is None:
                raise ValueError(f"the {suite} suite needs its data: set evaluate.{suite}.data to a file")
        return self

    def eval_suites(self) -> list[str]:
        return sorted(set(self.evaluate.suites) | set(self.budgets.suites()))

    def pass_list(self) -> list[tuple[str, dict[str, Any]]]:
        return [next(iter(entry.items())) for entry in self.passes]

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.model_dump(), sort_keys=True).encode()).hexdigest()


def format_validation_error(err: ValidationError, root: type[BaseModel], where: str) -> str:
    """Every problem on one line, each naming its path, what is wrong and what is allowed there."""
    return f"{where}: " + "; ".join(validation_problems(err, root))


def recipe_problems(data: Any) -> list[str]:
    """Everything wrong with a parsed recipe that can be known without the model: the schema, every pass name
    and every pass's options, all at once (torch, onnx and the passes' own modules are not imported)."""
    problems = []
    try:
        Recipe.model_validate(data)
    except ValidationError as exc:
        problems += validation_problems(exc, Recipe)
    passes = data.get("passes") if isinstance(data, dict) else None
    for i, entry in enumerate(passes if isinstance(passes, list) else []):
        if isinstance(entry, dict) and len(entry) == 1:
            problems += _pass_problems(i, *next(iter(entry.items())))
    return problems


def _pass_problems(index: int, name: Any, options: Any) -> list[str]:
    configs = registered_configs()
    if name not in configs:
        return [f"passes[{index}]: {unknown_pass(str(name), configs)}"]
    if not isinstance(options, dict):
        return []  # the recipe schema reports it
    try:
        configs[name].model_validate(options)
    except ValidationError as exc:
        return validation_problems(exc, configs[name], f"passes[{index}].{name}")
    return []


def load_recipe(path: str | Path) -> tuple[Recipe, Path]:
    """Parse and validate a recipe file; returns the recipe and the folder relative paths resolve against."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"recipe file {path} does not exist; pass the path of a YAML recipe")
    data = read_yaml(path, path.read_bytes(), "a recipe")
    if not isinstance(data, dict):
        raise UserError(f"{path}: a recipe is a mapping with at least `model:`; see docs/RECIPES.md")
    problems = recipe_problems(data)
    if problems:
        count = f"{len(problems)} problems: " if len(problems) > 1 else ""
        raise UserError(f"{path}: {count}{'; '.join(problems)}")
    return Recipe.model_validate(data), path.resolve().parent


def read_yaml(path: Path, raw: bytes, what: str) -> Any:
    """YAML from `raw` (the bytes of `path`), with errors as one line naming path:line:column."""
    try:
        return yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); {what} is a YAML file") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{_yaml_place(path, exc)}: not valid YAML ({_yaml_problem(exc)}); fix the syntax") from None


def _yaml_place(path: Path, exc: yaml.YAMLError) -> str:
    """path:line:column of the problem (1-based, as editors count), when PyYAML knows it."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    return f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    parts = [getattr(exc, "context", None), getattr(exc, "problem", None)]
    return ": ".join(p for p in parts if p) or " ".join(str(exc).split())
