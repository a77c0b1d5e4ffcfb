"""The `inspect` command: what a bundle holds and what this host would run it on."""

from __future__ import annotations

import json

from mmtrt.cli.arguments import examples
from mmtrt.terminal import show


def _inspect(args) -> int:
    from mmtrt.bundle.inspect import describe, describe_placement, inspect_json

    if args.placement:
        info = inspect_json(args.bundle)["manifest"]
        sections = {k: info.get(k) for k in ("placement", "tensorrt", "tensorrt_llm")}
        show(json.dumps(sections, indent=2) if args.json else describe_placement(args.bundle))
        return 0
    show(json.dumps(inspect_json(args.bundle), indent=2) if args.json else describe(args.bundle))
    return 0


def add_command(sub) -> None:
    p = sub.add_parser("inspect", help="show a bundle: model, backends, shapes, passes, hashes",
                       description="What a bundle holds and what this host would run it on.",
                       epilog=examples("mmtrt inspect out/dino-smollm.bundle",
                                       "mmtrt inspect out/dino-smollm.bundle --placement"))
    p.add_argument("bundle", help="a bundle folder written by `mmtrt compile`")
    p.add_argument("--json", action="store_true", help="print the manifest and this host's view as JSON")
    p.add_argument("--placement", action="store_true", help="segments per component, with why any node falls back")
    p.set_defaults(func=_inspect)
