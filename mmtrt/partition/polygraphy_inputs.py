"""Beside each ONNX partition, what `polygraphy run PART.onnx --onnxrt` needs: a data loader script for
`--data-loader-script`. Polygraphy's default inputs give every dynamic dimension the same size, which the LLM
refuses (its attention_mask is `past + seq` long, its positions continue the cache); the script feeds a
prefill of a typical prompt and then one decode step after it, with consistent sizes, token ids within the
vocabulary, an all-ones mask and positions that continue the cache. The script is standalone (numpy only), so
it runs where mmtrt is not installed; its values are drawn from a fixed seed, so every run feeds the same."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmtrt.ir.logits import LOGITS_FROM
from mmtrt.partition.segments import dim_at

FOLDER = "polygraphy"

SCRIPT = '''"""Inputs for `polygraphy run {onnx} --onnxrt --data-loader-script {script}` (written by mmtrt compile).

Iterations: {what}. Token ids are below the vocabulary size, attention_mask is all ones over past + seq,
position_ids continue the cache; other inputs are standard normal from a fixed seed.
"""

import numpy as np

INPUTS = {inputs}
ITERATIONS = {iterations}
VOCAB_SIZE = {vocab}
SEED = 0


def _value(name, dtype, shape, sizes, rng):
    if name == "input_ids":
        return rng.integers(0, VOCAB_SIZE, size=shape).astype(dtype)
    if name == "attention_mask":
        return np.ones(shape, dtype)
    if name == {logits_from!r}:  # every position's logits
        return np.zeros(shape, dtype)
    if name == "position_ids":
        return np.broadcast_to(np.arange(sizes["past"], sizes["past"] + sizes["seq"]), shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def load_data():
    rng = np.random.default_rng(SEED)
    for sizes, shapes in ITERATIONS:
        yield {{name: _value(name, INPUTS[name], shapes[name], sizes, rng) for name in INPUTS}}
'''


def iterations(component: str, dims: dict[str, dict[str, int]], typical_prompt: int) -> list[dict[str, int]]:
    """Sizes of the named dimensions per run: one batch of two images; for the LLM a prefill, then a decode step."""
    prompt = min(max(typical_prompt, dims["seq"]["min"]), dims["seq"]["max"])
    if component == "vision":
        return [{"num_images": min(2, dims["num_images"]["max"])}]
    if component == "embed":
        return [{"batch": 1, "seq": prompt}]
    return [{"batch": 1, "seq": prompt, "past": 0}, {"batch": 1, "seq": 1, "past": prompt}]


def _runs(name: str, comp: dict[str, Any], dims: dict, typical_prompt: int) -> list:
    runs = []
    for sizes in iterations(name, dims, typical_prompt):
        point = {k: {"at": v} for k, v in sizes.items()}
        point["total"] = point["past + seq"] = {"at": sizes.get("past", 0) + sizes.get("seq", 0)}
        shapes = {s["name"]: [dim_at(d, point, "at") for d in s["shape"]] for s in comp["inputs"]}
        runs.append((sizes, shapes))
    return runs


def write_loaders(manifest_components: dict[str, Any], dims: dict, typical_prompt: int, vocab: int,
                  folder: Path) -> dict[str, dict[str, str]]:
    """Write `polygraphy/<component>.py` for every ONNX component; returns per component the script and the
    command line, both relative to the bundle folder."""
    (folder / FOLDER).mkdir(exist_ok=True)
    section = {}
    for name, comp in manifest_components.items():
        if not comp["artifact"].endswith(".onnx"):
            continue
        try:
            runs = _runs(name, comp, dims, typical_prompt)
        except KeyError as exc:
            section[name] = {"data_loader": None, "why": f"input dimension {exc.args[0]} is set by the runtime "
                             "(a kv_layout cache's size, an image's own patch count with its grid indices), not a "
                             "size a generic loader can draw"}
            continue
        script = f"{FOLDER}/{name}.py"
        what = "a prefill, then one decode step after it" if name == "llm" else "one"
        text = SCRIPT.format(onnx=comp["artifact"], script=script, what=what, vocab=vocab, logits_from=LOGITS_FROM,
                             inputs=json.dumps({s["name"]: s["dtype"] for s in comp["inputs"]}),
                             iterations=json.dumps(runs))
        (folder / script).write_text(text)
        section[name] = {"data_loader": script,
                         "command": f"polygraphy run {comp['artifact']} --onnxrt --data-loader-script {script}"}
    return section
