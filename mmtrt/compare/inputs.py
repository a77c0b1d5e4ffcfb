"""Inputs for comparisons: generated within a bundle's envelope (fresh random values, with the seed recorded),
or loaded from an .npz file a previous comparison saved (keys `component/iteration/input`). The Qwen2-VL
families' vision inputs and M-RoPE positions follow an image's grid (mmtrt/compare/qwen2_vl.py)."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from mmtrt.compare import kv_layouts, qwen2_vl
from mmtrt.errors import UserError
from mmtrt.ir.graph import TensorSpec
from mmtrt.ir.logits import LOGITS_FROM
from mmtrt.partition.shapes import check_shape

PREFILL_TOKENS = 12
NUMPY = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "int32": np.int32, "bool": np.bool_}


def _iterations(component: str, dims: dict[str, dict[str, int]]) -> list[dict[str, int]]:
    """Sizes of the named dimensions per iteration: two images; for the LLM a prefill, then one decode step."""
    if component == "vision":
        return [{"num_images": min(2, dims["num_images"]["max"])}]
    seq = max(dims["seq"]["min"], min(PREFILL_TOKENS, dims["seq"]["max"]))
    if component == "embed":
        return [{"batch": 1, "seq": seq}]
    return [{"batch": 1, "seq": seq, "past": 0, "total": seq}, {"batch": 1, "seq": 1, "past": seq, "total": seq + 1}]


def generate(manifest: dict[str, Any], component: str, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    """Feeds a model of this bundle accepts: token ids below the vocabulary size, an all-ones attention mask,
    positions continuing the cache (M-RoPE's rows of a prompt with an image), a kv_layout cache's lengths, table and
    slots (mmtrt/compare/kv_layouts.py), normal values elsewhere; a Qwen2-VL tower gets images of a drawn grid with
    their index inputs."""
    if component == "vision" and manifest["model"]["architecture"] in qwen2_vl.QWEN_FAMILIES:
        return qwen2_vl.generate_vision(manifest, rng)
    vocab = manifest["model"]["llm"]["vocab_size"]
    feeds, cache = [], kv_layouts.rewritten(manifest, component)
    for sizes in _iterations(component, manifest["dims"]):
        if cache:
            sizes = kv_layouts.sizes(manifest, sizes)
        feed = {}
        for spec in manifest["components"][component]["inputs"]:
            shape = [d if isinstance(d, int) else sizes[d] for d in spec["shape"]]
            feed[spec["name"]] = _values(spec["name"], spec["dtype"], shape, sizes, manifest["model"], rng)
        if cache:
            kv_layouts.fill(manifest, sizes, feed, rng)
        feeds.append(feed)
    return feeds


def _values(name: str, dtype: str, shape: list[int], sizes: dict[str, int], model: dict, rng) -> np.ndarray:
    if name == "input_ids":
        return rng.integers(0, model["llm"]["vocab_size"], size=shape, dtype=np.int64)
    if name == "attention_mask":
        return np.ones(shape, NUMPY[dtype])
    if name == LOGITS_FROM:  # every position's logits
        return np.zeros(shape, NUMPY[dtype])
    if name == "position_ids" and model["llm"].get("rope") == "mrope":
        return qwen2_vl.positions(sizes, shape, model["vision"]["merge_size"]).astype(NUMPY[dtype])
    if name == "position_ids":
        return np.broadcast_to(np.arange(sizes["past"], sizes["past"] + sizes["seq"]), shape).astype(NUMPY[dtype])
    return rng.standard_normal(shape).astype(NUMPY[dtype])


def save(path: Path, feeds: dict[str, list[dict[str, np.ndarray]]]) -> None:
    np.savez(path, **{f"{comp}/{i}/{name}": value for comp, its in feeds.items()
                      for i, feed in enumerate(its) for name, value in feed.items()})


def load(path: Path, manifest: dict[str, Any], components: list[str]) -> dict[str, list[dict[str, np.ndarray]]]:
    """The inputs in `path` for `components`, each checked against the bundle's contract and profile."""
    feeds = _read_npz(Path(path))
    for comp in components:
        if not feeds.get(comp):
            raise UserError(f"inputs file {path} has no inputs for {comp}; pass --partition for those it has, or "
                            "save inputs with --save-inputs")
        for i, feed in enumerate(feeds[comp]):
            _check_feed(f"{path}: {comp}/{i}", feed, manifest, comp)
            if comp == "vision" and manifest["model"]["architecture"] in qwen2_vl.QWEN_FAMILIES:
                qwen2_vl.grid_of(feed, manifest["model"]["vision"], f"{path}: {comp}/{i}")
    return {comp: feeds[comp] for comp in components}


def _read_npz(path: Path) -> dict[str, list[dict[str, np.ndarray]]]:
    if not path.is_file():
        raise UserError(f"inputs file {path} does not exist; pass an .npz that `mmtrt compare --save-inputs` wrote")
    try:
        arrays = _npz_arrays(path)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise UserError(f"inputs file {path} is not an .npz of arrays ({type(exc).__name__}: {exc}); pass one "
                        "that `mmtrt compare --save-inputs` wrote") from None
    feeds: dict[str, dict[int, dict[str, np.ndarray]]] = {}
    for key, value in arrays.items():
        parts = key.split("/")
        if len(parts) != 3 or not parts[1].isdigit():
            raise UserError(f"{path}: key {key!r} is not component/iteration/input; save inputs with --save-inputs")
        feeds.setdefault(parts[0], {}).setdefault(int(parts[1]), {})[parts[2]] = value
    return {comp: [its[i] for i in sorted(its)] for comp, its in feeds.items()}


def _npz_arrays(path: Path) -> dict[str, np.ndarray]:
    data = np.load(path, allow_pickle=False)
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ValueError("one .npy array, not an archive of them")
    with data:
        return {key: data[key] for key in data.files}


def _check_feed(where: str, feed: dict[str, np.ndarray], manifest: dict[str, Any], comp: str) -> None:
    specs = [TensorSpec.from_json(s) for s in manifest["components"][comp]["inputs"]]
    names = [s.name for s in specs]
    if sorted(feed) != sorted(names):
        raise UserError(f"{where} has inputs {sorted(feed)}, the bundle's {comp} takes {sorted(names)}; save inputs "
                        "with --save-inputs from a bundle of the same contract")
    for spec in specs:
        value = feed[spec.name]
        if value.dtype != NUMPY[spec.dtype] or value.ndim != len(spec.shape):
            raise UserError(f"{where}/{spec.name} is {value.dtype}{list(value.shape)}, the bundle takes "
                            f"{spec.dtype}{list(spec.shape)}; save inputs with --save-inputs")
        try:
            check_shape(comp, spec, value.shape, manifest["dims"])
        except UserError as exc:
            raise UserError(f"{where}: {exc}") from None
