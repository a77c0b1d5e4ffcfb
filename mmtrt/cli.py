"""The `mmtrt` command line. Bad input is one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import atexit
import json
import math
import os
import sys
from pathlib import Path
from typing import NoReturn

from mmtrt.errors import Terminated, UserError
from mmtrt.progress import set_quiet

EXIT_USER_ERROR = 2
EXIT_COMPARE_FAILED = 1
EXIT_NOT_ALL_BUILT = 1  # build-engines: some TensorRT segment was skipped or failed (each record says why)
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
EXIT_BROKEN_PIPE = 141


def one_line(message: str) -> str:
    """Line breaks and other control characters (a recipe key may hold any) as escapes: one line, always."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)


class Parser(argparse.ArgumentParser):
    """Argument errors as one line, like every other bad input (argparse prints the usage too)."""

    def error(self, message):
        self.exit(EXIT_USER_ERROR, f"mmtrt: error: {self.prog}: {one_line(message)}; see `{self.prog} --help`\n")


def _parse(text: str, kind: type, what: str, ok) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


def positive_int(text: str) -> int:
    return _parse(text, int, "an integer >= 1", lambda v: v >= 1)


def natural_int(text: str) -> int:
    return _parse(text, int, "an integer >= 0", lambda v: v >= 0)


def tolerance(text: str) -> float:
    return _parse(text, float, "a finite number >= 0", lambda v: math.isfinite(v) and v >= 0)


def output_file(text: str) -> Path:
    """A file the command writes at the end: its folder must exist now, not after minutes of work."""
    path = Path(text)
    if path.is_dir() or not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder or its folder does not exist")
    return path


def _compile(args) -> int:
    from mmtrt.compiler import compile_recipe, make_plan

    if args.plan:
        print(json.dumps(make_plan(args.recipe).to_json(), indent=2))
        return 0
    out = args.output or Path(args.recipe).with_suffix("").name + ".bundle"
    if args.dump_ir:
        from mmtrt.pipeline.instruments import dump_folder

        dump_folder(args.dump_ir)
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
    from mmtrt.backends.tensorrt.plan_report import describe_plan, plan_report
    from mmtrt.backends.trtllm_engines import build_llm_engine, plan_json

    bundle = Path(args.bundle)
    if args.plan:
        from mmtrt.bundle.manifest import read_manifest

        manifest = read_manifest(bundle)
        report = plan_report(bundle, manifest, args.target)
        if args.target == "tensorrt":
            report["tensorrt_llm"] = plan_json(bundle, manifest)
        print(json.dumps(report, indent=2) if args.json else describe_plan(report))
        return 0
    log = (lambda line: None) if args.json else print
    # --segment names TensorRT segments; TensorRT-RTX has no TensorRT-LLM
    llm = [] if args.segment or args.target == "rtx" else [build_llm_engine(bundle, args.force, log)]
    segments = build_engines(bundle, args.segment, force=args.force, target=args.target, log=log)
    counts = {s: sum(r["status"] == s for r in segments) for s in ("built", "up to date", "skipped", "failed")}
    print(json.dumps(llm + segments, indent=2) if args.json else ", ".join(f"{n} {s}" for s, n in counts.items()))
    # the TensorRT segments decide: a TensorRT-LLM engine this host cannot build is reported, not counted
    return 0 if counts["built"] + counts["up to date"] == len(segments) else EXIT_NOT_ALL_BUILT


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
    from mmtrt.eval.options import cli_options
    from mmtrt.eval.suites import run_suite
    from mmtrt.eval.source import source_model
    from mmtrt.runtime import load

    pipe = load(args.bundle, threads=args.threads)
    source = source_model(pipe.manifest, args.source_model) if args.suite in ("parity", "agreement") else None
    options = cli_options(args.suite, args.data, args.scorer, args.tolerance, args.max_new_tokens, source)
    out = run_suite(pipe, args.suite, args.limit, text_file=args.text, **options)
    if args.json:
        print(json.dumps(out))
    else:
        metrics = ", ".join(f"{k}={v:.6g}" for k, v in out["metrics"].items())
        samples = ", ".join(f"{k}={v}" for k, v in out["samples"].items())
        print(f"{out['suite']}: {metrics} ({samples}) bundle {out['bundle_sha256'][:16]}")
    return 0


def _profile(args) -> int:
    from mmtrt.profile.cli import profile_command

    return profile_command(args)


def _nightly(args) -> int:
    from mmtrt.nightly.command import main as nightly

    return nightly(args)


def _verify(args) -> int:
    from mmtrt.bundle.manifest import read_manifest
    from mmtrt.bundle.verify import verify_bundle

    manifest = read_manifest(Path(args.bundle))
    verify_bundle(args.bundle, manifest, full=True)
    print(f"{args.bundle}: all {len(manifest['artifacts'])} artifacts match the manifest's sha256")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="mmtrt", description="Ahead-of-time compiler for LLaVA-style multimodal models.")
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
    p.add_argument("--max-new-tokens", type=positive_int)
    p.add_argument("--raw-prompt", action="store_true", help="use the prompt as is, with <image> where the image goes")
    p.add_argument("--threads", type=positive_int, help="ONNX Runtime intra-op threads")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_run)

    p = sub.add_parser("eval", help="evaluate a bundle on a suite: digits, perplexity, parity, qa or agreement")
    p.add_argument("bundle")
    p.add_argument("--suite", required=True, choices=["digits", "perplexity", "parity", "qa", "agreement"])
    p.add_argument("--limit", type=positive_int, help="images (digits, parity), windows (perplexity), questions (qa) or prompts (agreement) to use")
    p.add_argument("--data", type=Path, help="qa: JSONL of {image, prompt, answer}; agreement: prompts, one per line, or JSONL of {prompt[, image]}")
    p.add_argument("--scorer", choices=["exact", "contains", "numeric"], default="contains", help="qa: how answers are scored (default contains)")
    p.add_argument("--tolerance", type=tolerance, default=0.0, help="qa with --scorer numeric: largest absolute difference counted right")
    p.add_argument("--max-new-tokens", type=positive_int, default=16, help="qa: tokens per answer; agreement: tokens of the source's answer scored (default 16)")
    p.add_argument("--text", type=Path, help="perplexity: a UTF-8 text file instead of Python's documentation")
    p.add_argument("--source-model", type=Path, help="parity, agreement: the checkpoint folder of an hf-sourced bundle")
    p.add_argument("--threads", type=positive_int, help="ONNX Runtime intra-op threads")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_eval)

    p = sub.add_parser("inspect", help="show a bundle's manifest")
    p.add_argument("bundle")
    p.add_argument("--json", action="store_true")
    p.add_argument("--placement", action="store_true", help="segments per component, with why any node falls back")
    p.set_defaults(func=_inspect)

    p = sub.add_parser("build-engines", help="build the bundle's TensorRT engines: TensorRT 11 (and the TensorRT-LLM engine) on this GPU host, or TensorRT-RTX on any host")
    p.add_argument("bundle")
    p.add_argument("--target", choices=["tensorrt", "rtx"], default="tensorrt",
                   help="tensorrt: TensorRT 11 for this host's GPU (default); rtx: TensorRT-RTX engines for compute "
                        "capability 8.0, 8.6, 8.9 and 12.0, built on any host, no GPU needed")
    p.add_argument("--segment", action="append", help="build only this segment (repeatable), e.g. vision.0")
    p.add_argument("--force", action="store_true", help="rebuild engines that are up to date")
    p.add_argument("--plan", action="store_true", help="print the build plan for --target (profiles, engine files, commands) and build nothing")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_build_engines)

    p = sub.add_parser("compare", help="compare two bundles, or a bundle and its PyTorch source, partition by partition")
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path, nargs="?")
    p.add_argument("--reference", choices=["torch"], help="compare A with the PyTorch model it was compiled from")
    p.add_argument("--source-model", type=Path, help="with --reference torch: the checkpoint folder of an hf-sourced bundle")
    p.add_argument("--atol", type=tolerance, default=1e-5, help="absolute tolerance (default 1e-5)")
    p.add_argument("--rtol", type=tolerance, default=1e-5, help="relative tolerance, relative to B (default 1e-5)")
    p.add_argument("--partition", action="append", choices=["vision", "embed", "llm"], help="compare only these")
    p.add_argument("--inputs", type=Path, help="an .npz of inputs saved by --save-inputs, instead of generated ones")
    p.add_argument("--save-inputs", type=output_file, help="save the inputs used to this .npz")
    p.add_argument("--seed", type=natural_int, help="seed for generated inputs (default: fresh, recorded in the report)")
    p.add_argument("--json-out", type=output_file, help="write the full report as JSON")
    p.set_defaults(func=_compare)

    p = sub.add_parser("profile", help="where a request's time and memory go: stages, layers, heads, with pictures")
    p.add_argument("bundles", nargs="+", type=Path, help="one bundle, or several to put side by side")
    p.add_argument("--image", required=True)
    p.add_argument("--prompt", required=True)
    p.add_argument("--batch", default="1", help="comma-separated batch sizes (default 1)")
    p.add_argument("--context", default="256,1024", help="comma-separated KV contexts to sweep (default 256,1024)")
    p.add_argument("--rounds", type=positive_int, default=5, help="timed requests per batch size (default 5)")
    p.add_argument("--new-tokens", type=positive_int, default=16, help="tokens decoded per request, EOS or not (default 16)")
    p.add_argument("--threads", type=positive_int, default=1, help="ONNX Runtime intra-op threads (default 1)")
    p.add_argument("-o", "--output", type=Path, default=Path("profile-report"), help="report folder")
    p.add_argument("--json", action="store_true", help="print the whole report as JSON")
    p.set_defaults(func=_profile)

    p = sub.add_parser("nightly", help="compile, evaluate and benchmark a recipe matrix; compare with the last good night")
    p.add_argument("config", help="NIGHTLY.yaml (docs/NIGHTLY.md)")
    p.add_argument("-o", "--output", type=Path, default=Path("nightly-report"), help="report folder")
    p.add_argument("--shard", help="I/N: run every N-th recipe from the I-th (plus the reference); record nothing")
    p.add_argument("--merge", nargs="+", type=Path, metavar="SHARD_DIR", help="record the shards' reports as one night")
    p.add_argument("--history", help="SQLite file or SQLAlchemy URL instead of the config's `history:`")
    p.add_argument("--label", help="the night's name in the history (default: the UTC start time)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_nightly)

    p = sub.add_parser("verify", help="hash every artifact of a bundle against its manifest (loads check cheaply)")
    p.add_argument("bundle")
    p.set_defaults(func=_verify)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    set_quiet(bool(getattr(args, "json", False)))
    try:
        return args.func(args)
    except UserError as exc:
        print(f"mmtrt: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:  # `mmtrt inspect B | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except OSError as exc:  # the file system's answer on a path the user gave: name too long, no permission, disk full
        print(f"mmtrt: error: {one_line(str(exc))}; check the path, its permissions and the free space", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        print(f"mmtrt: interrupted by {'SIGTERM' if terminated else 'Ctrl-C'}; nothing half-written was left",
              file=sys.stderr)
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED


def run_as_module(argv: list[str] | None = None) -> NoReturn:
    """`python -m mmtrt.cli`: main's exit status, 130 also after a Ctrl-C that main handled.

    Under -m, CPython ends a process whose KeyboardInterrupt once escaped any C-level eval (a library's
    PyRun_String, as pybind11's py::exec is) by killing it with SIGINT at exit, however that exception was handled
    later: the flag it sets is global. So after a handled Ctrl-C the exit functions run here (temporary folders'
    finalizers among them) and the process exits with the status main gave."""
    code = main(argv)
    if code == EXIT_INTERRUPTED:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run_as_module()
