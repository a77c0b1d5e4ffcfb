"""Write the files recipes/own-data.yaml reads, from data that ships with scikit-learn, so they can be rebuilt:

photos/        8 crops (160 px JPEG) of scikit-learn's two sample photos (china.jpg, flower.jpg): the calibration folder
digits/        12 held-out digits (mmtrt.eval.digits' split, never used in training or calibration) as PNGs
questions.jsonl  {image, prompt, answer} for the digits: the scored qa suite
calibration.jsonl  8 train-split digits with the digits prompt: calibration images beside the photos
prompts.jsonl  label-free prompts for the agreement suite: text only, and about the photos
notes.txt      English text for the LLM's calibration: the descriptions of scikit-learn's toy data sets

    python scripts/make_own_data.py [OUT]   (default: recipes/own-data)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from PIL import Image
from sklearn.datasets import load_diabetes, load_iris, load_sample_images, load_wine

from mmtrt.eval import digits

CROP = 160
QUESTIONS = 12
CALIBRATION_DIGITS = 8
TEXT_PROMPTS = ["Write one sentence about the sea.", "What is the capital of France?",
                "List three colours.", "Explain what a compiler does in one sentence."]
PHOTO_PROMPTS = ["Describe the image.", "What colour dominates this picture?"]


def photos(out: Path) -> list[str]:
    names = []
    for path, image in zip(load_sample_images().filenames, load_sample_images().images):
        h, w = image.shape[:2]
        for i, (y, x) in enumerate([(0, 0), (0, w - 2 * CROP), (h - 2 * CROP, 0), (h - 2 * CROP, w - 2 * CROP)]):
            crop = Image.fromarray(image[y:y + 2 * CROP, x:x + 2 * CROP]).resize((CROP, CROP), Image.Resampling.BILINEAR)
            name = f"{Path(path).stem}_{i}.jpg"
            crop.save(out / "photos" / name, quality=85)
            names.append(name)
    return names


def digit_files(out: Path, split: str, count: int, folder: str) -> list[tuple[str, int]]:
    rows = []
    for i, (img, label) in enumerate(digits.samples(split, count)):
        name = f"{folder}/{split}_{i:02d}.png"
        img.save(out / name)
        rows.append((name, label))
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main(out: Path) -> None:
    for sub in ("photos", "digits"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    names = photos(out)
    held = digit_files(out, "heldout", QUESTIONS, "digits")
    train = digit_files(out, "train", CALIBRATION_DIGITS, "digits")
    write_jsonl(out / "questions.jsonl", [{"image": n, "prompt": digits.PROMPT, "answer": a} for n, a in held])
    write_jsonl(out / "calibration.jsonl", [{"image": n, "prompt": digits.PROMPT} for n, _ in train])
    write_jsonl(out / "prompts.jsonl", [{"prompt": p} for p in TEXT_PROMPTS]
                + [{"image": f"photos/{n}", "prompt": PHOTO_PROMPTS[i % 2]} for i, n in enumerate(names[::2])])
    (out / "notes.txt").write_text("\n\n".join(f().DESCR for f in (load_iris, load_wine, load_diabetes)))
    print(f"wrote {out}: {len(names)} photos, {len(held)} questions, {len(train)} calibration digits")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "recipes/own-data"))
