"""The `sign` command: a bundle signed with an elliptic-curve private key."""

from __future__ import annotations

import os
from pathlib import Path

from mmtrt.cli.arguments import examples
from mmtrt.terminal import show


def _sign(args) -> int:
    from mmtrt.bundle.sign import sign_bundle

    digest = sign_bundle(Path(args.bundle), args.key, os.environ.get("MMTRT_SIGNING_PASSWORD"))
    show(f"signed {args.bundle} (digest sha256:{digest}) with {args.key}")
    return 0


def add_command(sub) -> None:
    p = sub.add_parser("sign", help="sign a bundle with an elliptic-curve private key (OpenSSF model-signing, offline)",
                       description="Sign every file of a bundle with an elliptic-curve private key (OpenSSF "
                       "model-signing, offline); `run`, `serve` and `verify` given the public key then refuse a "
                       "changed bundle (docs/security.md).",
                       epilog=examples("mmtrt sign out/dino-smollm.bundle --key key.pem"))
    p.add_argument("bundle", help="a bundle folder written by `mmtrt compile`")
    p.add_argument("--key", type=Path, required=True, metavar="PEM", help="PEM private key (P-256, P-384 or P-521); "
                   "an encrypted one reads its password from MMTRT_SIGNING_PASSWORD")
    p.set_defaults(func=_sign)
