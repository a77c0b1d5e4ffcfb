"""The `verify` command: every artifact hashed against the manifest, and the signature checked."""

from __future__ import annotations

from pathlib import Path

from mmtrt.cli.arguments import examples
from mmtrt.terminal import show


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


def add_command(sub) -> None:
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
