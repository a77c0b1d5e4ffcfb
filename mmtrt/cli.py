"""The `mmtrt` command line. Bad input is one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import atexit
import difflib
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import NoReturn

from mmtrt.errors import Terminated, UserError
from mmtrt.progress import set_quiet, stage
from mmtrt.serve.cli import add_commands as add_serve_commands
from mmtrt.terminal import one_line, printable, show

EXIT_USER_ERROR = 2
EXIT_COMPARE_FAILED = 1
EXIT_NOT_ALL_BUILT = 1  # build-engines: some TensorRT segment was skipped or failed (each record says why)
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
EXIT_BROKEN_PIPE = 141


class HelpFormatter(argparse.HelpFormatter):
    """Examples kept as written, and every option's default shown unless its help already says it."""

    def _fill_text(self, text, width, indent):
        if text.startswith("examples:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS) or action.option_strings == []:
            return text
        return f"{text} (default: {action.default})"


class Parser(argparse.ArgumentParser):
    """Argument errors as one line, like every other bad input (argparse prints the usage too), with the closest
    command, choice or option when the user mistyped one."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, formatter_class=HelpFormatter, **kwargs)

    def error(self, message):
        self.exit(EXIT_USER_ERROR, f"mmtrt: error: {self.prog}: {one_line(self._explained(message))}; "
                                   f"see `{self.prog} --help`\n")

    def _explained(self, message: str) -> str:
        choice = re.match(r"argument (\S+): invalid choice: '(.*)' \(choose from (.*)\)$", message)
        if choice:
            name, given, allowed = choice[1], choice[2], re.findall(r"'([^']*)'", choice[3])
            what = "command" if name == "COMMAND" else f"value for {name}"
            close = difflib.get_close_matches(given, allowed, n=1)
            hint = f"; did you mean {_shown_choice(self.prog, name, close[0])}?" if close else ""
            return f"unknown {what} '{given}'{hint} (one of {', '.join(allowed)})"
        if message == "the following arguments are required: COMMAND":
            return f"no command given; one of {', '.join(self._commands())}"
        unknown = re.match(r"unrecognized arguments: (--?\S+)", message)
        if unknown:
            close = difflib.get_close_matches(unknown[1], self._option_strings(), n=1)
            return f"{message}; did you mean {close[0]}?" if close else message
        return message

    def _commands(self) -> list[str]:
        return [name for a in self._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices]

    def _option_strings(self) -> list[str]:
        """Every option of this parser and of its commands."""
        parsers = [self] + [sub for a in self._actions if isinstance(a, argparse._SubParsersAction)
                            for sub in a.choices.values()]
        return [s for parser in parsers for a in parser._actions for s in a.option_strings]


def _shown_choice(prog: str, argument: str, choice: str) -> str:
    return f"`{prog} {choice}`" if argument == "COMMAND" else f"'{choice}'"


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
    from mmtrt.recipe import load_recipe

    recipe, _ = load_recipe(args.recipe)  # every problem the schema can see, before torch loads
    with stage("loading torch, transformers and the passes"):
        from mmtrt.compiler import compile_recipe, make_plan
    out = args.output or Path(args.recipe).with_suffix("").name + ".bundle"
    if args.plan:
        from mmtrt.plan_text import describe_plan

        plan = make_plan(args.recipe)
        show(json.dumps(plan.to_json(), indent=2) if args.json else describe_plan(plan, args.recipe, str(out)))
        return 0
    if args.dump_ir:
        from mmtrt.pipeline.instruments import dump_folder

        dump_folder(args.dump_ir)
    from mmtrt.bundle.trust import manifest_digest

    bundle = compile_recipe(args.recipe, out, force=args.force, dump_dir=args.dump_ir, device=args.device)
    show(f"wrote {bundle}")
    show(f"digest sha256:{manifest_digest(bundle)}")
    show(f"next: {_first_run(bundle, recipe)}")
    return 0


def _first_run(bundle: Path, recipe) -> str:
    """The command that tries the new bundle: on a shipped digit for the zoo's digit models."""
    if recipe.model.source == "zoo" and recipe.model.name.startswith("dino-smollm"):
        return f'mmtrt run {bundle} --image examples/digit-5.png --prompt "Which digit is shown?"'
    return f'mmtrt run {bundle} --image examples/sample.png --prompt "What is in the picture?"'


def _sampling(args):
    """The sampling flags, checked before the bundle loads."""
    from mmtrt.runtime.sampling import SamplingParams

    return SamplingParams(None, args.temperature, args.top_p, args.top_k, args.seed, args.repetition_penalty,
                          tuple(args.stop or ())).validate()


def _run(args) -> int:
    sampling = _sampling(args)
    if args.requests:
        if args.stream:
            raise UserError("--stream prints one request as it is made; use it with --image and --prompt")
        return _run_requests(args, sampling)
    if args.image is None or args.prompt is None:
        raise UserError("run needs --image and --prompt, or --requests FILE.jsonl")
    pipe = _load(args)
    if args.stream:
        for delta in pipe.stream(args.image, args.prompt, args.max_new_tokens, args.raw_prompt, sampling):
            if args.json:
                print(json.dumps({"token_ids": list(delta.token_ids), "text": delta.text,
                                  "finish_reason": delta.finish_reason}), flush=True)
            else:
                print(printable(delta.text), end="\n" if delta.finish_reason else "", flush=True)
        return 0
    result = pipe.generate(args.image, args.prompt, args.max_new_tokens, raw_prompt=args.raw_prompt,
                           sampling=sampling)
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        show(result.text)
        show(" ".join(f"{k}={v:.2f}" for k, v in result.timings.items()), file=sys.stderr)
    return 0


def _load(args):
    from mmtrt.runtime import load

    return load(args.bundle, threads=args.threads, expect_digest=args.expect_digest, public_key=args.public_key,
                parse_special_tokens=args.parse_special_tokens)


def _run_requests(args, sampling) -> int:
    from dataclasses import replace

    from mmtrt.runtime.pipeline import Refused
    from mmtrt.runtime.requests import read_requests

    if args.image is not None or args.prompt is not None:
        raise UserError("--requests takes each request's image and prompt from its line; give either --requests or "
                        "--image and --prompt")
    parsed = read_requests(args.requests, args.max_new_tokens, args.raw_prompt)
    pipe = _load(args)
    good = [i for i, r in enumerate(parsed) if not isinstance(r, str)]
    results = {i: Refused(i, r) for i, r in enumerate(parsed) if isinstance(r, str)}
    batch = [parsed[i] if parsed[i].sampling else replace(parsed[i], sampling=sampling) for i in good]
    for i, result in zip(good, pipe.generate_batch(batch)):
        results[i] = Refused(i, result.reason) if isinstance(result, Refused) else result
    for i in range(len(parsed)):
        result = results[i]
        if isinstance(result, Refused):
            print(f"mmtrt: error: {one_line(result.to_json()['error'])}", file=sys.stderr)
        if args.json:
            print(json.dumps(result.to_json()))
        elif not isinstance(result, Refused):
            show(result.text)
    return EXIT_USER_ERROR if any(isinstance(r, Refused) for r in results.values()) else 0


def _inspect(args) -> int:
    from mmtrt.bundle.inspect import describe, describe_placement, inspect_json

    if args.placement:
        info = inspect_json(args.bundle)["manifest"]
        sections = {k: info.get(k) for k in ("placement", "tensorrt", "tensorrt_llm")}
        show(json.dumps(sections, indent=2) if args.json else describe_placement(args.bundle))
        return 0
    show(json.dumps(inspect_json(args.bundle), indent=2) if args.json else describe(args.bundle))
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
        show(json.dumps(report, indent=2) if args.json else describe_plan(report))
        return 0
    log = (lambda line: None) if args.json else show
    # --segment names TensorRT segments; TensorRT-RTX has no TensorRT-LLM
    llm = [] if args.segment or args.target == "rtx" else [build_llm_engine(bundle, args.force, log)]
    segments = build_engines(bundle, args.segment, force=args.force, target=args.target, log=log)
    counts = {s: sum(r["status"] == s for r in segments) for s in ("built", "up to date", "skipped", "failed")}
    show(json.dumps(llm + segments, indent=2) if args.json else ", ".join(f"{n} {s}" for s, n in counts.items()))
    # the TensorRT segments decide: a TensorRT-LLM engine this host cannot build is reported, not counted
    return 0 if counts["built"] + counts["up to date"] == len(segments) else EXIT_NOT_ALL_BUILT


def _compare(args) -> int:
    from mmtrt.compare.report import compare, format_report

    report = compare(args.a, args.b, reference=args.reference, atol=args.atol, rtol=args.rtol,
                     components=args.partition, inputs_file=args.inputs, save_inputs=args.save_inputs,
                     seed=args.seed, source_model=args.source_model)
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    show(format_report(report))
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
        show(f"{out['suite']}: {metrics} ({samples}) bundle {out['bundle_sha256'][:16]}")
    return 0


def _profile(args) -> int:
    from mmtrt.profile.cli import profile_command

    return profile_command(args)


def _nightly(args) -> int:
    from mmtrt.nightly.command import main as nightly

    return nightly(args)


def _verify(args) -> int:
    from mmtrt.bundle.manifest import read_manifest
    from mmtrt.bundle.schema import check_schema
    from mmtrt.bundle.sign import verify_signature
    from mmtrt.bundle.trust import manifest_digest
    from mmtrt.bundle.verify import verify_bundle

    manifest = read_manifest(Path(args.bundle))
    check_schema(Path(args.bundle), manifest)
    verify_bundle(args.bundle, manifest, full=True)
    show(f"{args.bundle}: all {len(manifest['artifacts'])} artifacts match the manifest's sha256; digest "
         f"sha256:{manifest_digest(Path(args.bundle))}")
    if args.public_key:
        verify_signature(Path(args.bundle), args.public_key)
        show(f"{args.bundle}: the signature verifies with {args.public_key} and covers every file")
    return 0


def _sign(args) -> int:
    from mmtrt.bundle.sign import sign_bundle

    digest = sign_bundle(Path(args.bundle), args.key, os.environ.get("MMTRT_SIGNING_PASSWORD"))
    show(f"signed {args.bundle} (digest sha256:{digest}) with {args.key}")
    return 0


def examples(*lines: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


DIGIT = 'examples/digit-5.png --prompt "Which digit is shown?"'


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="mmtrt", description="Ahead-of-time compiler for LLaVA-style multimodal models: a recipe "
                    "in, a deployable bundle out, run by `mmtrt run`, Python or C++.",
                    epilog=examples("mmtrt compile recipes/dino-smollm.yaml -o out/dino-smollm.bundle",
                                    f"mmtrt run out/dino-smollm.bundle --image {DIGIT}",
                                    "mmtrt COMMAND --help            every option of a command, with examples")
                    + "\n\ndocs: docs/quickstart.md, docs/cli.md, docs/RECIPES.md")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("compile", help="compile a recipe into a bundle",
                       description="Lower the recipe's model into ONNX components, run its passes, plan backends "
                       "and shapes, and write a content-hashed bundle. The recipe is checked first, every problem "
                       "at once, before anything heavy loads.",
                       epilog=examples("mmtrt compile recipes/tiny-llava.yaml -o out/tiny-llava.bundle",
                                       "mmtrt compile recipes/dino-smollm.yaml --plan       # what would be built",
                                       "mmtrt compile recipes/dino-smollm.yaml --plan --json"))
    p.add_argument("recipe", help="the recipe, a YAML file (docs/RECIPES.md)")
    p.add_argument("-o", "--output", help="bundle folder to write (default: RECIPE_NAME.bundle here)")
    p.add_argument("--plan", action="store_true", help="check the recipe and the model, print what would be built; "
                   "build nothing")
    p.add_argument("--json", action="store_true", help="with --plan: print the whole plan as JSON")
    p.add_argument("--force", action="store_true", help="replace an existing bundle folder")
    p.add_argument("--dump-ir", type=Path, metavar="DIR", help="write every ONNX graph after every pass into DIR")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where export and calibration run (default auto: CUDA when a GPU is visible)")
    p.set_defaults(func=_compile)

    p = sub.add_parser("run", help="answer a prompt about an image with a bundle (or a file of requests)",
                       description="Generate from a bundle, greedily unless sampling is asked for: the answer on "
                       "stdout, the timings on stderr (--json: one JSON object with the exact text, token ids and "
                       "timings; --stream: the text as it is made).",
                       epilog=examples(f"mmtrt run out/dino-smollm.bundle --image {DIGIT}",
                                       f"mmtrt run out/dino-smollm.bundle --image {DIGIT} --stream",
                                       "mmtrt run out/tiny-llava.bundle --image examples/sample.png --prompt Hi --json",
                                       f"mmtrt run out/dino-smollm.bundle --image {DIGIT} --temperature 0.7 --seed 1",
                                       "mmtrt run out/tiny-llava.bundle --requests requests.jsonl --json"))
    p.add_argument("bundle", help="a bundle folder written by `mmtrt compile`")
    p.add_argument("--image", help="the image file (PNG, JPEG, ...; any size: preprocessing resizes it)")
    p.add_argument("--prompt", help="the question; the bundle's chat template wraps it, with the image first")
    p.add_argument("--requests", type=Path, metavar="FILE.jsonl", help="JSON Lines, one {image, prompt[, "
                   "max_new_tokens, raw_prompt]} per line (image paths relative to the file); prints one result per "
                   "request in input order")
    p.add_argument("--max-new-tokens", type=positive_int, metavar="N", help="most tokens to generate (default: the "
                   "recipe's envelope.max_new_tokens; with --requests: for lines without their own)")
    p.add_argument("--raw-prompt", action="store_true", help="use the prompt as is, with <image> where the image goes "
                   "(with --requests: for lines without their own)")
    p.add_argument("--threads", type=positive_int, metavar="N",
                   help="ONNX Runtime intra-op threads (default: ONNX Runtime's choice)")
    p.add_argument("--expect-digest", metavar="SHA256", help="refuse the bundle unless its digest (`mmtrt inspect`) "
                   "is this sha256")
    p.add_argument("--public-key", type=Path, metavar="PEM", help="refuse the bundle unless it carries a valid "
                   "signature (`mmtrt sign`) by this PEM public key")
    p.add_argument("--parse-special-tokens", action="store_true", help="special tokens typed in the prompt (such "
                   "as <|im_end|>) act as special tokens; by default they are text (docs/security.md)")
    p.add_argument("--json", action="store_true", help="the result as JSON (with --stream: one JSON line per token)")
    p.add_argument("--stream", action="store_true", help="print the text as it is made")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; up to 2")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: keep the most probable tokens up "
                   "to this probability mass, in (0, 1]; 1: off")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most probable tokens; 0: off")
    p.add_argument("--seed", type=int, help="the sampler's seed: same seed, same tokens (default: a fresh one)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="above 1 discourages tokens already seen; "
                   "1: off")
    p.add_argument("--stop", action="append", metavar="TEXT", help="end the text before this string (repeatable)")
    p.set_defaults(func=_run)

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

    p = sub.add_parser("inspect", help="show a bundle: model, backends, shapes, passes, hashes",
                       description="What a bundle holds and what this host would run it on.",
                       epilog=examples("mmtrt inspect out/dino-smollm.bundle",
                                       "mmtrt inspect out/dino-smollm.bundle --placement"))
    p.add_argument("bundle", help="a bundle folder written by `mmtrt compile`")
    p.add_argument("--json", action="store_true", help="print the manifest and this host's view as JSON")
    p.add_argument("--placement", action="store_true", help="segments per component, with why any node falls back")
    p.set_defaults(func=_inspect)

    p = sub.add_parser("build-engines", help="build the bundle's TensorRT engines: TensorRT 11 (and the TensorRT-LLM "
                       "engine) on this GPU host, or TensorRT-RTX on any host",
                       description="Build the bundle's TensorRT segments into BUNDLE/engines/: with TensorRT 11 (and "
                       "the TensorRT-LLM engine) on the GPU host that will run the bundle, or with TensorRT-RTX on any "
                       "host, no GPU needed (--target rtx). Each segment is reported as built, up to date, skipped or "
                       "failed; exit code 1 unless every one is built. Hosts without a matching engine run ONNX "
                       "Runtime (docs/tensorrt.md).",
                       epilog=examples("mmtrt build-engines out/dino-smollm.bundle --target rtx",
                                       "mmtrt build-engines out/dino-smollm.bundle --target rtx --plan",
                                       "mmtrt build-engines out/dino-smollm.bundle --plan",
                                       "mmtrt build-engines out/dino-smollm.bundle --segment vision.0"))
    p.add_argument("bundle", help="a bundle folder written by `mmtrt compile`")
    p.add_argument("--target", choices=["tensorrt", "rtx"], default="tensorrt",
                   help="tensorrt: TensorRT 11 for this host's GPU; rtx: TensorRT-RTX engines for compute "
                        "capability 8.0, 8.6, 8.9 and 12.0, built on any host, no GPU needed")
    p.add_argument("--segment", action="append", metavar="ID",
                   help="build only this segment (repeatable), e.g. vision.0 (default: all)")
    p.add_argument("--force", action="store_true", help="rebuild engines that are up to date")
    p.add_argument("--plan", action="store_true", help="print the build plan for --target (profiles, engine files, "
                   "commands that run as printed) and build nothing")
    p.add_argument("--json", action="store_true", help="print the plan or the build records as JSON")
    p.set_defaults(func=_build_engines)

    p = sub.add_parser("compare", help="compare two bundles, or a bundle and its PyTorch source, partition by partition",
                       description="Run both sides on the same inputs through Polygraphy and compare every output; "
                       "exit code 1 when one fails the tolerances.",
                       epilog=examples("mmtrt compare out/dino-smollm.bundle --reference torch",
                                       "mmtrt compare out/a.bundle out/b.bundle --atol 1e-3 --partition llm"))
    p.add_argument("a", type=Path, help="a bundle folder")
    p.add_argument("b", type=Path, nargs="?", help="a second bundle folder (or --reference torch)")
    p.add_argument("--reference", choices=["torch"], help="compare A with the PyTorch model it was compiled from")
    p.add_argument("--source-model", type=Path, metavar="CHECKPOINT",
                   help="with --reference torch: the checkpoint folder of an hf-sourced bundle")
    p.add_argument("--atol", type=tolerance, default=1e-5, help="absolute tolerance")
    p.add_argument("--rtol", type=tolerance, default=1e-5, help="relative tolerance, relative to B")
    p.add_argument("--partition", action="append", choices=["vision", "embed", "llm"],
                   help="compare only these (repeatable; default: all)")
    p.add_argument("--inputs", type=Path, metavar="FILE.npz",
                   help="inputs saved by --save-inputs, instead of generated ones")
    p.add_argument("--save-inputs", type=output_file, metavar="FILE.npz", help="save the inputs used")
    p.add_argument("--seed", type=natural_int, help="seed for generated inputs (default: fresh, recorded in the report)")
    p.add_argument("--json-out", type=output_file, metavar="FILE", help="write the full report as JSON")
    p.set_defaults(func=_compare)

    p = sub.add_parser("profile", help="where a request's time and memory go: stages, layers, heads, with pictures",
                       description="Profile what ships: stage times, per-layer and per-op kernel time, attention "
                       "heads, KV memory, written as a report folder with pictures (index.html).",
                       epilog=examples(f"mmtrt profile out/dino-smollm.bundle --image {DIGIT} --rounds 3",
                                       f"mmtrt profile A.bundle B.bundle --image {DIGIT}   # side by side"))
    p.add_argument("bundles", nargs="+", type=Path, help="one bundle, or several to put side by side")
    p.add_argument("--image", required=True, help="the image of the profiled request")
    p.add_argument("--prompt", required=True, help="the prompt of the profiled request")
    p.add_argument("--batch", default="1", help="comma-separated batch sizes")
    p.add_argument("--context", default="256,1024", help="comma-separated KV contexts to sweep")
    p.add_argument("--rounds", type=positive_int, default=5, help="timed requests per batch size")
    p.add_argument("--new-tokens", type=positive_int, default=16, help="tokens decoded per request, EOS or not")
    p.add_argument("--threads", type=positive_int, default=1, help="ONNX Runtime intra-op threads")
    p.add_argument("-o", "--output", type=Path, default=Path("profile-report"), help="report folder")
    p.add_argument("--json", action="store_true", help="print the whole report as JSON")
    p.set_defaults(func=_profile)

    p = sub.add_parser("nightly", help="compile, evaluate and benchmark a recipe matrix; compare with the last good night",
                       description="A scheduled build: a recipe matrix through a build cache, evaluated and "
                       "benchmarked, compared with the last good night (docs/NIGHTLY.md); exit code 1 on a regression.",
                       epilog=examples("mmtrt nightly scripts/nightly.yaml -o nightly-report",
                                       "mmtrt nightly scripts/nightly.yaml --shard 1/2 -o shard1"))
    p.add_argument("config", help="NIGHTLY.yaml (docs/NIGHTLY.md)")
    p.add_argument("-o", "--output", type=Path, default=Path("nightly-report"), help="report folder")
    p.add_argument("--shard", metavar="I/N", help="run every N-th recipe from the I-th (plus the reference); record nothing")
    p.add_argument("--merge", nargs="+", type=Path, metavar="SHARD_DIR", help="record the shards' reports as one night")
    p.add_argument("--history", help="SQLite file or SQLAlchemy URL (default: the config's `history:`)")
    p.add_argument("--label", help="the night's name in the history (default: the UTC start time)")
    p.add_argument("--json", action="store_true", help="print the night's outcome as JSON")
    p.set_defaults(func=_nightly)

    add_serve_commands(sub, positive_int, natural_int, examples)

    p = sub.add_parser("verify", help="hash every artifact of a bundle against its manifest, and its signature",
                       description="Hash every byte of every artifact against the manifest's sha256 (loads check "
                       "cheaply, by file identity, after their first full check) and print the bundle's digest; with "
                       "--public-key, also check its signature (docs/security.md).",
                       epilog=examples("mmtrt verify out/dino-smollm.bundle",
                                       "mmtrt verify out/dino-smollm.bundle --public-key key.pub"))
    p.add_argument("bundle", help="a bundle folder written by `mmtrt compile`")
    p.add_argument("--public-key", type=Path, metavar="PEM", help="also check the bundle's signature (`mmtrt sign`) "
                   "with this PEM public key, hashing every file (OpenSSF model-signing)")
    p.set_defaults(func=_verify)

    p = sub.add_parser("sign", help="sign a bundle with an elliptic-curve private key (OpenSSF model-signing, offline)",
                       description="Sign every file of a bundle with an elliptic-curve private key (OpenSSF "
                       "model-signing, offline); `run`, `serve` and `verify` given the public key then refuse a "
                       "changed bundle (docs/security.md).",
                       epilog=examples("mmtrt sign out/dino-smollm.bundle --key key.pem"))
    p.add_argument("bundle", help="a bundle folder written by `mmtrt compile`")
    p.add_argument("--key", type=Path, required=True, metavar="PEM", help="PEM private key (P-256, P-384 or P-521); "
                   "an encrypted one reads its password from MMTRT_SIGNING_PASSWORD")
    p.set_defaults(func=_sign)
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
