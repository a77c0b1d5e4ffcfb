"""The `eval` command: a bundle measured on a suite."""

from __future__ import annotations

import contextlib
import gc
import json
import tempfile
from pathlib import Path

from mmtrt.cli.arguments import examples, positive_int, tolerance
from mmtrt.terminal import show


def _eval(args) -> int:
    from mmtrt.ir.source_float32 import in_float32
    from mmtrt.eval.options import cli_options
    from mmtrt.eval.suites import run_suite
    from mmtrt.eval.source import source_model
    from mmtrt.runtime import load

    if args.suite == "parity":
        out = _parity(args)
    else:
        pipe = load(args.bundle, threads=args.threads)
        agreement = args.suite == "agreement"
        source = source_model(pipe.manifest, args.source_model, own_dtype=True) if agreement else None
        options = cli_options(args.suite, args.data, args.scorer, args.tolerance, args.max_new_tokens, source)
        with in_float32(source[0]) if agreement else contextlib.nullcontext():
            out = run_suite(pipe, args.suite, args.limit, text_file=args.text, **options)
    if args.json:
        print(json.dumps(out))
    else:
        metrics = ", ".join(f"{k}={v:.6g}" for k, v in out["metrics"].items())
        samples = ", ".join(f"{k}={v}" for k, v in out["samples"].items())
        show(f"{out['suite']}: {metrics} ({samples}) bundle {out['bundle_sha256'][:16]}")
    return 0


def _parity(args) -> dict:
    """The PyTorch side first, its logits kept in files, then the bundle: the two models are never loaded together
    (a 2B model's float32 twins do not fit 24 GB). The source is held in its checkpoint's dtype and computes in
    float32, a layer at a time where the whole model in float32 would not fit (a 7B one on 24 GB)."""
    from mmtrt.bundle.manifest import image_side, read_manifest
    from mmtrt.ir.source_float32 import in_float32
    from mmtrt.eval.parity import parity_references
    from mmtrt.eval.source import source_model
    from mmtrt.eval.suites import run_suite, suite_limit
    from mmtrt.ir.resident import give_back_freed_memory
    from mmtrt.runtime import load

    manifest = read_manifest(args.bundle)
    limit = suite_limit("parity", args.limit)
    source = source_model(manifest, args.source_model, own_dtype=True)
    with tempfile.TemporaryDirectory(prefix="mmtrt-parity-") as folder:
        with in_float32(source[0]):
            references = parity_references(source, image_side(manifest), limit, Path(folder))
        del source
        gc.collect()
        give_back_freed_memory()
        return run_suite(load(args.bundle, threads=args.threads), "parity", limit, references=references)


def add_command(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a bundle on a suite: digits, perplexity, parity, qa or agreement",
                       description="Measure a bundle: digits accuracy, perplexity, parity with the PyTorch source, "
                       "your own questions (qa) or agreement with the source on your prompts (no labels).",
                       epilog=examples("mmtrt eval out/dino-smollm.bundle --suite digits --limit 100",
                                       "mmtrt eval out/dino-smollm.bundle --suite perplexity",
                                       "mmtrt eval BUNDLE --suite qa --data questions.jsonl --scorer numeric"))
    p.add_argument("bundle", help="a bundle folder written by `mmtrt compile`")
    p.add_argument("--suite", required=True, choices=["digits", "perplexity", "parity", "qa", "agreement"],
                   help="what to measure")
    p.add_argument("--limit", type=positive_int, metavar="N", help="images (digits, parity), windows (perplexity), "
                   "questions (qa) or prompts (agreement) to use (default: the suite's own)")
    p.add_argument("--data", type=Path, help="qa: JSONL of {image, prompt, answer}; agreement: prompts, one per line, "
                   "or JSONL of {prompt[, image]}")
    p.add_argument("--scorer", choices=["exact", "contains", "numeric"], default="contains",
                   help="qa: how answers are scored")
    p.add_argument("--tolerance", type=tolerance, default=0.0,
                   help="qa with --scorer numeric: largest absolute difference counted right")
    p.add_argument("--max-new-tokens", type=positive_int, default=16, metavar="N",
                   help="qa: tokens per answer; agreement: tokens of the source's answer scored")
    p.add_argument("--text", type=Path, help="perplexity: a UTF-8 text file (default: Python's documentation)")
    p.add_argument("--source-model", type=Path, metavar="CHECKPOINT",
                   help="parity, agreement: the checkpoint folder of an hf-sourced bundle")
    p.add_argument("--threads", type=positive_int, metavar="N",
                   help="ONNX Runtime intra-op threads (default: ONNX Runtime's choice)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_eval)
