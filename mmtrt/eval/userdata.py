"""The user's own data files: image folders, JSONL of {image, prompt[, answer]}, prompt lists and text files.

Everything is read and checked when the plan is made, before any heavy work, so a missing image or a broken line
is one error naming the file and the line. Paths inside a JSONL are relative to the JSONL; recipe paths are
relative to the recipe file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from mmtrt.errors import UserError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


@dataclass(frozen=True)
class Sample:
    """One example: an image (or None for a text-only prompt), a prompt, and the expected answer if labelled."""

    image: Path | None
    prompt: str
    answer: str | None = None
    where: str = ""  # "file:line", for messages about this sample


def resolve(path: str | Path, base: Path) -> Path:
    path = Path(path)
    return path if path.is_absolute() else base / path


def image_folder(folder: Path, prompt: str) -> list[Sample]:
    """Every image file in `folder` (sorted by name, not recursive), each shown with `prompt`."""
    if not folder.is_dir():
        raise UserError(f"image folder {folder} does not exist; give a folder of PNG or JPEG files")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise UserError(f"image folder {folder} holds no images ({', '.join(IMAGE_SUFFIXES)}); add some or point "
                        "at another folder")
    for f in files:
        _check_image(f, str(f))
    return [Sample(f, prompt, None, str(f)) for f in files]


def jsonl(path: Path, answers: bool, images: str = "optional") -> list[Sample]:
    """Lines of {"image": path, "prompt": text[, "answer": value]}; `images` is "required" or "optional"."""
    lines = _lines(path)
    samples = [_sample(path, n, line, answers, images) for n, line in lines]
    if not samples:
        raise UserError(f"{path} holds no samples (every line is empty); add lines of JSON objects")
    return samples


def prompts(path: Path) -> list[Sample]:
    """Text-only prompts: a .jsonl file as `jsonl`, anything else one prompt per non-empty line."""
    if path.suffix.lower() == ".jsonl":
        return jsonl(path, answers=False)
    samples = [Sample(None, line.strip(), None, f"{path}:{n}") for n, line in _lines(path)]
    if not samples:
        raise UserError(f"{path} holds no prompts; write one prompt per line")
    return samples


def text_files(paths: list[Path]) -> str:
    """The files' text, in the order given, separated by blank lines."""
    parts = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UserError(f"text file {path} does not exist; give UTF-8 text files") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read text file {path} ({exc}); give UTF-8 text files") from None
        if not text.strip():
            raise UserError(f"text file {path} is empty; give text for calibration or drop it")
        parts.append(text)
    return "\n\n".join(parts)


def digest(samples: list[Sample], text: str = "") -> str:
    """sha256 over every sample's image bytes, prompt and answer, and the text: what the manifest records."""
    h = hashlib.sha256()
    for s in samples:
        h.update(s.image.read_bytes() if s.image else b"")
        h.update(json.dumps([s.prompt, s.answer]).encode())
    h.update(text.encode())
    return h.hexdigest()


def _lines(path: Path) -> list[tuple[int, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"data file {path} does not exist; check the path (relative to the recipe)") from None
    except IsADirectoryError:
        raise UserError(f"data file {path} is a folder; give a file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read data file {path} ({exc}); give a UTF-8 file") from None
    return [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def _sample(path: Path, n: int, line: str, answers: bool, images: str) -> Sample:
    where = f"{path}:{n}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: not JSON ({exc.msg}); write one JSON object per line") from None
    wanted = {"image", "prompt", "answer"} if answers else {"image", "prompt"}
    if not isinstance(row, dict):
        raise UserError(f"{where}: expected a JSON object with keys {', '.join(sorted(wanted))}")
    unknown = sorted(set(row) - wanted)
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r}; allowed keys: {', '.join(sorted(wanted))}")
    if not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
        raise UserError(f"{where}: needs \"prompt\", a non-empty string")
    if answers and (row.get("answer") is None or isinstance(row["answer"], (dict, list, bool))):
        raise UserError(f"{where}: needs \"answer\", a string or a number")
    image = row.get("image")
    if image is None and images == "required":
        raise UserError(f"{where}: needs \"image\", a path relative to {path.name}")
    if image is not None and not isinstance(image, str):
        raise UserError(f"{where}: \"image\" must be a path string")
    image_path = resolve(image, path.parent) if image is not None else None
    if image_path is not None:
        _check_image(image_path, where)
    answer = None if row.get("answer") is None else str(row["answer"])
    return Sample(image_path, row["prompt"], answer, where)


def _check_image(path: Path, where: str) -> None:
    try:
        with Image.open(path) as img:
            img.verify()
    except (FileNotFoundError, IsADirectoryError):
        raise UserError(f"{where}: image {path} does not exist; fix the path (relative to the JSONL file)") from None
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise UserError(f"{where}: cannot read image {path} ({exc}); give a PNG or JPEG file") from None
