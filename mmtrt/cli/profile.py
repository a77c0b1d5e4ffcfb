"""The `profile` command's arguments; the work is mmtrt/profile's."""

from __future__ import annotations

from pathlib import Path

from mmtrt.cli.arguments import DIGIT, examples, positive_int


def _profile(args) -> int:
    from mmtrt.profile.cli import profile_command

    return profile_command(args)


def add_command(sub) -> None:
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
