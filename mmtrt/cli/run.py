"""The `run` command: one request from the flags, or a file of requests, answered by a bundle."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mmtrt.cli.arguments import DIGIT, examples, positive_int
from mmtrt.cli.exit_codes import EXIT_USER_ERROR
from mmtrt.errors import UserError
from mmtrt.terminal import one_line, printable, show


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


def add_command(sub) -> None:
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
