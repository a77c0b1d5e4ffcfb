"""The `mmtrt` command line. Bad input is one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mmtrt.errors import UserError
from mmtrt.progress import set_quiet

EXIT_USER_ERROR = 2
EXIT_COMPARE_FAILED = 1


def _compile(args) -> int:
    from mmtrt.compiler import compile_recipe, make_plan

    if args.plan:
        print(json.dumps(make_plan(args.recipe).to_json(), indent=2))
        return 0
    out = args.output or Path(args.recipe).with_suffix("").name + ".bundle"
    bundle = compile_recipe(args.recipe, out, force=args.force, dump_dir=args.dump_ir)
    print(f"wrote {bundle}")
    return 0


def _run(args) -> int:
    from mmtrt.runtime import load

    if args.requests:
        return _run_requests(args)
    if not (args.image and args.prompt):
        raise UserError("run needs --image and --prompt, or --requests FILE.jsonl")
    pipe = load(args.bundle, threads=args.threads)
    result = pipe.generate(args.image, args.prompt, args.max_new_tokens, raw_prompt=args.raw_prompt)
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        print(result.text)
        print(" ".join(f"{k}={v:.2f}" for k, v in result.timings.items()), file=sys.stderr)
    return 0


def _run_requests(args) -> int:
    from mmtrt.runtime import load
    from mmtrt.runtime.pipeline import Refused
    from mmtrt.runtime.requests import read_requests

    parsed = read_requests(args.requests)
    pipe = load(args.bundle, threads=args.threads)
    good = [(i, r) for i, r in enumerate(parsed) if not isinstance(r, str)]
    results = dict(zip([i for i, _ in good], pipe.generate_batch([r for _, r in good])))
    results.update({i: Refused(i, r) for i, r in enumerate(parsed) if isinstance(r, str)})
    for i in range(len(parsed)):
        result = results[i]
        if isinstance(result, Refused):
            print(f"mmtrt: error: {result.to_json()['error']}", file=sys.stderr)
        if args.json:
            print(json.dumps(result.to_json()))
        elif not isinstance(result, Refused):
            print(result.text)
    return EXIT_USER_ERROR if any(isinstance(r, Refused) for r in results.values()) else 0


def _inspect(args) -> int:
    from mmtrt.bundle.inspect import describe, describe_placement, inspect_json

    if args.placement:
        info = inspect_json(args.bundle)["manifest"]
        sections = {k: info.get(k) for k in ("placement", "tensorrt", "tensorrt_llm")}
        print(json.dumps(sections, indent=2) if args.json else describe_placement(args.bundle))
        return 0
    print(json.dumps(inspect_json(args.bundle), indent=2) if args.json else describe(args.bundle))
    return 0


def _build_engines(args) -> int:
    from mmtrt.backends.tensorrt.build import build_engines

    if args.plan:
        from mmtrt.bundle.manifest import read_manifest

        print(json.dumps(read_manifest(Path(args.bundle))["tensorrt"], indent=2))
        return 0
    records = build_engines(args.bundle, args.segment, force=args.force)
    print(json.dumps(records, indent=2) if args.json else f"{len(records)} segment(s) done")
    return 0


def _compare(args) -> int:
    from mmtrt.compare.report import compare, format_report

    report = compare(args.a, args.b, reference=args.reference, atol=args.atol, rtol=args.rtol,
                     components=args.partition, inputs_file=args.inputs, save_inputs=args.save_inputs,
                     seed=args.seed, source_model=args.source_model)
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    print(format_report(report))
    return 0 if report["passed"] else EXIT_COMPARE_FAILED


def _eval(args) -> int:
    from mmtrt.eval.suites import run_suite
    from mmtrt.eval.source import source_model
    from mmtrt.runtime import load

    pipe = load(args.bundle, threads=args.threads)
    source = source_model(pipe.manifest, args.source_model) if args.suite == "parity" else None
    out = run_suite(pipe, args.suite, args.limit, text_file=args.text, source=source)
    if args.json:
        print(json.dumps(out))
    else:
        metrics = ", ".join(f"{k}={v:.6g}" for k, v in out["metrics"].items())
        samples = ", ".join(f"{k}={v}" for k, v in out["samples"].items())
        print(f"{out['suite']}: {metrics} ({samples}) bundle {out['bundle_sha256'][:16]}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmtrt", description="Ahead-of-time compiler for LLaVA-style multimodal models.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compile", help="compile a recipe into a bundle")
    p.add_argument("recipe")
    p.add_argument("-o", "--output", help="bundle folder (default: RECIPE_NAME.bundle)")
    p.add_argument("--plan", action="store_true", help="validate and print the resolved plan; build nothing")
    p.add_argument("--force", action="store_true", help="replace an existing bundle folder")
    p.add_argument("--dump-ir", type=Path, help="write every ONNX graph after every pass into this folder")
    p.set_defaults(func=_compile)

    p = sub.add_parser("run", help="generate from a bundle with one image and one prompt, or a file of requests")
    p.add_argument("bundle")
    p.add_argument("--image")
    p.add_argument("--prompt")
    p.add_argument("--requests", type=Path, help="JSON Lines, one {image, prompt, max_new_tokens} per line; "
                   "prints one result per request in input order")
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--raw-prompt", action="store_true", help="use the prompt as is, with <image> where the image goes")
    p.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_run)

    p = sub.add_parser("eval", help="evaluate a bundle on a suite: digits, perplexity or parity")
    p.add_argument("bundle")
    p.add_argument("--suite", required=True, choices=["digits", "perplexity", "parity"])
    p.add_argument("--limit", type=int, help="images (digits, parity) or windows (perplexity) to use")
    p.add_argument("--text", type=Path, help="perplexity: a UTF-8 text file instead of Python's documentation")
    p.add_argument("--source-model", type=Path, help="parity: the checkpoint folder of an hf-sourced bundle")
    p.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_eval)

    p = sub.add_parser("inspect", help="show a bundle's manifest")
    p.add_argument("bundle")
    p.add_argument("--json", action="store_true")
    p.add_argument("--placement", action="store_true", help="segments per component, with why any node falls back")
    p.set_defaults(func=_inspect)

    p = sub.add_parser("build-engines", help="build the bundle's TensorRT engines on this GPU host (needs TensorRT 11)")
    p.add_argument("bundle")
    p.add_argument("--segment", action="append", help="build only this segment (repeatable), e.g. vision.0")
    p.add_argument("--force", action="store_true", help="rebuild engines that are up to date")
    p.add_argument("--plan", action="store_true", help="print the build plan (profiles, commands) and build nothing")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_build_engines)

    p = sub.add_parser("compare", help="compare two bundles, or a bundle and its PyTorch source, partition by partition")
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path, nargs="?")
    p.add_argument("--reference", choices=["torch"], help="compare A with the PyTorch model it was compiled from")
    p.add_argument("--source-model", type=Path, help="with --reference torch: the checkpoint folder of an hf-sourced bundle")
    p.add_argument("--atol", type=float, default=1e-5, help="absolute tolerance (default 1e-5)")
    p.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance, relative to B (default 1e-5)")
    p.add_argument("--partition", action="append", choices=["vision", "embed", "llm"], help="compare only these")
    p.add_argument("--inputs", type=Path, help="an .npz of inputs saved by --save-inputs, instead of generated ones")
    p.add_argument("--save-inputs", type=Path, help="save the inputs used to this .npz")
    p.add_argument("--seed", type=int, help="seed for generated inputs (default: fresh, recorded in the report)")
    p.add_argument("--json-out", type=Path, help="write the full report as JSON")
    p.set_defaults(func=_compare)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    set_quiet(bool(getattr(args, "json", False)))
    try:
        return args.func(args)
    except UserError as exc:
        print(f"mmtrt: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
