"""The `mmtrt profile` handler: parse the lists, run, print the table or the JSON."""

from __future__ import annotations

import json

from mmtrt.errors import UserError
from mmtrt.runtime.image_file import open_image


def int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{flag} {text!r} is not a comma-separated list of integers, e.g. {flag} 1,4,8") from None
    if not values or min(values) < 1:
        raise UserError(f"{flag} {text!r} needs positive integers, e.g. {flag} 1,4,8")
    return values


def profile_command(args) -> int:
    from mmtrt.profile.report import format_text, run

    batches, contexts = int_list(args.batch, "--batch"), int_list(args.context, "--context")
    if args.rounds < 1:
        raise UserError(f"--rounds {args.rounds} must be at least 1")
    image = open_image(args.image)
    report = run(args.bundles, image, args.prompt, batches, contexts, args.output, args.rounds, args.new_tokens,
                 args.threads)
    print(json.dumps(report) if args.json else format_text(report) + f"\nreport: {args.output / 'index.html'}")
    return 0
