"""NIGHTLY.yaml: a strict schema like the recipe's, so a misspelled key fails before a night's work starts."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from mmtrt.errors import UserError
from mmtrt.recipe import Strict, format_validation_error, read_yaml

Suite = Literal["digits", "perplexity", "parity"]
Timing = Literal["preprocess_ms", "vision_ms", "prefill_ms", "decode_ms_per_token"]


class Rules(Strict):
    accuracy_drop_points: float | None = Field(1.0, ge=0, description="Most an accuracy metric (`digits.accuracy_pct`, `parity.top1_agreement_pct`, `parity.greedy_identical_pct`) may fall, in points, below the baseline; null turns the rule off.")
    perplexity_increase_pct: float | None = Field(2.0, ge=0, description="Most `perplexity.perplexity` may rise, in percent of the baseline.")
    latency_ratio_increase_pct: float | None = Field(25.0, ge=0, description="Most a timing's ratio to the reference recipe, measured in the same run, may rise, in percent of the baseline's ratio. Absolute times are never compared: the hosts are shared.")
    bundle_size_increase_pct: float | None = Field(5.0, ge=0, description="Most the bundle's size may grow, in percent.")
    compile_time_increase_pct: float | None = Field(None, ge=0, description="Most the compile time may grow, in percent; compared only when both nights compiled. Off by default: an absolute time on a shared host.")
    failed_build: bool = Field(True, description="A recipe that fails to compile, evaluate or benchmark is a regression.")
    nondeterminism: bool = Field(True, description="The same cache key (same inputs) giving a bundle with a different hash is a regression.")


class RecipeEntry(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="Unique name: the history, the cache and the report use it.")
    recipe: str = Field(description="The recipe file, relative to NIGHTLY.yaml.")
    override: dict[str, Any] = Field({}, description="Top-level recipe keys replaced for this entry, e.g. `passes:` for a pass variant of a shared recipe; the result is validated as a recipe.")
    eval: dict[Suite, int | None] = Field({}, description="Eval suites (`digits`, `perplexity`, `parity`) and the limit of each (images or windows; null: the suite's default).")
    benchmark: bool = Field(True, description="Time this recipe in the interleaved benchmark.")
    check_determinism: bool = Field(False, description="On a cache hit, compile again into a scratch folder and compare the bundle hashes (costs a compile).")
    rules: Rules | None = Field(None, description="Rule thresholds for this recipe; keys given here replace the top-level `rules`, the others are inherited.")

    @field_validator("eval")
    @classmethod
    def _limits(cls, value: dict[str, int | None]) -> dict[str, int | None]:
        bad = {suite: limit for suite, limit in value.items() if limit is not None and limit < 1}
        if bad:
            raise ValueError(f"eval limits are counts of at least 1 (null: the suite's default), not {bad}")
        return value


class Benchmark(Strict):
    rounds: int = Field(7, ge=1, description="Timed rounds; each round runs every recipe once, in turn, so drift on a shared host hits all alike.")
    statistic: Literal["min", "median"] = Field("min", description="What the rounds are reduced to: `min` (preemption on a shared host only ever adds time, so the fastest round is the least disturbed one; the default) or `median`.")
    warmup: int = Field(1, ge=0, description="Untimed rounds first.")
    timings: list[Timing] = Field(["vision_ms", "prefill_ms", "decode_ms_per_token"], min_length=1, description="Which of `mmtrt run`'s timings are recorded (each also as a ratio to the reference recipe).")
    image: str = Field("examples/sample.png", description="The image of the timed request, relative to NIGHTLY.yaml.")
    prompt: str = Field("What is in the picture?", description="The prompt of the timed request.")
    max_new_tokens: int = Field(8, ge=1, description="Tokens generated per timed request.")
    threads: int = Field(1, ge=1, description="ONNX Runtime intra-op threads (spinning off).")


class NightlyConfig(Strict):
    recipes: list[RecipeEntry] = Field(min_length=1, description="The recipe matrix.")
    reference: str = Field(description="The recipe whose timings the others are divided by; it runs in every shard.")
    history: str = Field("nightly/history.sqlite", description="An SQLite file (relative to NIGHTLY.yaml) or an SQLAlchemy URL such as `postgresql+psycopg://host/db` for a shared history; `--history` and `MMTRT_NIGHTLY_HISTORY` override it.")
    cache: str = Field("nightly/cache", description="The build cache folder, relative to NIGHTLY.yaml.")
    benchmark: Benchmark = Field(Benchmark(), description="The timed requests.")
    rules: Rules = Field(Rules(), description="Regression thresholds against the last good night.")

    @model_validator(mode="after")
    def _names(self) -> "NightlyConfig":
        names = [r.name for r in self.recipes]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"recipe names must be unique, repeated: {', '.join(twice)}")
        if self.reference not in names:
            raise ValueError(f"reference {self.reference!r} is not one of the recipes ({', '.join(names)})")
        return self

    def rules_for(self, entry: RecipeEntry) -> Rules:
        if entry.rules is None:
            return self.rules
        return self.rules.model_copy(update=entry.rules.model_dump(exclude_unset=True))


def load_config(path: str | Path) -> tuple[NightlyConfig, Path, str]:
    """The config, the folder its relative paths resolve against, and the sha256 of its text."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"nightly config {path} does not exist; pass a NIGHTLY.yaml (see docs/NIGHTLY.md)")
    raw = path.read_bytes()
    data = read_yaml(path, raw, "a nightly config")
    if not isinstance(data, dict):
        raise UserError(f"{path}: a nightly config is a mapping with `recipes:` and `reference:`; see docs/NIGHTLY.md")
    try:
        config = NightlyConfig.model_validate(data)
    except ValidationError as exc:
        raise UserError(format_validation_error(exc, NightlyConfig, str(path))) from None
    return config, path.resolve().parent, hashlib.sha256(raw).hexdigest()


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """`I/N` with 1 <= I <= N."""
    if text is None:
        return None
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        index = count = 0
    if not 1 <= index <= count:
        raise UserError(f"--shard {text!r} must be I/N with 1 <= I <= N, e.g. --shard 1/2")
    return index, count


def shard_entries(config: NightlyConfig, shard: tuple[int, int] | None) -> list[RecipeEntry]:
    """Every N-th recipe from the I-th, plus the reference (timing ratios need it on the same host)."""
    if shard is None:
        return list(config.recipes)
    index, count = shard
    return [r for i, r in enumerate(config.recipes) if i % count == index - 1 or r.name == config.reference]
